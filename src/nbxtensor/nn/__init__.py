"""nbx.nn: torch.nn for inference: Module, Parameter, the layers (nbx.nn.Linear, ...), the
functional namespace (`nbx.nn.functional`, also `nbx.nn.F`), `nbx.nn.init` and
`nbx.nn.utils`. There is no autograd: modules hold and apply weights; see
nbxtensor.grad_mode."""
from __future__ import annotations

from . import functional  # noqa: F401
from . import functional as F  # noqa: F401,N812 - torch's conventional alias
from . import init, utils  # noqa: F401
from .modules import *  # noqa: F401,F403
from . import modules as _modules
from .modules.module import Buffer, Module, Parameter  # noqa: F401

__all__ = ["functional", "F", "init", "utils"] + sorted(
    n for n, v in vars(_modules).items() if isinstance(v, type) and not n.startswith("_"))
