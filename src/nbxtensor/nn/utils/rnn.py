"""torch.nn.utils.rnn: PackedSequence, pack_padded_sequence, pad_packed_sequence,
pad_sequence, pack_sequence, unpad_sequence. The recurrent layers (nn.RNN/LSTM/GRU) accept a
PackedSequence: each sequence runs for its own length (its state stops changing after its
last element; the reverse direction starts at it) and the output is packed again."""
from __future__ import annotations

from collections import namedtuple

from ... import dtypes as _dt
from ... import ops as _ops
from ...tensor import Tensor

__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence",
           "pack_sequence", "unpad_sequence", "unpack_sequence"]

_Packed = namedtuple("PackedSequence", ["data", "batch_sizes", "sorted_indices",
                                        "unsorted_indices"])


class PackedSequence(_Packed):
    """data (sum of lengths, *): the time steps' batch rows, longest sequences first;
    batch_sizes (cpu int64): how many sequences each time step has."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = _invert(sorted_indices)
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs):
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        dev = data.device
        return type(self)(data, self.batch_sizes,
                          None if self.sorted_indices is None else self.sorted_indices.to(dev),
                          None if self.unsorted_indices is None else self.unsorted_indices.to(dev))

    @property
    def is_cuda(self):
        return self.data.is_cuda


def _invert(perm):
    from ...creation import arange, empty_like
    return empty_like(perm).scatter_(0, perm, arange(perm.numel(), device=perm.device))


def _lengths_list(lengths):
    if isinstance(lengths, Tensor):
        if lengths.ndim != 1:
            raise ValueError(f"lengths must be a 1D tensor, got shape {tuple(lengths.shape)}")
        return [int(v) for v in lengths.cpu().tolist()]
    return [int(v) for v in lengths]


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True):  # noqa: A002
    from ...creation import tensor as _tensor
    lens = _lengths_list(lengths)
    x = input.transpose(0, 1) if batch_first else input
    if len(lens) != x.shape[1]:
        raise ValueError(f"pack_padded_sequence: expected {x.shape[1]} lengths, got {len(lens)}")
    if any(n <= 0 for n in lens):
        raise ValueError("pack_padded_sequence: all lengths must be > 0 (length 0 found)")
    if max(lens) > x.shape[0]:
        raise ValueError(f"pack_padded_sequence: a length {max(lens)} exceeds the padded length "
                         f"{x.shape[0]}")
    if enforce_sorted:
        if any(a < b for a, b in zip(lens, lens[1:])):
            raise RuntimeError("`lengths` array must be sorted in decreasing order when "
                               "`enforce_sorted` is True. You can pass `enforce_sorted=False` "
                               "to pack_padded_sequence and/or pack_sequence to sidestep this "
                               "requirement if you do not need ONNX exportability.")
        order = list(range(len(lens)))
        sorted_idx = None
    else:
        order = sorted(range(len(lens)), key=lambda i: -lens[i])   # stable, as torch's sort
        sorted_idx = _tensor(order, dtype=_dt.int64, device=x.device)
        x = _ops.index_select(x, 1, sorted_idx)
    slens = [lens[i] for i in order]
    batch_sizes = [sum(1 for n in slens if n > t) for t in range(slens[0])]
    data = _ops.cat([x[t, :b] for t, b in enumerate(batch_sizes)], 0)
    return PackedSequence(data, _tensor(batch_sizes, dtype=_dt.int64), sorted_idx, None)


def _padded(seq: PackedSequence, padding_value=0.0, total_length=None):
    """(L, N, *) in sorted order and the sorted lengths (list)."""
    from ...creation import full
    bs = [int(v) for v in seq.batch_sizes.tolist()]
    n, L = bs[0], len(bs)
    if total_length is not None:
        if total_length < L:
            raise ValueError(f"Expected total_length to be at least {L}, but got {total_length}")
        L = total_length
    data = seq.data
    out = full((L, n) + tuple(data.shape[1:]), padding_value, dtype=data.dtype,
                    device=data.device)
    pos = 0
    for t, b in enumerate(bs):
        out[t, :b] = data[pos:pos + b]
        pos += b
    lens = [sum(1 for b in bs if b > i) for i in range(n)]
    return out, lens


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    from ...creation import tensor as _tensor
    out, lens = _padded(sequence, padding_value, total_length)
    lengths = _tensor(lens, dtype=_dt.int64)
    if sequence.unsorted_indices is not None:
        out = _ops.index_select(out, 1, sequence.unsorted_indices)
        lengths = _ops.index_select(lengths, 0, sequence.unsorted_indices.cpu())
    if batch_first:
        out = out.transpose(0, 1)
    return out, lengths


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """Stack variable-length tensors (L_i, *) into (max L, N, *) (batch_first: (N, max L, *)),
    padding with `padding_value` on the right (or left)."""
    if isinstance(sequences, Tensor):
        sequences = list(sequences.unbind(0))
    if not sequences:
        raise ValueError("pad_sequence: received an empty list of sequences")
    if padding_side not in ("right", "left"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got "
                         f"{padding_side}.")
    from ...creation import full
    first = sequences[0]
    L = max(s.shape[0] for s in sequences)
    out = full((len(sequences), L) + tuple(first.shape[1:]), padding_value,
                    dtype=first.dtype, device=first.device)
    for i, s in enumerate(sequences):
        n = s.shape[0]
        if n:
            if padding_side == "right":
                out[i, :n] = s
            else:
                out[i, L - n:] = s
    return out if batch_first else out.transpose(0, 1)


def pack_sequence(sequences, enforce_sorted=True):
    from ...creation import tensor as _tensor
    lengths = _tensor([s.shape[0] for s in sequences], dtype=_dt.int64)
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences, lengths, batch_first=False):
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    return [x[i, :n] for i, n in enumerate(_lengths_list(lengths))]


def unpack_sequence(packed_sequences):
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
