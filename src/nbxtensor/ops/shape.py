"""Shape ops: views as functions, and the data-moving ones (cat, stack, flip, roll, repeat,
repeat_interleave, tril/triu, pad) with torch's names and semantics.

Each data-moving op validates, works out the result shape and dtype, allocates (or
checks `out=`) and dispatches to backends/cpu/shape.py or kernels/shape.py.
"""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from .. import plans as _plans
from ..creation import arange
from ..device import Device
from ..dispatch import impl
from ..tensor import (MAX_SIZE, Size, Tensor, _as_int, cached_contiguous_strides, new_contiguous,
                      normalize_dim, normalize_size)
from ._common import check_out as _prepare_out, check_tensor, out_overlaps
from ._methods import install

__all__ = ["cat", "concat", "concatenate", "stack", "hstack", "vstack", "split", "chunk",
           "unbind", "flip", "fliplr", "flipud", "roll", "tile", "repeat_interleave", "tril",
           "triu", "pad", "movedim", "moveaxis", "narrow", "select", "permute", "transpose",
           "swapaxes", "swapdims", "squeeze", "unsqueeze", "flatten", "unflatten", "reshape",
           "t", "atleast_1d", "atleast_2d", "atleast_3d"]


def _write(out, user_out, srcs, run):
    """Run `run(dst)`; through a temporary when `out=` overlaps an input."""
    if out_overlaps(user_out, *srcs):
        tmp = Tensor._empty(out.shape, out.dtype, out.device)
        run(tmp)
        out.copy_(tmp)
    else:
        run(out)
    return out


# ---------------------------------------------------------------- views, as functions
def narrow(input, dim, start, length):  # noqa: A002 - torch's names
    return check_tensor(input, "input", "narrow").narrow(dim, start, length)


def select(input, dim, index):  # noqa: A002
    return check_tensor(input, "input", "select").select(dim, index)


def permute(input, dims):  # noqa: A002
    return check_tensor(input, "input", "permute").permute(dims)


def transpose(input, dim0, dim1):  # noqa: A002
    return check_tensor(input, "input", "transpose").transpose(dim0, dim1)


swapaxes = swapdims = transpose


def t(input):  # noqa: A002
    return check_tensor(input, "input", "t").t()


def squeeze(input, dim=None):  # noqa: A002
    return check_tensor(input, "input", "squeeze").squeeze(dim)


def unsqueeze(input, dim):  # noqa: A002
    return check_tensor(input, "input", "unsqueeze").unsqueeze(dim)


def flatten(input, start_dim=0, end_dim=-1):  # noqa: A002
    return check_tensor(input, "input", "flatten").flatten(start_dim, end_dim)


def unflatten(input, dim, sizes):  # noqa: A002
    return check_tensor(input, "input", "unflatten").unflatten(dim, sizes)


def reshape(input, shape):  # noqa: A002
    return check_tensor(input, "input", "reshape").reshape(shape)


def split(tensor, split_size_or_sections, dim=0):
    return check_tensor(tensor, "tensor", "split").split(split_size_or_sections, dim)


def chunk(input, chunks, dim=0):  # noqa: A002
    return check_tensor(input, "input", "chunk").chunk(chunks, dim)


def unbind(input, dim=0):  # noqa: A002
    return check_tensor(input, "input", "unbind").unbind(dim)


def movedim(input, source, destination):  # noqa: A002
    """Move dims `source` to positions `destination` (ints or sequences of equal length)."""
    x = check_tensor(input, "input", "movedim")
    src = (source,) if isinstance(source, (int, np.integer)) else tuple(source)
    dst = (destination,) if isinstance(destination, (int, np.integer)) else tuple(destination)
    if len(src) != len(dst):
        raise ValueError(f"movedim: source {src} and destination {dst} must have the same length")
    src = [normalize_dim(d, x.ndim, "source") for d in src]
    dst = [normalize_dim(d, x.ndim, "destination") for d in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"movedim: repeated dim in source {src} or destination {dst}")
    if x.ndim == 0:
        return x
    order = [-1] * x.ndim
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(d for d in range(x.ndim) if d not in src)
    order = [o if o >= 0 else next(rest) for o in order]
    return x.permute(order)


moveaxis = movedim


def atleast_1d(input):  # noqa: A002
    x = check_tensor(input, "input", "atleast_1d")
    return x.reshape(1) if x.ndim == 0 else x


def atleast_2d(input):  # noqa: A002
    x = check_tensor(input, "input", "atleast_2d")
    return x.reshape(1, -1) if x.ndim < 2 else x


