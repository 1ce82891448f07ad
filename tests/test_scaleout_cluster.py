"""The real-cluster commands of docs/scaleout.md, on localhost (issue 14).

``dask scheduler`` and ``dask worker ADDRESS`` run as separate processes (as on a real cluster), then
``sparsedp histogram ... --executor dask --scheduler ADDRESS`` publishes through them; the written
release equals the in-process ``release_hierarchical`` with the same seed.  The flags are the ones
the docs give (only the host, port, sizes and paths differ), so a test failure means the docs are wrong.
Skipped when the ``dask`` command line (``dask[distributed]``) is not installed.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sparsedp.scaleout import release_hierarchical

BIN = Path(sys.executable).parent


def _dask_cli() -> str | None:
    exe = BIN / "dask"
    if exe.exists():
        return str(exe)
    return shutil.which("dask")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_workers(address: str, count: int, timeout: float) -> None:
    from distributed import Client

    with Client(address, timeout=timeout) as client:
        client.wait_for_workers(count, timeout=timeout)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a stuck process
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.skipif(_dask_cli() is None, reason="the dask command line (dask[distributed]) is not installed")
def test_docs_cluster_commands_on_localhost(tmp_path):
    pytest.importorskip("distributed")
    dask = _dask_cli()
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    logs = [open(tmp_path / "scheduler.log", "w"), open(tmp_path / "worker.log", "w")]
    # the docs' commands, as separate processes: docs/scaleout.md "Running on a real cluster"
    scheduler = subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                                 stdout=logs[0], stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    procs = [scheduler]
    try:
        worker = subprocess.Popen([dask, "worker", address, "--nworkers", "1", "--nthreads", "2", "--memory-limit",
                                   "1GB", "--no-dashboard"], stdout=logs[1], stderr=subprocess.STDOUT, env=env,
                                  cwd=tmp_path)
        procs.append(worker)
        _wait_for_workers(address, 1, timeout=30)

        x = np.random.default_rng(21).integers(0, 30, 5000)
        data, out = tmp_path / "counts.npy", tmp_path / "release.npy"
        np.save(data, x)
        t0 = time.perf_counter()
        done = subprocess.run([str(BIN / "sparsedp"), "histogram", str(data), "--epsilon", "1", "--executor", "dask",
                               "--scheduler", address, "--k", "4", "--chunk", "256", "--seed", "7", "--out", str(out)],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "on dask" in done.stdout and "20 chunks of 256" in done.stdout
        assert time.perf_counter() - t0 < 60
        want = release_hierarchical(x, 1.0, k=4, chunk=256, rng=7).estimate
        np.testing.assert_array_equal(np.load(out), want)
        assert worker.poll() is None and scheduler.poll() is None  # the CLI closed its client, not the cluster
    finally:
        for p in reversed(procs):
            _stop(p)
        for f in logs:
            f.close()
