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
    unit = "CustomerID"          # records: whom the release protects (default: one row), with
    max_rows = 50                # its bounds: rows per unit, or "auto" (a share of the budget
                                 # chooses it privately); max_groups / max_rows_per_group (bins);
                                 # drop_missing_units = true drops rows without an id

    [consistency]
    nonnegative = true           # non-negative estimate
    total = 5000                 # a public total the release must add up to (an invariant: not protected)

    [output]
    release = "release.npz"      # release file: answers, estimate, ledger (sparsedp ledger FILE)
    report = "report.md"         # markdown report (released values and their accuracy only)
    plot = "report.png"          # released histogram (needs matplotlib)
    overwrite = false            # replace an existing release file (the CLI's --force)

Everything is checked before the budget is charged: unknown sections and keys, the data, the
workload, the strategy, the budget, ``total`` (a real number in ``[0, 2^50]``: the counts are
non-negative, so no release adds up to a negative total) and the outputs.  Outputs are written in
the spec's directory only (a path whose ``..``, absolute form or symlinks lead out of it is
refused), never over the spec or its data file, each to its own file, and an existing release file
is replaced only with ``overwrite = true`` or ``force=True`` (``sparsedp release --force``).  Then
the budget is charged once (one measurement through the measurement path), the estimate
reconstructed by GLS (NNLS with ``nonnegative``), then made consistent with the public total by
post-processing.  Nothing computed from the raw data other than the release is written.
The release file (and its ledger) is written first, then the report and plot, made from the release
alone; if they fail, the error says where the release is and :func:`rebuild_report` (``sparsedp
report RELEASE``) writes them from the saved file, without reading the data or charging again.

A spec whose ``[data]`` names several ``columns`` releases their marginals instead
(:mod:`sparsedp.spec_marginals`), and one whose ``[data]`` names ``geo`` columns a TopDown release
of a hierarchical table (:mod:`sparsedp.spec_topdown`); the sections and keys of every kind are
checked by :mod:`sparsedp.spec_file`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import strategies as st
from . import workloads as wl
from .errors import InfeasibleConstraintsError, InputBoundError, SparseDPError
from .io import as_bins, load_histogram, table_columns
from .mechanism import MatrixMechanism
from .privacy import Accountant
from .privacy_unit import warn_if_id_like
from .privacy_unit_cli import unit_from_spec
from .unit_records import read_unit_histogram
from ._cli_util import OutputFile, check_output_paths
from .releases import ReleaseResult, load_release, workload_labels
from .spec_file import (
    Writer,
    flag,
    load_spec,
    matplotlib_pyplot,
    outputs,
    privacy_line,
    refuse_keys,
    save_then_report,
    spec_record,
)
from .spec_marginals import MARGINAL_ONLY, is_marginal_spec, marginals_plot, marginals_report, run_marginal_spec
from .spec_topdown import TOPDOWN_ONLY, is_topdown_spec, run_topdown_spec, topdown_plot, topdown_report
from .validation import MAX_MAGNITUDE

__all__ = ["SpecResult", "load_spec", "rebuild_report", "run_spec"]

@dataclass(frozen=True)
class SpecResult:
    """What :func:`run_spec` produced."""

    answers: np.ndarray
    estimate: np.ndarray | None  # the histogram estimate (None for a marginal spec)
    release: Any  # the mechanism's Release, or the marginal release
    accountant: Accountant
    files: dict[str, Path]
    result: ReleaseResult | None = None  # what the release file holds


