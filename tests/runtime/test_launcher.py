"""The launcher: Triton's specialisation rules, refusals, the prepared parameter buffer,
and kernels run through `nbx.launch` on every device (interp in CI, cuda on the GPU).

CI has no GPU: the cuda path is exercised up to the driver with fake cuda tensors, a
fake allocator and a recording cuLaunchKernel; the compile step is real (sm_90).
"""
from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.device import Device
from nbxtensor.tensor import Tensor

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from helpers import assert_close, poisoned, randn, rng  # noqa: E402
from nbxtensor.backends.cuda import launcher as L  # noqa: E402
from fakes import FakeAllocator, fake_cuda  # noqa: E402


# ----------------------------------------------------------------------------- kernels

@triton.jit
def _add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)


@triton.jit
def _axpy_strided(x, out, n, sx, so, alpha, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    v = tl.load(x + i * sx, mask=m).to(tl.float32)
    tl.store(out + i * so, (v * alpha).to(out.dtype.element_ty), mask=m)


@triton.jit
def _scale_rows(x, out, rows, cols, sxr, sxc, sor, soc, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < cols
    v = tl.load(x + r * sxr + c * sxc, mask=m)
    tl.store(out + r * sor + c * soc, v * (r + 1), mask=m)


@triton.jit
def _mixed(p, a, b, c, d, e, f, g, h: tl.constexpr):
    tl.store(p, a + b + c + d + e + f)


@triton.jit(do_not_specialize=["b"], do_not_specialize_on_alignment=["c"])
def _nospec(p, a, b, c, d):
    tl.store(p, a + b + c)


@triton.jit
def _annotated(p, n: tl.int64, s: tl.float32, q: tl.constexpr = 3):
    tl.store(p, n + s + q)


@triton.jit
def _with_default(x, n, BLOCK: tl.constexpr = 64):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)


@triton.jit
def _big_smem(x, out, BLOCK: tl.constexpr):
    # a BLOCK x BLOCK tile transposed through shared memory
    r = tl.arange(0, BLOCK)
    t = tl.load(x + r[:, None] * BLOCK + r[None, :])
    tl.store(out + r[:, None] * BLOCK + r[None, :], tl.trans(t))


# ----------------------------------------------------------------------------- fakes


class Recorder:
    """Stands in for cuLaunchKernel (11 arguments) and cuLaunchKernelEx (4: config, f,
    params, extra): decodes what it is handed into the same fields (Ex: the CUlaunchConfig
    read back from its address: grid, block, shared, stream, launch attributes)."""

    def __init__(self):
        self.calls = []

    def __call__(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert extra is None
        self.calls.append(dict(api="cuLaunchKernel", f=f.value, grid=(gx, gy, gz), block=(bx, by, bz),
                               shared=shared, stream=stream.value or 0, attrs=[],
                               params=[params[i] for i in range(len(params))]))
        return 0

    def ex(self, cfgp, f, params, extra):
        assert extra is None
        c = L.drv.LaunchConfig.from_address(cfgp.value)
        self.calls.append(dict(api="cuLaunchKernelEx", f=f.value, grid=(c.gridDimX, c.gridDimY, c.gridDimZ),
                               block=(c.blockDimX, c.blockDimY, c.blockDimZ), shared=c.sharedMemBytes,
                               stream=c.hStream or 0,
                               attrs=[(c.attrs[i].id, list(c.attrs[i].value[:3])) for i in range(c.numAttrs)],
                               params=[params[i] for i in range(len(params))]))
        return 0


@pytest.fixture(params=["ex", "classic"])
def fake_gpu(monkeypatch, request):
    """The cuda launcher wired to fakes below the compile step (which stays real); the fast
    launchers call cuLaunchKernelEx ("ex", the default where the driver has it) or
    cuLaunchKernel ("classic", older drivers). More than one device: the device check stays."""
    alloc = FakeAllocator()
    rec = Recorder()
    monkeypatch.setattr(L, "_allocator_for", lambda dev: alloc)
    monkeypatch.setattr(L, "_device_info", lambda dev: (90, 232448, 49152))
    monkeypatch.setattr(L, "_load", lambda md, cubin, dev: 0xF00 + dev)
    monkeypatch.setattr(L, "_cuLaunchKernel", rec)
    monkeypatch.setattr(L, "_cuLaunchKernelEx", rec.ex)
    monkeypatch.setattr(L, "_use_ex", request.param == "ex")
    monkeypatch.setattr(L, "_single", False)
    monkeypatch.setattr(L, "_streams", {0: ctypes.c_void_p(0x5)})
    monkeypatch.setattr(L.drv, "set_device", lambda i: setattr(L.drv._tls, "device", i))
    L._forget_verified()
    yield alloc, rec
    L._forget_verified()
    L.drv._tls.__dict__.pop("device", None)


def run_script(tmp_path, code, timeout=300):
    """Run `code` in a fresh interpreter from a file (@triton.jit needs real source)."""
    f = tmp_path / "script.py"
    f.write_text(textwrap.dedent(code))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, str(f)], capture_output=True, text=True, timeout=timeout,
                          env=env)


def read_param(addr, ty):
    fmt = {"Q": "Q", "i32": "i", "i64": "q", "u64": "Q", "fp32": "f", "u1": "B", "fp64": "d"}[ty]
    n = struct.calcsize(fmt)
    return struct.unpack(fmt, ctypes.string_at(addr, n))[0]


# ----------------------------------------------------------------------------- binder vs Triton

class Duck:
    """What triton's specialiser sees of a tensor: .dtype and .data_ptr()."""

    def __init__(self, t):
        self.dtype, self._p = t.dtype, t.data_ptr()

    def data_ptr(self):
        return self._p


def _triton_binding(kernel, args, kwargs):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    targs = [Duck(a) if isinstance(a, Tensor) else a for a in args]
    bound, specialization, options = binder(*targs, **kwargs)
    opts, signature, constexprs, attrs = kernel._pack_args(backend, dict(kwargs), bound, specialization,
                                                           options)
    return signature, constexprs, attrs


VALUES = [0, 1, 2, 8, 24, 16, 17, -16, -8, -1, 2**31 + 8, 2**31 - 1, 2**31, 2**31 + 16, -2**31, -2**31 - 1, 2**63 - 1,
          2**63, 2**64 - 16, 2**64 - 1, 1.0, 0.0, -2.5, True, False, None]


@pytest.mark.parametrize("v", VALUES, ids=repr)
def test_spec_of_matches_native_specialize(v):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    for is_const, spec, align in [(False, True, True), (False, False, True), (False, True, False)]:
        want = native_specialize_impl(BaseBackend, v, is_const, spec, align)
        assert L.spec_of(v, is_const=is_const, specialize=spec, align=align) == tuple(want), (v, spec, align)


@pytest.mark.parametrize("dtype", nbx.all_dtypes, ids=str)
@pytest.mark.parametrize("offset", [0, 1, 4])
def test_spec_of_pointer_matches_native(dtype, offset):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    t = fake_cuda((64,), dtype, offset=offset)
    for is_const, align in [(False, True), (True, True), (False, False)]:
        want = native_specialize_impl(BaseBackend, Duck(t), is_const, True, align)
        assert L.spec_of(t, is_const=is_const, align=align) == tuple(want)


def test_spec_of_refuses_too_large_ints_and_other_objects():
    with pytest.raises(L.KernelArgumentError, match="64-bit"):
        L.spec_of(2**64)
    with pytest.raises(L.KernelArgumentError, match="64-bit"):
        L.spec_of(-2**63 - 1)
    with pytest.raises(L.KernelArgumentError, match="str"):
        L.spec_of("fp32")


