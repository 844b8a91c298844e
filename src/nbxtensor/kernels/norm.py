"""Normalisations on cuda/interp: layer_norm, rms_norm (both optionally fused with a
residual add), group_norm, batch_norm (inference form).

layer_norm / rms_norm see rows: x viewed as [R, N] with a row stride and unit stride
along N (the op layer makes that view, copying only when the strides forbid it).
With a residual, h = x + residual is rounded to the input dtype (exactly what the
unfused `x + residual` would give), stored as the new residual stream, and normalised.
Statistics are fp32 (fp64 for fp64 input). Rows up to MAX_SINGLE elements are held in
registers (one read of each input, one write of each output); longer rows loop.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ._host import cdiv as _cdiv
from .softmax import row_config
from .. import autotune as _autotune


@triton.jit
def _load_row(x_ptr, r_ptr, xrow, rrow, c, mask, HAS_RES: tl.constexpr, F64: tl.constexpr):
    x = tl.load(x_ptr + xrow[:, None] + c[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + rrow[:, None] + c[None, :], mask=mask, other=0.0)
        # round the sum to the input dtype, as the unfused add would
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype) if not F64 else x + r
    return x


@triton.jit
def _norm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, o_ptr, h_ptr, R, N, s_x, s_r, s_o, s_h, eps,
                 BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE: tl.constexpr,
                 RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                 HAS_RES: tl.constexpr, F64: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    rows = tl.where(rmask, rows, 0).to(tl.int64)
    xrow = rows * s_x
    rrow = rows * s_r
    orow = rows * s_o
    hrow = rows * s_h
    cols = tl.arange(0, BLOCK_N)
    if SINGLE:
        mask = rmask[:, None] & (cols[None, :] < N)
        xin = _load_row(x_ptr, r_ptr, xrow, rrow, cols, mask, HAS_RES, F64)
        # weight and bias are issued together with the row, not after the reductions: their
        # latency then overlaps the row's instead of adding to every program's critical path
        if HAS_W:
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
        if HAS_B:
            bb = tl.load(b_ptr + cols, mask=cols < N, other=0.0)
        if HAS_RES:
            tl.store(h_ptr + hrow[:, None] + cols[None, :], xin, mask=mask)
        x = xin.to(tl.float64) if F64 else xin.to(tl.float32)
        if RMS:
            var = tl.sum(x * x, axis=1) / N
            y = x * (1.0 / tl.sqrt(var + eps))[:, None]
        else:
            mean = tl.sum(x, axis=1) / N
            d = tl.where(mask, x - mean[:, None], 0.0)
            var = tl.sum(d * d, axis=1) / N
            y = d * (1.0 / tl.sqrt(var + eps))[:, None]
        if HAS_W:
            y = y * w.to(y.dtype)[None, :]
        if HAS_B:
            y = y + bb.to(y.dtype)[None, :]
        tl.store(o_ptr + orow[:, None] + cols[None, :], y.to(o_ptr.dtype.element_ty), mask=mask)
    else:
        if F64:
            acc = tl.zeros((BLOCK_R, BLOCK_N), tl.float64)
        else:
            acc = tl.zeros((BLOCK_R, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):      # pass 1: sum (mean) or sum of squares (rms)
            c = start + cols
            mask = rmask[:, None] & (c[None, :] < N)
            xin = _load_row(x_ptr, r_ptr, xrow, rrow, c, mask, HAS_RES, F64)
            if HAS_RES:
                tl.store(h_ptr + hrow[:, None] + c[None, :], xin, mask=mask)
            x = xin.to(acc.dtype)
            if RMS:
                acc += x * x
            else:
                acc += x
        if RMS:
            var = tl.sum(acc, axis=1) / N
        else:
            mean = tl.sum(acc, axis=1) / N
            acc = tl.zeros_like(acc)
            for start in range(0, N, BLOCK_N):  # pass 2: variance about the mean
                c = start + cols
                mask = rmask[:, None] & (c[None, :] < N)
                x = _load_row(x_ptr, r_ptr, xrow, rrow, c, mask, HAS_RES, F64).to(acc.dtype)
                d = tl.where(mask, x - mean[:, None], 0.0)
                acc += d * d
            var = tl.sum(acc, axis=1) / N
        rstd = 1.0 / tl.sqrt(var + eps)
        for start in range(0, N, BLOCK_N):      # last pass: normalise and write
            c = start + cols
            mask = rmask[:, None] & (c[None, :] < N)
            x = _load_row(x_ptr, r_ptr, xrow, rrow, c, mask, HAS_RES, F64).to(acc.dtype)
            if RMS:
                y = x * rstd[:, None]
            else:
                y = (x - mean[:, None]) * rstd[:, None]
            if HAS_W:
                y = y * tl.load(w_ptr + c, mask=c < N, other=0.0).to(y.dtype)[None, :]
            if HAS_B:
                y = y + tl.load(b_ptr + c, mask=c < N, other=0.0).to(y.dtype)[None, :]
            tl.store(o_ptr + orow[:, None] + c[None, :], y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _group_norm_kernel(x_ptr, w_ptr, b_ptr, o_ptr, G, CG, HW, eps,
                       BLOCK: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                       F64: tl.constexpr):
    """One program per (sample, group); x, out contiguous (N, C, HW); a group is the
    contiguous run of CG * HW elements starting at (n * G + g) * CG * HW."""
    pid = tl.program_id(0)
    g = pid % G
    L = CG * HW
    base = pid.to(tl.int64) * L
    offs = tl.arange(0, BLOCK)
    if F64:
        acc = tl.zeros((BLOCK,), tl.float64)
    else:
        acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, L, BLOCK):
        i = start + offs
        acc += tl.load(x_ptr + base + i, mask=i < L, other=0.0).to(acc.dtype)
    mean = tl.sum(acc, axis=0) / L
    acc = tl.zeros_like(acc)
    for start in range(0, L, BLOCK):
        i = start + offs
        x = tl.load(x_ptr + base + i, mask=i < L, other=0.0).to(acc.dtype)
        d = tl.where(i < L, x - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / L + eps)
    for start in range(0, L, BLOCK):
        i = start + offs
        m = i < L
        x = tl.load(x_ptr + base + i, mask=m, other=0.0).to(acc.dtype)
        y = (x - mean) * rstd
        ch = g * CG + i // HW
        if HAS_W:
            y = y * tl.load(w_ptr + ch, mask=m, other=0.0).to(y.dtype)
        if HAS_B:
            y = y + tl.load(b_ptr + ch, mask=m, other=0.0).to(y.dtype)
        tl.store(o_ptr + base + i, y.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _batch_norm_kernel(x_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, o_ptr, numel, C, HW, eps,
                       BLOCK: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                       F64: tl.constexpr):
    """Inference form over contiguous (N, C, HW): y = (x - mean[c]) / sqrt(var[c] + eps) * w + b."""
    pid = tl.program_id(0)
    i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < numel
    ch = (i // HW) % C
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    x = x.to(tl.float64) if F64 else x.to(tl.float32)
    mu = tl.load(mean_ptr + ch, mask=m, other=0.0).to(x.dtype)
    var = tl.load(var_ptr + ch, mask=m, other=1.0).to(x.dtype)
    y = (x - mu) / tl.sqrt(var + eps)
    if HAS_W:
        y = y * tl.load(w_ptr + ch, mask=m, other=0.0).to(x.dtype)
    if HAS_B:
        y = y + tl.load(b_ptr + ch, mask=m, other=0.0).to(x.dtype)
    tl.store(o_ptr + i, y.to(o_ptr.dtype.element_ty), mask=m)


# ------------------------------------------------------------------ launch configuration
# Rows: the softmax rule (kernels/softmax.py `row_config`), with MAX_SINGLE = 16384
# elements held in registers. group_norm: BLOCK = 1024 (4 warps); batch_norm: BLOCK = 1024.
_OVERRIDE: dict | None = None     # tests and sweeps: BLOCK_R / BLOCK_N / num_warps


def _f64(*ts):
    from .. import dtypes as _dt
    return any(t is not None and t.dtype is _dt.float64 for t in ts)


def _unit(t):
    """A 1-D per-channel parameter with unit stride (the kernels index it by the channel
    alone), copying a strided view; None stays None."""
    if t is None or t.numel() <= 1 or t.stride(0) == 1:
        return t
    return t.contiguous()


def _norm(out, x, weight, bias, eps, residual, h_out, rms):
    from ..backends.launch import launch
    R, N = x.shape
    if R == 0 or N == 0:
        return out
    weight, bias = _unit(weight), _unit(bias)
    cfg = row_config(N)
    if cfg["SINGLE"] and cfg["BLOCK_N"] == 4096 and x.dtype.itemsize == 2 \
            and x.device.type == "cuda":
        # H200 sweep (sweep_bandwidth.py --groups=norm, 16384x4096 bf16): one row per
        # program at 16 warps 83.1 us layer_norm / 75.4 us rms_norm, at 8 warps (the row
        # rule, 32 elements a thread) 72.4 / 67.2, two rows per 8-warp program 67.2 / 67.8 (93% of
        # copy): two rows win for layer_norm and tie for rms_norm. (Persistent pipelined
        # rows, one-reduction moments, eviction and streaming-store hints lost.)
        cfg.update(BLOCK_R=2, num_warps=8)
    if _OVERRIDE:
        cfg.update(_OVERRIDE)
    elif rms:
        # autotune seam: a screened entry for (rows, N) inside today's space, else the rule
        # (the residual form is the same kernel; layer_norm keeps the rule: never timed)
        cfg = _autotune.pick("rms_norm", (R, N), cfg, dtype=x.dtype.name, device=x.device)
    has_res = residual is not None
    launch(_norm_kernel, (_cdiv(R, cfg["BLOCK_R"]),), x, residual if has_res else x,
           weight if weight is not None else x, bias if bias is not None else x, out,
           h_out if has_res else out, R, N, x.stride(0), residual.stride(0) if has_res else 0,
           out.stride(0), h_out.stride(0) if has_res else 0, float(eps),
           BLOCK_R=cfg["BLOCK_R"], BLOCK_N=cfg["BLOCK_N"], SINGLE=cfg["SINGLE"], RMS=rms,
           HAS_W=weight is not None, HAS_B=bias is not None, HAS_RES=has_res,
           F64=_f64(x, out), num_warps=cfg["num_warps"])
    return out


@register("layer_norm", "triton")
def layer_norm(out, x, weight, bias, eps, residual=None, h_out=None):
    return _norm(out, x, weight, bias, eps, residual, h_out, rms=False)


@register("rms_norm", "triton")
def rms_norm(out, x, weight, eps, residual=None, h_out=None):
    return _norm(out, x, weight, None, eps, residual, h_out, rms=True)


@register("group_norm", "triton")
def group_norm(out, x, num_groups, weight, bias, eps):
    """x, out: contiguous (N, C, HW)."""
    from ..backends.launch import launch
    n, C, HW = x.shape
    if out.numel() == 0:
        return out
    cg = C // num_groups
    weight, bias = _unit(weight), _unit(bias)
    bl = (_OVERRIDE or {}).get("BLOCK", 1024)
    launch(_group_norm_kernel, (n * num_groups,), x, weight if weight is not None else x,
           bias if bias is not None else x, out, num_groups, cg, HW, float(eps),
           BLOCK=bl, HAS_W=weight is not None, HAS_B=bias is not None, F64=_f64(x, out),
           num_warps=4)
    return out


@register("batch_norm", "triton")
def batch_norm(out, x, running_mean, running_var, weight, bias, eps):
    """x, out: contiguous (N, C, HW)."""
    from ..backends.launch import launch
    n, C, HW = x.shape
    numel = out.numel()
    if numel == 0:
        return out
    running_mean, running_var = _unit(running_mean), _unit(running_var)
    weight, bias = _unit(weight), _unit(bias)
    bl = (_OVERRIDE or {}).get("BLOCK", 1024)
    launch(_batch_norm_kernel, (_cdiv(numel, bl),), x, running_mean, running_var,
           weight if weight is not None else x, bias if bias is not None else x, out,
           numel, C, HW, float(eps), BLOCK=bl, HAS_W=weight is not None,
           HAS_B=bias is not None, F64=_f64(x, out), num_warps=4)
    return out
