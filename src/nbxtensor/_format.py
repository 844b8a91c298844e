"""repr() of a tensor, as torch prints it: the same number formats (fixed, integral with a
trailing '.', or scientific, chosen from the non-zero finite values shown), the same widths,
line breaks at 80 columns, summaries ('...', 3 edge items) above 1000 elements, and the same
suffixes (device=, dtype=, size=)."""
from __future__ import annotations

import math

import numpy as np

from . import dtypes as _dt

_THRESHOLD = 1000   # more elements than this are summarised with '...'
_EDGE = 3
_LINEWIDTH = 80
_PRECISION = 4


class _Formatter:
    """torch's _Formatter: one width and one number format for every element shown."""

    def __init__(self, vals: np.ndarray, floating: bool):
        self.floating = floating
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        flat = vals.reshape(-1)
        if not floating:
            self.max_width = max([1] + [len(_scalar_text(v)) for v in flat])
            return
        nz = flat[np.isfinite(flat) & (flat != 0)]
        if nz.size == 0:
            return
        a = np.abs(nz)
        lo, hi = float(a.min()), float(a.max())
        self.int_mode = bool(np.all(nz == np.ceil(nz)))
        self.sci_mode = hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4
        if self.sci_mode:
            widths = [len(f"{v:.{_PRECISION}e}") for v in nz.tolist()]
        elif self.int_mode:
            widths = [len(f"{v:.0f}") + 1 for v in nz.tolist()]
        else:
            widths = [len(f"{v:.{_PRECISION}f}") for v in nz.tolist()]
        self.max_width = max([1] + widths)

    def format(self, v) -> str:
        if self.floating:
            v = float(v)
            if self.sci_mode:
                s = f"{v:{self.max_width}.{_PRECISION}e}"
            elif self.int_mode:
                s = f"{v:.0f}"
                if not (math.isinf(v) or math.isnan(v)):
                    s += "."
            else:
                s = f"{v:.{_PRECISION}f}"
        else:
            s = _scalar_text(v)
        return (self.max_width - len(s)) * " " + s


class _ComplexFormatter:
    """torch's complex printing: one format for the real parts, one for the imaginary ones
    (`1.5000+2.0000j`)."""

    def __init__(self, vals: np.ndarray):
        self.re = _Formatter(vals.real.astype(np.float64), True)
        self.im = _Formatter(np.abs(vals.imag).astype(np.float64), True)
        self.max_width = self.re.max_width + self.im.max_width + 2

    def format(self, v) -> str:
        im = self.im.format(abs(v.imag)).lstrip()
        s = self.re.format(v.real) + ("-" if math.copysign(1.0, v.imag) < 0 else "+") + im + "j"
        return (self.max_width - len(s)) * " " + s


def _scalar_text(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    return str(int(v))


def _summarized(vals: np.ndarray) -> np.ndarray:
    """The values that will be printed (edges only along each long dim)."""
    if vals.ndim == 0:
        return vals
    idx = [np.r_[0:_EDGE, n - _EDGE:n] if n > 2 * _EDGE else np.arange(n) for n in vals.shape]
    return vals[np.ix_(*idx)]


def _vector(vals, indent, summarize, fmt) -> str:
    per_line = max(1, math.floor((_LINEWIDTH - indent) / (fmt.max_width + 2)))
    n = vals.shape[0]
    if summarize and n > 2 * _EDGE:
        data = ([fmt.format(v) for v in vals[:_EDGE]] + [" ..."]
                + [fmt.format(v) for v in vals[n - _EDGE:]])
    else:
        data = [fmt.format(v) for v in vals]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + ("," + "\n" + " " * (indent + 1)).join(lines) + "]"


def _nested(vals, indent, summarize, fmt) -> str:
    if vals.ndim == 0:
        return fmt.format(vals[()])
    if vals.ndim == 1:
        return _vector(vals, indent, summarize, fmt)
    n = vals.shape[0]
    rows = (list(range(_EDGE)) + [None] + list(range(n - _EDGE, n))
            if summarize and n > 2 * _EDGE else list(range(n)))
    slices = ["..." if i is None else _nested(vals[i], indent + 1, summarize, fmt) for i in rows]
    return "[" + ("," + "\n" * (vals.ndim - 1) + " " * (indent + 1)).join(slices) + "]"


def _add_suffixes(text: str, suffixes, indent: int) -> str:
    parts = [text]
    last = len(text) - text.rfind("\n") + 1
    for s in suffixes:
        if last + len(s) + 2 > _LINEWIDTH:
            parts.append(",\n" + " " * indent + s)
            last = indent + len(s)
        else:
            parts.append(", " + s)
            last += len(s) + 2
    return "".join(parts) + ")"


def format_tensor(t) -> str:
    prefix = "tensor("
    indent = len(prefix)
    dt = t.dtype
    suffixes = []
    if t.device.type != "cpu":
        suffixes.append(f"device='{t.device}'")
    if t.numel() == 0:
        if t.ndim != 1:
            suffixes.append(f"size={tuple(t.shape)}")
        # no values to tell an int64 from a float: torch names every non-default dtype
        if dt is not _dt.get_default_dtype():
            suffixes.append(f"dtype=nbxtensor.{dt.name}")
        return _add_suffixes(prefix + "[]", suffixes, indent)
    if dt not in (_dt.get_default_dtype(), _dt.to_complex(_dt.get_default_dtype()), _dt.int64,
                  _dt.bool):
        suffixes.append(f"dtype=nbxtensor.{dt.name}")
    arr = t.numpy()
    if dt.is_floating_point:
        arr = arr.astype(np.float64)    # bf16/fp8 print their values (torch: through half)
    summarize = t.numel() > _THRESHOLD
    shown = _summarized(arr) if summarize else arr
    fmt = _ComplexFormatter(shown) if dt.is_complex else _Formatter(shown, dt.is_floating_point)
    return _add_suffixes(prefix + _nested(arr, indent, summarize, fmt), suffixes, indent)
