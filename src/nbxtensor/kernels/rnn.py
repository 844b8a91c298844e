"""An LSTM layer's recurrence in one launch (cuda, interp).

nn.LSTM computes the input projection of the whole sequence as one matmul; what is left is
L dependent steps of `gates = gi[t] + W_hh @ h + b_hh`, then the cell update. As separate
ops that is about ten launches a step, so a 100-step line crop of the OCR recogniser cost
thousands of launches. Here the programs of one sequence walk every step together: h lives
in a double-buffered fp32 scratch row (read whole by the product, written by the update),
c in another. Program (n, g) owns hidden units [g*BLOCK_R, (g+1)*BLOCK_R) of sequence n:
the four gates' rows of W_hh for them (i, f, g, o: torch's order), which stay in its L1
from step to step, and their cell update. One program alone would pull all of W_hh
through one SM every step (~25 us a step for H = 256 in fp32); split G ways, a step is
the ~2 us of a barrier. The G programs meet at a counter barrier after each step, so the
grid must be resident at once: G programs a sequence only while N * G fits the SMs
(else one program a sequence, as on interp, whose programs run one after another).
Lengths (packed sequences): a step at or past a sequence's length keeps its state and
writes a zero output row, so the reverse direction starts at each sequence's last element.
Gates and state are fp32; the outputs are rounded once to the input's dtype.
"""
from __future__ import annotations

from ._triton import triton, tl  # Triton, or its stand-in without Triton

from .. import dtypes as _dt
from ..dispatch import register
from ._host import next_pow2 as _next_pow2
from ._common import device_facts

