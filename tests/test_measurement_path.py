"""Issue 13: one measurement path.  No module outside sparsedp.noise (the samplers) and
sparsedp.measure (the path) draws privacy noise, and every release defaults to exact noise."""

import inspect
import re
from pathlib import Path

import pytest

import sparsedp

PACKAGE = Path(sparsedp.__file__).resolve().parent
SAMPLER_CALL = re.compile(
    r"(?<![\w.])(laplace|gaussian|discrete_laplace|discrete_gaussian)\(|(?:_?noise|nz)\.noise\(|"
    r"\.(laplace|normal|exponential|geometric)\("
)
# simulation noise for synthetic problems, documented as never privacy noise (its own test)
ALLOWED = {("completion/synthetic.py", "gen.laplace(0.0, scale, size)")}


def test_no_module_outside_the_path_calls_a_sampler():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ("noise.py", "measure.py"):
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if code.strip().startswith(("def ", '"""', "``")) or not SAMPLER_CALL.search(code):
                continue
            if any(rel == f and snippet in code for f, snippet in ALLOWED):
                continue
            offenders.append(f"{rel}:{no}: {line.strip()}")
    assert not offenders, "noise drawn outside sparsedp.measure:\n" + "\n".join(offenders)


def _secure_default(obj) -> bool:
    return inspect.signature(obj).parameters["secure"].default is True


@pytest.mark.parametrize("name", [
    "sparsedp.MatrixMechanism", "sparsedp.measure", "sparsedp.plan_measurement",
    "sparsedp.trees.LUEDPTree", "sparsedp.trees.Boost", "sparsedp.trees.BoostUN", "sparsedp.trees.Privelet",
    "sparsedp.trees.Dwork", "sparsedp.flows.release_flows", "sparsedp.consistency.restaurant_release",
    "sparsedp.completion.privatize_observations", "sparsedp.continual.ContinualCounter",
    "sparsedp.continual.GLSTreeCounter",
])
def test_every_release_defaults_to_exact_noise(name):
    import importlib

    mod, _, attr = name.rpartition(".")
    obj = getattr(importlib.import_module(mod), attr)
    assert _secure_default(obj), f"{name} does not default to secure=True"