def _total(value: Any) -> float | None:
    """The public total: ``None``, or a real number in ``[0, 2^50]`` (checked before any charge: the
    counts are non-negative integers, so a negative total has no consistent release)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SparseDPError(f"consistency.total must be a number, got {value!r}")
    total = float(value)
    if not np.isfinite(total):
        raise SparseDPError(f"consistency.total must be finite, got {value!r}")
    if total < 0:
        raise InfeasibleConstraintsError(f"consistency.total = {value!r}: counts are non-negative, so no release "
                                         "adds up to a negative total")
    if total > MAX_MAGNITUDE:
        raise InputBoundError(f"consistency.total = {value!r} is above the supported bound 2^50")
    return total


def _workload(section: dict[str, Any], n: int) -> Any:
    kind = section.get("kind", "identity")
    if kind == "ranges":
        raw = section.get("ranges", [])
        if not isinstance(raw, list) or not all(
                isinstance(r, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in r) for r in raw):
            raise SparseDPError(f"workload.ranges must be a list of [lo, hi] pairs of integers, got {raw!r}")
        ranges = np.asarray(raw, dtype=np.int64) if raw and len({len(r) for r in raw}) == 1 else np.zeros((0, 0))
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
        branching = section.get("branching", 16)
        if isinstance(branching, bool) or not isinstance(branching, int):
            raise SparseDPError(f"strategy.branching must be an integer >= 2, got {branching!r}")
        return st.hierarchical(n, branching)
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


def run_spec(path: str | Path, *, rng: Any = None, accountant: Accountant | None = None,
             force: bool = False) -> SpecResult:
    """Run the release a spec file describes (see the module docstring).  ``force`` replaces an
    existing release file (as ``overwrite = true`` in ``[output]``).  Every check, the outputs'
    included, comes before the budget is charged."""
    spec = load_spec(path)
    if is_topdown_spec(spec):
        if is_marginal_spec(spec):
            raise SparseDPError("data.geo (a TopDown table) and data.columns (marginals) name two kinds of spec: "
                                "give one")
        res, rel, acc, files = run_topdown_spec(spec, path, rng=rng, accountant=accountant, force=force)
        return SpecResult(np.asarray(res.answers), None, rel, acc, files, res)
    if is_marginal_spec(spec):
        # a marginal spec reads records per privacy unit: only the TopDown table's own keys are refused
        refuse_keys(spec, {k: v for k, v in TOPDOWN_ONLY.items() if k != "privacy"}, "marginal (data.columns)")
        res, rel, acc, files = run_marginal_spec(spec, path, rng=rng, accountant=accountant, force=force)
        return SpecResult(np.asarray(res.answers), None, rel, acc, files, res)
    refuse_keys(spec, MARGINAL_ONLY, "histogram (data.column)")
    # a histogram spec reads records per privacy unit: only the TopDown table's own keys are refused
    refuse_keys(spec, {k: v for k, v in TOPDOWN_ONLY.items() if k != "privacy"}, "histogram (data.column)")
    base: Path = spec["_base"]
    data = spec["data"]
    if "path" not in data:
        raise SparseDPError("data.path is required")
    if not isinstance(data["path"], str) or not data["path"]:
        raise SparseDPError(f"data.path must be a file name, got {data['path']!r}")
    if not isinstance(data.get("column", ""), str):
        raise SparseDPError(f"data.column must be a column name, got {data['column']!r}")
    cons = spec.get("consistency", {})
    nonneg = flag(cons, "nonnegative", "consistency")
    total = _total(cons.get("total"))
    priv = spec["privacy"]
    secure = flag(priv, "secure", "privacy", default=True)
    files_out = outputs(spec, Path(path), base / data["path"], force)
    unit, drop = unit_from_spec(priv)
    bins = as_bins(data.get("bins"))
    if unit.is_row:
        warn_if_id_like(table_columns(base / data["path"]), unit)
        x = load_histogram(base / data["path"], data.get("column"), bins, flag(data, "clip", "data"))
    elif bins is None or not data.get("column"):
        raise SparseDPError("privacy.unit applies to records: give data.column and data.bins")
    n = x.size if unit.is_row else bins.count
    W = _workload(spec.get("workload", {}), n)
    M = _strategy(spec.get("strategy", {}), n)
    noise = priv.get("noise", "laplace")
    budget = {k: priv[k] for k in ("epsilon", "rho", "delta") if k in priv}
    if accountant is None and "epsilon" in budget and "delta" not in budget:
        accountant = Accountant(epsilon=budget["epsilon"])
    elif accountant is None and "rho" in budget:
        accountant = Accountant(rho=budget["rho"])
    choice = None
    if not unit.is_row:  # records read and checked, then an auto bound charged, then truncated per unit
        if "delta" in budget:
            raise SparseDPError("privacy.unit: give epsilon (Laplace) or rho (Gaussian), not delta")
        key = "epsilon" if "epsilon" in budget else "rho"
        x, unit, choice, budget[key] = read_unit_histogram(
            base / data["path"], data["column"], bins, unit, clip=flag(data, "clip", "data"), drop_missing=drop,
            accountant=accountant, rng=rng, **{key: budget[key]})
        budget["privacy_unit"] = unit
    options = None
    if isinstance(M, str):  # "optimized"; seeded random starts: the same spec gives the same strategy
        options = {"rng": 0, "time_limit": spec.get("strategy", {}).get("time_limit")}
    mech = MatrixMechanism(W, M, noise=noise, secure=secure, accountant=accountant,
                           optimize_options=options, **budget)
    release = mech.run(x, rng=rng, method="nnls" if nonneg and total is None else "ls")
    estimate = _consistent(release.x_hat, total, nonneg)
    answers = W.matvec(estimate)
    report = mech.error_report()  # exact variances of the GLS answers (before any consistency step)
    processed = nonneg or total is not None
    description = {**spec_record(path, files_out), "workload": W.name, "strategy": mech.M.name, "bins": n,
                   "nonnegative": nonneg, "public_total": total, "privacy_unit": unit.describe(),
                   **({"privacy_unit_bound": choice.describe()} if choice is not None else {}),
                   "expected_error_per_query": report.per_query,
                   "variances": ("of the least-squares answers before the consistency step (non-negativity / "
                                 "public total), which moves the answers: intervals are indicative") if processed
                   else "exact, of the released least-squares answers"}
    entries = [release.measurement.entry] if release.measurement.entry else []
    if choice is not None and choice.measurement.entry is not None:  # the bound's charge first
        entries.insert(0, choice.measurement.entry)
    result = ReleaseResult(kind="spec", answers=answers, labels=workload_labels(W), variances=report.variances,
                           noise=release.measurement.noise, secure=release.measurement.secure,
                           strategy=mech.M.name, ledger=entries, private=release.private, description=description,
                           arrays={"estimate": estimate},
                           variance_method="gls-before-consistency" if processed else "exact-gls",
                           report=None if processed else report)
    files = save_then_report(result, files_out, histogram_report, histogram_plot)
    return SpecResult(answers, estimate, release, accountant, files, result)


def _answer_label(labels: dict[str, Any], i: int) -> str:
    if "lo" in labels and "hi" in labels:
        lo, hi = int(labels["lo"][i]), int(labels["hi"][i])
        return f"bins {lo}..{hi}" if hi > lo else f"bin {lo}"
    name, col = next(iter(labels.items()))
    return f"{name} {col[i]}"


def histogram_report(path: Path, result: ReleaseResult) -> Path:
    """The markdown report of a histogram spec's release (in memory or loaded from its file: only
    the release is read): the workload, strategy and privacy, and each answer with its standard
    deviation and 95% interval (the first 50)."""
    desc = result.description
    answers = np.asarray(result.answers)
    lo, hi = result.confidence_intervals(0.95)
    e = result.ledger[0] if result.ledger else None
    sensitivity = f", sensitivity {e['sensitivity']:g}" if e is not None and "sensitivity" in e else ""
    lines = [
        f"# sparsedp release: {desc['spec']}",
        "",
        f"- workload: `{desc['workload']}` ({answers.size} answers) on {desc['bins']} bins",
        f"- strategy: `{desc['strategy']}`{sensitivity}",
        privacy_line(result),
        f"- expected squared error per answer (before consistency): {desc['expected_error_per_query']:.4g}",
        f"- non-negative: {desc['nonnegative']}; public total: {desc['public_total']}",
        f"- variances: {desc['variances']}",
        "",
        "| answer | value | standard deviation | 95% interval |",
        "|---|---:|---:|---:|",
    ]
    sd = np.sqrt(result.variances)
    lines += [f"| {_answer_label(result.labels, i)} | {v:.6g} | {sd[i]:.4g} | [{lo[i]:.6g}, {hi[i]:.6g}] |"
              for i, v in enumerate(answers[:50])]
    if answers.size > 50:
        lines.append(f"| ... | ({answers.size - 50} more in the release file) |")
    if e is not None:
        lines += ["", f"Ledger: {e['label']}: {e['rows']}x{e['columns']}, "
                      f"scales [{e['scale_min']:g}, {e['scale_max']:g}]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def histogram_plot(path: Path, result: ReleaseResult) -> Path:
    """The released answers with their 95% intervals (a per-bin estimate is not plotted: the
    strategy may determine single bins only with a large variance; the answers are what was asked),
    from the release alone."""
    workload = result.description.get("workload", "")
    plt = matplotlib_pyplot()
    answers = np.asarray(result.answers, dtype=np.float64)
    lo, hi = result.confidence_intervals(0.95)
    fig, ax = plt.subplots(figsize=(8, 3))
    idx = np.arange(answers.size)
    ax.errorbar(idx, answers, yerr=np.vstack([answers - lo, hi - answers]), fmt="o", ms=3, capsize=2)
    ax.set_xlabel("answer (see the report for what each is)")
    ax.set_ylabel("released value")
    ax.set_title(f"released answers with 95% intervals ({workload})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


#: Per kind of spec release: its report and plot writers, each ``(path, release) -> path``.
_WRITERS: dict[str, tuple[Writer, Writer]] = {
    "spec": (histogram_report, histogram_plot),
    "marginals": (marginals_report, marginals_plot),
    "topdown": (topdown_report, topdown_plot),
}


def rebuild_report(release: str | Path, out: str | Path | None = None) -> dict[str, Path]:
    """Re-create the report (and the plot, if its spec made one) of a spec's release from its
    saved release file alone: no data read, no budget charged, no noise drawn (``sparsedp report
    FILE``).  The files get the names the spec gave them, in ``out`` (default: the release file's
    directory); they never replace the release file.  Returns ``{"report": path, "plot": path}``.

    For when a report is lost, or its writing failed after the release was paid for and saved."""
    p = Path(release)
    rel = load_release(p)
    if rel.kind not in _WRITERS or "spec" not in rel.description:
        raise SparseDPError(f"{p} is a {rel.kind!r} release, not one of a spec (sparsedp release): it has no report to "
                            "re-create; 'sparsedp ledger FILE' prints what it holds")
    names = rel.description.get("outputs") or {}
    if not isinstance(names, dict):
        raise SparseDPError(f"{p}: its record of the spec's outputs is not a table")
    directory = Path(out) if out is not None else p.parent
    wanted = {"report": directory / _file_name(names.get("report"), f"{p.stem}.md")}
    if "plot" in names:
        wanted["plot"] = directory / _file_name(names["plot"], f"{p.stem}.png")
    check_output_paths([OutputFile(key, path) for key, path in wanted.items()], [p])
    if "plot" in wanted:
        matplotlib_pyplot()  # a missing extra is reported before any file is written
    report, plot = _WRITERS[rel.kind]
    files = {"report": report(wanted["report"], rel)}
    if "plot" in wanted:
        files["plot"] = plot(wanted["plot"], rel)
    return files


def _file_name(recorded: Any, default: str) -> str:
    """The bare file name a release records for an output (any directory part dropped: the files
    go to the chosen directory only), or ``default`` when it records none usable."""
    name = Path(str(recorded)).name if isinstance(recorded, str) else ""
    return name if name not in ("", ".", "..") else default
