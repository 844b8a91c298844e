"""torch.testing: assert_close with torch's default tolerances per dtype, and its messages'
first line ("Tensor-likes are not close!", "Scalars are not close!")."""
from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from .tensor import Tensor

__all__ = ["assert_close", "assert_allclose"]

# (rtol, atol) torch uses when neither is given
_DEFAULT = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
            "float64": (1e-7, 1e-7), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7),
            "float8_e4m3fn": (1.25e-1, 1e-5), "float8_e5m2": (2.5e-1, 1e-5)}


def _as_pair(v):
    if isinstance(v, Tensor):
        return v, v.dtype, v.device, v.cpu().numpy()
    if isinstance(v, np.ndarray):
        return v, _dt.as_dtype(v.dtype), None, v
    return v, None, None, np.asarray(v)


def assert_close(actual, expected, *, allow_subclasses=True, rtol=None, atol=None,
                 equal_nan=False, check_device=True, check_dtype=True, check_layout=True,
                 check_stride=False, msg=None):
    if isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)) and not (
            isinstance(actual, Tensor) or isinstance(expected, Tensor)):
        if len(actual) != len(expected):
            raise AssertionError(f"The length of the sequences mismatch: {len(actual)} != "
                                 f"{len(expected)}")
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan,
                         check_device=check_device, check_dtype=check_dtype, msg=msg)
        return
    if isinstance(actual, dict) and isinstance(expected, dict):
        if actual.keys() != expected.keys():
            raise AssertionError(f"The keys of the mappings do not match: {sorted(actual)} != "
                                 f"{sorted(expected)}")
        for k in actual:
            assert_close(actual[k], expected[k], rtol=rtol, atol=atol, equal_nan=equal_nan,
                         check_device=check_device, check_dtype=check_dtype, msg=msg)
        return
    if (rtol is None) != (atol is None):
        raise ValueError(f"Both 'rtol' and 'atol' must be either specified or omitted, but got "
                         f"no {'rtol' if rtol is None else 'atol'}.")
    tensor_like = isinstance(actual, (Tensor, np.ndarray)) or isinstance(expected, (Tensor, np.ndarray))
    _, adt, adev, a = _as_pair(actual)
    _, edt, edev, e = _as_pair(expected)
    if isinstance(actual, Tensor) != isinstance(expected, Tensor) and allow_subclasses is False:
        raise AssertionError(f"Type mismatch: {type(actual)} != {type(expected)}")
    if a.shape != e.shape:
        raise AssertionError(_msg(msg, f"The values for attribute 'shape' do not match: "
                                       f"{a.shape} != {e.shape}."))
    if check_device and adev is not None and edev is not None and adev != edev:
        raise AssertionError(_msg(msg, f"The values for attribute 'device' do not match: "
                                       f"{adev} != {edev}."))
    if check_dtype and adt is not None and edt is not None and adt is not edt:
        raise AssertionError(_msg(msg, f"The values for attribute 'dtype' do not match: "
                                       f"{adt} != {edt}."))
    if rtol is None:
        names = [d.name for d in (adt, edt) if d is not None]
        if not names:
            kinds = {a.dtype.kind, e.dtype.kind}
            names = ["float64" if kinds & {"f", "c"} else "int64"]
        tols = [_DEFAULT.get(n, (0.0, 0.0)) for n in names]
        rtol, atol = max(t[0] for t in tols), max(t[1] for t in tols)
    if a.dtype.kind in "biu" and e.dtype.kind in "biu":
        bad = a != e
    else:
        a64 = a.astype(np.complex128 if "c" in (a.dtype.kind, e.dtype.kind) else np.float64)
        e64 = e.astype(a64.dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            close = np.abs(a64 - e64) <= atol + rtol * np.abs(e64)
            close |= a64 == e64           # equal infinities
            if equal_nan:
                close |= np.isnan(a64) & np.isnan(e64)
        bad = ~close
    if np.any(bad):
        n, total = int(np.count_nonzero(bad)), bad.size
        head = "Tensor-likes are not close!" if tensor_like else "Scalars are not close!"
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a.astype(np.float64) - e.astype(np.float64)) if a.dtype.kind != "c" \
                else np.abs(a - e)
        worst = np.unravel_index(int(np.nanargmax(np.where(bad, diff, -1.0))), bad.shape) \
            if bad.ndim else ()
        raise AssertionError(_msg(msg, f"{head}\n\nMismatched elements: {n} / {total} "
                                       f"({100.0 * n / total:.1f}%)\nGreatest absolute "
                                       f"difference: {float(np.nanmax(np.where(bad, diff, 0)))} "
                                       f"at index {tuple(int(i) for i in worst)} (up to {atol} "
                                       f"allowed)\n(rtol={rtol}, atol={atol})"))


def _msg(msg, default):
    if msg is None:
        return default
    return msg(default) if callable(msg) else msg


def assert_allclose(actual, expected, rtol=None, atol=None, equal_nan=True, msg=""):
    """The deprecated spelling: no dtype or device check, NaNs equal by default."""
    if rtol is None and atol is None:
        rtol, atol = None, None
    assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan,
                 check_device=False, check_dtype=False, msg=msg or None)