def atleast_3d(input):  # noqa: A002
    """0-D -> (1, 1, 1); 1-D (n,) -> (1, n, 1); 2-D (m, n) -> (m, n, 1); else as is."""
    x = check_tensor(input, "input", "atleast_3d")
    if x.ndim == 0:
        return x.reshape(1, 1, 1)
    if x.ndim == 1:
        return x.reshape(1, -1, 1)
    return x.unsqueeze(-1) if x.ndim == 2 else x


# ---------------------------------------------------------------- cat / stack
def _tensor_list(tensors, opname):
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{opname}: tensors must be a list or tuple of Tensors, got "
                        f"{type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{opname}: expected a non-empty list of Tensors")
    for i, x in enumerate(tensors):
        if not isinstance(x, Tensor):
            raise TypeError(f"{opname}: tensors[{i}] is a {type(x).__name__}, expected a Tensor")
    dev = tensors[0].device
    for i, x in enumerate(tensors):
        if x.device != dev:
            raise ValueError(f"{opname}: tensors[{i}] is on {x.device}, but tensors[0] is on "
                             f"{dev}; all must be on one device")
    return list(tensors)


# cat/stack of contiguous tensors of one dtype on a kernel device: one launch per 4 inputs
# (kernels/shape.py cat_rows, through the "cat" entry's rows_widths argument).
# The plan (result shape, rows, widths, the bound launcher) is inferred once per (device
# type, dtype, stack, dim, shapes and strides) by the memoised `_cat_infer`; the per-call
# checks left are each tensor's class, dtype and device.
def _cat_fast_plan(shapes_strides, d, stack):
    ref = shapes_strides[0][0]
    nd = len(ref)
    for shp, st in shapes_strides:
        if len(shp) != nd or not _contiguous(shp, st) or 0 in shp:
            return None
        if stack:
            if shp != ref:
                return None
        elif any(shp[k] != ref[k] for k in range(nd) if k != d):
            return None
    if stack:
        if not -nd - 1 <= d <= nd:
            return None
        d = d % (nd + 1)
        shape = ref[:d] + (len(shapes_strides),) + ref[d:]
        rows = 1
        for n in ref[:d]:
            rows *= n
        inner = 1
        for n in ref[d:]:
            inner *= n
        return shape, rows, (inner,) * len(shapes_strides)
    if nd == 0 or not -nd <= d < nd:
        return None
    d = d % nd
    rows = 1
    for n in ref[:d]:
        rows *= n
    after = 1
    for n in ref[d + 1:]:
        after *= n
    widths = tuple(shp[d] * after for shp, _ in shapes_strides)
    shape = ref[:d] + (sum(shp[d] for shp, _ in shapes_strides),) + ref[d + 1:]
    return shape, rows, widths


