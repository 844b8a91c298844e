"""repr() of a tensor, in the style of torch's printing."""
from __future__ import annotations

import numpy as np

from . import dtypes as _dt

_THRESHOLD = 1000   # more elements than this are summarised with '...'
_EDGE = 3


def _float_formatter(vals: np.ndarray):
    finite = vals[np.isfinite(vals)]
    nonzero = np.abs(finite[finite != 0])
    integral = finite.size == 0 or bool(np.all(finite == np.round(finite)))
    big = nonzero.max() if nonzero.size else 0.0
    small = nonzero.min() if nonzero.size else 0.0
    # torch's rules: scientific when the range is wide (> 1e3), large (> 1e8) or tiny (< 1e-4)
    if integral:
        sci = big > 1e8 or (small > 0 and big / small > 1e3)
        fmt = (lambda x: f"{x:.4e}") if sci else (lambda x: f"{x:.0f}.")
    else:
        sci = big > 1e8 or small < 1e-4 or (small > 0 and big / small > 1e3)
        fmt = (lambda x: f"{x:.4e}") if sci else (lambda x: f"{x:.4f}")

    def one(x):
        x = float(x)
        if np.isnan(x):
            return "nan"
        if np.isinf(x):
            return "inf" if x > 0 else "-inf"
        return fmt(x)
    return one


def format_tensor(t) -> str:
    arr = t.numpy()
    dt = t.dtype
    suffix = []
    if t.device.type != "cpu":
        suffix.append(f"device='{t.device}'")
    if t.numel() == 0:
        if t.ndim != 1:
            suffix.insert(0, f"size={tuple(t.shape)}")
        # no values to tell an int64 from a float: torch names every non-default dtype
        if dt is not _dt.get_default_dtype():
            suffix.append(f"dtype=nbxtensor.{dt.name}")
    elif dt not in (_dt.get_default_dtype(), _dt.int64, _dt.bool):
        suffix.append(f"dtype=nbxtensor.{dt.name}")

    if dt.is_floating_point:
        vals = arr.astype(np.float64)
        shown = _summary_values(vals)
        one = _float_formatter(shown)
    elif dt is _dt.bool:
        vals = arr
        shown = vals
        one = lambda x: "True" if x else "False"  # noqa: E731
    else:
        vals = arr
        shown = _summary_values(vals)
        one = lambda x: str(int(x))  # noqa: E731
    width = max((len(one(x)) for x in shown.ravel()), default=0)

    if t.numel() == 0:
        body = "[]"
    else:
        body = np.array2string(vals, separator=", ", prefix="tensor(",
                               formatter={"all": lambda x: one(x).rjust(width)},
                               threshold=_THRESHOLD, edgeitems=_EDGE, max_line_width=80)
    return "tensor(" + body + "".join(", " + s for s in suffix) + ")"


def _summary_values(vals: np.ndarray) -> np.ndarray:
    """The values that will be printed (edges only for large tensors), for choosing a format."""
    if vals.size <= _THRESHOLD or vals.ndim == 0:
        return vals
    idx = tuple(np.r_[0:min(_EDGE, n), max(n - _EDGE, _EDGE):n] if n > 2 * _EDGE else slice(None)
                for n in vals.shape)
    return vals[np.ix_(*[np.arange(n)[i] for n, i in zip(vals.shape, idx)])]
