"""TopDown specs: a ``sparsedp release`` spec whose ``[data]`` names geography columns.

A table with one row per leaf unit of a geography (state > county > district, any depth) and
count columns becomes a TopDown release (:func:`sparsedp.topdown.topdown`): every unit's counts at
every level, non-negative integers, every parent the sum of its children, the invariants exact::

    [data]
    path = "counts.csv"                       # .csv (.csv.gz) or .parquet
    geo = ["state_fips", "county_fips", "vtd_code"]   # outermost first; codes read as text
    counts = ["vap_*", "u18_*"]               # count columns: names or glob patterns
    attributes = ["age", "race"]              # optional: the cells' attributes (column NAME_VALUE_...)
    cells_per_person = 1                      # optional: the most count columns one person is in (1:
                                              # they partition the people; more for overlapping ones)

    [workload]
    marginals = { cells = 1, total = 1 }      # optional: what the release is for (the default: every
                                              # unit's cells and total); { total = 1 }: totals first;
                                              # { "age+race" = 2, race = 1 }; per level: a list of
                                              # tables (root first) or { state = { total = 1 }, ... }

    [strategy]
    kind = "topdown"                          # the default when [data] has geo
    # split = [0.25, 0.25, 0.25, 0.25]        # optional: each level's share of the budget (root first)
                                              # instead of the design optimised for the workload
                                              # (the default; "equal": the plain design)

    [privacy]
    rho = 1.0                                 # zCDP, exact discrete Gaussian noise (or epsilon: Laplace)

    [consistency]
    invariants = ["state_fips:total"]         # published EXACTLY (not protected)

    [output]
    release = "release.npz"                   # the release file (sparsedp.load_release, sparsedp ledger)
    report = "release.md"                     # per level: units, cells, standard deviation, checks
    plot = "release.png"                      # per-level standard deviation of a published count

Record rows (one row per record: a person, an event) take ``categories`` instead of ``counts``,
and the public ``units``; ``[privacy] unit`` protects the entity a column identifies, each keeping
at most ``max_rows`` records (or ``max_groups`` (leaf unit, cell) groups of ``max_rows_per_group``)::

    [data]
    path = "records.csv"
    geo = ["state", "county"]
    categories = { age = ["young", "old"], sex = ["f", "m"] }   # each category column's values
    units = "units.csv"                       # every unit's geography codes (public), or "observed"

    [privacy]
    rho = 1.0
    unit = "person_id"                        # whom the release protects
    max_rows = 5                              # or "auto": a share of the budget chooses it
    drop_missing_units = false                # records without an id are refused unless true

Neighbours add or remove one person (one unit in one cell of the leaf, and so of every level), or,
with a declared unit, one whole entity with all of its (truncated) records.
Everything is checked before the budget is charged: the keys (those of the other kinds are
refused), the table (missing columns, non-numeric or negative counts), the budget, the workload,
the split and the invariants, and the outputs.  The report and plot show what the release's own variances say
(data-free: they depend on the hierarchy, the budget and the split), never the data.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import SparseDPError
from .privacy import Accountant
from .releases import ReleaseResult
from .privacy_unit_cli import UNIT_SPEC_KEYS, unit_from_spec
from .spec_file import (
    matplotlib_pyplot,
    outputs,
    privacy_budget,
    privacy_line,
    refuse_keys,
    save_then_report,
    spec_record,
)
from .topdown.cli import workload_by_level
from .topdown.hierarchy import read_table
from .topdown.release import TopDownRelease, topdown, topdown_from_result
from .topdown.units import read_records, with_bound_choice

__all__ = ["TOPDOWN_ONLY", "is_topdown_spec", "run_topdown_spec", "topdown_plot", "topdown_report"]

#: Keys of the other kinds that a TopDown spec would ignore: refused.
_OTHERS: dict[str, frozenset[str]] = {
    "data": frozenset({"column", "bins", "clip", "columns", "sizes"}),
    "workload": frozenset({"kind", "ranges", "k", "lower"}),
    "strategy": frozenset({"branching", "time_limit"}),
    "consistency": frozenset({"total", "nonnegative"}),
}
#: Keys of a TopDown spec that the other kinds would ignore: refused there.
TOPDOWN_ONLY: dict[str, frozenset[str]] = {
    "data": frozenset({"geo", "counts", "attributes", "sep", "root", "cells_per_person", "units"}),
    "strategy": frozenset({"split"}),
    "consistency": frozenset({"invariants"}),
    # the privacy unit: refused by a kind until it reads and bounds records per unit
    "privacy": UNIT_SPEC_KEYS,
}


def is_topdown_spec(spec: dict[str, Any]) -> bool:
    """Whether a loaded spec is of the TopDown kind (``[data] geo``)."""
    return "geo" in spec.get("data", {})


def _names(value: Any, key: str, *, empty: bool = False) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or (not value and not empty) or not all(isinstance(v, str) and v for v in value):
        raise SparseDPError(f"{key} must be a list of names, got {value!r}")
    return list(value)


def _split(strategy: dict[str, Any]) -> Any:
    kind = strategy.get("kind", "topdown")
    if kind != "topdown":
        raise SparseDPError(f"a spec with data.geo is a TopDown release: strategy.kind must be 'topdown', got {kind!r}")
    split = strategy.get("split")
    if split is None or isinstance(split, str):
        return split
    if isinstance(split, dict):
        return dict(split)
    if not isinstance(split, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in split):
        raise SparseDPError(f"strategy.split must be a list of numbers (one per level, root first), a table "
                            f"{{level = share}} or a name, got {split!r}")
    return list(split)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _workload(spec: dict[str, Any], levels: list[str], split: Any) -> Any:
    """``[workload] marginals``: the ``workload=`` of :func:`~sparsedp.topdown.topdown` (``None``:
    the default, every unit's cells and total).  A marginal (``"total"``) or a list of them (equal
    weights), a table ``{marginal = weight}`` for every level, a list of such tables (one per
    level, root first), or ``{level = {marginal = weight}}`` (the levels not named keep the
    default).  Its form is checked here, the marginals' names when the design is planned: both
    before anything is read or charged."""
    if "marginals" not in spec.get("workload", {}):
        return None
    w = spec["workload"]["marginals"]
    if split not in (None, "optimal"):
        raise SparseDPError("[workload] marginals is what the optimised design is for (strategy.split absent or "
                            f"'optimal'); with strategy.split = {split!r} it would be ignored")
    form = ("workload.marginals must be a marginal, a list of marginals, a table {marginal = weight}, a list of "
            f"such tables (one per level, root first: {levels}) or a table {{level = {{marginal = weight}}}}, got {w!r}")

    def table(t: Any) -> dict[str, float]:
        if not isinstance(t, dict) or not t or not all(isinstance(k, str) and _number(v) for k, v in t.items()):
            raise SparseDPError(form)
        return dict(t)

    if isinstance(w, str) and w:
        return w
    if isinstance(w, list) and w and all(isinstance(m, str) and m for m in w):
        return list(w)
    if isinstance(w, list) and w and all(isinstance(t, dict) for t in w):
        if len(w) != len(levels):
            raise SparseDPError(f"workload.marginals has {len(w)} tables for {len(levels)} levels {levels} (root first)")
        return [table(t) for t in w]
    if isinstance(w, dict) and w and all(isinstance(t, dict) for t in w.values()):
        return workload_by_level({k: table(t) for k, t in w.items()}, levels, None, "workload.marginals")
    return table(w)


def run_topdown_spec(spec: dict[str, Any], path: str | Path, *, rng: Any = None,
                     accountant: Accountant | None = None, force: bool = False
                     ) -> tuple[ReleaseResult, TopDownRelease, Accountant, dict[str, Path]]:
    """Run a loaded TopDown spec: ``(release, the TopDown release, accountant, files)``.  Every
    check comes before the charge (:func:`~sparsedp.topdown.topdown` checks the design before it
    measures); then one release, saved, reported and plotted."""
    refuse_keys(spec, _OTHERS, "TopDown (data.geo)")
    data = spec["data"]
    geo = _names(data["geo"], "data.geo")
    unit, drop_missing = unit_from_spec(spec["privacy"])
    records = _records(data, unit)
    counts = _names(data["counts"], "data.counts") if records is None else None
    attributes = _names(data["attributes"], "data.attributes") if "attributes" in data else None
    sep, root = data.get("sep", "_"), data.get("root", "root")
    if not isinstance(sep, str) or not isinstance(root, str) or not root:
        raise SparseDPError("data.sep and data.root must be text")
    noise, total, secure = privacy_budget(spec["privacy"], "TopDown", noise_key=False)
    rho, eps = (total, None) if noise == "gaussian" else (None, total)
    split = _split(spec.get("strategy", {}))
    workload = _workload(spec, [root] + geo, split)
    invariants = _names(spec.get("consistency", {}).get("invariants", []), "consistency.invariants", empty=True)
    if not isinstance(data.get("path"), str) or not data["path"]:
        raise SparseDPError(f"data.path must be a file name, got {data.get('path')!r}")
    base: Path = spec["_base"]
    out = spec.get("output", {})
    if "release" in out and Path(str(out["release"])).suffix.lower() != ".npz":
        raise SparseDPError(f"output.release of a TopDown spec is an .npz release file, got {out['release']!r} "
                            "(its table: sparsedp.load_release(FILE).to_pandas())")
    files_out = outputs(spec, Path(path), base / data["path"], force)
    if accountant is None:
        accountant = Accountant(rho=rho) if rho is not None else Accountant(epsilon=eps)
    choice = None
    if records is None:
        table = read_table(base / data["path"], geo, counts, attributes=attributes, sep=sep, root=root,
                           contributions_per_person=data.get("cells_per_person", 1))
    else:
        units = records["units"] if records["units"] == "observed" else base / records["units"]
        table, choice, rho, eps = read_records(base / data["path"], geo, list(records["domain"]),
                                               domain=records["domain"], units=units, root=root, privacy_unit=unit,
                                               drop_missing_units=drop_missing, rng=rng, rho=rho, epsilon=eps,
                                               accountant=accountant)
    rel = with_bound_choice(topdown(table, rho=rho, epsilon=eps, split=split, invariants=invariants, secure=secure,
                                    accountant=accountant, rng=rng, keep_noisy=False, workload=workload), choice)
    del table
    result = rel.to_release()
    result = replace(result, description={**result.description, **spec_record(path, files_out)})
    files = save_then_report(result, files_out, topdown_report, topdown_plot)
    return result, rel, accountant, files


def _records(data: dict[str, Any], unit: Any) -> dict[str, Any] | None:
    """For record rows (``data.categories``): their domain and units, checked; ``None`` for a
    table of counts (``data.counts``), which takes no privacy unit."""
    if ("counts" in data) == ("categories" in data):
        raise SparseDPError("a TopDown spec names its count columns (data.counts: names or glob patterns) or, for "
                            "record rows, their category columns (data.categories = {column = [values]}): one of them")
    if "counts" in data:
        if not unit.is_row or "units" in data:
            raise SparseDPError("privacy.unit and data.units go with record rows (data.categories), not a table of "
                                "counts (overlapping count columns: data.cells_per_person)")
        return None
    for key in ("attributes", "cells_per_person"):
        if key in data:
            raise SparseDPError(f"data.{key} goes with a table of counts (data.counts), not record rows")
    cats = data["categories"]
    if not isinstance(cats, dict) or not cats:
        raise SparseDPError("data.categories must be a table {column = [values]}")
    for c, vals in cats.items():
        if not isinstance(vals, list) or not vals or len(set(map(str, vals))) != len(vals):
            raise SparseDPError(f"data.categories.{c} must be a non-empty list of distinct values, got {vals!r}")
    units = data.get("units")
    if not isinstance(units, str) or not units:
        raise SparseDPError('record rows need data.units: a CSV of every unit\'s geography codes (public) or "observed"')
    return {"domain": {str(c): [str(v) for v in vals] for c, vals in cats.items()}, "units": units}


def _level_sd(rel: TopDownRelease) -> list[float]:
    """Per level, the root mean of the per-cell variances of the GLS estimate (data-free)."""
    return [float(np.sqrt(np.mean(v))) if np.size(v) else 0.0 for v in rel.variance]


def topdown_report(path: Path, res: ReleaseResult) -> Path:
    """The report of a TopDown spec's release (in memory or loaded from its file: only the release
    is read): the hierarchy, the privacy, the invariants, the checks and each level's accuracy."""
    rel = topdown_from_result(res)
    h = rel.hierarchy
    checks = rel.check()
    invariants = [f"{item['level']}:{item['marginal']}" for item in rel.invariants]
    lines = [f"# sparsedp release: {res.description.get('spec', '')}", "",
             f"- TopDown release of {' > '.join(h.levels)} x {h.cells.size} cells "
             f"({sum(c.size for c in rel.counts)} published counts)",
             privacy_line(res),
             f"- invariants (published exactly, not protected): {', '.join(invariants) or 'none'}",
             f"- checks: {', '.join(f'{k} {v}' for k, v in checks.items())}",
             *[f"- not measured: level {item['level']!r} ({item['reason']}); its budget went to the other levels"
               for item in res.description.get("skipped", ())], "",
             "| level | units | cells per unit | standard deviation of a count (GLS, before rounding) |",
             "|---|---:|---:|---:|"]
    lines += [f"| {lv} | {n} | {h.cells.size} | {sd:.4g} |" for lv, n, sd in zip(h.levels, h.sizes, _level_sd(rel))]
    lines += ["", "Ledger:"] + [f"- {e.get('label', '')}: {', '.join(f'{k} {e[k]:g}' for k in ('rho', 'epsilon') if e.get(k))}"
                                for e in res.ledger]
    path.write_text("\n".join(lines) + "\n")
    return path


def topdown_plot(path: Path, res: ReleaseResult) -> Path:
    """The per-level standard deviation of a published count's GLS estimate (data-free), from the
    release alone."""
    plt = matplotlib_pyplot()
    rel = topdown_from_result(res)
    h = rel.hierarchy
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(range(len(h.levels)), _level_sd(rel))
    ax.set_xticks(range(len(h.levels)))
    ax.set_xticklabels([f"{lv}\n({n} units)" for lv, n in zip(h.levels, h.sizes)], fontsize=8)
    ax.set_ylabel("standard deviation of a count")
    ax.set_title("TopDown release: accuracy by level (before rounding)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