CASES = [
    (_mixed, lambda: (fake_cuda((8,)), 1, 16, 17, 2**31, -5, 2.5, True), {"h": 4}),
    (_mixed, lambda: (fake_cuda((8,), offset=1), 0, 1, 2**63, -16, 32, 1.0, False), {"h": 1}),
    (_nospec, lambda: (fake_cuda((8,), nbx.bfloat16), 1, 1, 32, 48), {}),
    (_nospec, lambda: (fake_cuda((8,), nbx.int64, offset=3), 16, 32, 1, None), {}),
    (_annotated, lambda: (fake_cuda((8,), nbx.bool), 16, 2.0), {}),
    (_annotated, lambda: (fake_cuda((8,)), 1, 1.0), {"q": 5}),
    (_add, lambda: (fake_cuda((8,)), fake_cuda((8,), offset=2), fake_cuda((8,), nbx.float16), 1000),
     {"BLOCK": 128, "num_warps": 2}),
    (_with_default, lambda: (fake_cuda((8,), nbx.uint8), 7), {}),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bind_matches_triton_jit(case):
    kernel, make_args, kwargs = CASES[case]
    args = make_args()
    sig, constexprs, attrs, options, runtime = L.bind(kernel, args, kwargs)
    tsig, tconst, tattrs = _triton_binding(kernel, args, kwargs)
    assert sig == tsig
    assert constexprs == tconst
    assert attrs == tattrs
    assert {k: v for k, v in kwargs.items() if k not in kernel.arg_names} == options


def test_bind_refuses_wrong_argument_count_and_keywords():
    x = fake_cuda((8,))
    with pytest.raises(L.KernelArgumentError, match=r"missing n.*takes 5 arguments|takes 5 arguments.*missing n"):
        L.bind(_add, (x, x, x), {"BLOCK": 4})
    with pytest.raises(L.KernelArgumentError, match="takes 5 arguments, got 6 positional"):
        L.bind(_add, (x, x, x, 3, 4, 5), {})
    with pytest.raises(L.KernelArgumentError, match="unknown keyword argument 'BLOK'"):
        L.bind(_add, (x, x, x, 3), {"BLOK": 4})
    with pytest.raises(L.KernelArgumentError, match="both by position and by keyword"):
        L.bind(_add, (x, x, x, 3, 4), {"BLOCK": 4})
    with pytest.raises(L.KernelArgumentError, match="expected a @triton.jit kernel"):
        L.bind(lambda x: x, (x,), {})


def test_declared_param_count_reads_ptx_entry():
    ptx = ".visible .entry k(\n .param .u64 .ptr .global .align 1 k_param_0,\n .param .u32 k_param_1\n)\n{ }"
    assert L.declared_param_count(ptx) == 2


# ----------------------------------------------------------------------------- the cuda path, faked below compile

def test_cuda_launch_packs_parameters_like_tritons_launcher(fake_gpu):
    alloc, rec = fake_gpu
    x, y = fake_cuda((1000,)), fake_cuda((1000,), offset=4)
    out = fake_cuda((1000,), ptr=0x7F0000100000)
    nbx.launch(_add, (8,), x, y, out, 1000, BLOCK=128, num_warps=2)
    (c,) = rec.calls
    assert c["grid"] == (8, 1, 1) and c["block"] == (64, 1, 1) and c["stream"] == 0x5
    assert c["f"] == 0xF00 and c["shared"] == 0
    p = c["params"]
    # x, y, out, n, then Triton 3.6's two scratch pointers (global, profile), both null here
    assert len(p) == 6
    assert [read_param(p[i], "Q") for i in range(3)] == [x.data_ptr(), y.data_ptr(), out.data_ptr()]
    assert read_param(p[3], "i32") == 1000
    assert read_param(p[4], "Q") == 0 and read_param(p[5], "Q") == 0
    assert all(a % 8 == 0 for a in p)

    # the cached path rewrites the same buffer in place
    n_prepared = L.cache_info()["prepared"]
    nbx.launch(_add, (3, 1), y, x, out, 1016, BLOCK=128, num_warps=2)  # same kinds
    c2 = rec.calls[-1]
    assert L.cache_info()["prepared"] == n_prepared
    assert c2["params"] == p
    assert read_param(p[0], "Q") == y.data_ptr() and read_param(p[3], "i32") == 1016
    assert c2["grid"] == (3, 1, 1)


def test_cuda_launch_constant_one_and_wide_ints(fake_gpu):
    alloc, rec = fake_gpu
    p0 = fake_cuda((8,))
    # a=1 is a constexpr (dropped from the buffer); c=2**31 is i64; e=-5 i32; f float; g bool
    nbx.launch(_mixed, (1,), p0, 1, 16, 2**31, 2**63, -5, 2.5, True, h=3)
    p = rec.calls[-1]["params"]
    assert len(p) == 1 + 6 + 2
    assert read_param(p[0], "Q") == p0.data_ptr()
    assert read_param(p[1], "i32") == 16
    assert read_param(p[2], "i64") == 2**31
    assert read_param(p[3], "u64") == 2**63
    assert read_param(p[4], "i32") == -5
    assert read_param(p[5], "fp32") == 2.5
    assert read_param(p[6], "u1") == 1
    # a different kind (a != 1) prepares a separate launch with a in the buffer
    nbx.launch(_mixed, (1,), p0, 7, 16, 2**31, 2**63, -5, 2.5, True, h=3)
    assert len(rec.calls[-1]["params"]) == 1 + 7 + 2
    # a bool is not the int 1 (equal hashes must not share an entry)
    nbx.launch(_mixed, (1,), p0, True, 16, 2**31, 2**63, -5, 2.5, True, h=3)
    assert len(rec.calls[-1]["params"]) == 1 + 7 + 2


@triton.jit
def _times_c(x, out, n, C: tl.constexpr, BLOCK: tl.constexpr):
    # C as an int32, fp32 or int1 constant: x * C has a different type in each compile
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, (tl.load(x + i, mask=m) * C).to(out.dtype.element_ty), mask=m)


@pytest.mark.parametrize("how", ["keyword", "prepared", "positional"])
def test_cuda_launch_constexprs_of_equal_value_and_other_type_compile_apart(fake_gpu, monkeypatch,
                                                                            how):
    # 2 == 2.0 == True... and hash alike, but they are different constants (int32, fp32; True
    # == 1): each must get its own compile, including after the first one has a fast launcher
    alloc, rec = fake_gpu
    loads = []     # a new handle each load: one per prepared entry (True and 1 compile alike)
    monkeypatch.setattr(L, "_load", lambda md, cubin, dev: loads.append(cubin) or 0xF00 + len(loads))
    x, out = fake_cuda((100,), nbx.int32), fake_cuda((100,), nbx.int32, ptr=0x7F0000100000)
    seen = {}
    for c in (2, 2.0, 2, 1, True, 1.0, True, 2.0):
        if how == "keyword":
            nbx.launch(_times_c, (1,), x, out, 100, C=c, BLOCK=128)
        elif how == "prepared":
            L.prepare(_times_c, x, out, 100, C=c, BLOCK=128)((1,), x, out, 100)
        else:
            nbx.launch(_times_c, (1,), x, out, 100, c, BLOCK=128)
        f = rec.calls[-1]["f"]
        seen.setdefault((type(c), c), f)
        assert seen[(type(c), c)] == f, (c, f, seen)
    assert len(set(seen.values())) == 5, seen     # 2, 2.0, 1, True, 1.0: five kernels


def test_cuda_launch_defaults_callable_grid_and_empty_grid(fake_gpu):
    alloc, rec = fake_gpu
    x = fake_cuda((100,))
    nbx.launch(_with_default, lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),), x, 100)
    assert rec.calls[-1]["grid"] == (2, 1, 1)
    n = len(rec.calls)
    nbx.launch(_with_default, (0,), x, 100)
    assert len(rec.calls) == n  # nothing launched


def test_cuda_launch_refuses_wrong_argument_count(fake_gpu):
    x = fake_cuda((8,))
    with pytest.raises(L.KernelArgumentError, match="takes 5 arguments"):
        nbx.launch(_add, (1,), x, x, x, BLOCK=16)
    with pytest.raises(L.KernelArgumentError, match="takes 5 arguments, got 6"):
        nbx.launch(_add, (1,), x, x, x, 8, 16, 4)
    with pytest.raises(L.KernelArgumentError, match="not constexpr"):
        nbx.launch(_add, (1,), x, x, x, n=8, BLOCK=16)


def test_cuda_launch_refuses_foreign_pointer(fake_gpu):
    alloc, rec = fake_gpu
    good = fake_cuda((8,))
    foreign = fake_cuda((8,), ptr=0x1000)
    with pytest.raises(L.ForeignPointerError, match=r"argument 1 .*0x1000.*did not hand out"):
        nbx.launch(_add, (1,), good, foreign, good, 8, BLOCK=16)
    assert rec.calls == []
    # a storage is checked once, then remembered while it lives
    nbx.launch(_add, (1,), good, good, good, 8, BLOCK=16)
    calls = alloc.calls
    nbx.launch(_add, (1,), good, good, good, 8, BLOCK=16)
    assert alloc.calls == calls


def test_cuda_launch_refuses_mixed_devices(fake_gpu):
    a, b = fake_cuda((8,)), fake_cuda((8,), index=1)
    with pytest.raises(ValueError, match="cuda:1.*launch is on cuda:0"):
        nbx.launch(_add, (1,), a, b, a, 8, BLOCK=16)


