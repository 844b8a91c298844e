"""complex64/complex128: promotion, creation, casts, printing, views, element-wise ops,
reductions, matmul and refusals, against NumPy complex128 references on every device."""
import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor import dtypes as dt

C = [nbx.complex64, nbx.complex128]
TOL = {nbx.complex64: 2e-6, nbx.complex128: 1e-13}


def _rand(g, shape, d):
    a = g.standard_normal(shape) + 1j * g.standard_normal(shape)
    return a.astype(d.np)


@pytest.mark.parametrize("a,b,want", [
    ("complex64", "float64", "complex128"), ("int64", "complex64", "complex64"),
    ("bool", "complex128", "complex128"), ("float16", "complex64", "complex64"),
    ("complex64", "complex128", "complex128"), ("bfloat16", "complex64", "complex64")])
def test_promote_types(a, b, want):
    assert dt.promote_types(a, b) is dt.as_dtype(want)
    assert dt.promote_types(b, a) is dt.as_dtype(want)


def test_result_type_scalars_and_categories():
    f32 = nbx.zeros(3)
    assert dt.result_type(f32, 1j) is nbx.complex64
    assert dt.result_type(nbx.zeros(3, dtype=nbx.float64), 1j) is nbx.complex128
    assert dt.result_type(nbx.zeros(3, dtype=nbx.int32), 1j) is nbx.complex64
    # torch keeps the dim tensor's float width: float32 + complex128 0-dim -> complex64
    assert dt.result_type(f32, nbx.zeros((), dtype=nbx.complex128)) is nbx.complex64
    assert dt.result_type(nbx.zeros(3, dtype=nbx.int8), nbx.zeros((), dtype=nbx.complex128)) \
        is nbx.complex128
    assert dt.result_type(nbx.zeros(3, dtype=nbx.complex64), 2.5) is nbx.complex64
    assert dt.result_type(nbx.zeros(3, dtype=nbx.complex64), nbx.zeros((), dtype=nbx.float64)) \
        is nbx.complex64


def test_all_dtypes_stays_real():
    assert nbx.complex64 not in nbx.all_dtypes and nbx.complex128 not in nbx.all_dtypes
    assert dt.complex_dtypes == (nbx.complex64, nbx.complex128)
    assert dt.as_dtype("cfloat") is nbx.complex64 and dt.as_dtype(np.complex128) is nbx.complex128
    assert nbx.complex64.triton is None and nbx.complex64.safetensors is None
    assert dt.finfo(nbx.complex64).eps == dt.finfo(nbx.float32).eps


@pytest.mark.parametrize("d", C)
def test_creation_roundtrip_and_views(device, d):
    g = np.random.default_rng(1)
    a = _rand(g, (5, 7), d)
    t = nbx.tensor(a, device=device)
    assert t.dtype is d and np.array_equal(t.numpy(), a)
    assert nbx.tensor([[1 + 2j, 3], [0.5, -1j]]).dtype is nbx.complex64
    s = t[:, 1::2]                                   # a strided view
    assert np.array_equal(s.contiguous().numpy(), a[:, 1::2])
    r = nbx.view_as_real(s)
    assert r.shape == (5, 3, 2) and r.stride() == (14, 4, 1)
    assert np.array_equal(r.numpy(), np.stack([a[:, 1::2].real, a[:, 1::2].imag], -1))
    back = nbx.view_as_complex(nbx.view_as_real(t))
    assert np.array_equal(back.numpy(), a)
    assert np.array_equal(t.real.numpy(), a.real) and np.array_equal(t.imag.numpy(), a.imag)
    other = C[1 - C.index(d)]
    assert np.allclose(t.to(other).numpy(), a.astype(other.np), rtol=1e-6)
    f = nbx.tensor(a.real.copy(), device=device)
    assert np.array_equal(f.to(d).numpy(), a.real.astype(d.np))
    z = nbx.full((2, 3), 1 - 2j, device=device)
    assert z.dtype is nbx.complex64 and np.all(z.numpy() == np.complex64(1 - 2j))


