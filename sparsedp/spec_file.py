"""A release spec file: its sections and keys, checked before anything else (:mod:`sparsedp.spec`
runs it; :mod:`sparsedp.spec_marginals` runs the marginal kind).

Every section and key is listed here: anything else is refused with the closest known name ("did
you mean ...?"), since a misspelt key must never be ignored.  The outputs are checked here too
(in the spec's directory, never over the spec or its data, an existing release file replaced only
with ``overwrite = true`` or ``--force``).
"""

from __future__ import annotations

import difflib
import math
import tomllib
from pathlib import Path
from typing import Any, Callable

from ._cli_util import OutputFile, check_output_paths
from .errors import InvalidPrivacyParameterError, SparseDPError

__all__ = ["flag", "load_spec", "matplotlib_pyplot", "outputs", "privacy_budget", "privacy_line", "refuse_keys",
           "spec_record", "save_then_report"]

#: The keys each section may hold (anything else is refused: a misspelt key must not be ignored).
_KEYS: dict[str, frozenset[str]] = {
    "data": frozenset({"path", "column", "bins", "clip", "columns", "sizes", "categories", "geo", "counts",
                       "attributes", "sep", "root", "cells_per_person", "units"}),
    "workload": frozenset({"kind", "ranges", "k", "lower", "marginals"}),
    "strategy": frozenset({"kind", "branching", "time_limit", "split"}),
    "privacy": frozenset({"epsilon", "rho", "delta", "noise", "secure", "unit", "max_rows", "max_groups",
                          "max_rows_per_group", "drop_missing_units"}),
    "consistency": frozenset({"nonnegative", "total", "invariants"}),
    "output": frozenset({"release", "report", "plot", "overwrite"}),
}
_SECTIONS = set(_KEYS)


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
        raise SparseDPError(f"{p}: unknown section(s) {_named(unknown, _SECTIONS, '[{}]')}; known: {sorted(_SECTIONS)}")
    for name, section in spec.items():
        if not isinstance(section, dict):
            raise SparseDPError(f"{p}: {name} must be a section [{name}], got a {type(section).__name__}")
        extra = set(section) - _KEYS[name]
        if extra:
            raise SparseDPError(f"{p}: unknown key(s) {_named(extra, _KEYS[name], '{}')} in [{name}]; "
                                f"known: {sorted(_KEYS[name])}")
    for needed in ("data", "privacy"):
        if needed not in spec:
            raise SparseDPError(f"{p}: the [{needed}] section is required")
    spec["_base"] = p.parent
    return spec


def _named(unknown: set[str], known: Any, fmt: str) -> str:
    """The unknown names, each with the closest known one ("did you mean ...?") when there is one."""
    parts = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f" (did you mean {fmt.format(close[0])!r}?)" if close else ""
        if not close and fmt == "{}":  # a key of another section, perhaps misspelt
            for section, keys in _KEYS.items():
                other = difflib.get_close_matches(name, sorted(keys), n=1, cutoff=0.75)
                if other:
                    hint = f" (did you mean {other[0]!r} in [{section}]?)"
                    break
        parts.append(repr(name) + hint)
    return ", ".join(parts)