def test_cuda_launch_refuses_values_that_do_not_fit(fake_gpu):
    x = fake_cuda((8,))
    nbx.launch(_axpy_strided, (1,), x, x, 8, 1, 1, 2.0, BLOCK=16)
    with pytest.raises(L.KernelArgumentError, match="alpha.*fp32"):
        nbx.launch(_axpy_strided, (1,), x, x, 8, 1, 1, 1e300, BLOCK=16)


def test_shared_memory_refusal_with_fake_device_limit(fake_gpu, monkeypatch):
    x = fake_cuda((64 * 64,))
    # compiles for sm_90 (real), then the device limit is checked before any load
    monkeypatch.setattr(L, "_device_info", lambda dev: (90, 4096, 4096))
    loads = []
    monkeypatch.setattr(L, "_load", lambda *a: loads.append(a) or 1)
    with pytest.raises(L.OutOfResourcesError, match=r"_big_smem needs \d+ bytes of shared memory.*at most 4096"):
        nbx.launch(_big_smem, (1,), x, x, BLOCK=64)
    assert loads == []


def test_check_shared_passes_under_the_limit():
    L.check_shared("k", 1000, 1000)
    with pytest.raises(L.OutOfResourcesError):
        L.check_shared("k", 1001, 1000)


def test_compile_imports_no_torch(tmp_path):
    r = run_script(tmp_path, """
        import sys, importlib.abc
        attempts = []
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == 'torch' or name.startswith('torch.'):
                    attempts.append(name)   # even an import that is caught counts
                    raise ImportError('torch import attempted: ' + name)
        sys.meta_path.insert(0, Block())
        import nbxtensor as nbx
        from nbxtensor.backends.cuda import launcher as L
        import triton, triton.language as tl
        @triton.jit
        def k(x, n, BLOCK: tl.constexpr):
            i = tl.arange(0, BLOCK)
            tl.store(x + i, i, mask=i < n)
        sig, c, a, o, rt = L.bind(k, (nbx.zeros(4, device='interp'), 5), {'BLOCK': 16})
        L._compile(k, sig, c, a, o, 90)
        # the interp device too: Triton's specialiser must not get to import torch
        x = nbx.zeros(40, device='interp')
        nbx.launch(k, (1,), x, 40, BLOCK=64)
        assert x.numpy().tolist() == list(range(40))
        assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules)
        assert attempts == [], attempts
        print('ok')
    """, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


# ----------------------------------------------------------------------------- kernels on every device

def _skip_cpu(device):
    if device == "cpu":
        pytest.skip("cpu runs NumPy implementations, not Triton kernels")


@pytest.mark.parametrize("n", [1, 257, 128 * 3 + 1])
def test_launch_add(device, n):
    _skip_cpu(device)
    x, y = randn((n,), device=device), randn((n,), device=device)
    out = poisoned((n,), nbx.float32, device)
    nbx.launch(_add, (triton.cdiv(n, 128),), x, y, out, n, BLOCK=128, num_warps=4)
    assert_close(out, x.numpy().astype(np.float64) + y.numpy())


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.float16, nbx.bfloat16])
def test_launch_strided_views(device, dtype):
    _skip_cpu(device)
    g = rng()
    n = 64 * 5 + 1
    base = randn((3 * n + 5,), dtype, device=device, gen=g)
    x = base[5::3]                               # offset view, stride 3
    out_base = poisoned((2 * n,), dtype, device)
    out = out_base[1::2]
    alpha = float(g.uniform(0.5, 2.0))
    nbx.launch(_axpy_strided, (triton.cdiv(n, 64),), x, out, n, x.stride(0), out.stride(0), alpha,
               BLOCK=64)
    assert_close(out, x.numpy().astype(np.float64) * np.float32(alpha), dtype=dtype)
    assert np.isnan(out_base.numpy()[0::2].astype(np.float64)).all()   # untouched


def test_launch_2d_transposed_input(device):
    _skip_cpu(device)
    rows, cols = 5, 33
    src = randn((cols, rows), device=device)
    x = src.t()                                       # (rows, cols), non-contiguous
    out = poisoned((rows, cols), nbx.float32, device)
    nbx.launch(_scale_rows, lambda m: (rows, triton.cdiv(cols, m["BLOCK"])), x, out, rows, cols,
               *x.stride(), *out.stride(), BLOCK=16)
    assert_close(out, x.numpy().astype(np.float64) * np.arange(1, rows + 1)[:, None])


def test_launch_default_constexpr(device):
    _skip_cpu(device)
    n = 64 * 2 + 1
    x = randn((n,), device=device)
    ref = x.numpy().astype(np.float64) * 2
    nbx.launch(_with_default, (triton.cdiv(n, 64),), x, n)
    assert_close(x, ref)
    # a callable grid sees every bound argument by name, defaults included (cuda and interp)
    nbx.launch(_with_default, lambda m: (triton.cdiv(m["n"], m["BLOCK"]),), x, n)
    assert_close(x, ref * 2)


def test_launch_refusals_on_every_device(device):
    _skip_cpu(device)
    x = randn((8,), device=device)
    with pytest.raises(L.KernelArgumentError, match="takes 5 arguments"):
        nbx.launch(_add, (1,), x, x, x, BLOCK=16)
    with pytest.raises(L.KernelArgumentError, match="unknown keyword"):
        nbx.launch(_add, (1,), x, x, x, 8, BLOCK=16, nm_warps=4)
    with pytest.raises(TypeError, match="grid"):
        nbx.launch(_add, "abc", x, x, x, 8, BLOCK=16)
    for bad in ((), (1, 1, 1, 1), []):     # no dimension / too many: a ValueError naming grid
        with pytest.raises(ValueError, match=r"grid must have 1 to 3 dimensions, got"):
            nbx.launch(_add, bad, x, x, x, 8, BLOCK=16)


def test_launch_refuses_cpu_and_no_tensor():
    x = nbx.zeros(4)
    with pytest.raises(ValueError, match="cannot run Triton kernels"):
        nbx.launch(_add, (1,), x, x, x, 4, BLOCK=16)
    with pytest.raises(ValueError, match="no tensor argument"):
        nbx.launch(_add, (1,), 1, 2, 3, 4, BLOCK=16)


# ----------------------------------------------------------------------------- GPU only (the lead runs these)

cuda = pytest.mark.cuda
needs_gpu = pytest.mark.skipif("cuda" not in os.environ.get("NBX_TEST_DEVICES", "cuda") or
                               not __import__("nbxtensor.backends.cuda.driver", fromlist=["x"]).availability()[0],
                               reason="needs a CUDA device")


@cuda
@needs_gpu
def test_gpu_kernel_fault_is_a_named_error(tmp_path):
    # an illegal address poisons the context, so it runs in its own process
    r = run_script(tmp_path, """
        import nbxtensor as nbx, triton, triton.language as tl
        from nbxtensor.backends.cuda.driver import CudaError
        @triton.jit
        def poke(x, off):
            tl.store(x + off, 1.0)
        x = nbx.zeros(4, device='cuda')
        try:
            nbx.launch(poke, (1,), x, 1 << 40)
            nbx.cuda.synchronize()
        except CudaError as e:
            print('NAME', e.name, '|', e.call)
    """)
    assert "NAME CUDA_ERROR_ILLEGAL_ADDRESS" in r.stdout, r.stdout + r.stderr[-2000:]


@cuda
@needs_gpu
def test_gpu_bad_launch_configuration_is_a_named_error():
    from nbxtensor.backends.cuda import driver as drv
    x = nbx.zeros(4096, device="cuda")
    # num_warps=64 compiles, but 2048 threads per block exceed the device's 1024
    with pytest.raises(drv.CudaError) as ei:
        nbx.launch(_add, (1,), x, x, x, 4096, BLOCK=4096, num_warps=64)
    assert ei.value.name == "CUDA_ERROR_INVALID_VALUE" and "cuLaunchKernel" in ei.value.call
    # the same through the driver entry point directly
    nbx.launch(_add, (1,), x, x, x, 4096, BLOCK=128)
    e = [e for e in L._state.entries.values()
         if getattr(e, "name", None) == "_add" and e.block == 128][0]
    with pytest.raises(drv.CudaError) as ei:
        drv.launch_kernel(e.f.value, (1, 1, 1), (2048, 1, 1), 0, 0, e.params)
    assert ei.value.name == "CUDA_ERROR_INVALID_VALUE"
    with pytest.raises(ValueError, match="grid dimension 1"):
        nbx.launch(_add, (1, 70000), x, x, x, 4096, BLOCK=128)   # checked before the driver
    nbx.cuda.synchronize()  # the context survives all of these
    assert (x.numpy() == 0).all()