__all__ = ["lstm_scan"]


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _gate_rows(src, w_ptr, r, r_ok, ks, H, s_wr, s_wk, GATE: tl.constexpr,
               BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(W_hh[GATE*H + r, :] @ h) for the rows r, h the fp32 row at src."""
    acc = tl.zeros([BLOCK_R], tl.float32)
    rows = (GATE * H + r).to(tl.int64) * s_wr
    for k0 in range(0, H, BLOCK_K):
        k = k0 + ks
        k_ok = k < H
        hk = tl.load(src + k, mask=k_ok, other=0.0, cache_modifier=".cg")
        w = tl.load(w_ptr + rows[:, None] + k[None, :].to(tl.int64) * s_wk,
                    mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * hk[None, :], 1)
    return acc


@triton.jit
def _step_barrier(cnt_ptr, target):
    """Arrive at and wait on a sequence's step counter: returns once all G programs of the
    sequence have arrived `target // G` times, their earlier stores visible (release on
    arrival, acquire while waiting; one thread of the program does the atomics)."""
    tl.debug_barrier()              # every thread's stores are issued before the arrival
    seen = tl.atomic_add(cnt_ptr, 1, sem="acq_rel") + 1
    while seen < target:
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _lstm_scan_kernel(gi_ptr, w_ptr, b_ptr, h0_ptr, c0_ptr, len_ptr, out_ptr, hn_ptr, cn_ptr,
                      hb_ptr, cb_ptr, cnt_ptr, L, N, H, ROWS,
                      s_gt, s_gn, s_gh, s_wr, s_wk, s_ot, s_on, s_oh, s_h0, s_c0, s_b,
                      HAS_BIAS: tl.constexpr, HAS_LEN: tl.constexpr, REVERSE: tl.constexpr,
                      SYNC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0)
    g = tl.program_id(1)
    G = tl.num_programs(1)
    r_lo = g * ROWS                 # this program's hidden units: [r_lo, r_lo + ROWS)
    rs = tl.arange(0, BLOCK_R)
    ks = tl.arange(0, BLOCK_K)
    c_row = cb_ptr + n.to(tl.int64) * H
    for r0 in range(0, ROWS, BLOCK_R):
        r = r_lo + r0 + rs
        ok = r < H
        tl.store(hb_ptr + n.to(tl.int64) * H + r,
                 tl.load(h0_ptr + n * s_h0 + r, mask=ok).to(tl.float32), mask=ok)
        tl.store(c_row + r, tl.load(c0_ptr + n * s_c0 + r, mask=ok).to(tl.float32), mask=ok)
    if SYNC:
        _step_barrier(cnt_ptr + n, G)
    else:
        tl.debug_barrier()
    length = L
    if HAS_LEN:
        length = tl.load(len_ptr + n)
    for s in range(0, L):
        if REVERSE:
            t = L - 1 - s
        else:
            t = s
        src = hb_ptr + ((s % 2) * N + n).to(tl.int64) * H
        dst = hb_ptr + (((s + 1) % 2) * N + n).to(tl.int64) * H
        valid = t < length
        g_row = gi_ptr + t.to(tl.int64) * s_gt + n.to(tl.int64) * s_gn
        o_row = out_ptr + t.to(tl.int64) * s_ot + n.to(tl.int64) * s_on
        for r0 in range(0, ROWS, BLOCK_R):
            r = r_lo + r0 + rs
            ok = r < H
            gi_i = _gate_rows(src, w_ptr, r, ok, ks, H, s_wr, s_wk, 0, BLOCK_R, BLOCK_K)
            gi_f = _gate_rows(src, w_ptr, r, ok, ks, H, s_wr, s_wk, 1, BLOCK_R, BLOCK_K)
            gi_g = _gate_rows(src, w_ptr, r, ok, ks, H, s_wr, s_wk, 2, BLOCK_R, BLOCK_K)
            gi_o = _gate_rows(src, w_ptr, r, ok, ks, H, s_wr, s_wk, 3, BLOCK_R, BLOCK_K)
            gi_i += tl.load(g_row + r * s_gh, mask=ok, other=0.0).to(tl.float32)
            gi_f += tl.load(g_row + (H + r) * s_gh, mask=ok, other=0.0).to(tl.float32)
            gi_g += tl.load(g_row + (2 * H + r) * s_gh, mask=ok, other=0.0).to(tl.float32)
            gi_o += tl.load(g_row + (3 * H + r) * s_gh, mask=ok, other=0.0).to(tl.float32)
            if HAS_BIAS:
                gi_i += tl.load(b_ptr + r * s_b, mask=ok, other=0.0).to(tl.float32)
                gi_f += tl.load(b_ptr + (H + r) * s_b, mask=ok, other=0.0).to(tl.float32)
                gi_g += tl.load(b_ptr + (2 * H + r) * s_b, mask=ok, other=0.0).to(tl.float32)
                gi_o += tl.load(b_ptr + (3 * H + r) * s_b, mask=ok, other=0.0).to(tl.float32)
            c_old = tl.load(c_row + r, mask=ok, other=0.0)
            h_old = tl.load(src + r, mask=ok, other=0.0, cache_modifier=".cg")
            c_new = tl.sigmoid(gi_f) * c_old + tl.sigmoid(gi_i) * _tanh(gi_g)
            h_new = tl.sigmoid(gi_o) * _tanh(c_new)
            tl.store(c_row + r, tl.where(valid, c_new, c_old), mask=ok)
            tl.store(dst + r, tl.where(valid, h_new, h_old), mask=ok)
            tl.store(o_row + r * s_oh, tl.where(valid, h_new, 0.0).to(out_ptr.dtype.element_ty),
                     mask=ok)
        if SYNC:
            _step_barrier(cnt_ptr + n, (s + 2) * G)
        else:
            tl.debug_barrier()
    last = hb_ptr + ((L % 2) * N + n).to(tl.int64) * H
    for r0 in range(0, ROWS, BLOCK_R):
        r = r_lo + r0 + rs
        ok = r < H
        tl.store(hn_ptr + n.to(tl.int64) * H + r,
                 tl.load(last + r, mask=ok).to(hn_ptr.dtype.element_ty), mask=ok)
        tl.store(cn_ptr + n.to(tl.int64) * H + r,
                 tl.load(c_row + r, mask=ok).to(cn_ptr.dtype.element_ty), mask=ok)
    if SYNC:
        # the last program out resets both counters for the next launch (no program is
        # still waiting on the step counter once all have taken an exit ticket)
        ticket = tl.atomic_add(cnt_ptr + N + n, 1, sem="acq_rel")
        if ticket == G - 1:
            tl.store(cnt_ptr + n, 0)
            tl.store(cnt_ptr + N + n, 0)


_OVERRIDE: dict | None = None     # tests: BLOCK_R / BLOCK_K smaller than the hidden size


def _split(devtype, sms, N, H):
    """(BLOCK_R, programs per sequence): the narrowest row tile (16, 32, 64) whose grid
    N * cdiv(H, BLOCK_R) fits the SMs on cuda; one program a sequence otherwise."""
    if devtype == "cuda":
        for block_r in (16, 32, 64):
            G = -(-H // block_r)
            if N * G <= sms:
                return block_r, G
    return min(max(_next_pow2(H), 16), 64), 1


@register("lstm_scan", "triton")
def lstm_scan(out, h_n, c_n, gi, w_hh, b_hh, h0, c0, lengths, reverse):
    """out (L, N, H) <- the LSTM recurrence over gi (L, N, 4H) (x @ W_ih^T + b_ih), from
    h0, c0 (N, H); h_n, c_n (N, H) the last states. lengths: an int32 tensor (N,) or None."""
    from ..backends.launch import launch
    from .decode_attention import _counters
    L, N, H = out.shape
    if N == 0:
        return out
    sms = device_facts(out.device).sms if out.device.type == "cuda" else 1
    block_r, G = _split(out.device.type, sms, N, H)
    cfg = dict(BLOCK_R=block_r, BLOCK_K=min(max(_next_pow2(H), 16), 128))
    if _OVERRIDE:
        cfg.update(_OVERRIDE)
    rows = -(-H // G)
    rows = -(-rows // cfg["BLOCK_R"]) * cfg["BLOCK_R"]
    hb = type(out)._empty((2, N, H), _dt.float32, out.device)
    cb = type(out)._empty((N, H), _dt.float32, out.device)
    cnt = _counters(2 * N, out.device, "rnn") if G > 1 else gi
    launch(_lstm_scan_kernel, (N, G), gi, w_hh, b_hh if b_hh is not None else gi, h0, c0,
           lengths if lengths is not None else gi, out, h_n, c_n, hb, cb, cnt, L, N, H, rows,
           *gi.stride(), *w_hh.stride(), *out.stride(), h0.stride(0), c0.stride(0),
           b_hh.stride(0) if b_hh is not None else 0,
           HAS_BIAS=b_hh is not None, HAS_LEN=lengths is not None, REVERSE=bool(reverse),
           SYNC=G > 1, num_warps=4, **cfg)
    return out