def flag(section: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    """A true / false key of a section (a string or a number is refused, not read as a truth value)."""
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise SparseDPError(f"{where}.{key} must be true or false, got {value!r}")
    return value


def outputs(spec: dict[str, Any], spec_path: Path, data_path: Path, force: bool) -> dict[str, Path]:
    """The output files of a spec, checked (:func:`~sparsedp._cli_util.check_output_paths`): in the
    spec's directory, never the spec or its data, distinct, in an existing directory, and an
    existing release file only with ``overwrite = true`` / ``force``."""
    out = spec.get("output", {})
    base: Path = spec["_base"]
    wanted: list[OutputFile] = []
    for key in ("release", "report", "plot"):
        if key in out:
            if not isinstance(out[key], str) or not out[key]:
                raise SparseDPError(f"output.{key} must be a file name, got {out[key]!r}")
            wanted.append(OutputFile(f"output.{key}", base / out[key], release=key == "release"))
    force = force or flag(out, "overwrite", "output")
    check_output_paths(wanted, [spec_path, data_path], force=force, within=base,
                       force_hint="'overwrite = true' in [output] (or sparsedp release --force)")
    if "plot" in out:
        matplotlib_pyplot()  # a missing extra is found before the charge, not after it
    return {o.name.removeprefix("output."): Path(o.path) for o in wanted}


def matplotlib_pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or :class:`SparseDPError` without the plot extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - the plot extra
        raise SparseDPError("the plot needs matplotlib: pip install 'sparsedp[plot]'") from exc
    return plt


def refuse_keys(spec: dict[str, Any], keys: dict[str, frozenset[str]], why: str) -> None:
    """Refuse the ``keys`` (``{section: names}``) a spec of one kind holds but does not use (a key
    that would be ignored is an error, as a misspelt one is); ``why`` names the kind."""
    for section, names in keys.items():
        present = sorted(set(spec.get(section, {})) & names) if section in spec else []
        if names == frozenset({"*"}) and section in spec:
            raise SparseDPError(f"a {why} spec takes no [{section}] section")
        if present:
            raise SparseDPError(f"[{section}] {', '.join(map(repr, present))}: not used by a {why} spec")


def privacy_line(result: Any) -> str:
    """The report's line on the privacy of a :class:`~sparsedp.releases.ReleaseResult`: its ledger
    total, the noise, and a warning when it is not private (seeded noise)."""
    cost = f"rho {result.rho:g}" if result.rho else f"epsilon {result.epsilon:g}"
    return (f"- privacy: {cost}, {'exact' if result.secure else 'float'} {result.noise} noise"
            + ("" if result.private else " **(seeded: NOT private)**"))


def privacy_budget(priv: dict[str, Any], kind: str, *, noise_key: bool = True) -> tuple[str, float, bool]:
    """``(noise, budget, secure)`` of a ``[privacy]`` section that takes ``rho`` (zCDP, Gaussian
    noise) or ``epsilon`` (pure DP, Laplace noise), exactly one, a finite number > 0, and no
    ``delta``; ``noise``, when allowed (``noise_key``), must name the noise the budget implies.
    ``kind`` names the spec in the errors."""
    if "delta" in priv or ("noise" in priv and not noise_key):
        raise InvalidPrivacyParameterError(f"a {kind} spec takes rho (zCDP, Gaussian noise) or epsilon (pure DP, "
                                           "Laplace noise); " + ("not delta" if "delta" in priv else
                                                                 "the noise follows from it"))
    if ("rho" in priv) == ("epsilon" in priv):
        raise InvalidPrivacyParameterError(f"a {kind} spec takes privacy.rho (zCDP, Gaussian noise) or "
                                           "privacy.epsilon (pure DP, Laplace noise): exactly one")
    key, noise = ("rho", "gaussian") if "rho" in priv else ("epsilon", "laplace")
    if priv.get("noise", noise) != noise:
        raise InvalidPrivacyParameterError(f"privacy.noise = {priv['noise']!r} does not go with {key} ({noise} noise)")
    value = priv[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidPrivacyParameterError(f"privacy.{key}: the budget must be a finite number > 0, got {value!r}")
    return noise, float(value), flag(priv, "secure", "privacy", default=True)


def spec_record(spec_path: str | Path, files_out: dict[str, Path]) -> dict[str, Any]:
    """What a release file keeps of its spec so that ``sparsedp report`` can re-create the report
    from the release alone: the spec's file name and the names of its report and plot."""
    return {"spec": Path(spec_path).name,
            "outputs": {k: Path(v).name for k, v in files_out.items() if k in ("report", "plot")}}


#: ``(path, release) -> path``: writes a report or a plot of a release from the release alone.
Writer = Callable[[Path, Any], Path]


def save_then_report(result: Any, files_out: dict[str, Path], report: Writer, plot: Writer) -> dict[str, Path]:
    """Write a spec's outputs once the budget is spent: the release file (with its ledger) first,
    then the report and the plot, both made from ``result`` alone, as ``sparsedp report`` makes
    them from the saved file.  If the report or the plot fails, the paid-for release is not lost:
    it is in its file (or, when the spec asked for none, in a ``*.rescued.npz`` file next to the
    report), and the :class:`SparseDPError` raised says where and how to re-create the report
    without a new charge."""
    files: dict[str, Path] = {}
    if "release" in files_out:
        files["release"] = result.save(files_out["release"], overwrite=True)  # outputs() refused it unless asked
    for key, write in (("report", report), ("plot", plot)):
        if key not in files_out:
            continue
        try:
            files[key] = write(files_out[key], result)
        except Exception as exc:  # noqa: BLE001 - any failure here comes after the charge: keep the release
            saved = files.get("release") or _rescue(result, files_out[key])
            raise SparseDPError(
                f"the release is saved in {saved} (with its ledger: the budget was spent once), but writing its "
                f"{key} {files_out[key]} failed ({type(exc).__name__}: {exc}); re-create the report from the saved "
                f"release, without a new charge: sparsedp report {saved}") from exc
    return files


def _rescue(result: Any, near: Path) -> Path:
    """Save ``result`` next to ``near`` under a name no file has yet (``NAME.rescued.npz``,
    ``NAME.rescued-2.npz``, ...): the only copy of a release whose spec named no release file."""
    for i in range(1, 1000):
        target = near.with_name(f"{near.stem}.rescued{'' if i == 1 else f'-{i}'}.npz")
        if not target.exists():
            return result.save(target)
    raise SparseDPError(f"no free file name for the release next to {near}")  # pragma: no cover
