"""The ``sparsedp`` command.

``sparsedp demo``   the main job on built-in data: the prefix workload on a DPBench histogram,
                    measured with several strategies; expected vs empirical error and time.
``sparsedp error``  the analytic expected error of a workload / strategy pair.
``sparsedp release`` a declarative release from a TOML spec; ``sparsedp report`` re-creates its
                    report from the saved release file, without a new charge.

Subsystems add their own commands: every module named in ``COMMAND_MODULES`` that exists defines
``register(subparsers)``, which adds sub-parsers whose ``func(args) -> int`` runs the command.

Files written (issue 26): before a command runs, the files it would write (``FILE_OPTIONS``) are
checked by :func:`sparsedp._cli_util.check_output_paths`: no output may be one of the command's
input files (after resolving symlinks and ``..``), two outputs may not be one file, every output's
directory must exist, and an existing release file is replaced only with ``--force`` (added to every
command that writes one).  So a bad path stops the command with ``sparsedp: error: ...`` before any
data are read, any budget is charged or any noise is drawn.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import strategies as st
from . import workloads as wl
from ._cli_util import OutputFile, check_output_paths
from .datasets import DEFAULT_DPBENCH, demo_histogram
from .errors import SparseDPError
from .mechanism import MatrixMechanism
from .progress import command_progress

STRATEGIES: dict[str, Callable[[int], object]] = {
    "identity": st.identity,
    "hierarchical-2": lambda n: st.hierarchical(n, 2),
    "hierarchical-16": lambda n: st.hierarchical(n, 16),
    "haar": st.haar,
    "fenwick": st.fenwick,
}
WORKLOADS: dict[str, Callable[[int], object]] = {
    "prefix": wl.prefix,
    "all-ranges": wl.all_ranges,
    "identity": wl.identity,
    "total": wl.total,
}


def _demo(args: argparse.Namespace) -> int:
    x, label = demo_histogram(args.dataset)
    n = x.size
    W = wl.prefix(n)
    truth = W.matvec(x)
    print(f"sparsedp demo: prefix workload ({n} running sums) on {label}, total {int(x.sum())}")
    print(f"epsilon = {args.epsilon} (exact discrete Laplace), {args.trials} trials, seed {args.seed} "
          "(an evaluation on built-in data: seeded noise, not a private release)\n")
    header = f"{'strategy':<16}{'Delta_1':>8}{'expected MSE':>15}{'empirical MSE':>15}{'emp/exp':>9}{'sec/trial':>11}"
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(args.seed)
    for name, build in STRATEGIES.items():
        mech = MatrixMechanism(W, build(n), epsilon=args.epsilon)
        expected = mech.error_report().per_query
        t0 = time.perf_counter()
        errs = [np.mean((mech.run(x, rng=rng).answers - truth) ** 2) for _ in range(args.trials)]
        sec = (time.perf_counter() - t0) / args.trials
        emp = float(np.mean(errs))
        print(f"{name:<16}{mech.sensitivity:>8g}{expected:>15.4g}{emp:>15.4g}{emp / expected:>9.3f}{sec:>11.4f}")
    print("\nMSE = mean squared error per running sum; expected = analytic GLS error (sparsedp.expected_error).")
    return 0


def _error(args: argparse.Namespace) -> int:
    W = WORKLOADS[args.workload](args.n)
    if args.strategy == "optimized":  # sparsedp.optimize, its random starts seeded (reproducible; no privacy noise)
        mech = MatrixMechanism(W, "optimized", epsilon=args.epsilon, secure=not args.float_noise,
                               optimize_options={"rng": 0})
    else:
        mech = MatrixMechanism(W, STRATEGIES[args.strategy](args.n), epsilon=args.epsilon, secure=not args.float_noise)
    rep = mech.error_report()
    kind = "float Laplace" if args.float_noise else "exact discrete Laplace"
    name = args.strategy if mech.optimized is None else f"optimized ({mech.optimized.family} {mech.optimized.name})"
    print(f"workload {args.workload}({args.n}), strategy {name}, epsilon {args.epsilon}, {kind} noise")
    print(f"Delta_1 = {mech.sensitivity:g}, Laplace scale b = {mech.noise_scale():g}")
    extra = f" +- {rep.stderr:.3g}" if not rep.exact else ""
    print(f"expected total squared error = {rep.total:.6g}{extra} ({rep.method})")
    print(f"per query = {rep.per_query:.6g}")
    return 0


def _release(args: argparse.Namespace) -> int:
    from .spec import run_spec

    if args.seed is not None:
        print("WARNING: --seed makes the noise reproducible: this release is NOT private", file=sys.stderr)
    res = run_spec(args.spec, rng=args.seed, force=args.force)
    r = res.result
    cost = f"epsilon {r.epsilon:g}" if r.epsilon else f"rho {r.rho:g}"
    print(f"released {res.answers.size} answers ({cost}, {'exact' if r.secure else 'float'} noise)")
    for name, path in res.files.items():
        print(f"{name}: {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from .spec import rebuild_report

    for name, path in rebuild_report(args.file, args.out).items():
        print(f"{name}: {path}")
    return 0


def _ledger(args: argparse.Namespace) -> int:
    from .release_file import ledger_rows
    from .releases import load_release

    print("\n".join(ledger_rows(load_release(args.file))))  # every release file sparsedp writes
    return 0


COMMAND_MODULES = (
    "sparsedp.consistency.cli",
    "sparsedp.continual.cli",
    "sparsedp.trees.cli",
    "sparsedp.completion.cli",
    "sparsedp.flows.cli",
    "sparsedp.optimize.cli",
    "sparsedp.marginals.cli",
    "sparsedp.topdown.cli",
)


def _scaleout_side(out: str | None, chunked: bool) -> list[OutputFile]:
    """The ledger ``OUT.release.json`` a chunked release writes next to its ``.npy`` / ``.zarr`` output."""
    return [OutputFile("the ledger of --out", f"{out}.release.json", release=True)] if out and chunked else []


def _histogram_files(a: argparse.Namespace) -> tuple[list, list[OutputFile]]:
    return [a.data], [OutputFile("--out", a.out, release=True), *_scaleout_side(a.out, a.executor is not None)]


def _restaurant_files(a: argparse.Namespace) -> tuple[list, list[OutputFile]]:
    chunked = a.chunk is not None or (a.out is not None and Path(a.out).suffix in (".npy", ".zarr"))
    outs = [OutputFile("--out", a.out, release=True), *_scaleout_side(a.out, chunked),
            OutputFile("--json", a.json), OutputFile("--plot", a.plot)]
    return [a.data], outs


def _flows_files(a: argparse.Namespace) -> tuple[list, list[OutputFile]]:
    return [a.trips_file], [OutputFile("--out", a.out, release=True), OutputFile("--json", a.json),
                            OutputFile("--write-network", a.write_network)]


def _complete_files(a: argparse.Namespace) -> tuple[list, list[OutputFile]]:
    return [a.data], [OutputFile("--save", a.save, release=True), OutputFile("--json", a.json)]


def _marginals_files(a: argparse.Namespace) -> tuple[list, list[OutputFile]]:
    return [a.data, a.categories], [OutputFile("--out", a.out, release=True)]


def _topdown_files(a: argparse.Namespace) -> tuple[list, list[OutputFile]]:
    table = Path(a.out).suffix.lower() in (".csv", ".parquet", ".pq")
    return [a.data], [OutputFile("--out", a.out, release=True),
                      *([OutputFile("the record of --out", f"{a.out}.release.json", release=True)] if table else [])]


def _optimize_files(a: argparse.Namespace) -> tuple[list, list[OutputFile]]:
    # a workload is NAME, FILE or FILE:WEIGHT; only names of existing files can be overwritten
    candidates = [w for spec in a.workload for w in (spec, spec.rpartition(":")[0]) if w]
    return [w for w in candidates if Path(w).exists()], [OutputFile("--json", a.json), OutputFile("--save", a.save)]


#: Per command: a function of its parsed arguments giving the files it reads and the files it
#: writes (:class:`~sparsedp._cli_util.OutputFile`; ``release=True`` for release files, which get
#: ``--force``).  ``continual`` is absent: its ``--state`` file is read and rewritten by design.
FILE_OPTIONS: dict[str, tuple[Callable[[argparse.Namespace], tuple[list, list[OutputFile]]], bool]] = {
    "histogram": (_histogram_files, True),
    "restaurant": (_restaurant_files, True),
    "flows": (_flows_files, True),
    "complete": (_complete_files, True),
    "marginals": (_marginals_files, True),
    "topdown": (_topdown_files, True),
    "optimize": (_optimize_files, False),
}


def _add_force_options(sub: argparse._SubParsersAction) -> None:
    """``--force`` on every command of ``FILE_OPTIONS`` that writes a release file."""
    for name, (_, writes_release) in FILE_OPTIONS.items():
        parser = sub.choices.get(name)
        if parser is not None and writes_release:
            parser.add_argument("--force", action="store_true",
                                help="replace the release file (--out / --save) if it exists (default: refuse); "
                                "an output never replaces an input file")


def _check_files(args: argparse.Namespace) -> None:
    """The checks of :func:`~sparsedp._cli_util.check_output_paths` on the command's files."""
    entry = FILE_OPTIONS.get(args.command)
    if entry is None:
        return
    inputs, outputs = entry[0](args)
    check_output_paths([o for o in outputs if o.path is not None], inputs, force=bool(getattr(args, "force", False)))


