"""``sparsedp topdown``: a TopDown release of a hierarchical table (geography x cells).

    sparsedp topdown counts.csv --geo state_fips,county_fips,vtd_code --counts 'vap_*,u18_*' \\
        --attributes age,race --rho 1 --invariant state_fips:total --out release.npz

The table has one row per leaf unit: geography columns (outermost first; codes read as text, so
leading zeros stay) and count columns (names or glob patterns).  Every level is measured with exact
discrete Gaussian noise (``--rho``, zCDP) or discrete Laplace noise (``--epsilon``, pure DP), the
design optimised for ``--workload`` (what the release is for: the marginals users read per level,
default every unit's cells and total; ``--split equal`` or weights: the plain design), then estimated
by GLS and made non-negative integer and consistent.  ``--invariant LEVEL:MARGINAL`` (repeatable) publishes that
marginal EXACTLY (not private).  The count columns must partition the people (one column per
person and unit: not also a total); ``--cells-per-person K`` declares columns that overlap (a person
in up to ``K`` of them) and calibrates the noise to it.  Output: ``.npz`` -- the release file
(:func:`sparsedp.topdown.load_topdown`, :func:`sparsedp.load_release`, ``sparsedp ledger``); ``.csv``
/ ``.parquet`` -- one row per unit (level, codes, its full code ``55/025/000150``, its total, one
column per cell: :mod:`sparsedp.topdown.table_file`) with the release record (ledger, parameters)
in ``OUT.release.json`` next to it.  Both paths print the design per level (:func:`design_table`:
each level's measured queries and budgets, the workload's predicted errors against the plain
design's) and the error by level (:func:`error_table`).

``--workload`` (:func:`parse_workload_option`): ``cells:1,total:1`` (``MARGINAL:WEIGHT``, comma
separated; a marginal without ``:WEIGHT`` weighs 1: ``--workload total`` puts totals first;
``age+race:2,race:1``), the same for every level; or ``LEVEL=SPEC`` (repeatable) for one level,
the levels not named keeping the spec given without ``LEVEL=`` (else the default).

Record rows (one row per record: a person, an event) are read with ``--categories age,sex``
instead of ``--counts``, each category's values given by ``--domain age=young,old`` (public) and
the units by ``--units FILE`` (a CSV of every unit's geography codes) or ``--units observed``.
``--privacy-unit COLUMN --max-rows K|auto`` (or ``--max-groups G --max-rows-per-group R``)
protects the entity that column identifies: its records beyond the bounds are dropped and every
level's noise is calibrated to one whole entity (``auto``: a share of the budget chooses ``K``).

``--executor dask --workers N`` runs the release chunked by subtree on a local Dask cluster of ``N``
worker processes (:func:`sparsedp.topdown.scaleout.topdown_scaleout`): ``--out`` is then a
directory (the chunked release: ``sparsedp.load_release`` and ``load_topdown`` read it); a Parquet
input (a file, or a directory partitioned by the first geography column) is read by the workers
part by part, a CSV on the driver.  ``--subtree-level`` chooses the level whose units own the
subtrees (default: the first geography level); the same seed and subtree level give the same
release in-process and on Dask.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from .._cli_util import warn_not_private
from ..errors import SparseDPError
from ..privacy import Accountant
from ..privacy_unit_cli import add_unit_arguments, id_warnings_on_stderr, unit_from_args
from ..release_file import release_record
from .design import plan_topdown
from .hierarchy import Hierarchy, read_table
from .release import topdown
from .units import read_records, with_bound_choice

__all__ = ["register", "run", "parse_workload_option", "workload_by_level", "design_table", "error_table"]


def _split(text: str | None) -> Any:
    """``--split``: ``optimal`` (the data-free optimiser), ``equal``, or comma-separated weights."""
    if text is None or text.strip() in ("optimal", "equal"):
        return None if text is None else text.strip()
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise SparseDPError(f"--split must be 'optimal', 'equal' or comma-separated numbers, got {text!r}") from exc


def _weight(text: str, item: str) -> float:
    """A workload weight: a finite number >= 0."""
    try:
        w = float(text)
    except ValueError:
        w = float("nan")
    if not math.isfinite(w) or w < 0:
        raise SparseDPError(f"--workload: the weight of {item!r} must be a finite number >= 0")
    return w


def _workload_spec(text: str, where: str) -> dict[str, float]:
    """``"cells:1,total:1"`` -> ``{"cells": 1.0, "total": 1.0}`` (a marginal without ``:WEIGHT``
    weighs 1; a marginal is ``cells``, ``total``, an attribute or ``age+race``)."""
    out: dict[str, float] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            raise SparseDPError(f"{where}: an empty marginal in {text!r} (write MARGINAL:WEIGHT,MARGINAL:WEIGHT)")
        name, sep, weight = item.rpartition(":") if ":" in item else (item, "", "1")
        name = name.strip()
        if not name or "=" in name:
            raise SparseDPError(f"{where}: cannot read {item!r} as MARGINAL:WEIGHT (e.g. cells:1,total:1)")
        if name in out:
            raise SparseDPError(f"{where}: the marginal {name!r} is listed twice")
        out[name] = _weight(weight.strip(), item)
    return out


def workload_by_level(per_level: dict[str, Any], levels: Sequence[str], every: Any = None,
                      where: str = "workload") -> list[Any]:
    """The per-level list :func:`~sparsedp.topdown.topdown` takes (root first) from ``{level:
    workload}``: a named level gets its own, the others ``every`` (``None``: the default, every
    unit's cells and total).  Unknown level names raise (before anything is read or charged)."""
    unknown = [k for k in per_level if k not in levels]
    if unknown:
        raise SparseDPError(f"{where} names unknown level(s) {unknown}; the levels are {list(levels)}")
    return [per_level.get(name, every) for name in levels]


def parse_workload_option(items: Sequence[str] | None, levels: Sequence[str]) -> Any:
    """The ``workload=`` argument of :func:`~sparsedp.topdown.topdown` from the ``--workload``
    options (``levels``: the hierarchy's level names, root first): ``None`` when none is given (the
    library's default); one ``MARGINAL:WEIGHT,...`` (:func:`_workload_spec`) for every level; or,
    with ``LEVEL=MARGINAL:WEIGHT,...`` options, a list per level (:func:`workload_by_level`), the
    levels not named taking the option without ``LEVEL=`` (at most one) or the default.  Every
    form is checked here, before the data are read or anything is charged; the marginals' names
    are checked against the cells when the design is planned (also before any charge)."""
    if not items:
        return None
    every: Any = None
    per: dict[str, dict[str, float]] = {}
    for text in items:
        level, sep, spec = text.partition("=")
        if not sep:
            if every is not None:
                raise SparseDPError("--workload: give one SPEC for every level; per level write LEVEL=SPEC")
            every = _workload_spec(text, "--workload")
            continue
        level = level.strip()
        if not level or level in per:
            raise SparseDPError(f"--workload {text!r}: LEVEL=SPEC names a level once (e.g. state=cells:1,total:1)")
        per[level] = _workload_spec(spec, f"--workload {level}=")
    if not per:
        return every
    return workload_by_level(per, levels, every, "--workload")


def run(args: argparse.Namespace) -> int:
    """Run the command (``args`` from :func:`register`'s parser)."""
    if (args.rho is None) == (args.epsilon is None):
        raise SparseDPError("give --rho (zCDP) or --epsilon (pure DP)")
    out = Path(args.out)
    chunked = args.executor != "inprocess"
    if args.workers is not None and (args.workers < 1 or not chunked):
        raise SparseDPError("--workers is a number >= 1 and goes with --executor dask")
    if chunked:
        if out.suffix.lower() in (".npz", ".csv", ".parquet", ".pq", ".npy", ".zarr", ".json"):
            raise SparseDPError(f"with --executor {args.executor}, --out is a directory (the chunked release), got "
                                f"{out.name}")
    elif out.suffix.lower() not in (".npz", ".csv", ".parquet", ".pq"):
        raise SparseDPError(f"--out must end in .npz (release file), .csv or .parquet, got {out.name}")
    attributes = [a.strip() for a in args.attributes.split(",")] if args.attributes else None
    records = _records_args(args, chunked)
    split = _split(args.split)
    workload = parse_workload_option(args.workload, [args.root] + [g.strip() for g in args.geo.split(",")])
    if workload is not None and split not in (None, "optimal"):
        raise SparseDPError("--workload is what the optimised design is for (--split optimal, the default); with "
                            f"--split {args.split} the budget is split as given and the workload would be ignored")
    plan_args: dict[str, Any] = {} if workload is None else {"workload": workload}
    acc = Accountant(rho=args.rho) if args.rho is not None else Accountant(epsilon=args.epsilon)
    private = warn_not_private(args.seed, False)
    subtree = _level(args.subtree_level)
    if chunked:
        from .scaleout import ParquetSource, topdown_scaleout

        if plan_args and "workload" not in inspect.signature(topdown_scaleout).parameters:
            raise SparseDPError(f"--workload is not taken by the chunked release yet (--executor {args.executor}): "
                                "run it in process, or without --workload (the default workload)")
        data = Path(args.data)
        if data.is_dir() or data.suffix.lower() in (".parquet", ".pq"):
            source: Any = ParquetSource(str(data), args.geo, args.counts, attributes=attributes, sep=args.sep,
                                        root=args.root, contributions_per_person=args.cells_per_person)
        else:
            source = read_table(args.data, args.geo, args.counts, attributes=attributes, sep=args.sep, root=args.root,
                                contributions_per_person=args.cells_per_person)
        crel = topdown_scaleout(source, out, rho=args.rho, epsilon=args.epsilon, split=split,
                                invariants=list(args.invariant or ()), accountant=acc, rng=args.seed,
                                subtree_level=subtree, executor=args.executor, workers=args.workers, **plan_args)
        units = crel.description["hierarchy"]["units"]
        levels = " > ".join(f"{n} {u}" for n, u in zip(crel.description["hierarchy"]["levels"], units))
        cells = len(crel.description["hierarchy"]["cells"])
        budget = f"rho {acc.spent:g}" if args.rho is not None else f"epsilon {acc.spent:g}"
        print(f"released {sum(units) * cells} counts ({levels} x {cells} cells; {budget}, exact noise) on "
              f"{args.executor}, chunked by {crel.description['subtree_level']}; invariants: "
              f"{', '.join(args.invariant or ()) or 'none'}; violations: {crel.check()}")
        _print_notices(crel.description)
        try:  # from what the release recorded: no second plan on the driver
            print(design_table(crel.description))
            print(chunked_error_table(crel, None, rho=args.rho, epsilon=args.epsilon, split=split,
                                      invariants=list(args.invariant or ()), **plan_args))
        except SparseDPError as exc:  # the release is written and charged: say why the table is missing
            print(f"note: {exc}")
        print(f"--out: {out}")
        return 0
    rho, eps, choice = args.rho, args.epsilon, None
    if records is not None:
        table, choice, rho, eps = _read_records(args, records, acc)
    else:
        table = read_table(args.data, args.geo, args.counts, attributes=attributes, sep=args.sep, root=args.root,
                           contributions_per_person=args.cells_per_person)
    rel = with_bound_choice(topdown(table, rho=rho, epsilon=eps, split=split,
                                    invariants=list(args.invariant or ()), accountant=acc, rng=args.seed,
                                    keep_noisy=False, subtree_level=subtree, **plan_args), choice)
    if out.suffix.lower() == ".npz":
        rel.save(out, overwrite=bool(getattr(args, "force", False)))
    else:
        frame = rel.published_table()
        if out.suffix.lower() == ".csv":
            frame.to_csv(out, index=False)
        else:
            frame.to_parquet(out, index=False)
        record = release_record("topdown", ledger=rel.to_release().ledger, description=dict(rel.description),
                                private=rel.private and private)
        Path(str(out) + ".release.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    h = rel.hierarchy
    budget = f"rho {acc.spent:g}" if args.rho is not None else f"epsilon {acc.spent:g}"
    if table.privacy_unit is not None:
        budget += f" per {table.privacy_unit.column}"
    levels = " > ".join(f"{n} {s}" for n, s in zip(h.levels, h.sizes))
    print(f"released {sum(c.size for c in rel.counts)} counts ({levels} x {h.cells.size} cells; {budget}, "
          f"exact noise); invariants: {', '.join(args.invariant or ()) or 'none'}")
    _print_notices(rel.description)
    print(design_table(rel.design))
    print(error_table(rel.design))
    print(f"--out: {out}")
    return 0


def _print_notices(description: dict[str, Any]) -> None:
    """One line per level not measured because it carries no information."""
    for item in description.get("skipped", ()):
        print(f"note: level {item['level']!r} is not measured ({item['reason']}); its budget goes to the other levels")


def error_table(design: Any) -> str:
    """Per level, the standard deviation and 95% half-width of the GLS estimate of a cell and of a
    unit's total (:meth:`~sparsedp.topdown.design.TopDownDesign.error_summary`: from the design,
    no data), as printed lines."""
    rows = design.error_summary()
    width = max(len("level"), *(len(r["level"]) for r in rows))
    lines = ["error by level (GLS estimate before rounding; 95% half-width = 1.96 sd):",
             f"  {'level':{width}s} {'units':>8s} {'sd cell':>9s} {'95% cell':>9s} {'sd total':>9s} {'95% total':>9s}"]
    for r in rows:
        note = "  (not measured)" if r["skipped"] else ""
        lines.append(f"  {r['level']:{width}s} {r['units']:8d} {r['sd_cell']:9.3f} {r['half_width_cell']:9.3f} "
                     f"{r['sd_total']:9.3f} {r['half_width_total']:9.3f}{note}")
    return "\n".join(lines)


def design_table(design: Any) -> str:
    """The design per level, as printed lines (data-free: what was measured and why): per level its
    budget and each measured query's (``county: rho 0.2506 = residual:total 0.0212, ...``), or why
    it is not measured; then, when the design was optimised for a workload
    (:attr:`~sparsedp.topdown.design.TopDownDesign.split_choice`), that level's workload terms with
    their weights and the predicted expected mean absolute error per marginal cell of the GLS
    estimate next to the plain design's (the equal split measuring each level's cells).  ``design``:
    a design, or a release's description (what :meth:`TopDownDesign.describe` wrote: a chunked
    release keeps that, not its design)."""
    desc = design.describe() if hasattr(design, "describe") else design
    unit = "rho" if desc["noise"] == "gaussian" else "epsilon"
    choice = desc.get("split_choice")
    terms: dict[str, list[str]] = {}
    for t in (choice or {}).get("workload", ()):
        terms.setdefault(t["level"], []).append(
            f"{t['marginal']} (weight {t['weight']:g}) {t['predicted_gls_mae']:.3g} (plain {t['plain_design_mae']:.3g})")
    skipped = {item["level"]: item["reason"] for item in desc["skipped"]}
    width = max(len(lv["level"]) for lv in desc["levels"]) + 1
    how = ("optimised for the workload" if choice is not None else "budget split as given")
    lines = [f"design by level ({how}; chosen from the public design, never the counts):"]
    for lv in desc["levels"]:
        name = lv["level"]
        if lv["measured"]:
            queries = ", ".join(f"{q} {b:.4g}" for q, b in lv["queries"].items() if b > 0)
            lines.append(f"  {name + ':':{width}s} {unit} {lv[unit]:.4g} = {queries}")
        else:
            why = skipped.get(name, "no budget: estimated from the levels around it")
            lines.append(f"  {name + ':':{width}s} not measured ({why})")
        if name in terms:
            lines.append(f"  {'':{width}s}   workload, predicted MAE per cell: {'; '.join(terms[name])}")
    return "\n".join(lines)


def chunked_design(crel: Any, hierarchy: Hierarchy | None = None, **plan: Any) -> Any:
    """The design of a chunked release (:class:`~sparsedp.topdown.scaleout.ChunkedTopDownRelease`)
    planned again for the command's tables (see :func:`chunked_error_table`), checked to be the
    plan that ran."""
    desc = crel.description
    if hierarchy is None:
        hierarchy = crel.to_topdown().hierarchy
    design = plan_topdown(hierarchy, contributions_per_person=int(desc.get("contributions_per_person", 1)), **plan)
    ran = _plain({k: desc.get(k) for k in ("levels", "skipped")})
    if _plain({k: design.describe()[k] for k in ("levels", "skipped")}) != ran:
        raise SparseDPError("the design planned again differs from the one the chunked release ran: no error table")
    return design


def chunked_error_table(crel: Any, hierarchy: Hierarchy | None = None, **plan: Any) -> str:
    """:func:`error_table` of a chunked release (:class:`~sparsedp.topdown.scaleout.ChunkedTopDownRelease`),
    as the in-process command prints it.  The chunked release keeps its description, not its
    design (it was planned on a skeleton of the hierarchy), but its description records the
    design's error summary on the whole public structure (``error_summary``, computed on the
    driver from the hierarchy compressed by subtree shape: data-free, ``O(contexts x cells)``):
    printed as it is when no ``hierarchy`` is given.  Else (or for a release without one) the
    design is planned again -- :func:`~sparsedp.topdown.plan_topdown` on the real ``hierarchy``
    (public: the units and cells; ``None``: read from the release's files) with the run's ``plan``
    arguments (``rho`` / ``epsilon``, ``split``, ``invariants``, ``workload``) and its cells per
    person -- and used only if it is the plan that ran (the same budgets, queries and scales per
    level, the same skipped levels); that holds ``O(units x cells)`` numbers on the driver."""
    from types import SimpleNamespace

    rows = crel.description.get("error_summary")
    if hierarchy is None and rows is not None:
        return error_table(SimpleNamespace(error_summary=lambda: [dict(r) for r in rows]))
    return error_table(chunked_design(crel, hierarchy, **plan))


def _plain(obj: Any) -> Any:
    """``obj`` as JSON gives it back (tuples as lists, numbers as floats): descriptions compare
    alike whether read from a file or held in memory."""
    return json.loads(json.dumps(obj, default=str))


def _records_args(args: argparse.Namespace, chunked: bool) -> dict[str, Any] | None:
    """For record rows (``--categories``), what :func:`read_table` takes besides the file
    (checked, nothing read); ``None`` for a table of counts (``--counts``)."""
    unit, drop = unit_from_args(args)
    if (args.counts is None) == (args.categories is None):
        raise SparseDPError("give --counts (a table of counts, one row per leaf unit) or --categories (record rows)")
    if args.categories is None:
        if not unit.is_row or args.domain or args.units:
            raise SparseDPError("--privacy-unit, --domain and --units go with record rows (--categories)")
        return None
    if chunked:
        raise SparseDPError("record rows (--categories) are released in process (--executor inprocess)")
    if args.cells_per_person != 1:
        raise SparseDPError("--cells-per-person is for overlapping count columns; records: --privacy-unit")
    domain: dict[str, list[str]] = {}
    for item in args.domain or ():
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise SparseDPError(f"--domain is NAME=VALUE,VALUE,..., got {item!r}")
        domain[name.strip()] = [v.strip() for v in values.split(",")]
    if args.units is None:
        raise SparseDPError("give --units FILE (every unit's geography codes: public) or --units observed (the units "
                            "among the records, declared public)")
    return {"unit": unit, "drop": drop, "domain": domain, "units": args.units}


def _read_records(args: argparse.Namespace, rec: dict[str, Any], acc: Accountant) -> tuple[Any, Any, Any, Any]:
    """``(table, bound choice, rho, epsilon)`` (:func:`~sparsedp.topdown.units.read_records`)."""
    with id_warnings_on_stderr():
        table, choice, rho, eps = read_records(args.data, args.geo, args.categories, domain=rec["domain"],
                                               units=rec["units"], root=args.root, privacy_unit=rec["unit"],
                                               drop_missing_units=rec["drop"], rng=args.seed, rho=args.rho,
                                               epsilon=args.epsilon, accountant=acc)
    if choice is not None:
        print(f"privacy unit: max_rows {choice.bound}, chosen with {_spent(choice)} of the budget")
    return table, choice, rho, eps


def _spent(choice: Any) -> str:
    """What the choice of the bound spent, as text."""
    spent = choice.describe()["spent"]
    return ", ".join(f"{k} {v:g}" for k, v in spent.items())


def _level(text: str) -> Any:
    """A level by index (digits) or name."""
    return int(text) if text.strip().isdigit() else text.strip()


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``topdown`` command."""
    p = subparsers.add_parser(
        "topdown", help="release every level of a geographic table (geography x cells): non-negative integer, "
        "consistent, invariants exact", description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="CSV (.csv, .csv.gz) or Parquet file, one row per leaf unit (or per record)")
    p.add_argument("--geo", required=True, help="comma-separated geography columns, outermost first")
    p.add_argument("--counts", default=None, help="comma-separated count columns or glob patterns ('vap_*,u18_*')")
    p.add_argument("--categories", default=None,
                   help="record rows instead of counts: comma-separated category columns (one row per record)")
    p.add_argument("--domain", action="append", metavar="NAME=V1,V2,...",
                   help="a category's values (public; repeatable, one per --categories column)")
    p.add_argument("--units", default=None, metavar="FILE|observed",
                   help="records: a CSV of every unit's geography codes (public), or 'observed' to declare the units "
                   "among the records public")
    p.add_argument("--cells-per-person", type=int, default=1, metavar="K",
                   help="the most count columns one person is counted in (default 1: the columns partition the "
                   "people, and a column that is the sum of others, such as a total, is refused); K > 1 for "
                   "overlapping columns: the noise is calibrated to a person changing K counts (in the ledger)")
    p.add_argument("--attributes", default=None,
                   help="names of the cell attributes parsed from the count column names at --sep (e.g. age,race); "
                   "default: one attribute 'cell'")
    p.add_argument("--sep", default="_", help="separator of the attributes in column names (default %(default)r)")
    p.add_argument("--root", default="root", help="name of the top level (default %(default)r)")
    p.add_argument("--rho", type=float, default=None, help="zCDP budget (discrete Gaussian noise)")
    p.add_argument("--epsilon", type=float, default=None, help="pure-DP budget (discrete Laplace noise)")
    p.add_argument("--split", default=None, help="the design: 'optimal' (the default: each level's queries and budget "
                   "shares chosen for --workload from the design only, never the data), 'equal' (the plain design: "
                   "the cells of every level, equal shares), or comma-separated weights per level, root first")
    p.add_argument("--workload", action="append", metavar="[LEVEL=]MARGINAL:WEIGHT,...",
                   help="what the release is for: the marginals users read and their weights, e.g. cells:1,total:1 "
                   "(the default), total (totals first), age+race:2,race:1; LEVEL=SPEC (repeatable) for one level, "
                   "the levels not named keeping the SPEC given without LEVEL= (else the default)")
    p.add_argument("--invariant", action="append", metavar="LEVEL:MARGINAL",
                   help="publish this marginal EXACTLY (not private), e.g. state_fips:total; repeatable")
    p.add_argument("--seed", type=int, default=None, help="reproducible, NOT private noise (tests only)")
    p.add_argument("--out", required=True, help="release file (.npz) or a table of units (.csv / .parquet); with "
                   "--executor dask, a directory (the chunked release)")
    p.add_argument("--executor", choices=("inprocess", "dask"), default="inprocess",
                   help="inprocess (default) or dask: chunked by subtree on a local Dask cluster")
    p.add_argument("--workers", type=int, default=None, help="Dask worker processes (default 2; --executor dask)")
    p.add_argument("--subtree-level", default="1",
                   help="the level (name or index) whose units own the subtrees the noise is keyed by and the "
                   "chunked release is cut at (default 1: the first geography level)")
    add_unit_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - for running without the main CLI
    parser = argparse.ArgumentParser(prog="sparsedp")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SparseDPError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
