"""Property tests: a random chain of views on a random tensor reads what the same chain
reads on the NumPy array; where both are views, strides and offsets agree too."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbxtensor as nbx

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


def _factor(n, draw):
    """A random shape with n elements (some -1 inferred)."""
    if n == 0:
        return (0, draw(st.integers(1, 3)))
    out, rest = [], n
    for _ in range(draw(st.integers(0, 3))):
        divs = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divs))
        out.append(d)
        rest //= d
    out.append(rest)
    if len(out) > 1 and draw(st.booleans()):
        out[draw(st.integers(0, len(out) - 1))] = -1
    return tuple(out)


@st.composite
def view_step(draw, shape):
    """One view op valid for `shape`: (name, args) and the new shape's rank."""
    nd = len(shape)
    ops = ["unsqueeze", "none_index", "reshape", "expand_new"]
    if nd:
        ops += ["permute", "transpose", "slice", "int", "narrow", "select", "squeeze",
                "flatten", "split", "ellipsis_int", "unflatten"]
    if any(n == 1 for n in shape):
        ops += ["expand"]
    if nd >= 2:
        ops += ["mT"]
    op = draw(st.sampled_from(ops))
    if op == "permute":
        return op, (draw(st.permutations(range(nd))),)
    if op == "transpose":
        return op, (draw(st.integers(-nd, nd - 1)), draw(st.integers(-nd, nd - 1)))
    if op == "slice":
        idx = []
        for n in shape[:draw(st.integers(1, nd))]:
            a = draw(st.none() | st.integers(-n - 2, n + 2))
            b = draw(st.none() | st.integers(-n - 2, n + 2))
            c = draw(st.none() | st.integers(1, 3))
            idx.append(slice(a, b, c))
        return op, (tuple(idx),)
    if op in ("int", "select", "ellipsis_int"):
        dims = [d for d in range(nd) if shape[d] > 0]
        if not dims:
            return "unsqueeze", (0,)
        d = draw(st.sampled_from(dims))
        return op, (d, draw(st.integers(-shape[d], shape[d] - 1)))
    if op == "narrow":
        d = draw(st.integers(0, nd - 1))
        start = draw(st.integers(0, shape[d]))
        return op, (d, start, draw(st.integers(0, shape[d] - start)))
    if op == "squeeze":
        return op, (draw(st.none() | st.integers(-nd, nd - 1)),)
    if op == "unsqueeze":
        return op, (draw(st.integers(-nd - 1, nd)),)
    if op == "none_index":
        return op, (draw(st.integers(0, nd)),)
    if op == "flatten":
        s = draw(st.integers(0, nd - 1))
        return op, (s, draw(st.integers(s, nd - 1)))
    if op == "unflatten":
        d = draw(st.integers(0, nd - 1))
        n = shape[d]
        if n == 0:
            return "unsqueeze", (0,)
        a = draw(st.sampled_from([k for k in range(1, n + 1) if n % k == 0]))
        return op, (d, (a, -1))
    if op == "reshape":
        return op, (_factor(math.prod(shape), draw),)
    if op == "expand":
        new = tuple(draw(st.integers(0, 3)) if n == 1 else n for n in shape)
        return op, (new,)
    if op == "expand_new":
        return op, ((draw(st.integers(1, 3)),) + tuple(shape),)
    if op == "split":
        d = draw(st.integers(0, nd - 1))
        size = draw(st.integers(1, max(shape[d], 1)))
        pieces = -(-shape[d] // size) if shape[d] else 1
        return op, (d, size, draw(st.integers(0, pieces - 1)))
    return op, ()


def apply_nbx(t, op, args):
    if op == "permute":
        return t.permute(*args[0])
    if op == "transpose":
        return t.transpose(*args)
    if op == "slice":
        return t[args[0]]
    if op == "int":
        return t[(slice(None),) * args[0] + (args[1],)]
    if op == "ellipsis_int":
        return t[(slice(None),) * args[0] + (args[1], Ellipsis)]
    if op == "select":
        return t.select(*args)
    if op == "narrow":
        return t.narrow(*args)
    if op == "squeeze":
        return t.squeeze(args[0]) if args[0] is not None else t.squeeze()
    if op == "unsqueeze":
        return t.unsqueeze(args[0])
    if op == "none_index":
        return t[(slice(None),) * args[0] + (None,)]
    if op == "flatten":
        return t.flatten(*args)
    if op == "unflatten":
        return t.unflatten(*args)
    if op == "reshape":
        return t.reshape(args[0])
    if op in ("expand", "expand_new"):
        return t.expand(*args[0])
    if op == "split":
        return t.split(args[1], args[0])[args[2]]
    if op == "mT":
        return t.mT
    raise AssertionError(op)


def apply_np(a, op, args):
    if op == "permute":
        return a.transpose(args[0])
    if op == "transpose":
        return np.swapaxes(a, *args)
    if op in ("slice", "int", "ellipsis_int", "none_index"):
        idx = {"slice": lambda: args[0],
               "int": lambda: (slice(None),) * args[0] + (args[1],),
               "ellipsis_int": lambda: (slice(None),) * args[0] + (args[1], Ellipsis),
               "none_index": lambda: (slice(None),) * args[0] + (None,)}[op]()
        return a[idx]
    if op == "select":
        return a[(slice(None),) * args[0] + (args[1],)]
    if op == "narrow":
        d, s, n = args
        return a[(slice(None),) * d + (slice(s, s + n),)]
    if op == "squeeze":
        if args[0] is None:
            return a.squeeze()
        d = args[0] % a.ndim
        return a.squeeze(d) if a.shape[d] == 1 else a
    if op == "unsqueeze":
        return np.expand_dims(a, args[0])
    if op == "flatten":
        s, e = args
        return a.reshape(a.shape[:s] + (math.prod(a.shape[s:e + 1]),) + a.shape[e + 1:])
    if op == "unflatten":
        d, (k, _) = args
        return a.reshape(a.shape[:d] + (k, a.shape[d] // k) + a.shape[d + 1:])
    if op == "reshape":
        return a.reshape(args[0])
    if op in ("expand", "expand_new"):
        return np.broadcast_to(a, args[0])
    if op == "split":
        d, size, i = args
        return a[(slice(None),) * d + (slice(i * size, (i + 1) * size),)]
    if op == "mT":
        return np.swapaxes(a, -1, -2)
    raise AssertionError(op)


@st.composite
def chains(draw):
    shape = draw(shapes)
    steps, s = [], shape
    probe = np.empty(shape, np.int8)
    for _ in range(draw(st.integers(1, 6))):
        op, args = draw(view_step(s))
        try:
            probe = apply_np(probe, op, args)
        except ValueError:  # e.g. flatten of an empty range NumPy cannot infer; skip the step
            continue
        steps.append((op, args))
        s = probe.shape
    return shape, steps


def _run(device, shape, steps, dtype=np.float32):
    base = np.arange(1, math.prod(shape) + 1, dtype=np.float64).reshape(shape).astype(dtype)
    if device == "cpu":
        t = nbx.from_numpy(base)
    else:
        t = nbx.tensor(base, device=device)
    a = base
    for op, args in steps:
        t = apply_nbx(t, op, args)
        a = apply_np(a, op, args)
        assert tuple(t.shape) == a.shape, (op, args)
    np.testing.assert_array_equal(t.numpy(), a)
    # a chain that stayed a NumPy view and a nbx view must agree on strides and offset
    if device == "cpu" and a.size and np.shares_memory(a, base) and \
            np.shares_memory(t.numpy(), base):
        item = base.itemsize
        for n, s, ast in zip(a.shape, t.stride(), a.strides):
            if n > 1:
                assert s == ast // item, (steps, t.stride(), a.strides)
        assert t.data_ptr() == a.ctypes.data


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                       HealthCheck.filter_too_much])


@settings(max_examples=300, **_SETTINGS)
@given(chains())
def test_view_chains_cpu(chain):
    _run("cpu", *chain)


@pytest.mark.parametrize("dtype", [np.int16, np.float64])
@settings(max_examples=40, **_SETTINGS)
@given(chain=chains())
def test_view_chains_dtypes(dtype, chain):
    _run("cpu", *chain, dtype=dtype)


def test_view_chains_device(device):
    """The same property on every device (views are metadata only); fewer examples."""
    @settings(max_examples=30 if device != "cpu" else 50, **_SETTINGS)
    @given(chains())
    def inner(chain):
        _run(device, *chain)
    inner()


@settings(max_examples=200, **_SETTINGS)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple), data=st.data())
def test_from_numpy_strided_zero_copy(shape, data):
    """from_numpy of any non-negative-stride view shares memory and reads the same values."""
    base = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    idx = tuple(slice(data.draw(st.integers(0, n - 1)), None, data.draw(st.integers(1, 3)))
                for n in shape)
    a = base[idx]
    if data.draw(st.booleans()):
        a = a.transpose(data.draw(st.permutations(range(a.ndim))))
    t = nbx.from_numpy(a)
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.data_ptr() == a.ctypes.data
    assert t.stride() == tuple(s // 4 for s in a.strides)
    a[...] = -1  # writes through
    assert (t.numpy() == -1).all()
