"""cpu: an LSTM layer's recurrence with NumPy, the contract of kernels/rnn.py.

The per-step ops of nn.LSTM cost about ten tensor calls a step; here a step is one GEMV
(or, for a batch, one GEMM) with W_hh and the gates on NumPy arrays, in fp32 (fp64 for
fp64), the outputs rounded once. Lengths: a step at or past a sequence's length keeps its
state and writes a zero output row (torch's packed semantics).
"""
from __future__ import annotations

import numpy as np

from ...dispatch import register


def _sigmoid(z, out):
    np.negative(z, out=out)
    np.exp(out, out=out)
    out += 1.0
    return np.reciprocal(out, out=out)


@register("lstm_scan", "numpy")
def lstm_scan(out, h_n, c_n, gi, w_hh, b_hh, h0, c0, lengths, reverse):
    """out (L, N, H) <- the LSTM recurrence over gi (L, N, 4H), from h0, c0 (N, H); h_n,
    c_n (N, H) the last states. lengths: an int32 tensor (N,) or None."""
    L, N, H = out.shape
    wt = np.float64 if out.dtype.itemsize == 8 else np.float32
    g_all = gi._host_view().astype(wt, copy=False)
    wT = np.ascontiguousarray(w_hh._host_view().astype(wt, copy=False).T)    # (H, 4H)
    b = b_hh._host_view().astype(wt) if b_hh is not None else None
    h = h0._host_view().astype(wt)          # copies: the state is updated in place
    c = c0._host_view().astype(wt)
    lens = lengths._host_view() if lengths is not None else None
    res = np.zeros((L, N, H), wt)
    g = np.empty((N, 4 * H), wt)
    s = np.empty((N, 4 * H), wt)
    with np.errstate(all="ignore"):
        for t in (range(L - 1, -1, -1) if reverse else range(L)):
            np.matmul(h, wT, out=g)
            g += g_all[t]
            if b is not None:
                g += b
            _sigmoid(g, s)                   # i, f, o gates (the g gate's entry unused)
            gg = np.tanh(g[:, 2 * H:3 * H])
            c_new = s[:, H:2 * H] * c + s[:, :H] * gg
            h_new = s[:, 3 * H:] * np.tanh(c_new)
            if lens is not None and lens.min() <= t:
                live = (lens > t)[:, None]
                c = np.where(live, c_new, c)
                h = np.where(live, h_new, h)
                res[t] = np.where(live, h_new, 0.0)
            else:
                c, h = c_new, h_new
                res[t] = h_new
    np.copyto(out._host_view(), res, casting="unsafe")
    np.copyto(h_n._host_view(), h, casting="unsafe")
    np.copyto(c_n._host_view(), c, casting="unsafe")
    return out