def _contiguous(shape, stride):
    expected = 1
    for n, s in zip(reversed(shape), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


@_plans.memoize("ops.shape.cat")
def _cat_infer(devtype, dt, stack, dim, shapes_strides):
    """(shape, run, strides, nbytes) of cat/stack through one cat_rows dispatch, or False
    (a layout the fast form does not take: the full path runs)."""
    plan = _cat_fast_plan(shapes_strides, dim, stack)
    if not plan:
        return False
    shape, rows, widths = plan
    fn = impl("cat", Device(devtype))
    runner = getattr(fn, "runner", None)    # the triton impl's plan-bound launcher
    if runner is not None:
        run = runner(devtype, dt, rows, widths)
    else:
        def run(out, ts, fn=fn, rw=(rows, widths)):
            fn(out, ts, None, rows_widths=rw)
    shape = Size(shape)
    return shape, run, cached_contiguous_strides(shape), math.prod(shape) * dt.itemsize


def _cat_fast(tensors, dim, stack, out):
    """The result of cat/stack through one cat_rows dispatch, or None (take the full path)."""
    if out is not None or dim.__class__ is not int or tensors.__class__ not in (list, tuple) \
            or len(tensors) < 2:
        return None
    t0 = tensors[0]
    if t0.__class__ is not Tensor:
        return None
    dt, dev = t0._dtype, t0._storage.device
    if dev.type == "cpu":
        return None
    ss = []
    for x in tensors:
        if x.__class__ is not Tensor or x._dtype is not dt:
            return None
        xd = x._storage.device
        if xd is not dev and xd != dev:
            return None
        ss.append((x._shape, x._stride))
    plan = _cat_infer(dev.type, dt, stack, dim, tuple(ss))
    if plan is False:
        return None
    out = new_contiguous(plan[0], plan[2], dt, dev, plan[3])
    plan[1](out, tensors)   # kernel devices only
    return out


def cat(tensors, dim=0, *, out=None):
    """Concatenate along `dim`; dtypes promote (torch); 1-D empty tensors are skipped (torch)."""
    r = _cat_fast(tensors, dim, False, out)
    if r is not None:
        return r
    tensors = _tensor_list(tensors, "cat")
    dtype = tensors[0].dtype
    for x in tensors[1:]:
        dtype = _dt.promote_types(dtype, x.dtype)
    # torch's legacy rule: a 1-D tensor of size 0 takes part in nothing but the dtype
    numbered = [(i, x) for i, x in enumerate(tensors) if not (x.ndim == 1 and x.shape[0] == 0)]
    real = [x for _, x in numbered]
    if not real:
        shape, d = (0,), 0
    else:
        i0, ref = numbered[0]
        if ref.ndim == 0:
            raise ValueError(f"cat: zero-dimensional tensor (tensors[{i0}]) cannot be concatenated")
        d = normalize_dim(dim, ref.ndim)
        total = 0
        for i, x in numbered:
            if x.ndim != ref.ndim:
                raise ValueError(f"cat: tensors[{i}] has {x.ndim} dims, expected {ref.ndim} like "
                                 f"the first non-empty tensor (shape {tuple(ref.shape)})")
            for k in range(ref.ndim):
                if k != d and x.shape[k] != ref.shape[k]:
                    raise ValueError(f"cat: sizes of tensors must match except in dim {d}; "
                                     f"tensors[{i}] has shape {tuple(x.shape)}, expected size "
                                     f"{ref.shape[k]} at dim {k}")
            total += x.shape[d]
        shape = ref.shape[:d] + (total,) + ref.shape[d + 1:]
    dev = tensors[0].device
    res = _prepare_out(out, shape, dtype, dev, "cat")
    srcs = [x if x.dtype is dtype else x.to(dtype) for x in real]
    return _write(res, out, real, lambda o: impl("cat", dev)(o, srcs, d))


concat = concatenate = cat


def stack(tensors, dim=0, *, out=None):
    r = _cat_fast(tensors, dim, True, out)
    if r is not None:
        return r
    tensors = _tensor_list(tensors, "stack")
    for i, x in enumerate(tensors):
        if x.shape != tensors[0].shape:
            raise ValueError(f"stack: expects each tensor to be equal size, but tensors[0] has "
                             f"shape {tuple(tensors[0].shape)} and tensors[{i}] has "
                             f"{tuple(x.shape)}")
    d = normalize_dim(dim, tensors[0].ndim + 1)
    return cat([x.unsqueeze(d) for x in tensors], d, out=out)


def hstack(tensors, *, out=None):
    tensors = [atleast_1d(x) for x in _tensor_list(tensors, "hstack")]
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1, out=out)


def vstack(tensors, *, out=None):
    return cat([atleast_2d(x) for x in _tensor_list(tensors, "vstack")], 0, out=out)


# ---------------------------------------------------------------- flip / roll / repeat
def _dims_arg(dims, ndim, argname):
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    out = [normalize_dim(d, ndim, argname) for d in dims]
    if len(set(out)) != len(out):
        raise ValueError(f"{argname}: dim appears multiple times in {dims}")
    return out


# flip's fast path: (device type, dtype, shape, strides, dims as given) -> (normalised dims,
# implementation, its bound replay or None), stored once the full path accepted the call
# (dims are checked against the rank only). The replay is bound to the first call's output,
# so the plan is recorded by the full path (a PlanCache), not inferred from kinds alone.
_FLIP_FAST = _plans.PlanCache("ops.shape.flip", 4096)


def flip(input, dims):  # noqa: A002
    if input.__class__ is Tensor:
        dk = dims if dims.__class__ is int else tuple(dims) if dims.__class__ in (list, tuple) \
            else None
        if dk is not None:
            dev = input._storage.device
            key = (dev.type, input._dtype, input._shape, input._stride, dk)
            p = _FLIP_FAST.get(key)
            if p is not None:
                out = new_contiguous(input._shape, p[3], input._dtype, dev, p[4])
                if p[2] is not None:
                    p[2](out, input)
                else:
                    p[1](out, input, p[0])
                return out
    x = check_tensor(input, "input", "flip")
    dims = _dims_arg(dims, x.ndim, "dims")
    out = Tensor._empty(x.shape, x.dtype, x.device)
    if x.numel():
        fn = impl("flip", x.device)
        dims = dims if x.ndim else []
        fn(out, x, dims)
        if input.__class__ is Tensor and dk is not None:
            runner = getattr(fn, "runner", None)    # the triton impl's replay, bound
            _FLIP_FAST.put(key, (dims, fn, runner(out, x, dims) if runner is not None else None,
                                 out._stride, out.numel() * out._dtype.itemsize))
    return out