@cuda
@needs_gpu
def test_gpu_ten_thousand_launches_leave_allocated_bytes_unchanged():
    n = 1000
    x, y = randn((n,), device="cuda"), randn((n,), device="cuda")
    out = nbx.empty(n, device="cuda")
    nbx.launch(_add, (8,), x, y, out, n, BLOCK=128)
    nbx.cuda.synchronize()
    before = nbx.cuda.memory_allocated()
    for _ in range(10_000):
        nbx.launch(_add, (8,), x, y, out, n, BLOCK=128)
    nbx.cuda.synchronize()
    assert nbx.cuda.memory_allocated() == before
    assert_close(out, x.numpy().astype(np.float64) + y.numpy())


@cuda
@needs_gpu
def test_gpu_launch_on_a_side_stream():
    n = 4097
    x, y = randn((n,), device="cuda"), randn((n,), device="cuda")
    out = poisoned((n,), nbx.float32, "cuda")
    s = nbx.cuda.Stream()
    nbx.cuda.synchronize()   # a non-blocking stream does not wait for the poison fill
    with nbx.cuda.stream(s):
        nbx.launch(_add, (triton.cdiv(n, 256),), x, y, out, n, BLOCK=256)
    s.synchronize()
    assert_close(out, x.numpy().astype(np.float64) + y.numpy())


@cuda
@needs_gpu
def test_gpu_large_shared_memory_kernel_opts_in():
    # 128x128 fp32 transpose through shared memory: 64 KB > the default 48 KB
    b = 128
    x = randn((b * b,), device="cuda")
    out = poisoned((b * b,), nbx.float32, "cuda")
    nbx.launch(_big_smem, (1,), x, out, BLOCK=b, num_warps=8)
    nbx.cuda.synchronize()
    assert_close(out, x.numpy().reshape(b, b).T.reshape(-1).astype(np.float64))


@cuda
@needs_gpu
def test_gpu_cuda_run_imports_no_torch(tmp_path):
    r = run_script(tmp_path, """
        import sys, nbxtensor as nbx, triton, triton.language as tl
        @triton.jit
        def k(x, n, BLOCK: tl.constexpr):
            i = tl.arange(0, BLOCK)
            tl.store(x + i, i.to(tl.float32), mask=i < n)
        x = nbx.empty(100, device='cuda')
        nbx.launch(k, (1,), x, 100, BLOCK=128)
        nbx.cuda.synchronize()
        assert (x.numpy() == range(100)).all()
        print('torch' in sys.modules)
    """)
    assert r.stdout.strip().endswith("False"), r.stdout + r.stderr[-2000:]


@triton.jit
def _rowmax(x, out, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out, tl.max(tl.load(x + i, mask=i < n, other=-float("inf")), axis=0))


def test_interp_leaves_triton_language_unpatched_so_cuda_compiles_after():
    # Triton's interpreter leaves triton.language.core patched after nested @jit calls
    # (tl.max is one); the runner must undo that, or every later compile fails.
    import triton.language as tlang
    before = dict(vars(tlang.core))
    x = randn((37,), device="interp")
    out = poisoned((1,), nbx.float32, "interp")
    nbx.launch(_rowmax, (1,), x, out, 37, BLOCK=64)
    assert_close(out, np.array([x.numpy().max()], np.float64))
    after = vars(tlang.core)
    assert [k for k in before if after.get(k) is not before[k]] == []
    sig, c, a, o, _ = L.bind(_rowmax, (x, out, 37), {"BLOCK": 64})
    L._compile(_rowmax, sig, c, a, o, 90)


def test_cuda_launch_with_the_real_allocator_over_fake_memory(fake_gpu, monkeypatch):
    # the allocator's own holds(): storages it handed out pass, others are refused, and
    # a 10,000-launch loop leaves its statistics unchanged
    memory = pytest.importorskip("nbxtensor.backends.cuda.memory")
    from nbxtensor.backends.cuda.storage import CudaStorage
    alloc = memory.CachingAllocator(memory.FakeRaw(), "cuda:0")
    monkeypatch.setattr(L, "_allocator_for", lambda dev: alloc)
    dev = Device("cuda", 0)

    def tensor(n):
        st = CudaStorage(dev, 4 * n, alloc.malloc(4 * n), alloc)
        return Tensor._make(st, (n,), (1,), 0, nbx.float32)

    x, y, out = tensor(1000), tensor(1000), tensor(1000)
    _, rec = fake_gpu
    nbx.launch(_add, (8,), x, y, out, 1000, BLOCK=128)
    stats = dict(alloc.stats()) if hasattr(alloc, "stats") else None
    for _ in range(10_000):
        nbx.launch(_add, (8,), x, y, out, 1000, BLOCK=128)
    assert len(rec.calls) == 10_001
    if stats is not None:
        assert dict(alloc.stats()) == stats
    foreign = Tensor._make(CudaStorage(dev, 4000, None, None), (1000,), (1,), 0, nbx.float32)
    foreign._storage.ptr = 0x1234000   # memory the allocator never handed out
    with pytest.raises(L.ForeignPointerError, match="0x1234000"):
        nbx.launch(_add, (8,), x, foreign, out, 1000, BLOCK=128)
    empty = Tensor._make(CudaStorage(dev, 0, None, None), (0,), (1,), 0, nbx.float32)
    nbx.launch(_add, (0,), empty, empty, empty, 0, BLOCK=128)   # empty: accepted, nothing launched
    assert len(rec.calls) == 10_001


def test_cuda_launch_clusters_go_through_launch_kernel_ex(fake_gpu):
    # num_ctas > 1: Triton's launcher multiplies grid x by num_ctas and sets a cluster
    # dimension and the spread scheduling policy through cuLaunchKernelEx
    from nbxtensor.backends.cuda import driver as drv
    alloc, rec = fake_gpu
    x = fake_cuda((4096,))
    for k in range(3):     # the general path, then the fast one (Ex available) or general again
        nbx.launch(_add, (3, 2 + k), x, x, x, 4096, BLOCK=256, num_ctas=2, num_warps=4)
        c = rec.calls[-1]
        assert c["api"] == "cuLaunchKernelEx"
        assert c["grid"] == (6, 2 + k, 1) and c["block"] == (128, 1, 1) and c["stream"] == 0x5
        assert len(c["params"]) == 6 and read_param(c["params"][3], "i32") == 4096
        assert c["attrs"] == [(drv.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, [2, 1, 1]),
                              (drv.LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                               [drv.CLUSTER_SCHEDULING_POLICY_SPREAD, 0, 0])]


def test_cuda_launch_constexpr_passed_positionally_dispatches_on_its_value(fake_gpu, monkeypatch):
    compiled = []
    real = L._compile
    monkeypatch.setattr(L, "_compile", lambda k, sig, c, *a: compiled.append(dict(c)) or real(k, sig, c, *a))
    x = fake_cuda((4096,))
    for block in (128, 64, 128, 64):
        nbx.launch(_add, (4,), x, x, x, 4096, block)
    assert [c[(4,)] for c in compiled] == [128, 64]


# ----------------------------------------------------------------------------- fast launchers, prepare()

def _decoded(call, types):
    """A recorded launch as comparable values: function, grid, block, shared, stream,
    parameters, parameter count, launch attributes (decoded from the Ex config too)."""
    p = call["params"]
    return (call["f"], call["grid"], call["block"], call["shared"], call["stream"],
            [read_param(p[i], ty) for i, ty in enumerate(types)], len(p), call["attrs"])


@pytest.fixture
def distinct_loads(fake_gpu, monkeypatch):
    # one fake CUfunction per compiled kernel, so a launch shows which compilation it used
    loaded = {}
    monkeypatch.setattr(L, "_load", lambda md, cubin, dev: loaded.setdefault(md.hash, 0xF000 + 16 * len(loaded)))
    return fake_gpu


def test_fast_launcher_is_used_after_the_first_launch(fake_gpu, monkeypatch):
    alloc, rec = fake_gpu
    x, y, out = fake_cuda((1000,)), fake_cuda((1000,), offset=4), fake_cuda((1000,), ptr=0x7F0000100000)
    nbx.launch(_add, (8,), x, y, out, 1000, BLOCK=128)
    slow = []
    real = L._lookup
    monkeypatch.setattr(L, "_lookup", lambda *a: slow.append(a) or real(*a))
    nbx.launch(_add, (3, 2), y, x, out, 1000 + 32, BLOCK=128)      # same kinds, new values
    assert slow == []
    c = rec.calls[-1]
    assert c["grid"] == (3, 2, 1) and c["stream"] == 0x5
    assert [read_param(c["params"][i], "Q") for i in range(3)] == [y.data_ptr(), x.data_ptr(), out.data_ptr()]
    assert read_param(c["params"][3], "i32") == 1032
    # the current stream is read on every launch
    monkeypatch.setitem(L._streams, 0, ctypes.c_void_p(0x77))
    nbx.launch(_add, (2, 1, 3), y, x, out, 1000, BLOCK=128)
    assert rec.calls[-1]["stream"] == 0x77 and rec.calls[-1]["grid"] == (2, 1, 3) and slow == []