def _register_subsystems(sub: argparse._SubParsersAction) -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue  # that subsystem is not installed in this build
            raise
        module.register(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparsedp",
        description="Differentially private release of linear queries on sparse linear operators.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="prefix workload on a real histogram with identity, hierarchical, Haar and Fenwick strategies",
        description="Measure the prefix workload on a DPBench histogram (synthetic if the shared "
        "datasets are absent) with several strategies; print expected and empirical error and time.",
    )
    demo.add_argument("--dataset", default=DEFAULT_DPBENCH, help="DPBench file name (default %(default)s)")
    demo.add_argument("--epsilon", type=float, default=1.0, help="privacy budget per run (default %(default)s)")
    demo.add_argument("--trials", type=int, default=20, help="noisy runs per strategy (default %(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    demo.set_defaults(func=_demo)
    err = sub.add_parser("error", help="analytic expected error of a workload and strategy",
                         description="Print the expected total squared error of GLS workload answers.")
    err.add_argument("--workload", choices=sorted(WORKLOADS), default="prefix")
    err.add_argument("--strategy", choices=sorted(STRATEGIES) + ["optimized"], default="fenwick",
                     help="a fixed strategy, or optimized: the one sparsedp.optimize finds for the workload "
                     "(see 'sparsedp optimize')")
    err.add_argument("--n", type=int, default=1024, help="domain size (default %(default)s)")
    err.add_argument("--epsilon", type=float, default=1.0)
    err.add_argument("--float-noise", action="store_true",
                     help="error of textbook float Laplace noise (variance 2 b^2) instead of the default exact "
                     "discrete Laplace (variance 2q/(1-q)^2, q = exp(-1/b); slightly smaller)")
    err.set_defaults(func=_error)
    rel = sub.add_parser("release", help="run a declarative release described by a TOML spec",
                         description="Run the release a TOML spec describes (data, workload, strategy, budget, "
                         "consistency, outputs); see sparsedp.spec for the format.")
    rel.add_argument("spec", help="the spec file (.toml)")
    rel.add_argument("--seed", type=int, default=None,
                     help="seed the noise (reproducible, and then NOT private); default: OS entropy")
    rel.add_argument("--force", action="store_true",
                     help="replace the spec's release file if it exists (as 'overwrite = true' in [output]); "
                     "outputs never replace the spec or its data, and stay in the spec's directory")
    rel.set_defaults(func=_release)
    led = sub.add_parser("ledger", help="print the privacy ledger of a release file",
                         description="Print what a sparsedp release file says was measured: every "
                         "measurement's strategy size, sensitivity, noise, scales and cost, and the total.")
    led.add_argument("file", help="a release file written by sparsedp: an .npz, a chunked .npy / .zarr array (with "
                     "its .release.json record), or the JSON of 'sparsedp marginals'")
    led.set_defaults(func=_ledger)
    rep = sub.add_parser("report", help="re-create the report of a spec's release from its saved release file",
                         description="Write the report (and the plot, if the spec made one) of a release that "
                         "'sparsedp release' saved, from the release file alone: no data are read, no budget "
                         "is charged and no noise is drawn.")
    rep.add_argument("file", help="the release file (.npz) a spec wrote")
    rep.add_argument("--out", default=None, metavar="DIR",
                     help="directory for the report and plot (default: the release file's directory); the files "
                     "get the names the spec gave them")
    rep.set_defaults(func=_report)
    _register_subsystems(sub)
    _add_force_options(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        _check_files(args)  # before the command reads its data, charges or draws
        with command_progress():  # long library loops may draw tqdm bars (on a terminal only)
            return int(args.func(args))
    except SparseDPError as exc:
        print(f"sparsedp: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout piped into a reader that stopped (`| head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush would raise again
        return 141  # 128 + SIGPIPE, as a shell reports it


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
