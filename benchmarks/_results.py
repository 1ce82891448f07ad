"""Writing a benchmark's results file: optionally merged with the rows of an earlier run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