# argument values of every class the general path keys on; each launch is compared with the
# same launch through the general path (fast launchers forgotten first)
_MIXED_VALUES = dict(
    a=[1, 16, 17, -32, 2**31 + 16, 2**31 + 3, 2**63 + 16, True, 2.5],
    b=[0, 5, -2**31, 2**32],
    c=[7, 1, 64],
)
_MIXED_FEW = dict(a=[16, 17, 1], b=[0, 5], c=[7])     # few kinds: launchers meet other kinds often


# launch options whose entries need launch attributes (cuLaunchKernelEx): PDL, a cluster
_ATTR_OPTIONS = [{}, {"launch_pdl": True}, {"num_ctas": 2}, {"launch_cooperative_grid": True}]


@pytest.mark.parametrize("opts", _ATTR_OPTIONS, ids=["plain", "pdl", "cluster", "cooperative"])
def test_fast_launchers_agree_with_the_general_path(distinct_loads, opts, monkeypatch):
    from nbxtensor.backends.cuda import driver as drv
    alloc, rec = distinct_loads
    slow_paths = []
    real = L._lookup
    monkeypatch.setattr(L, "_lookup", lambda *a: slow_paths.append(1) or real(*a))
    g = rng()
    bases = [fake_cuda((64,), dt) for dt in (nbx.float32, nbx.int64)]
    kw = {"h": 2, **opts}
    want_attrs = {"plain": [], "pdl": [(drv.LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, [1, 0, 0])],
                  "cluster": [(drv.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, [2, 1, 1]),
                              (drv.LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                               [drv.CLUSTER_SCHEDULING_POLICY_SPREAD, 0, 0])],
                  "cooperative": [(drv.LAUNCH_ATTRIBUTE_COOPERATIVE, [1, 0, 0])]}
    want_attrs = want_attrs["pdl" if "launch_pdl" in opts else "cluster" if "num_ctas" in opts
                            else "cooperative" if opts else "plain"]
    steps = 100 if not opts else 60
    for step in range(steps):
        p0 = bases[int(g.integers(2))]
        p0 = p0[int(g.integers(3)):]                       # 16-byte aligned or not
        values = _MIXED_VALUES if step < 30 else _MIXED_FEW
        a, b, c = (v[int(g.integers(len(v)))] for v in values.values())
        grid = tuple(int(v) for v in g.integers(1, 5, size=int(g.integers(1, 4))))
        args = (p0, a, b, c, -5, 1.5, 2.0, False)
        _, _, _, _, runtime = L.bind(_mixed, args, kw)
        types = ["Q" if ty[0] == "*" else ty for _, ty, _ in runtime]
        n_slow = len(slow_paths)
        nbx.launch(_mixed, grid, *args, **kw)             # a fast launcher where one matches
        fast_call = rec.calls[-1]
        fast = _decoded(fast_call, types)
        served = len(slow_paths) == n_slow    # random history: served or not
        kept = L._fast_list(_mixed, kw)
        L._state.fast.pop(id(_mixed), None)
        nbx.launch(_mixed, grid, *args, **kw)             # the general path
        slow_call = rec.calls[-1]
        slow = _decoded(slow_call, types)
        # keep the recent launchers (other kinds) in line, as in a real sequence of launches
        fl = L._fast_list(_mixed, kw)
        fl += [k for k in kept if k is not fl[0]][:3]
        assert fast == slow, (step, args)
        assert slow[5] == [p0.data_ptr() if t == "Q" else v for t, (_, _, v) in zip(types, runtime)]
        assert slow[6] == len(runtime) + 2
        assert slow[7] == want_attrs
        if served and (opts or L._use_ex):     # Ex fast launchers (with attributes: only Ex)
            assert fast_call["api"] == "cuLaunchKernelEx", fast_call
        elif served:
            assert fast_call["api"] == "cuLaunchKernel", fast_call
        if opts and not L._use_ex:             # a driver without Ex: no fast launcher for these
            assert not served
        if opts:   # attributes: the general path calls Ex too, grid x times num_ctas
            assert slow_call["api"] == "cuLaunchKernelEx"
            assert slow[1][0] == grid[0] * opts.get("num_ctas", 1)
        # the same launch again: the launcher the general path just put first serves it
        n_slow = len(slow_paths)
        nbx.launch(_mixed, grid, *args, **kw)
        again = rec.calls[-1]
        assert _decoded(again, types) == slow, (step, args)
        if opts and not L._use_ex:
            assert len(slow_paths) == n_slow + 1
        else:
            assert len(slow_paths) == n_slow, (step, args)
            assert again["api"] == ("cuLaunchKernelEx" if L._use_ex else "cuLaunchKernel")


def test_fast_launcher_redispatches_when_kinds_change(distinct_loads):
    alloc, rec = distinct_loads
    x, out = fake_cuda((4096,)), fake_cuda((4096,), ptr=0x7F0000100000)
    nbx.launch(_add, (1,), x, x, out, 4096, BLOCK=128)
    f_aligned = rec.calls[-1]["f"]
    nbx.launch(_add, (1,), x[1:], x, out, 4095, BLOCK=128)      # misaligned pointer, n % 16 != 0
    assert rec.calls[-1]["f"] != f_aligned
    nbx.launch(_add, (1,), x, x, out, 4096, BLOCK=128)          # back: the first compilation
    assert rec.calls[-1]["f"] == f_aligned
    nbx.launch(_add, (1,), x, x, out, 1, BLOCK=128)             # the constant 1: not packed
    assert len(rec.calls[-1]["params"]) == 3 + 2
    nbx.launch(_add, (1,), x, x, out, 4096, BLOCK=64)           # other constexpr
    assert rec.calls[-1]["f"] not in (f_aligned,)
    h = fake_cuda((4096,), nbx.float16)
    nbx.launch(_add, (1,), h, h, h, 4096, BLOCK=128)            # other dtype
    assert rec.calls[-1]["f"] != f_aligned
    assert read_param(rec.calls[-1]["params"][0], "Q") == h.data_ptr()


def test_fast_launcher_keeps_every_refusal(fake_gpu):
    alloc, rec = fake_gpu
    x = fake_cuda((64,))
    nbx.launch(_axpy_strided, (1,), x, x, 8, 1, 1, 2.0, BLOCK=16)
    n = len(rec.calls)
    foreign = fake_cuda((64,), ptr=0x1000)                       # a new storage: checked
    with pytest.raises(L.ForeignPointerError, match="0x1000"):
        nbx.launch(_axpy_strided, (1,), foreign, x, 8, 1, 1, 2.0, BLOCK=16)
    with pytest.raises(L.KernelArgumentError, match="alpha.*fp32"):
        nbx.launch(_axpy_strided, (1,), x, x, 8, 1, 1, 1e300, BLOCK=16)
    with pytest.raises(L.KernelArgumentError, match="takes 7 arguments"):
        nbx.launch(_axpy_strided, (1,), x, x, 8, 1, 1, BLOCK=16)
    with pytest.raises(ValueError, match="grid dimension 1 = 70000"):
        nbx.launch(_axpy_strided, (1, 70000), x, x, 8, 1, 1, 2.0, BLOCK=16)
    with pytest.raises(TypeError, match="grid must hold ints"):
        nbx.launch(_axpy_strided, (1.0,), x, x, 8, 1, 1, 2.0, BLOCK=16)
    with pytest.raises(ValueError, match="cuda:1.*launch is on cuda:0"):
        nbx.launch(_axpy_strided, (1,), x, fake_cuda((64,), index=1), 8, 1, 1, 2.0, BLOCK=16)
    nbx.launch(_axpy_strided, (0,), x, x, 8, 1, 1, 2.0, BLOCK=16)          # empty grid: nothing
    assert len(rec.calls) == n


def test_fast_launcher_makes_its_device_current(fake_gpu, monkeypatch):
    alloc, rec = fake_gpu
    x = fake_cuda((64,))
    nbx.launch(_add, (1,), x, x, x, 64, BLOCK=16)
    made = []
    monkeypatch.setattr(L.drv, "set_device", lambda i: made.append(i) or setattr(L.drv._tls, "device", i))
    L.drv._tls.device = 1          # another device's context became current in this thread
    nbx.launch(_add, (1,), x, x, x, 64, BLOCK=16)
    assert made == [0] and len(rec.calls) == 2


