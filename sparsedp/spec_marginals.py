"""Marginal specs: a ``sparsedp release`` spec whose ``[data]`` names several columns.

A table of records (one row per person, say) becomes its marginals -- counts of every
combination of the named columns' values -- released with exact noise::

    [data]
    path = "people.csv"                      # .csv, .parquet, or an (n, d) .npy array of codes
    columns = ["age", "sex", "region"]       # the records' attributes
    categories = { age = ["0-17", "18-64", "65+"], sex = ["F", "M"], region = ["N", "S"] }
    # or sizes = [3, 2, 2]: the columns hold integer codes 0..size-1 (the domain is public: never read
    # from the data)

    [workload]
    kind = "marginals"                       # the default when [data] has columns
    k = 2                                    # every k-way marginal (default 2); lower = true adds lower orders
    # or marginals = [["age", "sex"], ["region"]]

    [privacy]
    rho = 0.5                                # zCDP: exact discrete Gaussian noise on residuals at
                                             # ResidualPlanner's optimum (sparsedp.marginals.release_marginals)
    # or epsilon = 1.0                       # pure DP: exact discrete Laplace on an optimised weighted-
                                             # marginals strategy (release_marginals_laplace; <= 16 columns)
    # unit = "CustomerID"                    # protect each customer with all of their rows: each keeps at
    # max_rows = 50                          # most max_rows (or "auto"; or max_groups + max_rows_per_group),
                                             # the budget is per customer (sparsedp.marginals.units)

    [consistency]
    nonnegative = true                       # zCDP only: consistent non-negative marginals (post-processing)

    [output]
    release = "marginals.npz"                # every cell of every marginal, its variance, the ledger
    report = "marginals.md"                  # a table per marginal: value, standard deviation, 95% interval
    plot = "marginals.png"                   # each marginal's cells with their 95% intervals

Neighbours add or remove one record (one unit in one cell of every marginal), or, with
``[privacy] unit``, one unit with all of its rows (kept rows only; drop_missing_units drops rows
without an id, else they are refused).  Everything is
checked before the budget is charged: the keys (a histogram spec's ``column``, ``bins``, ``clip``,
``ranges``, ``[strategy]`` and ``total`` are refused here), the domain, every record's values (a
missing value or one outside its column's categories or size is refused), the marginals, the
budget and the outputs.  Then the budget is charged once, and what is written is post-processing of
the noisy measurement only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ShapeError, SparseDPError
from .marginals.domain import Domain
from .marginals.nonneg import nonnegative_marginals
from .marginals.pure import optimize_marginals_laplace
from .marginals.pure_release import release_marginals_laplace
from .marginals.release import label_column, release_marginals
from .marginals.select import marginals_up_to
from .marginals.table import encode_records, read_unit_records
from .privacy import Accountant
from .privacy_unit_cli import unit_from_spec
from .releases import ReleaseResult
from .spec_file import (
    flag,
    matplotlib_pyplot,
    outputs,
    privacy_budget,
    privacy_line,
    refuse_keys,
    save_then_report,
    spec_record,
)

__all__ = ["MARGINAL_ONLY", "MarginalSpec", "is_marginal_spec", "marginal_spec", "marginals_plot", "marginals_report",
           "run_marginal_spec"]

#: Keys of a histogram spec that a marginal spec would ignore: refused.
_HISTOGRAM_ONLY: dict[str, frozenset[str]] = {
    "data": frozenset({"column", "bins", "clip"}),
    "workload": frozenset({"ranges"}),
    "strategy": frozenset({"*"}),
    "consistency": frozenset({"total"}),
}
#: Keys of a marginal spec that a histogram spec would ignore: refused there.
MARGINAL_ONLY: dict[str, frozenset[str]] = {
    "data": frozenset({"columns", "sizes", "categories"}),
    "workload": frozenset({"k", "lower", "marginals"}),
}


def is_marginal_spec(spec: dict[str, Any]) -> bool:
    """Whether a loaded spec is of the marginal kind (``[data] columns``)."""
    return "columns" in spec.get("data", {})


@dataclass(frozen=True)
class MarginalSpec:
    """A checked marginal spec: the columns, the public domain, the marginals and the budget."""

    columns: list[str]
    sizes: list[int] | None  # codes 0..size-1, or
    categories: dict[str, list[str]] | None  # each column's values
    marginals: list[tuple[str, ...]] | None  # explicit, or every k-way (and lower, with lower)
    k: int
    lower: bool
    noise: str  # "gaussian" (rho) or "laplace" (epsilon)
    budget: float
    secure: bool
    nonnegative: bool
    unit: Any = None  # the declared PrivacyUnit (None: one record)
    drop_missing_units: bool = False

    def workload(self, domain: Domain) -> list[tuple[str, ...]]:
        """The marginals to release, as tuples of column names."""
        if self.marginals is not None:
            return self.marginals
        return [tuple(domain.names[i] for i in S) for S in marginals_up_to(domain, self.k, exact=not self.lower)]


def _columns(data: dict[str, Any]) -> list[str]:
    cols = data["columns"]
    if not isinstance(cols, list) or not cols or not all(isinstance(c, str) and c for c in cols):
        raise SparseDPError(f"data.columns must be a non-empty list of column names, got {cols!r}")
    if len(set(cols)) != len(cols):
        raise SparseDPError(f"data.columns names a column twice: {cols!r}")
    return cols


def _domain(data: dict[str, Any], cols: list[str]) -> tuple[list[int] | None, dict[str, list[str]] | None]:
    """The public domain: ``sizes`` (codes) or ``categories`` (values), exactly one."""
    if ("sizes" in data) == ("categories" in data):
        raise SparseDPError("a marginal spec needs the public domain: data.sizes or data.categories (not both)")
    if "sizes" in data:
        sizes = data["sizes"]
        if not isinstance(sizes, list) or len(sizes) != len(cols) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
            raise ShapeError(f"data.sizes must list one integer >= 1 per column ({len(cols)}), got {sizes!r}")
        return list(sizes), None
    cats = data["categories"]
    if not isinstance(cats, dict):
        raise SparseDPError("data.categories must be a table {column = [values]}")
    missing = [c for c in cols if c not in cats]
    extra = sorted(set(cats) - set(cols))
    if missing or extra:
        raise ShapeError(f"data.categories must give every column's values and no other: missing {missing}, "
                         f"not in data.columns {extra}")
    out = {}
    for c in cols:
        vals = cats[c]
        if not isinstance(vals, list) or not vals or not all(
                isinstance(v, (str, int)) and not isinstance(v, bool) for v in vals):
            raise SparseDPError(f"data.categories.{c} must be a non-empty list of values, got {vals!r}")
        names = [str(v) for v in vals]
        if len(set(names)) != len(names):
            raise SparseDPError(f"data.categories.{c} lists a value twice")
        out[c] = names
    return None, out


def _marginals(section: dict[str, Any], cols: list[str]) -> tuple[list[tuple[str, ...]] | None, int, bool]:
    kind = section.get("kind", "marginals")
    if kind != "marginals":
        raise SparseDPError(f"a spec with data.columns releases marginals: workload.kind must be 'marginals', "
                            f"got {kind!r}")
    lower = flag(section, "lower", "workload")
    if "marginals" in section:
        if "k" in section or lower:
            raise SparseDPError("give workload.marginals or workload.k (with lower), not both")
        raw = section["marginals"]
        if not isinstance(raw, list) or not raw or not all(
                isinstance(m, list) and m and all(isinstance(a, str) for a in m) for m in raw):
            raise SparseDPError(f"workload.marginals must be a list of lists of column names, got {raw!r}")
        out = []
        for m in raw:
            unknown = [a for a in m if a not in cols]
            if unknown or len(set(m)) != len(m):
                raise SparseDPError(f"workload.marginals entry {m!r}: every name once, each one of data.columns "
                                    f"{cols}")
            key = tuple(sorted(m, key=cols.index))
            if key not in out:
                out.append(key)
        return out, 0, False
    k = section.get("k", min(2, len(cols)))
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(cols):
        raise SparseDPError(f"workload.k must be an integer in 1..{len(cols)} (the number of columns), got {k!r}")
    return None, k, lower


def marginal_spec(spec: dict[str, Any]) -> MarginalSpec:
    """Check a loaded marginal spec (:func:`sparsedp.spec.load_spec`) and return what it asks for."""
    refuse_keys(spec, _HISTOGRAM_ONLY, "marginal (data.columns)")
    data = spec["data"]
    cols = _columns(data)
    sizes, cats = _domain(data, cols)
    marginals, k, lower = _marginals(spec.get("workload", {}), cols)
    noise, budget, secure = privacy_budget(spec["privacy"], "marginal")
    nonneg = flag(spec.get("consistency", {}), "nonnegative", "consistency")
    if nonneg and noise == "laplace":
        raise SparseDPError("consistency.nonnegative is available for zCDP marginals (privacy.rho)")
    unit, drop = unit_from_spec(spec["privacy"])
    if not unit.is_row and Path(str(data.get("path", ""))).suffix.lower() == ".npy":
        raise SparseDPError("privacy.unit names a column: give a CSV or Parquet file (an .npy array holds codes only)")
    return MarginalSpec(cols, sizes, cats, marginals, k, lower, noise, budget, secure, nonneg,
                        None if unit.is_row else unit, drop)


def run_marginal_spec(spec: dict[str, Any], path: str | Path, *, rng: Any = None,
                      accountant: Accountant | None = None, force: bool = False
                      ) -> tuple[ReleaseResult, Any, Accountant, dict[str, Path]]:
    """Run a loaded marginal spec: ``(release, the marginal release object, accountant, files)``.
    Every check comes before the charge; then one release, saved, reported and plotted."""
    ms = marginal_spec(spec)
    base: Path = spec["_base"]
    data = spec["data"]
    if not isinstance(data.get("path"), str) or not data["path"]:
        raise SparseDPError(f"data.path must be a file name, got {data.get('path')!r}")
    files_out = outputs(spec, Path(path), base / data["path"], force)
    df, ids = read_unit_records(base / data["path"], ms.columns, ms.unit)
    dom, X = encode_records(df, ms.columns, ms.sizes, ms.categories)
    del df
    work = ms.workload(dom)
    desc: dict[str, Any] = {**spec_record(path, files_out), "columns": ms.columns,
                            "marginals": [",".join(m) for m in work], "nonnegative": ms.nonnegative}
    unit_kw: dict[str, Any] = {"privacy_unit": ms.unit, "unit_ids": ids, "drop_missing_units": ms.drop_missing_units}
    if ms.noise == "gaussian":
        accountant = accountant if accountant is not None else Accountant(rho=ms.budget)
        rel: Any = release_marginals(X, dom, work, ms.budget, accountant=accountant, rng=rng, secure=ms.secure,
                                     **unit_kw)
        result = rel.to_release(description=desc, categories=ms.categories)
        if ms.nonnegative:  # post-processing of the released marginals; variances of those before it
            result = nonnegative_marginals(rel).to_release(description=desc, categories=ms.categories)
    else:
        accountant = accountant if accountant is not None else Accountant(epsilon=ms.budget)
        strategy = optimize_marginals_laplace(dom, work, ms.budget, rng=0)  # seeded: the same spec, the same plan
        rel = release_marginals_laplace(X, strategy, accountant=accountant, rng=rng, secure=ms.secure, **unit_kw)
        if ms.categories is not None:
            desc["categories"] = ms.categories
        result = rel.to_release(description=desc)
    files = save_then_report(result, files_out, marginals_report, marginals_plot)
    return result, rel, accountant, files


#: How the report and the plot name the 0-way marginal (``lower = true`` adds it): the number of
#: records, one cell with no attribute.
TOTAL_NAME = "total (all records)"


def _title(name: str) -> str:
    """A marginal's heading: its attributes joined by ``","``, or :data:`TOTAL_NAME` for none."""
    return name or TOTAL_NAME


