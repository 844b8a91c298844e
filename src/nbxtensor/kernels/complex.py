"""Complex kernels (cuda and interp): element-wise ops on interleaved (re, im) pairs.

A complex tensor has no Triton type: a kernel reads it through its real view (dtypes.py,
tensor._real_view: float32 pairs for complex64, float64 pairs for complex128). Copies,
casts and fills are the real element-wise kernels applied to those views; arithmetic and
the complex functions are one kernel here that loads the (re, im) pairs of up to three
contiguous operands (or one broadcast element each), computes, and stores a complex,
real (abs) or bool (isnan, eq, ...) result. Operands are first made contiguous complex
tensors of the compute dtype, so broadcasting, strides and real operands are the copy
kernels' business, not this kernel's.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import dtypes as _dt
from ..backends.launch import launch
from ..tensor import Tensor, _real_view
from ._host import cdiv as _cdiv
from .elementwise import _INF, _atan2, _cos, _exp, _expm1, _fdiv, _log, _sin, _sqrt

_BLOCK = 1024


@triton.jit
def _cabs(re, im, INTERP: tl.constexpr):
    # scaled so that |z| does not overflow or underflow when re*re would
    a = tl.abs(re)
    b = tl.abs(im)
    m = tl.maximum(a, b)
    n = tl.minimum(a, b)
    q = _fdiv(n, tl.where(m == 0, 1.0, m).to(m.dtype))
    r = m * _sqrt(1.0 + q * q, INTERP)
    r = tl.where(m == _INF, m, r)
    return tl.where((re != re) | (im != im), tl.where(m == _INF, m, (_INF - _INF)), r)


@triton.jit
def _cdiv_c(ar, ai, br, bi):
    # Smith's algorithm: no overflow of |b|**2 for large b
    big = tl.abs(br) >= tl.abs(bi)
    r = tl.where(big, _fdiv(bi, tl.where(big, br, 1.0).to(br.dtype)),
                 _fdiv(br, tl.where(big, 1.0, bi).to(br.dtype)))
    d = tl.where(big, br + bi * r, bi + br * r)
    xr = tl.where(big, _fdiv(ar + ai * r, d), _fdiv(ar * r + ai, d))
    xi = tl.where(big, _fdiv(ai - ar * r, d), _fdiv(ai * r - ar, d))
    return xr, xi


@triton.jit
def _sinh_cosh(b, INTERP: tl.constexpr):
    em = _expm1(b, INTERP)
    en = _expm1(-b, INTERP)
    return 0.5 * (em - en), 1.0 + 0.5 * (em + en)


@triton.jit
def _cload(ptr, offs, mask, BC: tl.constexpr):
    if BC:                          # one element, broadcast
        re = tl.load(ptr + offs * 0)
        im = tl.load(ptr + offs * 0 + 1)
    else:
        re = tl.load(ptr + 2 * offs, mask=mask, other=0.0)
        im = tl.load(ptr + 2 * offs + 1, mask=mask, other=0.0)
    return re, im


# long: one fused Triton program; every OP branch is a constexpr and compiles away
@triton.jit
def _complex_kernel(out, a, b, c, N, OP: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr,
                    BCC: tl.constexpr, TWO: tl.constexpr, RES: tl.constexpr,
                    INTERP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    ar, ai = _cload(a, offs, mask, BA)
    br = ar
    bi = ai
    if TWO:
        br, bi = _cload(b, offs, mask, BB)
    if OP == "add_alpha" or OP == "sub_alpha":
        cr, ci = _cload(c, offs, mask, BCC)
        pr = cr * br - ci * bi
        pi = cr * bi + ci * br
        br = pr
        bi = pi
    rr = ar
    ri = ai
    if OP == "neg":
        rr = -ar
        ri = -ai
    elif OP == "add" or OP == "add_alpha":
        rr = ar + br
        ri = ai + bi
    elif OP == "sub" or OP == "sub_alpha":
        rr = ar - br
        ri = ai - bi
    elif OP == "mul":
        rr = ar * br - ai * bi
        ri = ar * bi + ai * br
    elif OP == "div":
        rr, ri = _cdiv_c(ar, ai, br, bi)
    elif OP == "reciprocal":
        rr, ri = _cdiv_c(ar * 0.0 + 1.0, ar * 0.0, ar, ai)
    elif OP == "abs":
        rr = _cabs(ar, ai, INTERP)
    elif OP == "exp":
        e = _exp(ar, INTERP)
        rr = e * _cos(ai, INTERP)
        ri = e * _sin(ai, INTERP)
        ri = tl.where(ai == 0, ai, ri)          # exp(x + 0j) stays real, even for x = inf
    elif OP == "log" or OP == "pow":
        # one reference to _atan2: Triton's dependency check compares the globals a helper
        # uses at each reference, and _atan2's NaN constant never equals itself
        rr = _log(_cabs(ar, ai, INTERP), INTERP)
        ri = _atan2(ai, ar, INTERP)
        if OP == "pow":
            # exp(b * log(a)); 0 ** b is 1 for b == 0 and 0 for re(b) > 0 (NumPy's values)
            tr = br * rr - bi * ri
            ti = br * ri + bi * rr
            e = _exp(tr, INTERP)
            rr = e * _cos(ti, INTERP)
            ri = e * _sin(ti, INTERP)
            zero = (ar == 0) & (ai == 0)
            bzero = (br == 0) & (bi == 0)
            rr = tl.where(zero, tl.where(bzero, 1.0, tl.where(br > 0, 0.0, (_INF - _INF))), rr)
            ri = tl.where(zero, tl.where(bzero | (br > 0), 0.0, (_INF - _INF)), ri)
            rr = tl.where(bzero, 1.0, rr)
            ri = tl.where(bzero, 0.0, ri)
    elif OP == "sqrt":
        # principal root: t = sqrt((|z| + |re|) / 2), the other part im / (2 t)
        m = _cabs(ar, ai, INTERP)
        t = _sqrt(0.5 * (m + tl.abs(ar)), INTERP)
        u = _fdiv(ai, 2.0 * tl.where(t == 0, 1.0, t).to(t.dtype))
        pos = ar >= 0
        rr = tl.where(pos, t, tl.abs(u))
        ri = tl.where(pos, u, tl.where(ai < 0, -t, t))
        rr = tl.where(t == 0, 0.0, rr)
        ri = tl.where(t == 0, ai, ri)
        rr = tl.where(ai == _INF, _INF, tl.where(ai == -_INF, _INF, rr))
        ri = tl.where(tl.abs(ai) == _INF, ai, ri)
    elif OP == "sin":
        sh, ch = _sinh_cosh(ai, INTERP)
        rr = _sin(ar, INTERP) * ch
        ri = _cos(ar, INTERP) * sh
    elif OP == "cos":
        sh, ch = _sinh_cosh(ai, INTERP)
        rr = _cos(ar, INTERP) * ch
        ri = -(_sin(ar, INTERP) * sh)
    elif OP == "isnan":
        rr = ((ar != ar) | (ai != ai)).to(tl.uint8)
    elif OP == "isinf":
        rr = ((tl.abs(ar) == _INF) | (tl.abs(ai) == _INF)).to(tl.uint8)
    elif OP == "isfinite":
        rr = ((tl.abs(ar) < _INF) & (tl.abs(ai) < _INF)).to(tl.uint8)
    elif OP == "eq":
        rr = ((ar == br) & (ai == bi)).to(tl.uint8)
    elif OP == "ne":
        rr = ((ar != br) | (ai != bi)).to(tl.uint8)
    if RES == 0:
        tl.store(out + 2 * offs, rr, mask=mask)
        tl.store(out + 2 * offs + 1, ri, mask=mask)
    else:
        tl.store(out + offs, rr, mask=mask)


_BOOL_RESULT = ("isnan", "isinf", "isfinite", "eq", "ne")


def _operand(x, ct, shape, dev):
    """`x` (a Tensor expanded to `shape` or a number) as (contiguous complex tensor of ct's real
    view, broadcast flag)."""
    if isinstance(x, Tensor):
        if x._dtype is ct and x.is_contiguous() and x._shape == shape:
            return _real_view(x), False
        if x.numel() == 1 or all(s == 0 for s in x._stride):
            one = Tensor._empty((), ct, dev)
            copy_complex(one, Tensor._make(x._storage, (), (), x._offset, x._dtype))
            return _real_view(one), True
        c = Tensor._empty(shape, ct, dev)
        copy_complex(c, x)
        return _real_view(c), False
    one = Tensor._empty((), ct, dev)
    fill_complex(one, x)
    return _real_view(one), True


def run_complex(op, out, inputs, params, ct):
    """The element-wise entry for a complex compute dtype (ops.elementwise COMPLEX_NAMES)."""
    shape, dev = out._shape, out._storage.device
    ops = [_operand(x, ct, shape, dev) for x in inputs]
    if op in ("add_alpha", "sub_alpha"):
        ops.append(_operand(params[0], ct, shape, dev))
    while len(ops) < 3:
        ops.append(ops[0])
    res = 2 if op in _BOOL_RESULT else (1 if op == "abs" else 0)
    want = {0: ct, 1: _dt.to_real(ct), 2: _dt.uint8}[res]
    direct = out._dtype is want and out.is_contiguous() and res == 0
    tmp = out if direct else Tensor._empty(shape, want, dev)
    n = out.numel()
    dst = _real_view(tmp) if res == 0 else tmp
    launch(_complex_kernel, (_cdiv(n, _BLOCK),), dst, ops[0][0], ops[1][0], ops[2][0], n, OP=op,
           BA=ops[0][1], BB=ops[1][1], BCC=ops[2][1], TWO=len(inputs) == 2, RES=res, INTERP=dev.type == "interp",
           BLOCK=_BLOCK)
    if not direct:
        if res == 2:        # the uint8 0/1 bytes are the bool result
            tmp = Tensor._make(tmp._storage, tmp._shape, tmp._stride, tmp._offset, _dt.bool)
        from .elementwise import copy_
        copy_(out, tmp)
    return out


def copy_complex(dst, src):
    """dst[...] = src where either is complex, as copies of real views (the cast rules of the
    parts: complex64 <-> complex128 round as float32 <-> float64; a real source fills the real
    parts and zeroes the imaginary ones). complex -> real is refused (tensor._check_cast)."""
    from .elementwise import copy_, fill_
    if src._dtype.kind != "c":
        v = _real_view(dst)
        copy_(v.select(-1, 0), src)
        fill_(v.select(-1, 1), 0)
        return dst
    if dst._dtype.kind != "c":
        raise TypeError(f"copy_: casting {src._dtype.name} to {dst._dtype.name} would discard "
                        f"the imaginary part")
    return copy_(_real_view(dst), _real_view(src))


def fill_complex(dst, value):
    from .elementwise import fill_
    value = complex(value)
    v = _real_view(dst)
    fill_(v.select(-1, 0), value.real)
    fill_(v.select(-1, 1), value.imag)
    return dst
