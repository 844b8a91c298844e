"""`nbx info`: versions and devices, never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np


def _nbx(*args):
    exe = os.path.join(os.path.dirname(sys.executable), "nbx")
    cmd = [exe, *args] if os.path.exists(exe) else [sys.executable, "-m", "nbxtensor.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_info_runs():
    r = _nbx("info")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    out = r.stdout
    import nbxtensor
    assert f"nbxtensor {nbxtensor.__version__}" in out
    assert "Python" in out and f"NumPy     {np.__version__}" in out
    assert "Triton" in out
    assert "cpu      available" in out
    cuda = [ln for ln in out.splitlines() if ln.strip().startswith("cuda")]
    assert cuda, out
    has_gpu = any("compute capability" in ln for ln in cuda)
    if not has_gpu:  # this machine: no GPU, so the reason is given
        assert any(ln.split(None, 1)[1].startswith("unavailable: ") and len(ln) > 25
                   for ln in cuda), cuda


def test_info_without_libcuda(tmp_path):
    """With the driver library unreachable, still no traceback and a reason for cuda."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-m", "nbxtensor.cli", "info"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr
    # the cuda line is there and says why (a bare "cuda" substring would match any path)
    cuda = [ln for ln in r.stdout.splitlines() if ln.startswith("  cuda     ")]
    assert cuda and ("unavailable: " in cuda[0] or "device(s)" in cuda[0]), r.stdout


def test_no_command_is_a_usage_error():
    r = _nbx()
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == ["nbx: error: the following arguments are required: "
                                     "command (see `nbx --help`)"]
    r = _nbx("--help")
    assert r.returncode == 0 and "usage: nbx" in r.stdout and "--debug" in r.stdout
