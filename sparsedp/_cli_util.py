"""Small pieces shared by the subsystems' command-line tools (no module imports ``sparsedp.cli``)."""

from __future__ import annotations

import sys

__all__ = ["warn_not_private"]


def warn_not_private(seed: int | None, evaluate: bool, truth: str = "the true data") -> bool:
    """Whether the output is a private release; say on stderr why not (a seeded noise generator
    is reproducible; an evaluation compares the release with ``truth``)."""
    if seed is not None:
        print(f"warning: --seed {seed} makes the noise reproducible: this release is NOT private "
              "(for tests and demonstrations only)", file=sys.stderr)
    if evaluate:
        print(f"warning: --evaluate compares the release with {truth}: the output is NOT private",
              file=sys.stderr)
    return seed is None and not evaluate
