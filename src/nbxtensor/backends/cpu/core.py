"""cpu: the data-moving primitives every Tensor needs (copy_, fill_)."""
from __future__ import annotations

import numpy as np

from ...dispatch import register


@register("copy_", "numpy")
def copy_(dst, src):
    """dst[...] = src, casting by the dtype table's rules; src already has dst's shape."""
    with np.errstate(all="ignore"):  # float->int of NaN/inf is unspecified, as documented
        np.copyto(dst._host_view(), src._host_view(), casting="unsafe")


@register("fill_", "numpy")
def fill_(dst, value):
    with np.errstate(all="ignore"):
        dst._host_view()[...] = np.asarray(value).astype(dst.dtype.np)