def _cell_names(result: ReleaseResult, rows: np.ndarray) -> list[str]:
    """``"age=18-64, sex=F"`` for each of ``rows`` (category names where the spec gives them;
    ``"all records"`` for the cell of the 0-way marginal)."""
    cats = result.description.get("categories")
    out = []
    marg = np.asarray(result.labels["marginal"])
    for i in rows:
        parts = []
        for a in filter(None, str(marg[i]).split(",")):
            code = int(np.asarray(result.labels[label_column(a)])[i])
            parts.append(f"{a}={cats[a][code] if cats else code}")
        out.append(", ".join(parts) or "all records")
    return out


def marginals_report(path: Path, result: ReleaseResult, max_rows: int = 400) -> Path:
    """A markdown table per marginal of a marginal spec's release (in memory or loaded from its
    file: only the release is read): each cell's released value, standard deviation, 95% interval."""
    answers = np.asarray(result.answers)
    lo, hi = result.confidence_intervals(0.95)
    sd = np.sqrt(np.asarray(result.variances))
    desc = result.description
    nonneg = bool(desc.get("nonnegative", False))
    lines = [f"# sparsedp release: {desc.get('spec', '')}", "",
             f"- marginals of {', '.join(desc['columns'])}: {len(desc['marginals'])} tables, "
             f"{answers.size} cells",
             privacy_line(result),
             f"- strategy: {result.strategy}",
             f"- non-negative: {nonneg}" + (" (the variances are those before this step: the intervals "
                                           "are indicative)" if nonneg else ""), ""]
    marg = np.asarray(result.labels["marginal"])
    shown = 0
    for name in desc["marginals"]:
        rows = np.flatnonzero(marg == name)
        lines += [f"## {_title(name)}", "", "| cell | value | standard deviation | 95% interval |",
                  "|---|---:|---:|---:|"]
        take = rows[:max(0, max_rows - shown)]
        lines += [f"| {c} | {answers[i]:.6g} | {sd[i]:.4g} | [{lo[i]:.6g}, {hi[i]:.6g}] |"
                  for c, i in zip(_cell_names(result, take), take)]
        if take.size < rows.size:
            lines.append(f"| ... | ({rows.size - take.size} more cells in the release file) | | |")
        shown += take.size
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def marginals_plot(path: Path, result: ReleaseResult, max_panels: int = 9) -> Path:
    """Each marginal's cells (the first ``max_panels`` marginals) with their 95% intervals, from
    the release alone."""
    plt = matplotlib_pyplot()
    names = result.description["marginals"][:max_panels]
    answers = np.asarray(result.answers, dtype=np.float64)
    lo, hi = result.confidence_intervals(0.95)
    marg = np.asarray(result.labels["marginal"])
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    for ax, name in zip(axes.ravel(), names):
        idx = np.flatnonzero(marg == name)
        ax.errorbar(np.arange(idx.size), answers[idx], yerr=np.vstack([answers[idx] - lo[idx], hi[idx] - answers[idx]]),
                    fmt="o", ms=3, capsize=2)
        ax.set_title(_title(name), fontsize=9)
        ax.set_xticks(np.arange(idx.size))
        ax.set_xticklabels(_cell_names(result, idx) if idx.size <= 12 else [], rotation=60, ha="right",
                           fontsize=6)
    for ax in axes.ravel()[len(names):]:
        ax.set_visible(False)
    fig.suptitle("released marginals with 95% intervals", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