def test_fast_launcher_launch_error_is_named(fake_gpu, monkeypatch):
    from nbxtensor.backends.cuda.driver import CudaError
    alloc, rec = fake_gpu
    x = fake_cuda((64,))
    nbx.launch(_add, (1,), x, x, x, 64, BLOCK=16)
    monkeypatch.setattr(L, "_cuLaunchKernel", lambda *a: 1)
    monkeypatch.setattr(L, "_cuLaunchKernelEx", lambda *a: 1)
    with pytest.raises(CudaError, match=r"cuLaunchKernel(Ex)?\(kernel=_add, grid=\(2, 1, 1\), "
                                        r"block=\(128, 1, 1\).*INVALID_VALUE"):
        nbx.launch(_add, (2,), x, x, x, 64, BLOCK=16)


def test_fast_launchers_are_per_thread(fake_gpu):
    import threading
    alloc, rec = fake_gpu
    x, y = fake_cuda((64,)), fake_cuda((64,), ptr=0x7F0000100000)
    nbx.launch(_add, (1,), x, x, x, 64, BLOCK=16)
    nbx.launch(_add, (1,), x, x, x, 64, BLOCK=16)
    main_params = rec.calls[-1]["params"]
    err, seen = [], []

    def other():
        try:
            nbx.launch(_add, (1,), y, y, y, 48, BLOCK=16)
            nbx.launch(_add, (1,), y, y, y, 48, BLOCK=16)
            p = rec.calls[-1]["params"]   # read while the thread (and its buffers) live
            seen.extend([p[0], read_param(p[0], "Q"), read_param(p[3], "i32")])
        except BaseException as e:   # pragma: no cover - reported below
            err.append(e)

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert not err, err
    # the other thread packed its own buffer: this thread's still holds x and 64
    assert seen[0] != main_params[0] and seen[1:] == [y.data_ptr(), 48]
    assert read_param(main_params[0], "Q") == x.data_ptr() and read_param(main_params[3], "i32") == 64


def test_prepare_launches_and_redispatches(distinct_loads, monkeypatch):
    alloc, rec = distinct_loads
    x, out = fake_cuda((4096,)), fake_cuda((4096,), ptr=0x7F0000100000)
    add = L.prepare(_add, x, x, out, 4096, BLOCK=128, num_warps=2)
    assert rec.calls == []                       # prepare compiles, launches nothing
    slow = []
    real = L._lookup
    monkeypatch.setattr(L, "_lookup", lambda *a: slow.append(a) or real(*a))
    add((4,), out, x, x, 4064)       # prepare made the device current: fast at once
    add((4,), out, x, x, 4064)
    assert len(slow) == 0
    c = rec.calls[-1]
    f0 = c["f"]
    assert c["grid"] == (4, 1, 1) and c["block"] == (64, 1, 1)
    assert [read_param(c["params"][i], "Q") for i in range(3)] == [out.data_ptr(), x.data_ptr(), x.data_ptr()]
    # an assumption the compiled kernel relies on breaks (16-byte alignment): re-dispatched
    add((1,), x[2:], x, out, 4064)
    assert len(slow) == 1 and rec.calls[-1]["f"] != f0
    assert read_param(rec.calls[-1]["params"][0], "Q") == x.data_ptr() + 8
    assert len(add.launchers) == 2
    add((1,), x[2:], x, out, 4064)               # now a prepared kind too
    add((1,), x, x, out, 4064)
    assert len(slow) == 1
    with pytest.raises(L.KernelArgumentError, match="takes 5 arguments"):
        add((1,), x, x, out)
    with pytest.raises(L.ForeignPointerError):
        add((1,), fake_cuda((8,), ptr=0x1000), x, out, 8)


def test_prepare_refuses_non_cuda():
    with pytest.raises(ValueError, match="no tensor argument"):
        L.prepare(_add, 1, 2, 3, 4, BLOCK=16)
    x = nbx.zeros(8, device="interp")
    with pytest.raises(ValueError, match="interp"):
        L.prepare(_add, x, x, x, 8, BLOCK=16)


@triton.jit
def _rt_default(x, n, scale=2.5, m=48, BLOCK: tl.constexpr = 16):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + i, tl.load(x + i, mask=i < n) * scale + m, mask=i < n)


def test_fast_launcher_none_constants_and_runtime_defaults(fake_gpu):
    # None and the constant 1 are guarded, not packed; runtime defaults are appended
    alloc, rec = fake_gpu
    p = fake_cuda((8,))
    for _ in range(2):
        nbx.launch(_nospec, (1,), p, 1, 1, 32, None)
        assert len(rec.calls[-1]["params"]) == 3 + 2     # p, b (=1, not specialised), c
        nbx.launch(_rt_default, (1,), p, 7)
        prm = rec.calls[-1]["params"]
        assert (read_param(prm[1], "i32"), read_param(prm[2], "fp32"), read_param(prm[3], "i32")) == (7, 2.5, 48)
    srcs = [fn.source for rec in L._state.fast.values() for fl in rec[2].values() for fn in fl]
    assert any("a4 is not None" in s for s in srcs) and any("*TAIL" in s for s in srcs)


@cuda
@needs_gpu
def test_gpu_fast_launchers_and_prepare_compute_the_right_results():
    # alternating kinds (aligned / misaligned views, n divisible by 16 or not) through
    # nbx.launch and a prepared launcher: every launch checked against NumPy
    n = 4096
    x, y = randn((n + 16,), device="cuda"), randn((n + 16,), device="cuda")
    add = L.prepare(_add, x, y, x, n, BLOCK=256)
    for step in range(6):
        off, m = (0, n) if step % 2 == 0 else (1, n - 3)
        a, b = x[off:off + m], y[off:off + m]
        for launcher in ("launch", "prepared"):
            out = poisoned((m,), nbx.float32, "cuda")
            if launcher == "launch":
                nbx.launch(_add, (triton.cdiv(m, 256),), a, b, out, m, BLOCK=256)
            else:
                add((triton.cdiv(m, 256),), a, b, out, m)
            assert_close(out, a.numpy().astype(np.float64) + b.numpy())