def test_from_numpy_zero_copy_and_print():
    a = np.array([1 + 2j, 3 - 4.5j], np.complex128)
    t = nbx.from_numpy(a)
    a[0] = 7j
    assert t.numpy()[0] == 7j and t.dtype is nbx.complex128
    assert repr(nbx.tensor([1 + 2j, 3 - 1j])) == "tensor([1.+2.j, 3.-1.j])"
    assert "dtype=nbxtensor.complex128" in repr(t)


def test_view_as_complex_refusals():
    x = nbx.zeros(4, 3)
    with pytest.raises(RuntimeError, match="last dimension of size 2"):
        nbx.view_as_complex(x)
    with pytest.raises(RuntimeError, match="stride 1"):
        nbx.view_as_complex(nbx.zeros(2, 4).t())
    with pytest.raises(TypeError, match="float32 or float64"):
        nbx.view_as_complex(nbx.zeros(4, 2, dtype=nbx.float16))
    with pytest.raises(TypeError, match="expected a complex tensor"):
        nbx.view_as_real(nbx.zeros(3))


_UNARY = [("neg", np.negative), ("abs", np.abs), ("exp", np.exp), ("log", np.log),
          ("sqrt", np.sqrt), ("reciprocal", lambda a: 1 / a), ("sin", np.sin), ("cos", np.cos),
          ("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite),
          ("angle", np.angle), ("conj", np.conj), ("conj_physical", np.conj)]


@pytest.mark.parametrize("d", C)
@pytest.mark.parametrize("name,ref", _UNARY, ids=[u[0] for u in _UNARY])
def test_unary(device, d, name, ref):
    g = np.random.default_rng(2)
    a = _rand(g, (3, 45), d)
    a[0, :4] = [complex(np.nan, 1), complex(1, np.inf), complex(-np.inf, 0), 0]
    t = nbx.tensor(a, device=device)[:, ::2]         # strided input
    r = getattr(nbx, name)(t).numpy()
    with np.errstate(all="ignore"):
        want = ref(a[:, ::2].astype(np.complex128))
    if want.dtype == bool:
        assert r.dtype == bool and np.array_equal(r, want)
        return
    fin = np.isfinite(want) & (np.arange(want.shape[1]) >= 2)[None]   # specials: NumPy's own
    fin[1:] = np.isfinite(want[1:])
    np.testing.assert_allclose(r[fin], want[fin], rtol=TOL[d], atol=TOL[d])
    if name == "abs":
        assert r.dtype == dt.to_real(d).np


_BIN = [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide),
        ("pow", np.power), ("eq", np.equal), ("ne", np.not_equal)]


@pytest.mark.parametrize("d", C)
@pytest.mark.parametrize("name,ref", _BIN, ids=[b[0] for b in _BIN])
def test_binary_complex_real_and_scalars(device, d, name, ref):
    g = np.random.default_rng(3)
    a = _rand(g, (4, 33), d)
    b = _rand(g, (33,), d)                           # broadcast
    a[0, 3] = b[3]                                   # an equal pair for eq/ne
    real = g.standard_normal((4, 33)).astype(dt.to_real(d).np)
    ta, tb, tr = (nbx.tensor(v, device=device) for v in (a, b, real))
    f = getattr(nbx, name)
    A, B, R = (v.astype(np.complex128) for v in (a, b, real))
    for got, want in ((f(ta, tb), ref(A, B)), (f(ta, tr), ref(A, R)), (f(tr, ta), ref(R, A)),
                      (f(ta, 1.5 - 0.5j), ref(A, 1.5 - 0.5j)), (f(ta, 2.0), ref(A, 2.0))):
        g_ = got.numpy()
        if want.dtype == bool:
            assert np.array_equal(g_, want)
        else:
            assert got.dtype is d
            np.testing.assert_allclose(g_, want, rtol=TOL[d] * 10, atol=TOL[d] * 10)
    got = nbx.add(ta, tb, alpha=2 - 1j).numpy()
    np.testing.assert_allclose(got, A + (2 - 1j) * B, rtol=TOL[d] * 10, atol=TOL[d] * 10)


