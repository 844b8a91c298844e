"""The op surface, by family. Each family module defines torch-named functions and
attaches its Tensor methods and operators with `_methods.install`.

Ops validate -> infer result shape/dtype -> allocate -> dispatch.impl(name, device).
"""
from __future__ import annotations

from . import elementwise, reduction, indexing, shape, linalg, nn, attention  # noqa: F401
from .elementwise import *  # noqa: F401,F403
from .reduction import *  # noqa: F401,F403
from .indexing import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .nn import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403

__all__ = (elementwise.__all__ + reduction.__all__ + indexing.__all__ + shape.__all__
           + linalg.__all__ + nn.__all__ + attention.__all__)