def test_bench_launch_cpu_overhead_mode_runs(tmp_path):
    # the no-GPU microbenchmark of benchmarks/bench_launch.py: runs, and reports each row
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = run_script(tmp_path, f"""
        import sys
        sys.path.insert(0, {os.path.join(root, 'benchmarks')!r})
        import bench_launch
        from nbxtensor.backends.cuda import launcher as L
        rep = bench_launch.cpu_overhead_compare({{"nbx": L}}, n_calls=50, repeats=2)
        assert set(rep["min_us"]) == {{"stub (ctypes, argtypes)", "stub (ctypes, raw)",
                                       "stub Ex (ctypes, raw)", "launch_public [nbx]",
                                       "Ex fast path [nbx]", "Ex, device check kept [nbx]",
                                       "cuLaunchKernel fast path [nbx]", "prepare()(...) [nbx]"}}, rep
        assert all(v > 0 for v in rep["min_us"].values())
        print("ok")
    """, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def test_cache_info_counts_fast_launchers_not_keyword_variants(monkeypatch):
    # _state.fast is {id(kernel): {constexpr keywords: [fast launchers]}}
    monkeypatch.setattr(L._state, "fast", {1: [None, (), {(("BLOCK", 128),): [len, abs, min]}],
                                           2: [None, (), {(): [max], (("BLOCK", 64),): []}]},
                        raising=False)
    assert L.cache_info()["fast"] == 4


# ----------------------------------------------------------------------------- this session: Ex, marks, grids

def test_empty_grid_is_a_value_error_naming_grid(fake_gpu):
    alloc, rec = fake_gpu
    x = fake_cuda((64,))
    for k in range(3):      # before any fast launcher, then with one in front
        for bad in ((), (1, 2, 3, 4), [], lambda meta: ()):
            with pytest.raises(L.GridError, match=r"grid must have 1 to 3 dimensions") as ei:
                nbx.launch(_add, bad, x, x, x, 64, BLOCK=16)
            assert isinstance(ei.value, ValueError) and isinstance(ei.value, TypeError)
        nbx.launch(_add, (1,), x, x, x, 64, BLOCK=16)
    nbx.launch(_add, (0, 3), x, x, x, 64, BLOCK=16)     # a zero-size dimension: nothing launched
    assert len(rec.calls) == 3


def test_single_device_drops_the_device_check(fake_gpu, monkeypatch):
    alloc, rec = fake_gpu
    monkeypatch.setattr(L, "_single", True)
    x = fake_cuda((64,))
    nbx.launch(_add, (1,), x, x, x, 64, BLOCK=16)
    (fn,) = L._fast_list(_add, {"BLOCK": 16})
    assert "_tls" not in fn.source
    nbx.launch(_add, (2,), x, x, x, 48, BLOCK=16)
    assert rec.calls[-1]["grid"] == (2, 1, 1) and read_param(rec.calls[-1]["params"][3], "i32") == 48
    monkeypatch.setattr(L, "_single", False)   # more than one device: the check is generated
    L.clear_cache()
    nbx.launch(_add, (1,), x, x, x, 64, BLOCK=16)
    (fn,) = L._fast_list(_add, {"BLOCK": 16})
    assert "_tls.device != 0" in fn.source


def test_fresh_allocations_take_the_fast_path(fake_gpu, monkeypatch):
    # a storage the caching allocator just handed out is marked at birth: an op's fresh output
    # goes through the fast launcher at once (no allocator lookup, no general path), and a
    # storage of device 1 is still refused for a device-0 launch
    from nbxtensor.backends.cuda import memory, storage
    from nbxtensor.tensor import contiguous_strides
    alloc, rec = fake_gpu
    monkeypatch.setattr(storage, "_stream_handle", lambda i: 0)
    fakes = {i: memory.CachingAllocator(memory.FakeRaw(), f"cuda:{i}") for i in (0, 1)}
    monkeypatch.setattr(storage, "allocator_for", lambda i: fakes[i])
    alloc.lo, alloc.hi = 0, 1 << 62     # the launcher's allocator check accepts the fake pool

    def fresh(index=0):
        st = storage.CudaStorage.allocate(Device("cuda", index), 256)
        return Tensor._make(st, (64,), contiguous_strides((64,)), 0, nbx.float32)
    x = fresh()
    nbx.launch(_add, (1,), x, x, fresh(), 64, BLOCK=16)    # builds the entry
    slow = []
    real = L._lookup
    monkeypatch.setattr(L, "_lookup", lambda *a: slow.append(1) or real(*a))
    checks = alloc.calls
    for _ in range(3):
        nbx.launch(_add, (1,), x, x, fresh(), 64, BLOCK=16)
    assert slow == [] and alloc.calls == checks and len(rec.calls) == 4
    with pytest.raises(ValueError, match="cuda:1.*launch is on cuda:0"):
        nbx.launch(_add, (1,), x, x, fresh(1), 64, BLOCK=16)
    # forgetting verifications makes the birth marks stale too
    L._forget_verified()
    nbx.launch(_add, (1,), x, x, x, 64, BLOCK=16)
    assert alloc.calls > checks


def test_verification_marks_and_the_id_fallback(fake_gpu, monkeypatch):
    # a storage with the slot is marked once verified; one without it is found by id; both get
    # the fast path, and neither lets a foreign or other-device storage through
    alloc, rec = fake_gpu
    slow = []
    real = L._lookup
    monkeypatch.setattr(L, "_lookup", lambda *a: slow.append(1) or real(*a))
    m = fake_cuda((64,))
    u = fake_cuda((64,), ptr=0x7F0000100000, mark=False)
    for k in range(3):
        nbx.launch(_add, (1,), m, u, m, 64, BLOCK=16)
    assert len(slow) == 1 and m._storage._nbx_launch is L._vtoken(0)
    assert id(u._storage) in L._verified[0] and id(m._storage) in L._verified[0]
    assert "_nbx_launch is not V" in L._fast_list(_add, {"BLOCK": 16})[0].source
    assert "id(s1) not in vd" in L._fast_list(_add, {"BLOCK": 16})[0].source
    # a new, unverified storage of either class: checked by the general path (here: foreign)
    for mark in (True, False):
        bad = fake_cuda((64,), ptr=0x1000, mark=mark)
        with pytest.raises(L.ForeignPointerError):
            nbx.launch(_add, (1,), m, bad, m, 64, BLOCK=16)
        with pytest.raises(L.ForeignPointerError):
            nbx.launch(_add, (1,), bad, u, m, 64, BLOCK=16)
    # a storage verified on device 1 is not verified for a device-0 launch
    d1 = fake_cuda((64,), index=1)
    nbx.launch(_add, (1,), d1, d1, d1, 64, BLOCK=16)
    assert d1._storage._nbx_launch is L._vtoken(1)
    with pytest.raises(ValueError, match="cuda:1.*launch is on cuda:0"):
        nbx.launch(_add, (1,), m, d1, m, 64, BLOCK=16)
    # a host tensor reaching a cuda fast launcher: declined, then the general path's refusal
    h = nbx.zeros(64, device="interp")
    with pytest.raises(ValueError, match="interp"):
        nbx.launch(_add, (1,), m, h, m, 64, BLOCK=16)
    # forgetting verifications: new tokens, the marks no longer match, storages re-checked
    L._forget_verified()
    calls = alloc.calls
    nbx.launch(_add, (1,), m, u, m, 64, BLOCK=16)
    assert alloc.calls > calls


def test_prepared_launcher_from_another_thread_takes_the_general_path(fake_gpu, monkeypatch):
    import threading
    alloc, rec = fake_gpu
    x = fake_cuda((64,))
    add = L.prepare(_add, x, x, x, 64, BLOCK=16)
    slow = []
    real = L._lookup
    monkeypatch.setattr(L, "_lookup", lambda *a: slow.append(threading.get_ident()) or real(*a))
    add((1,), x, x, x, 64)
    assert slow == []
    th = threading.Thread(target=lambda: add((1,), x, x, x, 64))
    th.start()
    th.join()
    assert len(slow) == 1 and slow[0] != threading.get_ident() and len(rec.calls) == 2


def test_pdl_entries_get_ex_fast_launchers(fake_gpu, monkeypatch):
    from nbxtensor.backends.cuda import driver as drv
    alloc, rec = fake_gpu
    slow = []
    real = L._lookup
    monkeypatch.setattr(L, "_lookup", lambda *a: slow.append(1) or real(*a))
    x, y = fake_cuda((4096,)), fake_cuda((4096,), ptr=0x7F0000100000)
    for k in range(4):
        nbx.launch(_add, (k + 1, 2), x, y, x, 4096 - 16 * k, BLOCK=128, launch_pdl=True)
        c = rec.calls[-1]
        assert c["api"] == "cuLaunchKernelEx" and c["grid"] == (k + 1, 2, 1) and c["stream"] == 0x5
        assert c["attrs"] == [(drv.LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, [1, 0, 0])]
        assert read_param(c["params"][3], "i32") == 4096 - 16 * k
        assert [read_param(c["params"][i], "Q") for i in range(3)] == [x.data_ptr(), y.data_ptr(), x.data_ptr()]
    # Ex: one general-path launch, then fast; without Ex (old driver) all take the general path
    assert len(slow) == (1 if L._use_ex else 4)
    # the same kernel without PDL is another entry: no attribute
    nbx.launch(_add, (1,), x, y, x, 4096, BLOCK=128)
    assert rec.calls[-1]["attrs"] == []


@triton.jit
def _pdl_producer(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + i, mask=i < n)
    for _ in range(8):                 # some work, so a consumer that did not wait would race
        v = v * 1.0001 + 0.5
    tl.store(out + i, v, mask=i < n)
    tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_consumer(a, out, n, BLOCK: tl.constexpr):
    tl.extra.cuda.gdc_wait()           # the producer's writes are visible after this
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(a + i, mask=i < n) * 2.0 - 1.0, mask=i < n)


