"""Writing a benchmark's results file: optionally merged with the rows of an earlier run."""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB: ``VmHWM`` of ``/proc/self/status`` where there is
    one (reset by exec, unlike ``getrusage``'s ``ru_maxrss``, which a child started by fork + exec
    inherits from its parent), else ``resource.getrusage``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024.0
    except OSError:  # pragma: no cover - not Linux
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def write_rows(path: str | Path, out: dict[str, Any], merge: bool, key: tuple[str, ...] = ("workload", "n")) -> None:
    """Write ``out`` (with its ``rows``) as JSON to ``path``; with ``merge``, keep the rows of the
    file already there whose ``key`` this run did not measure."""
    p = Path(path)
    if merge and p.exists():
        old = json.loads(p.read_text())
        ran = {tuple(r[k] for k in key) for r in out["rows"]}
        out["rows"] = [r for r in old.get("rows", []) if tuple(r[k] for k in key) not in ran] + out["rows"]
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {p}")
