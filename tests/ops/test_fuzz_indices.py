"""Out-of-range indices into every indexing op, on every device: an IndexError naming the
op, never a read of the neighbouring memory or a write into it.

The destination of each op is a view of the first rows of a larger buffer whose last row is
a canary: an index one past the end points exactly at it. Reads must raise rather than
return the canary; refused writes must leave the canary as it was (and on cpu, where the
check precedes the writes, the destination too).
Bad values are generated per op from its valid range: one past each end, the int32 limits
(an index that wraps when a kernel narrows it), and 2**40.
"""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
import nbxtensor.nn.functional as F
from helpers import rng
from nbxtensor.ops.indexing import check_index_errors

N, C, CANARY = 3, 4, 7777.0


def _buffer(device):
    """(buffer, x): x = buffer[:N] of fresh random values, buffer[N] the canary row."""
    a = rng(11).standard_normal((N + 1, C)).astype(np.float32)
    a[N] = CANARY
    buf = nbx.tensor(a, device=device)
    return buf, buf[:N]


def _bad(wraps: bool, n: int = N):
    """Indices outside [0, n) (or [-n, n) for ops that wrap negatives, as torch's do)."""
    return [n, n + 1, -n - 1 if wraps else -1, 2**31 - 1, -2**31, 2**31, 2**40, -2**40]


def _idx(v, device, dtype=nbx.int64, shape=None):
    a = np.array([0, v] if shape is None else np.full(shape, 0), dtype=np.int64)
    if shape is not None:
        a.reshape(-1)[-1] = v
    return nbx.tensor(a, dtype=dtype, device=device)


def _ones(shape, device):
    return nbx.tensor(rng(12).standard_normal(shape).astype(np.float32), device=device)


# name -> (wraps negatives, message fragment, reads?, fn(x, bad index value, device))
OPS = {
    "gather": (False, "gather:", True,
               lambda x, v, d: nbx.gather(x, 0, _idx(v, d, shape=(1, C)))),
    "gather_dim1": (False, "gather:", True,
                    lambda x, v, d: nbx.gather(x, 1, _idx(v + (C - N if v >= N else 0), d,
                                                          shape=(N, 1)))),
    "index_select": (False, "index_select:", True,
                     lambda x, v, d: nbx.index_select(x, 0, _idx(v, d))),
    "take": (True, "take:", True, lambda x, v, d: nbx.take(x, _idx(v * C if v >= N or v < -N
                                                                     else v, d))),
    "embedding": (False, "embedding:", True, lambda x, v, d: F.embedding(_idx(v, d), x)),
    "embedding_bag": (False, "embedding:", True, lambda x, v, d: F.embedding_bag(
        _idx(v, d), x, nbx.tensor([0], dtype=nbx.int64, device=d))),
    "getitem_tensor": (True, "index:", True, lambda x, v, d: x[_idx(v, d)]),
    "getitem_list": (True, "index:", True, lambda x, v, d: x[[0, v]]),
    "getitem_int": (True, "out of", True, lambda x, v, d: x[v]),
    "scatter": (False, "scatter", False, lambda x, v, d: x.scatter_(
        0, _idx(v, d, shape=(1, C)), _ones((1, C), d))),
    "scatter_value": (False, "scatter", False, lambda x, v, d: x.scatter_(
        0, _idx(v, d, shape=(1, C)), value=1.5)),
    "scatter_add": (False, "scatter_add", False, lambda x, v, d: x.scatter_add_(
        0, _idx(v, d, shape=(1, C)), _ones((1, C), d))),
    "scatter_reduce": (False, "scatter_reduce", False, lambda x, v, d: x.scatter_reduce_(
        0, _idx(v, d, shape=(1, C)), _ones((1, C), d), "amax")),
    "index_add": (False, "index_add", False, lambda x, v, d: x.index_add_(
        0, _idx(v, d), _ones((2, C), d))),
    "index_copy": (False, "index_copy", False, lambda x, v, d: x.index_copy_(
        0, _idx(v, d), _ones((2, C), d))),
    "index_fill": (False, "index_fill", False, lambda x, v, d: x.index_fill_(
        0, _idx(v, d), 2.5)),
    "index_put": (True, "index_put", False, lambda x, v, d: x.index_put_(
        (_idx(v, d),), _ones((2, C), d))),
    "index_put_accumulate": (True, "index_put", False, lambda x, v, d: x.index_put_(
        (_idx(v, d),), _ones((2, C), d), accumulate=True)),
    "setitem_tensor": (True, "index", False,
                       lambda x, v, d: x.__setitem__(_idx(v, d), 3.5)),
    "setitem_list": (True, "index", False,
                     lambda x, v, d: x.__setitem__(([0, v], [0, 0]), _ones((2,), d))),
    "setitem_int": (True, "out of", False, lambda x, v, d: x.__setitem__(v, 3.5)),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_out_of_range_index_raises_and_touches_nothing(device, op):
    wraps, fragment, reads, fn = OPS[op]
    for v in _bad(wraps):
        buf, x = _buffer(device)
        before = buf.numpy().copy()
        with pytest.raises(IndexError, match=fragment) as e:
            out = fn(x, v, device)
            check_index_errors()        # cuda reports a kernel's bad index at the next check
            pytest.fail(f"{op}: index {v} accepted, gave {out}")
        assert str(v) in str(e.value) or op.startswith(("take", "gather_dim1")), str(e.value)
        if not reads:
            # the canary always; on cpu (checks before writes) the destination too. On
            # interp/cuda an in-place op's in-range updates are applied (torch-differences.md)
            after = buf.numpy()
            np.testing.assert_array_equal(after[N], before[N], err_msg=f"{op} index {v}")
            if device == "cpu":
                np.testing.assert_array_equal(after, before, err_msg=f"{op} index {v}")


@pytest.mark.parametrize("op", ["index_select", "embedding", "gather"])
def test_int32_indices_at_their_limits(device, op):
    """An int32 index tensor whose values are int32's extremes: refused, not narrowed."""
    _, x = _buffer(device)
    for v in (2**31 - 1, -2**31):
        with pytest.raises(IndexError, match=f"{op}:"):
            if op == "gather":
                nbx.gather(x, 0, _idx(v, device, nbx.int32, shape=(1, C)))
            elif op == "embedding":
                F.embedding(_idx(v, device, nbx.int32), x)
            else:
                nbx.index_select(x, 0, _idx(v, device, nbx.int32))
            check_index_errors()


@pytest.mark.parametrize("op", sorted(OPS))
def test_in_range_indices_at_the_edges_work(device, op):
    """The bounds are exact: the last index (and -n where negatives wrap) is accepted and
    reads or writes the row it names, not the canary."""
    wraps, _, reads, fn = OPS[op]
    for v in ([N - 1, -N] if wraps else [N - 1]):
        buf, x = _buffer(device)
        out = fn(x, v, device)
        check_index_errors()
        after = buf.numpy()
        np.testing.assert_array_equal(after[N], CANARY, err_msg=f"{op} index {v}")
        if reads:
            got = np.asarray(out.numpy() if isinstance(out, nbx.Tensor) else out)
            assert not np.any(got == CANARY), (op, v, got)
