"""cpu: the data-moving primitives every Tensor needs (copy_, fill_)."""
from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...dispatch import register


@register("copy_", "numpy")
def copy_(dst, src):
    """dst[...] = src, casting by the dtype table's rules; src already has dst's shape."""
    with np.errstate(all="ignore"):  # float->int of NaN/inf is unspecified, as documented
        _dt.copy_into(dst._host_view(), src._host_view())


@register("fill_", "numpy")
def fill_(dst, value):
    with np.errstate(all="ignore"):
        dst._host_view()[...] = _dt.cast(value, dst.dtype)
