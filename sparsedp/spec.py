"""A declarative release: one TOML file from a data file to a published, consistent release.

``sparsedp release SPEC.toml`` (or :func:`run_spec`) reads::

    [data]                       # .npy, .csv or .parquet (see sparsedp.io)
    path = "ages.csv"            # relative to the spec file
    column = "age"               # for tables
    bins = { start = 0, stop = 100, width = 1 }   # records -> histogram (public domain); omit for counts
    clip = false                 # records outside the domain: refuse (default) or clip

    [workload]
    kind = "ranges"              # identity | total | prefix | all_ranges | ranges
    ranges = [[0, 17], [18, 64], [65, 99]]        # inclusive bins, for kind = "ranges"

    [strategy]
    kind = "hierarchical"        # identity | hierarchical | haar | fenwick | optimized
    branching = 16               # optimized: sparsedp.optimize for the workload (time_limit = s)

    [privacy]
    epsilon = 1.0                # pure DP (Laplace); or noise = "gaussian" with rho = ...
    secure = true                # exact noise (default)

    [consistency]
    nonnegative = true           # non-negative estimate
    total = 5000                 # a public total the release must add up to (an invariant: not protected)

    [output]
    release = "release.npz"      # release file: answers, estimate, ledger (sparsedp ledger FILE)
    report = "report.md"         # markdown report (released values and their accuracy only)
    plot = "report.png"          # released histogram (needs matplotlib)

The data are checked, the budget charged once (one measurement through the measurement path),
the estimate reconstructed by GLS (NNLS with ``nonnegative``), then made consistent with the
public total by post-processing.  Nothing computed from the raw data other than the release is
written.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import strategies as st
from . import workloads as wl
from .errors import SparseDPError
from .io import as_bins, load_histogram
from .mechanism import MatrixMechanism, Release
from .privacy import Accountant
from .release_file import save_release

__all__ = ["SpecResult", "load_spec", "run_spec"]

_SECTIONS = {"data", "workload", "strategy", "privacy", "consistency", "output"}


@dataclass(frozen=True)
class SpecResult:
    """What :func:`run_spec` produced."""

    answers: np.ndarray
    estimate: np.ndarray
    release: Release
    accountant: Accountant
    files: dict[str, Path]


def load_spec(path: str | Path) -> dict[str, Any]:
    """Parse and check a spec file's sections (unknown sections or keys raise)."""
    p = Path(path)
    try:
        spec = tomllib.loads(p.read_text())
    except FileNotFoundError as exc:
        raise SparseDPError(f"no such spec file: {p}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SparseDPError(f"{p} is not valid TOML: {exc}") from exc
    unknown = set(spec) - _SECTIONS
    if unknown:
        raise SparseDPError(f"{p}: unknown section(s) {sorted(unknown)}; known: {sorted(_SECTIONS)}")
    for needed in ("data", "privacy"):
        if needed not in spec:
            raise SparseDPError(f"{p}: the [{needed}] section is required")
    spec["_base"] = p.parent
    return spec


def _workload(section: dict[str, Any], n: int) -> Any:
    kind = section.get("kind", "identity")
    if kind == "ranges":
        ranges = np.asarray(section.get("ranges", []), dtype=np.int64)
        if ranges.ndim != 2 or ranges.shape[1] != 2 or ranges.shape[0] == 0:
            raise SparseDPError("workload.ranges must be a list of [lo, hi] pairs (inclusive bins)")
        if ranges.min() < 0 or ranges.max() >= n or np.any(ranges[:, 1] < ranges[:, 0]):
            raise SparseDPError(f"workload.ranges must satisfy 0 <= lo <= hi < {n}")
        return wl.range_queries(n, ranges)
    builders = {"identity": wl.identity, "total": wl.total, "prefix": wl.prefix, "all_ranges": wl.all_ranges}
    if kind not in builders:
        raise SparseDPError(f"workload.kind must be one of {sorted(builders) + ['ranges']}, got {kind!r}")
    return builders[kind](n)


def _strategy(section: dict[str, Any], n: int) -> Any:
    kind = section.get("kind", "hierarchical")
    if kind == "optimized":  # MatrixMechanism runs sparsedp.optimize on the workload (never the data)
        return "optimized"
    if kind == "hierarchical":
        return st.hierarchical(n, int(section.get("branching", 16)))
    builders = {"identity": st.identity, "haar": st.haar, "fenwick": st.fenwick}
    if kind not in builders:
        raise SparseDPError(f"strategy.kind must be one of {sorted(builders) + ['hierarchical', 'optimized']}, "
                            f"got {kind!r}")
    return builders[kind](n)


def _consistent(x_hat: np.ndarray, total: float | None, nonnegative: bool) -> np.ndarray:
    """Post-processing: the closest vector (Euclidean) adding up to ``total`` (and ``>= 0``)."""
    if total is None:
        return np.maximum(x_hat, 0.0) if nonnegative else x_hat
    from .consistency import LinearConstraints, solve

    row = np.ones((1, x_hat.size))
    return solve(x_hat, LinearConstraints(row, [float(total)], name="public total"), nonnegative=nonnegative).x


def run_spec(path: str | Path, *, rng: Any = None, accountant: Accountant | None = None) -> SpecResult:
    """Run the release a spec file describes (see the module docstring)."""
    spec = load_spec(path)
    base: Path = spec["_base"]
    data = spec["data"]
    if "path" not in data:
        raise SparseDPError("data.path is required")
    x = load_histogram(base / data["path"], data.get("column"), as_bins(data.get("bins")), bool(data.get("clip", False)))
    n = x.size
    W = _workload(spec.get("workload", {}), n)
    M = _strategy(spec.get("strategy", {}), n)
    priv = spec["privacy"]
    noise = priv.get("noise", "laplace")
    budget = {k: priv[k] for k in ("epsilon", "rho", "delta") if k in priv}
    cons = spec.get("consistency", {})
    nonneg = bool(cons.get("nonnegative", False))
    total = cons.get("total")
    if accountant is None and "epsilon" in budget and "delta" not in budget:
        accountant = Accountant(epsilon=budget["epsilon"])
    elif accountant is None and "rho" in budget:
        accountant = Accountant(rho=budget["rho"])
    options = None
    if isinstance(M, str):  # "optimized"; seeded random starts: the same spec gives the same strategy
        options = {"rng": 0, "time_limit": spec.get("strategy", {}).get("time_limit")}
    mech = MatrixMechanism(W, M, noise=noise, secure=bool(priv.get("secure", True)), accountant=accountant,
                           optimize_options=options, **budget)
    release = mech.run(x, rng=rng, method="nnls" if nonneg and total is None else "ls")
    estimate = _consistent(release.x_hat, total, nonneg)
    answers = W.matvec(estimate)
    files: dict[str, Path] = {}
    out = spec.get("output", {})
    description = {"spec": str(Path(path).name), "workload": W.name, "strategy": mech.M.name, "bins": n,
                   "nonnegative": nonneg, "public_total": total,
                   "expected_error_per_query": mech.error_report().per_query}
    if "release" in out:
        arrays = {"answers": answers, "estimate": estimate}
        entries = [release.measurement.entry] if release.measurement.entry else []
        files["release"] = save_release(base / out["release"], "spec", arrays, ledger=entries,
                                        description=description, private=release.private)
    if "report" in out:
        files["report"] = _report(base / out["report"], description, answers, release)
    if "plot" in out:
        files["plot"] = _plot(base / out["plot"], estimate, W.name)
    return SpecResult(answers, estimate, release, accountant, files)


def _report(path: Path, desc: dict[str, Any], answers: np.ndarray, release: Release) -> Path:
    e = release.measurement.entry
    lines = [
        f"# sparsedp release: {desc['spec']}",
        "",
        f"- workload: `{desc['workload']}` ({answers.size} answers) on {desc['bins']} bins",
        f"- strategy: `{desc['strategy']}`, sensitivity {release.measurement.sensitivity:g}",
        f"- privacy: {'epsilon' if release.measurement.cost.epsilon else 'rho'} "
        f"{release.measurement.cost.epsilon or release.measurement.cost.rho:g}, "
        f"{'exact' if release.measurement.secure else 'float'} {release.measurement.noise} noise"
        + ("" if release.private else " **(seeded: NOT private)**"),
        f"- expected squared error per answer (before consistency): {desc['expected_error_per_query']:.4g}",
        f"- non-negative: {desc['nonnegative']}; public total: {desc['public_total']}",
        "",
        "| answer | value |",
        "|---:|---:|",
    ]
    lines += [f"| {i} | {v:.6g} |" for i, v in enumerate(answers[:50])]
    if answers.size > 50:
        lines.append(f"| ... | ({answers.size - 50} more in the release file) |")
    if e is not None:
        lines += ["", f"Ledger: {e.label}: {e.rows}x{e.columns}, scales [{e.scale_min:g}, {e.scale_max:g}]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _plot(path: Path, estimate: np.ndarray, workload: str) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - the plot extra
        raise SparseDPError("the plot needs matplotlib: pip install 'sparsedp[plot]'") from exc
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.bar(np.arange(estimate.size), estimate, width=1.0)
    ax.set_xlabel("bin")
    ax.set_ylabel("released count")
    ax.set_title(f"released histogram ({workload})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