def test_pdl_kernels_compile_for_sm90():
    # catches a Triton API change in gdc_* here, without a GPU
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    for k in (_pdl_producer, _pdl_consumer):
        ck = triton.compile(ASTSource(fn=k, signature={"x" if k is _pdl_producer else "a": "*fp32",
                                                       "out": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                      constexprs={"BLOCK": 256}),
                            target=GPUTarget("cuda", 90, 32), options={"launch_pdl": True})
        assert "griddepcontrol" in ck.asm["ptx"] and ck.metadata.launch_pdl


@cuda
@needs_gpu
def test_gpu_pdl_pair_through_the_fast_path():
    # producer writes, consumer (launched with PDL) waits on it then reads: right results on
    # the general path (first launch) and on the Ex fast launchers (the following ones)
    n = 3 * 4096 + 1
    x = randn((n,), device="cuda")
    mid = poisoned((n,), nbx.float32, "cuda")
    ref = x.numpy().astype(np.float64)
    for _ in range(8):
        ref = ref * np.float32(1.0001) + 0.5
    for step in range(4):
        out = poisoned((n,), nbx.float32, "cuda")
        grid = (triton.cdiv(n, 256),)
        nbx.launch(_pdl_producer, grid, x, mid, n, BLOCK=256, launch_pdl=True)
        nbx.launch(_pdl_consumer, grid, mid, out, n, BLOCK=256, launch_pdl=True)
        assert_close(out, ref * 2.0 - 1.0, rtol=1e-5, atol=1e-5)
        mid = poisoned((n,), nbx.float32, "cuda")
    fns = L._fast_list(_pdl_consumer, {"BLOCK": 256, "launch_pdl": True})
    assert fns and all(getattr(f, "ex", False) for f in fns)


def test_fast_launcher_passes_the_kernels_shared_memory(fake_gpu, monkeypatch):
    # a kernel with shared memory (a transpose): the Ex config carries it like cuLaunchKernel
    alloc, rec = fake_gpu
    slow = []
    real = L._lookup
    monkeypatch.setattr(L, "_lookup", lambda *a: slow.append(1) or real(*a))
    x, out = fake_cuda((64 * 64,)), fake_cuda((64 * 64,), ptr=0x7F0000100000)
    for k in range(3):
        nbx.launch(_big_smem, (1,), x, out, BLOCK=64, num_warps=4)
    (e,) = [e for e in L._state.entries.values() if e.name == "_big_smem"]
    assert e.shared > 0 and len(slow) == 1
    assert [c["shared"] for c in rec.calls] == [e.shared] * 3
    assert {c["api"] for c in rec.calls[1:]} == {"cuLaunchKernelEx" if L._use_ex else "cuLaunchKernel"}


def test_grid_x_times_num_ctas_over_cuda_limit_is_refused(fake_gpu):
    # num_ctas > 1 multiplies grid x: a grid whose x fits CUDA's limit but x * num_ctas does
    # not is refused by name on both paths (was: handed to the driver, up to 2**32 - 1)
    alloc, rec = fake_gpu
    x = fake_cuda((4096,))
    for k in range(2):      # the general path, then with a fast launcher in front (Ex)
        for gx in (L._MAX_X // 2 + 1, L._MAX_X):
            with pytest.raises(ValueError, match=r"grid=.*num_ctas=2.*2147483647"):
                nbx.launch(_add, (gx, 1), x, x, x, 4096, BLOCK=256, num_ctas=2, num_warps=4)
        nbx.launch(_add, (L._MAX_X // 2, 1), x, x, x, 4096, BLOCK=256, num_ctas=2, num_warps=4)
        assert rec.calls[-1]["grid"] == (L._MAX_X - 1, 1, 1)
    assert len(rec.calls) == 2


def test_torch_watch_sees_a_package_import_of_torch_already_imported(monkeypatch):
    # a test may import torch first (an optional reference); an `import torch` in the package
    # after that finds it in sys.modules, where no meta-path finder is asked: still recorded
    import types
    watch = next(w for w in sys.meta_path if type(w).__name__ == "_TorchImportWatch")
    seen = sys.modules[type(watch).__module__]._TORCH_FROM_PACKAGE
    pkg = os.path.dirname(nbx.__file__) + os.sep
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    n = len(seen)
    try:
        exec(compile("import torch\n", pkg + "_planted.py", "exec"), {"__name__": "nbxtensor._planted"})
        exec(compile("import torch\n", "/elsewhere/test_x.py", "exec"), {"__name__": "test_x"})
        # a None entry (the interp runner blocks Triton's `import torch` so): a failed import
        monkeypatch.setitem(sys.modules, "torch", None)
        with pytest.raises(ImportError):
            exec(compile("import torch\n", pkg + "_planted.py", "exec"), {"__name__": "nbxtensor._p"})
        got = seen[n:]
    finally:
        del seen[n:]    # planted: the session must not fail for it
    assert len(got) == 1 and got[0].startswith("torch from ") and "_planted.py:1" in got[0]


def test_sync_seams_raise_pending_index_errors(monkeypatch):
    # every synchronising call (nbx.cuda.synchronize, Stream/Event.synchronize, a host read)
    # runs the registered device-error checks whose pending flag is set; kernels/indexing.py
    # registers the index-error flag's
    import nbxtensor.cuda as C
    from nbxtensor.backends.cuda import driver as drv
    from nbxtensor.backends.cuda import streams
    from nbxtensor.backends.cuda.storage import CudaStorage
    from nbxtensor.kernels import indexing as ix
    assert any(p is ix.PENDING and c is ix.check_pending for p, c in streams._sync_checks)
    for name in ("set_device", "stream_synchronize", "event_synchronize", "ctx_synchronize",
                 "memcpy_dtoh"):
        monkeypatch.setattr(drv, name, lambda *a: None)
    asked, flag = [], [0]
    monkeypatch.setattr(streams, "_sync_checks", [(flag, lambda: asked.append(1))])
    ev = object.__new__(C.Event)
    ev.handle = 0
    st = CudaStorage(Device("cuda", 0), 16, None, None)
    seams = [lambda: C.synchronize(0), C.Stream(0, handle=0).synchronize, ev.synchronize,
             lambda: st.to_host(0, 8)]
    try:
        for pending in (0, 1):
            flag[0] = pending
            for seam in seams:
                n = len(asked)
                seam()
                assert len(asked) == n + pending
    finally:
        ev.handle = None    # nothing to destroy


# ----------------------------------------------------------- launch_items (a plan's kept keywords)

def test_launch_items_matches_launch_and_follows_the_keywords(fake_gpu, monkeypatch):
    """launch_items(kernel, grid, args, items) launches what nbx.launch(*args, **dict(items))
    launches; a kept items tuple takes the fast launchers by identity, and another tuple
    (other constexpr values, or equal values in a new tuple) never reuses the last one's."""
    alloc, rec = fake_gpu
    x, y = fake_cuda((64,)), fake_cuda((64,), ptr=0x7F0000010000)
    o = fake_cuda((64,), ptr=0x7F0000020000)
    i16, i32 = (("BLOCK", 16),), (("BLOCK", 32),)
    def seen(n_ty="i32"):
        c = rec.calls[-1]
        return (c["f"], c["grid"], c["block"], c["shared"], c["stream"],
                [read_param(c["params"][k], "Q") for k in range(3)],
                read_param(c["params"][3], n_ty))
    nbx.launch(_add, (4,), x, y, o, 64, BLOCK=16)
    nbx.launch(_add, (4,), x, y, o, 64, BLOCK=16)     # (the fast path's launch)
    ref = seen()
    assert ref[5] == [x.data_ptr(), y.data_ptr(), o.data_ptr()] and ref[6] == 64
    looked = []
    real_lookup = L._lookup
    monkeypatch.setattr(L, "_lookup", lambda *a: looked.append(1) or real_lookup(*a))
    for k in range(3):
        L.launch_items(_add, (4,), (x, y, o, 64), i16)
        assert seen() == ref and not looked                 # the fast launcher of BLOCK=16
    n_before = len(L._fast_list(_add, {"BLOCK": 32}))
    L.launch_items(_add, (2,), (x, y, o, 64), i32)          # new constexpr: compiled, not reused
    assert looked and seen()[1] == (2, 1, 1) and n_before == 0
    assert len(L._fast_list(_add, {"BLOCK": 32})) == 1
    looked.clear()
    L.launch_items(_add, (2,), (x, y, o, 64), i32)
    assert not looked
    L.launch_items(_add, (4,), (x, y, o, 64), (("BLOCK", 16),))   # equal values, new tuple
    assert seen() == ref and not looked
    # arguments of another kind still go through the general path (and are checked there)
    L.launch_items(_add, (4,), (x, y, o, 2 ** 40), i16)
    assert looked and seen("i64")[6] == 2 ** 40
    with pytest.raises(L.KernelArgumentError):
        L.launch_items(_add, (4,), (x, y, o), i16)
    with pytest.raises(L.GridError):
        L.launch_items(_add, (), (x, y, o, 64), i16)
    L.clear_cache()                                          # forgotten launchers: general path
    looked.clear()
    L.launch_items(_add, (4,), (x, y, o, 64), i16)
    assert looked and seen()[1:] == ref[1:]


def test_launch_items_runs_on_interp(device):
    """Off cuda launch_items is nbx.launch: the interpreter runs the kernel (values checked)."""
    if device != "interp":
        pytest.skip("launch_items is for Triton devices")
    g = np.random.default_rng()
    n = 16 * 3 + 1
    a, b = (nbx.tensor(g.standard_normal(n).astype(np.float32), device="interp") for _ in "ab")
    out = nbx.full((n,), float("nan"), device="interp")
    for _ in range(2):
        L.launch_items(_add, (4,), (a, b, out, n), (("BLOCK", 16),))
        np.testing.assert_allclose(out.numpy(), a.numpy().astype(np.float64) + b.numpy(), rtol=1e-6)