def fliplr(input):  # noqa: A002
    if check_tensor(input, "input", "fliplr").ndim < 2:
        raise ValueError(f"fliplr: input must be >= 2-D, got {input.ndim}-D")
    return flip(input, [1])


def flipud(input):  # noqa: A002
    if check_tensor(input, "input", "flipud").ndim < 1:
        raise ValueError("flipud: input must be >= 1-D, got 0-D")
    return flip(input, [0])


def roll(input, shifts, dims=None):  # noqa: A002
    x = check_tensor(input, "input", "roll")
    shifts = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    shifts = tuple(_as_int(s, "shifts") for s in shifts)
    if dims is None:
        if len(shifts) != 1:
            raise ValueError(f"roll: shifts {shifts} needs dims of the same length when given "
                             f"more than one shift")
        return roll(x.flatten(), shifts, 0).view(x.shape)
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    dims = [normalize_dim(d, x.ndim, "dims") for d in dims]  # repeats add up (torch)
    if len(dims) != len(shifts):
        raise ValueError(f"roll: shifts {shifts} and dims {tuple(dims)} must have the same length")
    out = Tensor._empty(x.shape, x.dtype, x.device)
    if x.numel():
        if x.ndim == 0:
            out.copy_(x)
        else:
            impl("roll", x.device)(out, x, shifts, dims)
    return out


def _repeat(self, *sizes):
    """Tensor.repeat: tile the tensor `sizes[i]` times along dim i (leading new dims allowed)."""
    sizes = normalize_size(sizes, "repeats")
    if len(sizes) < self.ndim:
        raise ValueError(f"repeat: number of repeat dims ({len(sizes)}) can not be smaller than "
                         f"the number of tensor dims ({self.ndim})")
    x = self.reshape((1,) * (len(sizes) - self.ndim) + tuple(self.shape))
    shape = normalize_size(tuple(n * r for n, r in zip(x.shape, sizes)), "repeat")
    out = Tensor._empty(shape, x.dtype, x.device)
    if out.numel():
        impl("repeat", x.device)(out, x, sizes)
    return out


def tile(input, dims):  # noqa: A002
    x = check_tensor(input, "input", "tile")
    dims = normalize_size((dims,), "dims")
    dims = (1,) * (x.ndim - len(dims)) + dims
    return _repeat(x, dims)


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):  # noqa: A002
    """Repeat each element (or slice along `dim`) `repeats` times; repeats: int or 1-D tensor.

    `repeat_interleave(repeats_tensor)` alone gives arange(n) repeated by it (torch).
    """
    x = check_tensor(input, "input", "repeat_interleave")
    if repeats is None:
        if x.ndim != 1 or x.dtype.kind not in "ui":
            raise ValueError(f"repeat_interleave: with one argument, it must be a 1-D integer "
                             f"tensor of repeats, got shape {tuple(x.shape)} {x.dtype.name}")
        return repeat_interleave(arange(x.shape[0], device=x.device), x, 0,
                                 output_size=output_size)
    if dim is None:
        x, dim = x.flatten(), 0
    d = normalize_dim(dim, x.ndim)
    n = x.shape[d] if x.ndim else 1
    if isinstance(repeats, Tensor):
        if repeats.dtype.kind not in "ui" or repeats.ndim > 1:
            raise TypeError(f"repeats: expected an int or a 0-/1-D integer tensor, got shape "
                            f"{tuple(repeats.shape)} {repeats.dtype.name}")
        counts = repeats.numpy().astype(np.int64).reshape(-1)
        if counts.size == 1:
            counts = np.full(n, counts[0], np.int64)
        elif counts.size != n:
            raise ValueError(f"repeats: has {counts.size} entries, expected {n} (the size of dim "
                             f"{d}) or 1")
    else:
        r = _dt.check_scalar(_as_int(repeats, "repeats"), _dt.int64, "repeat_interleave",
                             "repeats")
        counts = np.full(n, r, np.int64)
    if (counts < 0).any():
        raise ValueError(f"repeats: must be >= 0, got {counts[counts < 0][0]}")
    # the sum in int64 wraps past 2**63: then add exactly (the allocation refuses the size)
    total = (int(counts.sum()) if int(counts.max(initial=0)) * counts.size <= MAX_SIZE
             else sum(map(int, counts)))
    if output_size is not None and _as_int(output_size, "output_size") != total:
        raise ValueError(f"output_size: {output_size} does not match the sum of repeats {total}")
    if x.ndim == 0:
        x = x.reshape(1)
    shape = x.shape[:d] + (total,) + x.shape[d + 1:]
    out = Tensor._empty(shape, x.dtype, x.device)
    if out.numel():
        impl("repeat_interleave", x.device)(out, x, counts, d)
    return out


