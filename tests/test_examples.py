import doctest
import os
import subprocess
import sys
from pathlib import Path

import sparsedp

ROOT = Path(__file__).resolve().parent.parent


def test_package_docstring_example():
    result = doctest.testmod(sparsedp, verbose=False)
    assert result.attempted > 0 and result.failed == 0


def test_quickstart_example_runs():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True, text=True,
                         env=env, check=True, timeout=120)
    assert "refused" in out.stdout and "hierarchical k=16" in out.stdout
    # issue 20 #8: the quick start says why one run differs from the expected error, with the
    # per-answer variances and an interval
    assert "Var(last)" in out.stdout and "95% interval" in out.stdout
