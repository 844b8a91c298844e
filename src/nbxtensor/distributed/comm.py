"""Communicators: the collectives of one process group, on tensors already checked by
nbx.distributed (shape, dtype, device, contiguity). Two implementations:

* `NcclCommunicator` -- NCCL on cuda tensors, enqueued on nbx.cuda's current stream of the
  tensor's device (capturable in a CUDA graph: no host synchronisation).
* `FakeCommunicator` -- FOR TESTS: the same collectives on host tensors (cpu, interp),
  performed through the rendezvous store, so the rendezvous, the launcher, the error paths
  and tensor-parallel code run in CI without GPUs. Slow (every call is a store round trip)
  and never meant for real work.
"""
from __future__ import annotations

import numpy as np

from . import nccl as _nccl
from .store import Store, exchange

__all__ = ["Communicator", "NcclCommunicator", "FakeCommunicator"]


class Communicator:
    """One process group's collectives. `out`/`inp` of the gathers and scatters are
    contiguous; gathers concatenate rank blocks in rank order along the flat memory."""

    rank: int
    world_size: int

    def all_reduce(self, t, op: str) -> None:
        raise NotImplementedError

    def all_gather(self, out, inp) -> None:
        raise NotImplementedError

    def reduce_scatter(self, out, inp, op: str) -> None:
        raise NotImplementedError

    def broadcast(self, t, src: int) -> None:
        raise NotImplementedError

    def send(self, t, dst: int) -> None:
        raise NotImplementedError

    def recv(self, t, src: int) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for the collectives enqueued so far (a no-op where they run eagerly)."""

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- NCCL
class NcclCommunicator(Communicator):
    """An NCCL communicator of `rank` on cuda device `device_index` (current at init)."""

    def __init__(self, unique_id: bytes, rank: int, world_size: int, device_index: int):
        from .. import cuda
        self._cuda = cuda
        self.rank, self.world_size, self.device_index = rank, world_size, device_index
        cuda.set_device(device_index)
        self.handle = _nccl.comm_init_rank(unique_id, world_size, rank)

    def _stream(self) -> int:
        return self._cuda.current_stream(self.device_index).handle

    def all_reduce(self, t, op):
        p = t.data_ptr()
        _nccl.all_reduce(p, p, t.numel(), _nccl.nccl_dtype(t.dtype), _nccl.reduce_op(op),
                         self.handle, self._stream())

    def all_gather(self, out, inp):
        _nccl.all_gather(inp.data_ptr(), out.data_ptr(), inp.numel(), _nccl.nccl_dtype(inp.dtype),
                         self.handle, self._stream())

    def reduce_scatter(self, out, inp, op):
        _nccl.reduce_scatter(inp.data_ptr(), out.data_ptr(), out.numel(),
                             _nccl.nccl_dtype(inp.dtype), _nccl.reduce_op(op), self.handle,
                             self._stream())

    def broadcast(self, t, src):
        p = t.data_ptr()
        _nccl.broadcast(p, p, t.numel(), _nccl.nccl_dtype(t.dtype), src, self.handle,
                        self._stream())

    def send(self, t, dst):
        _nccl.send(t.data_ptr(), t.numel(), _nccl.nccl_dtype(t.dtype), dst, self.handle,
                   self._stream())

    def recv(self, t, src):
        _nccl.recv(t.data_ptr(), t.numel(), _nccl.nccl_dtype(t.dtype), src, self.handle,
                   self._stream())

    def synchronize(self):
        self._cuda.current_stream(self.device_index).synchronize()

    def close(self):
        if self.handle:
            h, self.handle = self.handle, None
            _nccl.comm_destroy(h)

    def abort(self):
        if self.handle:
            h, self.handle = self.handle, None
            _nccl.comm_abort(h)


# ----------------------------------------------------------------------------- fake
def _reduce(arrays, op: str, dtype):
    """NCCL's reductions over rank-ordered arrays, in the arrays' dtype (avg: sum / n, an
    integer division for integer types, as NCCL)."""
    out = arrays[0].copy()
    for a in arrays[1:]:
        if op in ("sum", "avg"):
            out = out + a
        elif op == "prod":
            out = out * a
        elif op == "max":
            out = np.maximum(out, a)
        elif op == "min":
            out = np.minimum(out, a)
    if op == "avg":
        n = len(arrays)
        out = out // n if dtype.kind in "iub" else (out / np.asarray(n, out.dtype)).astype(out.dtype)
    return out


class FakeCommunicator(Communicator):
    """FOR TESTS ONLY: collectives on host tensors (cpu or interp) through the store.

    Each call exchanges every rank's bytes under a per-call tag; a rank that does not take
    part within the group's timeout is named in a StoreTimeout. Results equal NCCL's for
    the same rank order (reductions in the tensor's dtype, rank 0 first)."""

    def __init__(self, store: Store, rank: int, world_size: int, timeout: float):
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self._seq = 0
        self._p2p: dict = {}      # (src, dst) -> messages so far

    def _all(self, what, arr):
        self._seq += 1
        vals = exchange(self.store, f"fake/{self._seq}", self.rank, self.world_size,
                        np.ascontiguousarray(arr).tobytes(), self.timeout,
                        f"{what} (call {self._seq})")
        return [np.frombuffer(v, dtype=arr.dtype).reshape(arr.shape) for v in vals]

    @staticmethod
    def _write(t, arr):
        from .. import from_numpy
        t.copy_(from_numpy(np.ascontiguousarray(arr)))

    def all_reduce(self, t, op):
        self._write(t, _reduce(self._all("all_reduce", t.numpy()), op, t.dtype))

    def all_gather(self, out, inp):
        parts = self._all("all_gather", inp.numpy().reshape(-1))
        self._write(out, np.concatenate(parts).reshape(tuple(out.shape)))

    def reduce_scatter(self, out, inp, op):
        full = _reduce(self._all("reduce_scatter", inp.numpy().reshape(-1)), op, inp.dtype)
        n = out.numel()
        self._write(out, full[self.rank * n:(self.rank + 1) * n].reshape(tuple(out.shape)))

    def broadcast(self, t, src):
        self._write(t, self._all("broadcast", t.numpy())[src])

    def _p2p_key(self, src, dst):
        n = self._p2p.get((src, dst), 0) + 1
        self._p2p[(src, dst)] = n
        return f"fake/p2p/{src}/{dst}/{n}"

    def send(self, t, dst):
        self.store.set(self._p2p_key(self.rank, dst), np.ascontiguousarray(t.numpy()).tobytes())

    def recv(self, t, src):
        from .store import StoreTimeout
        key = self._p2p_key(src, self.rank)
        try:
            raw = self.store.get(key, self.timeout)
        except StoreTimeout:
            raise StoreTimeout([key], self.timeout, f"recv from rank {src}: nothing arrived "
                               f"within {self.timeout:g} s") from None
        self.store.delete(key)
        self._write(t, np.frombuffer(raw, dtype=t.dtype.np).reshape(tuple(t.shape)))