# ---------------------------------------------------------------- tril / triu
def _tri(name, input, diagonal, out):  # noqa: A002
    x = check_tensor(input, "input", name)
    if x.ndim < 2:
        raise ValueError(f"{name}: input must have at least 2 dims, got shape {tuple(x.shape)}")
    diagonal = _as_int(diagonal, "diagonal")
    res = _prepare_out(out, x.shape, x.dtype, x.device, name)
    if not res.numel():
        return res
    if out is not None and out._same_view(x):  # in place: each element reads only itself
        impl(name, x.device)(res, x, diagonal)
        return res
    return _write(res, out, [x], lambda o: impl(name, x.device)(o, x, diagonal))


def tril(input, diagonal=0, *, out=None):  # noqa: A002
    return _tri("tril", input, diagonal, out)


def triu(input, diagonal=0, *, out=None):  # noqa: A002
    return _tri("triu", input, diagonal, out)


def _tril_(self, diagonal=0):
    return tril(self, diagonal, out=self)


def _triu_(self, diagonal=0):
    return triu(self, diagonal, out=self)


# ---------------------------------------------------------------- pad
_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad(input, pad, mode="constant", value=None):  # noqa: A002
    """torch.nn.functional.pad: `pad` = (last_left, last_right, prev_left, prev_right, ...)."""
    x = check_tensor(input, "input", "pad")
    p = normalize_size((pad,), "pad", allow_negative=True)
    if len(p) % 2 or len(p) // 2 > x.ndim:
        raise ValueError(f"pad: expected an even number of entries, at most 2 * ndim = "
                         f"{2 * x.ndim}, got {len(p)} ({p})")
    if mode not in _PAD_MODES:
        raise ValueError(f"mode: expected one of {_PAD_MODES}, got {mode!r}")
    if mode != "constant" and value not in (None, 0):
        raise ValueError(f"pad: value={value} is only allowed with mode='constant', got "
                         f"mode={mode!r}")
    pads = [(0, 0)] * x.ndim
    for k in range(len(p) // 2):
        pads[x.ndim - 1 - k] = (p[2 * k], p[2 * k + 1])
    shape = []
    for d, ((b, e), n) in enumerate(zip(pads, x.shape)):
        m = n + b + e
        if m < 0:
            raise ValueError(f"pad: padding {b, e} gives dim {d} of size {n} the negative size {m}")
        if mode != "constant" and (b, e) != (0, 0):
            if b < 0 or e < 0:
                raise ValueError(f"pad: negative padding {b, e} at dim {d} is only supported with "
                                 f"mode='constant'")
            if mode == "reflect" and (b >= n or e >= n):
                raise ValueError(f"pad: padding {b, e} must be < the size {n} of dim {d} for "
                                 f"mode='reflect'")
            if mode in ("replicate", "circular") and n == 0:
                raise ValueError(f"pad: dim {d} of size 0 cannot be padded with mode={mode!r}")
            if mode == "circular" and (b > n or e > n):
                raise ValueError(f"pad: padding {b, e} must be <= the size {n} of dim {d} for "
                                 f"mode='circular'")
        shape.append(m)
    if value is not None and not isinstance(value, (bool, int, float, np.bool_, np.integer,
                                                   np.floating)):
        raise TypeError(f"value: expected a number, got {type(value).__name__}")
    out = Tensor._empty(shape, x.dtype, x.device)
    if out.numel():
        impl("pad", x.device)(out, x, pads, mode, 0 if value is None else value)
    return out


def _flip_method(self, *dims):
    # x.flip(0, 1) as well as x.flip((0, 1)) / x.flip(dims=[0, 1]), as torch's method
    return flip(self, dims[0] if len(dims) == 1 else dims)


def _flip_method_kw(self, *dims, **kwargs):
    if kwargs:
        if dims or set(kwargs) != {"dims"}:
            raise TypeError(f"flip() got unexpected arguments {sorted(kwargs)}")
        return flip(self, kwargs["dims"])
    return _flip_method(self, *dims)


install(flip=_flip_method_kw, fliplr=fliplr, flipud=flipud, roll=roll, repeat=_repeat, tile=tile,
        repeat_interleave=repeat_interleave, tril=tril, triu=triu, tril_=_tril_, triu_=_triu_,
        movedim=movedim, moveaxis=movedim)
