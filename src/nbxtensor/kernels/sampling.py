"""Token sampling on cuda/interp: one program per row of logits, the token stays on the device.

Order (HF's): repetition penalty -> temperature -> top-k -> top-p -> draw.
* Penalty (a pre-pass into an fp32 copy): logit/penalty where > 0, logit*penalty otherwise,
  for each token id in previous_tokens (ids outside [0, V) are ignored; a repeated id is
  penalised once, as HF's gather/scatter).
* Thresholds are found without sorting, by a 16-ary search over the order-preserving int
  key of the fp32 value: top-k keeps every token >= the k-th largest value (ties at the
  boundary all kept, as HF's `scores < topk[-1]` filter); top-p keeps every token whose
  value is >= the smallest value v with mass(tokens > v) < top_p (HF's rule; tokens tied
  with the boundary value are all kept). Each round is one pass over the row.
* The draw is Gumbel-max over the kept tokens: argmax(z + g), g = -log(-log(u)), u from
  Philox keyed by the generator's seed with counter (token, row, step); the generator's
  step lives on the device and a one-program kernel advances it after each draw, so a
  captured graph draws new numbers at every replay.
* Greedy (temperature 0): argmax, first index on ties (as torch).
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from ..dispatch import register
from ._host import cdiv as _cdiv, next_pow2 as _np2
from ._pdl import _pdl_wait, pdl_opts




@triton.jit
def _key(x):
    # order-preserving int of an fp32: positives as is, negatives with the magnitude flipped
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def _penalty_kernel(x_ptr, w_ptr, prev_ptr, s_xb, s_xv, s_pb, s_pp, V, NP, penalty,
                    BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr):
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    xb = x_ptr + row * s_xb
    wb = w_ptr + row * V
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)
        tl.store(wb + i, tl.load(xb + i * s_xv, mask=i < V).to(tl.float32), mask=i < V)
    tl.debug_barrier()
    for start in range(0, NP, BLOCK_P):
        j = start + tl.arange(0, BLOCK_P)
        tok = tl.load(prev_ptr + row * s_pb + j * s_pp, mask=j < NP, other=-1).to(tl.int64)
        ok = (tok >= 0) & (tok < V)
        tok = tl.where(ok, tok, 0)
        # from the original logit, so a repeated id writes the same value twice
        x = tl.load(xb + tok * s_xv, mask=ok, other=0.0).to(tl.float32)
        tl.store(wb + tok, tl.where(x > 0, x / penalty, x * penalty), mask=ok)


@triton.jit
def _search(xb, s_xv, V, lo, hi, target, floor_key, mz, inv_temp,
            WEIGHTED: tl.constexpr, BLOCK: tl.constexpr):
    """Largest key c in [lo, hi] with S(c) >= target, where S(c) sums over tokens with
    key >= max(c, floor_key) a weight (1, or exp(z - mz) when WEIGHTED). S(lo) >= target."""
    j = tl.arange(0, 16).to(tl.int64)
    while lo < hi:
        step = (hi - lo + 16) // 16
        cand = lo + j * step
        acc = tl.zeros((16,), tl.float32)
        for start in range(0, V, BLOCK):
            i = start + tl.arange(0, BLOCK)
            x = tl.load(xb + i * s_xv, mask=i < V, other=-float("inf")).to(tl.float32)
            k = _key(x)
            if WEIGHTED:
                w = tl.where((k >= floor_key) & (i < V),
                             tl.exp2((x * inv_temp - mz) * 1.4426950408889634), 0.0)
            else:
                w = tl.where(i < V, 1.0, 0.0)
            acc += tl.sum(tl.where(k[:, None] >= cand[None, :], w[:, None], 0.0), 0)
        ok = (acc >= target) & (cand <= hi)
        jb = tl.max(tl.where(ok, j, 0), 0)
        lo_new = lo + jb * step
        hi = tl.minimum(lo_new + step - 1, hi)
        lo = lo_new
    return lo


@triton.jit
def _sample_kernel(x_ptr, out_ptr, state_ptr, s_xb, s_xv, V, inv_temp, top_k, top_p,
                   GREEDY: tl.constexpr, TOPK: tl.constexpr, TOPP: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr):
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    xb = x_ptr + row * s_xb
    offs = tl.arange(0, BLOCK)
    if GREEDY:
        best = -float("inf")
        best_i = tl.zeros((), tl.int64) - 1
        for start in range(0, V, BLOCK):
            i = start + offs
            x = tl.load(xb + i * s_xv, mask=i < V, other=-float("inf")).to(tl.float32)
            m, mi = _first_max(x, i, V)     # NaN is the max and the first one wins, as torch
            take = (best_i < 0) | (m > best) | ((m != m) & (best == best))
            best_i = tl.where(take, mi.to(tl.int64), best_i)
            best = tl.where(take, m, best)
        tl.store(out_ptr + row, best_i)
    else:
        # pass 1: max (softmax shift) and the key range
        mx = -float("inf")
        kmin = tl.zeros((), tl.int64) + 0x7FFFFFFF
        for start in range(0, V, BLOCK):
            i = start + offs
            x = tl.load(xb + i * s_xv, mask=i < V, other=-float("inf")).to(tl.float32)
            mx = tl.maximum(mx, tl.max(x, 0))
            kmin = tl.minimum(kmin, tl.min(tl.where(i < V, _key(x), 0x7FFFFFFF), 0))
        kmax = _key(mx)
        mz = mx * inv_temp
        floor_key = kmin
        if TOPK:
            floor_key = _search(xb, s_xv, V, kmin, kmax, top_k * 1.0, kmin, mz,
                                inv_temp, False, BLOCK)
        if TOPP:
            z = tl.zeros((), tl.float32)
            for start in range(0, V, BLOCK):
                i = start + offs
                x = tl.load(xb + i * s_xv, mask=i < V, other=-float("inf")).to(tl.float32)
                z += tl.sum(tl.where((_key(x) >= floor_key) & (i < V),
                                     tl.exp2((x * inv_temp - mz) * 1.4426950408889634), 0.0), 0)
            floor_key = _search(xb, s_xv, V, floor_key, kmax, top_p * z, floor_key, mz,
                                inv_temp, True, BLOCK)
        seed = tl.load(state_ptr)
        step = tl.load(state_ptr + 1)
        c2 = (step & 0xFFFFFFFF).to(tl.uint32)
        c3 = ((step >> 32) & 0xFFFFFFFF).to(tl.uint32)
        best = -float("inf")
        best_i = tl.zeros((), tl.int64) - 1
        for start in range(0, V, BLOCK):
            i = start + offs
            x = tl.load(xb + i * s_xv, mask=i < V, other=-float("inf")).to(tl.float32)
            r, _r1, _r2, _r3 = tl.philox(seed, i.to(tl.uint32), (offs * 0 + row).to(tl.uint32),
                                         offs.to(tl.uint32) * 0 + c2,
                                         offs.to(tl.uint32) * 0 + c3)
            u = (r >> 8).to(tl.float32) * 5.9604644775390625e-08 + 2.9802322387695312e-08
            g = -tl.log(-tl.log(u))
            s = tl.where((_key(x) >= floor_key) & (i < V), x * inv_temp + g, -float("inf"))
            m = tl.max(s, 0)
            mi = tl.min(tl.where(s == m, i, V), 0).to(tl.int64)
            take = (m > best) | (best_i < 0)
            best_i = tl.where(take, mi, best_i)
            best = tl.where(take, m, best)
        tl.store(out_ptr + row, best_i)


@triton.jit
def _advance_kernel(state_ptr, PDL: tl.constexpr):
    _pdl_wait(PDL)
    tl.store(state_ptr + 1, tl.load(state_ptr + 1) + 1)


# ------------------------------------------------------------------ end of a decode step
@triton.jit
def _first_max(v, idx, V):
    """(max, its smallest idx) over a 1-D v as torch.argmax: NaN is the max (then the
    max is NaN), ties go to the smallest idx; idx V marks nothing."""
    isn = v != v
    has_nan = tl.max(isn.to(tl.int32), 0) > 0
    m = tl.max(v, 0)
    hit = tl.where(has_nan, isn, v == m)
    return tl.where(has_nan, float("nan"), m), tl.min(tl.where(hit, idx, V), 0)


@triton.jit
def _argmax_commit_kernel(x_ptr, pm_ptr, pi_ptr, cnt_ptr, tok_ptr, pos_ptr,
                          s_xb, s_xv, s_tb, s_pb, V, S, CHUNK,
                          BLOCK: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    """Greedy end of a decode step: tokens[b] = argmax(x[b]) (first index of the max, NaN
    counts as the max, as torch), positions[b] += 1. Grid (S, B): program s scans keys
    [s*CHUNK, (s+1)*CHUNK) element-wise (no reduction in the loop), writes its (max, index)
    partial and takes a ticket; the program drawing the last ticket of row b merges the S
    partials, commits and resets the counter to 0 (ready for the next launch / replay)."""
    _pdl_wait(PDL)
    s = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    xb = x_ptr + row * s_xb
    offs = tl.arange(0, BLOCK)
    bv = tl.full((BLOCK,), -float("inf"), tl.float32)
    bi = tl.full((BLOCK,), V, tl.int32)
    start = s * CHUNK
    end = tl.minimum(start + CHUNK, V)
    for c in range(start, end, BLOCK):
        i = c + offs
        x = tl.load(xb + i.to(tl.int64) * s_xv, mask=i < end, other=-float("inf")).to(tl.float32)
        # strict: an earlier index wins a tie; a NaN beats everything (+inf too) but an
        # earlier NaN (a lane keeps its first NaN)
        take = (x > bv) | ((x != x) & (bv == bv)) | ((bi == V) & (i < end))
        bv = tl.where(take, x, bv)
        bi = tl.where(take, i, bi)
    m, mi = _first_max(bv, bi, V)
    if S == 1:
        tl.store(tok_ptr + row * s_tb, mi.to(tok_ptr.dtype.element_ty))
        p = tl.load(pos_ptr + row * s_pb)
        tl.store(pos_ptr + row * s_pb, p + 1)
    else:
        tl.store(pm_ptr + row * S + s, m)
        tl.store(pi_ptr + row * S + s, mi)
        tl.debug_barrier()
        ticket = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel")
        if ticket == S - 1:
            tl.store(cnt_ptr + row, 0)
            j = tl.arange(0, BLOCK_S)
            pm = tl.load(pm_ptr + row * S + j, mask=j < S, other=-float("inf"),
                         cache_modifier=".cg")
            pi = tl.load(pi_ptr + row * S + j, mask=j < S, other=V, cache_modifier=".cg")
            gm, gi = _first_max(pm, pi, V)
            tl.store(tok_ptr + row * s_tb, gi.to(tok_ptr.dtype.element_ty))
            p = tl.load(pos_ptr + row * s_pb)
            tl.store(pos_ptr + row * s_pb, p + 1)


@triton.jit
def _commit_kernel(src_ptr, tok_ptr, pos_ptr, B, s_src, s_tb, s_pb, BLOCK_B: tl.constexpr,
                   PDL: tl.constexpr):
    """tokens[b] = src[b]; positions[b] += 1 (one program, every row)."""
    _pdl_wait(PDL)
    b = tl.arange(0, BLOCK_B)
    mb = b < B
    t = tl.load(src_ptr + b * s_src, mask=mb)
    tl.store(tok_ptr + b * s_tb, t.to(tok_ptr.dtype.element_ty), mask=mb)
    p = tl.load(pos_ptr + b * s_pb, mask=mb)
    tl.store(pos_ptr + b * s_pb, p + 1, mask=mb)


ARGMAX_MAX_SPLITS = 128          # cuda: ~1 program per SM; interp: 4 (exercises the merge)


def argmax_commit_config(V, device_type):
    block = 1024 if device_type == "cuda" else 16
    target = ARGMAX_MAX_SPLITS if device_type == "cuda" else 4
    chunk = block * max(1, _cdiv(_cdiv(V, target), block))
    return dict(BLOCK=block, CHUNK=chunk, S=_cdiv(V, chunk))


@register("argmax_commit", "triton")
def argmax_commit(logits, tokens, positions):
    """tokens[b, 0] = argmax(logits[b]) and positions[b, 0] += 1 in one kernel (the greedy
    end of a decode step). logits (B, V) float16/bfloat16/float32 (compared in fp32);
    tokens (B, 1) int; positions (B, 1) int.
    Validation is done by the caller (ops/decode.greedy_commit)."""
    from .. import dtypes as _dt
    from ..backends.launch import launch
    from ..tensor import Tensor
    from .decode_attention import _counters
    B, V = logits.shape
    cfg = argmax_commit_config(V, logits.device.type)
    if _OVERRIDE and "CHUNK" in _OVERRIDE:
        cfg = dict(BLOCK=_OVERRIDE.get("BLOCK", 16), CHUNK=_OVERRIDE["CHUNK"])
        cfg["S"] = _cdiv(V, cfg["CHUNK"])
    S = cfg["S"]
    pm = Tensor._empty((B * S,), _dt.float32, logits.device)
    pi = Tensor._empty((B * S,), _dt.int32, logits.device)
    cnt = _counters(B, logits.device, "argmax")     # one ticket counter per row
    launch(_argmax_commit_kernel, (S, B), logits, pm, pi, cnt, tokens, positions,
           *logits.stride(), tokens.stride(0), positions.stride(0), V, S, cfg["CHUNK"],
           BLOCK=cfg["BLOCK"], BLOCK_S=max(2, _np2(S)), num_warps=4,
           **pdl_opts(logits.device))


@register("commit_tokens", "triton")
def commit(src, tokens, positions):
    """tokens[b, 0] = src[b]; positions[b, 0] += 1 (one kernel). src (B,) int."""
    from ..backends.launch import launch
    B = src.shape[0]
    launch(_commit_kernel, (1,), src, tokens, positions, B, src.stride(0), tokens.stride(0),
           positions.stride(0), BLOCK_B=max(2, _np2(B)), num_warps=1,
           **pdl_opts(src.device))


# ------------------------------------------------------------------ launch configuration
# One program per row, BLOCK=1024 (64 on interp), 8 warps.
_OVERRIDE: dict | None = None


@register("sample", "triton")
def sample(out, logits, state, *, temperature, top_k, top_p, penalty, previous):
    from .. import dtypes as _dt
    from ..backends.launch import launch
    from ..tensor import Tensor
    B, V = logits.shape
    block = 1024 if logits.device.type != "interp" else 64
    if _OVERRIDE:
        block = _OVERRIDE.get("BLOCK", block)
    x = logits
    pdl = pdl_opts(logits.device)
    if penalty is not None:
        x = Tensor._empty((B, V), _dt.float32, logits.device)
        NP = previous.shape[1]
        launch(_penalty_kernel, (B,), logits, x, previous, *logits.stride(), *previous.stride(),
               V, NP, float(penalty), BLOCK=block,
               BLOCK_P=max(2, min(1024, _np2(max(NP, 1)))), num_warps=8, **pdl)
    greedy = temperature == 0
    use_k = top_k is not None and top_k < V
    use_p = top_p is not None and top_p < 1.0
    launch(_sample_kernel, (B,), x, out, state, *x.stride(), V,
           1.0 if greedy else 1.0 / temperature, int(top_k or 0) if use_k else 0,
           float(top_p) if use_p else 1.0, GREEDY=greedy, TOPK=use_k, TOPP=use_p,
           BLOCK=block, num_warps=8, **pdl)
    if not greedy:
        launch(_advance_kernel, (1,), state, num_warps=1, **pdl)
    return out
