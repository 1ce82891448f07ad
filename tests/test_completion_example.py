import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_inpaint_example_writes_pictures(tmp_path):
    pytest.importorskip("matplotlib")  # the optional 'plot' extra
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "inpaint_image.py"), "--out", str(tmp_path),
                          "--size", "96", "--epsilon", "20"], capture_output=True, text=True, env=env, check=True,
                         timeout=120).stdout
    for name in ("original", "observed_private", "dlnm_qr", "soft_impute"):
        path = tmp_path / f"{name}.png"
        assert path.is_file() and path.stat().st_size > 500
    rses = [float(v) for v in re.findall(r"RSE ([0-9.]+)", out)]
    assert len(rses) == 2 and all(v < 0.5 for v in rses)


def test_package_doctest_and_docs_snippet_run():
    import doctest

    import sparsedp.completion

    result = doctest.testmod(sparsedp.completion, verbose=False)
    assert result.attempted > 0 and result.failed == 0
    doc = (ROOT / "docs" / "completion.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         timeout=120).stdout.split()
    rse_value, floor, exact = float(out[0]), float(out[4]), float(out[5])
    assert floor < exact < 1.2 * floor  # the exact oracle sits above the asymptotic formula
    assert rse_value <= 1.01 * exact  # the calibrated fit of a release is at the exact oracle