@pytest.mark.parametrize("d", C)
def test_sum_mean_matmul_polar_complex(device, d):
    g = np.random.default_rng(4)
    a = _rand(g, (6, 5, 7), d)
    t = nbx.tensor(a, device=device)
    A = a.astype(np.complex128)
    tol = TOL[d] * 20
    np.testing.assert_allclose(nbx.sum(t).numpy(), A.sum(), rtol=tol)
    np.testing.assert_allclose(nbx.sum(t, dim=-1).numpy(), A.sum(-1), rtol=tol, atol=tol)
    np.testing.assert_allclose(nbx.mean(t, dim=(0, 2), keepdim=True).numpy(),
                               A.mean((0, 2), keepdims=True), rtol=tol, atol=tol)
    b = _rand(g, (7, 3), d)
    np.testing.assert_allclose(nbx.matmul(t, nbx.tensor(b, device=device)).numpy(),
                               A @ b.astype(np.complex128), rtol=tol, atol=tol)
    m = np.abs(A[0]).astype(dt.to_real(d).np)
    ang = np.angle(A[0]).astype(dt.to_real(d).np)
    p = nbx.polar(nbx.tensor(m, device=device), nbx.tensor(ang, device=device))
    np.testing.assert_allclose(p.numpy(), A[0], rtol=tol, atol=tol)
    c = nbx.complex(nbx.tensor(A.real[0].astype(m.dtype), device=device),
                    nbx.tensor(A.imag[0, 0].astype(m.dtype), device=device))  # broadcast imag
    np.testing.assert_allclose(c.numpy(), A.real[0] + 1j * A.imag[0, 0], rtol=tol)


def test_refusals(device):
    t = nbx.tensor(np.array([1 + 1j, 2], np.complex64), device=device)
    for f in (nbx.maximum, nbx.atan2, nbx.lt, nbx.remainder):
        with pytest.raises(TypeError, match="complex"):
            f(t, t)
    for f in (nbx.floor, nbx.sign, nbx.sigmoid, nbx.relu):
        with pytest.raises(TypeError, match="complex"):
            f(t)
    for f in (nbx.flip, nbx.sort, nbx.cumsum, nbx.amax):
        with pytest.raises(TypeError, match="complex"):
            f(t, 0) if f is not nbx.flip else f(t, [0])
    with pytest.raises(TypeError, match="imaginary"):
        t.to(nbx.float32)
    with pytest.raises(TypeError, match="imaginary"):
        nbx.zeros(2, device=device).copy_(t)
    with pytest.raises(TypeError, match="imaginary"):
        nbx.tensor([1j], dtype=nbx.float32)
    with pytest.raises(TypeError, match="in-place abs"):
        t.abs_()
    with pytest.raises(TypeError, match="can't be cast"):
        nbx.add(t, t, out=nbx.zeros(2, device=device))


def test_complex_kernel_compiles_for_sm90():
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from nbxtensor.kernels.complex import _complex_kernel
    for op, ty, res in (("pow", "*fp32", 0), ("log", "*fp64", 0), ("abs", "*fp32", 1),
                        ("sqrt", "*fp64", 0), ("sin", "*fp32", 0), ("div", "*fp32", 0),
                        ("eq", "*fp32", 2)):
        sig = {"out": "*u8" if res == 2 else ty, "a": ty, "b": ty, "c": ty, "N": "i32"}
        cx = dict(OP=op, BA=False, BB=True, BCC=True, TWO=op == "pow", RES=res, INTERP=False,
                  BLOCK=1024)
        sig.update({k: "constexpr" for k in cx})
        k = triton.compile(triton.compiler.ASTSource(fn=_complex_kernel, signature=sig,
                                                     constexprs=cx),
                           target=GPUTarget("cuda", 90, 64))
        assert "ld.global" in k.asm["ptx"]
