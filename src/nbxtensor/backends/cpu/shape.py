"""cpu: shape ops with NumPy. `out` is allocated (and validated) by ops/shape.py."""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...dispatch import register


@register("cat", "numpy")
def cat(out, tensors, dim):
    o = out._host_view()
    start = 0
    for t in tensors:  # ops/shape.py passes only tensors of out's ndim (no legacy (0,) ones)
        n = t.shape[dim]
        if n == 0:
            continue
        idx = (slice(None),) * dim + (slice(start, start + n),)
        o[idx] = t._host_view()
        start += n


@register("flip", "numpy")
def flip(out, x, dims):
    out._host_view()[...] = np.flip(x._host_view(), axis=tuple(dims))


@register("roll", "numpy")
def roll(out, x, shifts, dims):
    out._host_view()[...] = np.roll(x._host_view(), shift=tuple(shifts), axis=tuple(dims))


@register("repeat", "numpy")
def repeat(out, x, sizes):
    out._host_view()[...] = np.tile(x._host_view(), tuple(sizes))


@register("repeat_interleave", "numpy")
def repeat_interleave(out, x, counts, dim):
    out._host_view()[...] = np.repeat(x._host_view(), counts, axis=dim)


@register("tril", "numpy")
def tril(out, x, diagonal):
    out._host_view()[...] = np.tril(x._host_view(), diagonal)


@register("triu", "numpy")
def triu(out, x, diagonal):
    out._host_view()[...] = np.triu(x._host_view(), diagonal)


_NP_PAD_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
                "circular": "wrap"}


@register("pad", "numpy")
def pad(out, x, pads, mode, value):
    a = x._host_view()
    # negative pads crop first (constant mode only; ops/shape.py checks)
    crop = tuple(slice(max(-b, 0), n - max(-e, 0)) for (b, e), n in zip(pads, a.shape))
    a = a[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in pads]
    if mode == "constant":
        with np.errstate(all="ignore"):
            fill = _dt.cast(value, out.dtype)
        out._host_view()[...] = np.pad(a, width, mode="constant", constant_values=fill)
    else:
        out._host_view()[...] = np.pad(a, width, mode=_NP_PAD_MODE[mode])
