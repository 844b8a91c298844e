"""The op surface, by family. Each family module defines torch-named functions and
attaches its Tensor methods and operators with `_methods.install`.

Ops validate -> infer result shape/dtype -> allocate -> dispatch.impl(name, device).
"""
from __future__ import annotations

from . import elementwise, reduction, indexing, shape, linalg, nn, attention  # noqa: F401
from . import conv  # noqa: F401
from . import pooling, resample  # noqa: F401
from . import compare, structure, order, contract, factories, losses  # noqa: F401 - the everyday API
from . import moe  # noqa: F401 - nbx.nn.functional.fused_moe & co. (no torch top-level names)
from . import complex as _complex  # noqa: F401 - complex parts and views
from . import _methods
# Tensor[...] with tensor, list or bool indices (basic slicing is Tensor's own)
_methods.install(_advanced_getitem=indexing.getitem, _advanced_setitem=indexing.setitem)
from .elementwise import *  # noqa: F401,F403
from .reduction import *  # noqa: F401,F403
from .indexing import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .nn import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .compare import *  # noqa: F401,F403
from .structure import *  # noqa: F401,F403
from .order import *  # noqa: F401,F403
from .contract import *  # noqa: F401,F403
from .complex import *  # noqa: F401,F403
from .losses import cdist, cosine_similarity, pairwise_distance  # noqa: F401,E402 - torch.cdist & co.
# pooling and resampling: only the names torch has at its top level (torch.max_pool2d, ...);
# the rest are in nbx.nn.functional
_TOP = ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "adaptive_avg_pool1d",
        "adaptive_max_pool1d", "pixel_shuffle", "pixel_unshuffle")
from .pooling import (adaptive_avg_pool1d, adaptive_max_pool1d, avg_pool1d,  # noqa: F401,E402
                      max_pool1d, max_pool2d, max_pool3d)
from .resample import pixel_shuffle, pixel_unshuffle  # noqa: F401,E402

__all__ = (elementwise.__all__ + reduction.__all__ + indexing.__all__ + shape.__all__
           + linalg.__all__ + nn.__all__ + attention.__all__ + conv.__all__ + list(_TOP)
           + compare.__all__ + structure.__all__ + order.__all__ + contract.__all__
           + _complex.__all__
           + ["cdist", "cosine_similarity", "pairwise_distance"])
