"""`import nbxtensor` loads NumPy and our own Python only: nothing heavy until first use.

What is imported is checked here; how long that takes is measured by
benchmarks/bench_import.py (a timed assertion would fail on a loaded machine).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

# each costs from tens of ms (jinja2) to seconds (triton, torch) at import; ml_dtypes
# 0.5-1 s on two cores. They load on first use: a bf16/fp8 dtype's `.np`, a cuda or interp
# dispatch, a model or a template.
HEAVY = ("ml_dtypes", "triton", "torch", "jinja2", "tokenizers", "gguf", "safetensors",
         "huggingface_hub", "scipy", "yaml", "requests", "numba", "llvmlite", "PIL")


def _modules_after(code: str) -> dict:
    """Run `code` in a fresh interpreter; its top-level modules and what it printed."""
    probe = (f"import sys, json\n{code}\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    *printed, mods = out.stdout.strip().splitlines()
    return {"modules": set(json.loads(mods)), "printed": printed}


def test_import_loads_nothing_heavy():
    mods = _modules_after("import nbxtensor")["modules"]
    loaded = sorted(m for m in HEAVY if m in mods)
    assert not loaded, f"import nbxtensor imported {', '.join(loaded)}"


def test_float_work_without_bf16_needs_no_ml_dtypes():
    # float32 tensors, the dtype table and finfo of NumPy's own floats stay on NumPy
    r = _modules_after("import nbxtensor as nbx\n"
                       "t = nbx.tensor([1.5, 2.0]).to(nbx.float16) + 1\n"
                       "print(nbx.finfo(nbx.float32).eps, nbx.bfloat16.itemsize, t.tolist())")
    assert "ml_dtypes" not in r["modules"]
    assert r["printed"] == [f"{2.0 ** -23} 2 [2.5, 3.0]"]


def test_ml_dtypes_rows_resolve_on_first_use():
    r = _modules_after("import nbxtensor as nbx\n"
                       "from nbxtensor import dtypes as D\n"
                       "import ml_dtypes, numpy as np\n"
                       # a NumPy dtype of ml_dtypes before its row has resolved `.np`
                       "print(D.as_dtype(ml_dtypes.float8_e5m2) is nbx.float8_e5m2,\n"
                       "      D.as_dtype(np.dtype(ml_dtypes.bfloat16)) is nbx.bfloat16,\n"
                       "      nbx.from_numpy(np.ones(2, ml_dtypes.float8_e4m3fn)).dtype,\n"
                       "      nbx.tensor([1.0], dtype=nbx.bfloat16).numpy().dtype,\n"
                       "      nbx.finfo(nbx.bfloat16).eps)")
    assert r["printed"] == ["True True nbxtensor.float8_e4m3fn bfloat16 0.0078125"]


def test_public_surface():
    import nbxtensor as nbx
    for name in ("tensor", "from_numpy", "empty", "zeros", "ones", "full", "arange", "linspace",
                 "eye", "empty_like", "zeros_like", "ones_like", "full_like", "promote_types",
                 "result_type", "Tensor", "Size", "device", "cat", "stack", "split", "flip",
                 "roll", "tril", "triu", "pad", "repeat_interleave", "movedim"):
        assert hasattr(nbx, name), name
    assert nbx.__version__
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        nbx.nope  # noqa: B018


def test_a_kernel_module_that_fails_to_import_raises_instead_of_hiding_its_ops(monkeypatch):
    """A broken family module must surface its ImportError, not 'X is not implemented'."""
    import importlib
    import nbxtensor.dispatch as d
    real = importlib.import_module

    def broken(name, *a, **k):
        if name == "nbxtensor.backends.cpu.elementwise":
            raise ImportError("simulated: a name this module needs is missing")
        return real(name, *a, **k)
    monkeypatch.setattr(d, "_loaded", set())
    monkeypatch.setattr(d.importlib, "import_module", broken)
    with pytest.raises(ImportError, match="simulated"):
        d._load("numpy")
    assert "numpy" not in d._loaded


def test_import_loads_no_kernel_module_and_no_backend_family():
    r = _modules_after("import nbxtensor\n"
                       "print(sorted(m for m in sys.modules if m.startswith('nbxtensor.kernels')"
                       " or m.startswith('nbxtensor.backends.cuda')))")
    assert r["printed"] == ["[]"], r["printed"]


def test_dispatch_homes_name_the_modules_that_register():
    """dispatch.HOMES says which module registers each op; an op the table places in the
    wrong module would load a module that lacks it (then its whole family)."""
    import nbxtensor.dispatch as d
    for fam in ("numpy", "triton"):
        d._load(fam)
    pkgs = {fam: d._FAMILY_PACKAGES[fam] + "." for fam in ("numpy", "triton")}
    wrong = sorted(f"{name} ({fam}): registered in {fn.__module__}, HOMES says "
                   f"{d.home_of(name, fam)}"
                   for (name, fam), fn in d._IMPLS.items()
                   if fn.__module__.startswith(pkgs[fam]) and fn.__module__ != d.home_of(name, fam))
    assert not wrong, "; ".join(wrong)
    # every module HOMES names exists and registers what it is said to
    for fam, mods in d.HOMES.items():
        for mod, ops in mods.items():
            for op in ops:
                assert (op, fam) in d._IMPLS, (fam, mod, op)


def test_first_ops_import_only_their_modules():
    """The first `x + x` imports the element-wise module of its family, not every family:
    no family is loaded whole (dispatch._loaded stays empty)."""
    probe = ("import nbxtensor as nbx\n"
             "from nbxtensor import dispatch\n"
             "x = nbx.tensor([[1.0, -2.0], [3.0, 4.5]])\n"
             "y = (x + x, nbx.softmax(x, -1), x @ x)\n"
             "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules\n"
             "             if m.startswith('nbxtensor.backends.cpu.')), sorted(dispatch._loaded))\n")
    r = _modules_after(probe)
    cpu, loaded = r["printed"][0].split("] [")
    assert loaded == "]", loaded
    for absent in ("conv", "sort", "pooling", "resample", "moe", "quant", "paged_attention"):
        assert f"'{absent}'" not in cpu, cpu
    pytest.importorskip("triton")
    r = _modules_after("import nbxtensor as nbx\n"
                       "from nbxtensor import dispatch\n"
                       "x = nbx.tensor([1.0, 2.0, 3.0], device='interp')\n"
                       "assert (x + x).tolist() == [2.0, 4.0, 6.0]\n"
                       "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules\n"
                       "             if m.startswith('nbxtensor.kernels.') and\n"
                       "             not m.rsplit('.', 1)[1].startswith('_')), sorted(dispatch._loaded))")
    assert r["printed"] == ["['elementwise'] []"], r["printed"]


def test_a_home_module_that_fails_to_import_raises(monkeypatch):
    import importlib
    import nbxtensor.dispatch as d
    from nbxtensor.device import Device
    real = importlib.import_module

    def broken(name, *a, **k):
        if name == "nbxtensor.backends.cpu.conv":
            raise ImportError("simulated: conv's module is broken")
        return real(name, *a, **k)
    monkeypatch.setattr(d, "_imported", set())
    monkeypatch.setattr(d, "_BY_DEVTYPE", {})
    monkeypatch.setattr(d, "_IMPLS", {k: v for k, v in d._IMPLS.items() if k != ("conv", "numpy")})
    monkeypatch.setattr(d.importlib, "import_module", broken)
    with pytest.raises(ImportError, match="simulated"):
        d.impl("conv", Device("cpu"))
