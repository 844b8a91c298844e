"""Scans beyond cumsum/cumprod: logcumsumexp as NumPy's logaddexp accumulated along the dim
(fp16/bf16 in float32, rounded once)."""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...dispatch import register


@register("logcumsumexp", "numpy")
def logcumsumexp(x, dim, out):
    a = x._host_view()
    w = a.astype(np.float64 if a.dtype == np.float64 else np.float32)
    with np.errstate(all="ignore"):
        r = np.logaddexp.accumulate(w, axis=dim) if w.ndim else w
        _dt.copy_into(out._host_view(), r)
