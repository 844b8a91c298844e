"""RNN, LSTM, GRU and their cells (torch.nn's parameter names and layouts).

One matmul of the whole sequence with weight_ih per layer and direction, then the
recurrence: an LSTM's in one call (the lstm_scan op: one kernel on cuda/interp, one NumPy
loop on cpu), the others (and an LSTM with proj_size) per time step, a matmul with
weight_hh and the gates' element-wise ops. Gate order as torch's: LSTM (i, f, g, o),
GRU (r, z, n). PackedSequence inputs run padded with each sequence's length.
"""
from __future__ import annotations

import math

from .. import init
from ... import dtypes as _dt
from ... import ops as _ops
from ...creation import zeros
from ...tensor import Tensor
from .._compose import dropout as _dropout
from ._call import non_defaults
from ._factory import param
from .module import Module

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _lstm_step(gi, h, c, w_hh, b_hh, w_hr):
    g = gi + _ops.linear(h, w_hh, b_hh)
    i, f, gg, o = g.chunk(4, -1)
    c = _ops.sigmoid(f) * c + _ops.sigmoid(i) * _ops.tanh(gg)
    h = _ops.sigmoid(o) * _ops.tanh(c)
    if w_hr is not None:
        h = _ops.linear(h, w_hr)
    return h, c


def _lstm_scan(gi, w_hh, b_hh, h0, c0, lengths, reverse):
    """The whole recurrence of one LSTM layer and direction in one kernel (kernels/rnn.py):
    (output (L, N, H), h_n, c_n)."""
    from ...dispatch import impl
    L, N = gi.shape[0], gi.shape[1]
    H = w_hh.shape[1]
    out = Tensor._empty((L, N, H), gi.dtype, gi.device)
    h_n = Tensor._empty((N, H), gi.dtype, gi.device)
    c_n = Tensor._empty((N, H), gi.dtype, gi.device)
    lens = None
    if lengths is not None:
        from ...creation import tensor as _tensor
        lens = _tensor(list(lengths), dtype=_dt.int32, device=gi.device)
    impl("lstm_scan", gi.device)(out, h_n, c_n, gi, w_hh, b_hh, h0.contiguous(),
                                 c0.contiguous(), lens, reverse)
    return out, h_n, c_n


def _gru_step(gi, h, w_hh, b_hh):
    gh = _ops.linear(h, w_hh, b_hh)
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    r = _ops.sigmoid(i_r + h_r)
    z = _ops.sigmoid(i_z + h_z)
    n = _ops.tanh(i_n + r * h_n)
    return n + z * (h - n)


def _rnn_step(gi, h, w_hh, b_hh, relu):
    g = gi + _ops.linear(h, w_hh, b_hh)
    return _ops.relu(g) if relu else _ops.tanh(g)


class RNNBase(Module):
    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0, device=None,
                 dtype=None):
        super().__init__()
        if mode not in _GATES:
            raise ValueError(f"Unrecognized RNN mode: {mode}")
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) \
                or not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"hidden_size must be an int greater than 0, got {hidden_size!r}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be an int greater than 0, got {num_layers!r}")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable "
                             "projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        D = 2 if bidirectional else 1
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size if proj_size > 0 else hidden_size
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(D):
                layer_input = input_size if layer == 0 else real_hidden * D
                suffix = "_reverse" if direction == 1 else ""
                shapes = [("weight_ih", (gate_size, layer_input)),
                          ("weight_hh", (gate_size, real_hidden))]
                if bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if proj_size > 0:
                    shapes += [("weight_hr", (proj_size, hidden_size))]
                names = []
                for base, shape in shapes:
                    name = f"{base}_l{layer}{suffix}"
                    setattr(self, name, param(shape, device, dtype))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    @property
    def all_weights(self):
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + non_defaults(
            self, (("proj_size", 0), ("num_layers", 1), ("bias", True), ("batch_first", False),
                   ("dropout", 0), ("bidirectional", False)))

    def _weights(self, layer, direction):
        suffix = "_reverse" if direction == 1 else ""
        get = lambda base: getattr(self, f"{base}_l{layer}{suffix}", None)  # noqa: E731
        return (get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh"),
                get("weight_hr"))

    def _initial(self, hx, N, size, dtype, device, batched, what):
        D = 2 if self.bidirectional else 1
        want = (D * self.num_layers, N, size) if batched else (D * self.num_layers, size)
        if hx is None:
            return zeros((D * self.num_layers, N, size), dtype=dtype, device=device)
        if not isinstance(hx, Tensor):
            raise TypeError(f"{type(self).__name__}: {what} must be a Tensor, got "
                            f"{type(hx).__name__}")
        if tuple(hx.shape) != want:
            raise ValueError(f"Expected hidden size {want}, got {list(hx.shape)}")
        return hx if batched else hx.unsqueeze(1)

    def forward(self, input, hx=None):  # noqa: A002
        name = type(self).__name__
        from ..utils.rnn import PackedSequence
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: input must be a Tensor or a PackedSequence, got "
                            f"{type(input).__name__}")
        return self._forward(input, hx, None)

    def _forward_packed(self, packed, hx):
        """A PackedSequence: run padded (sorted order) with each sequence's length, pack the
        output again; h_n (and c_n) in the caller's order, as torch."""
        from ..utils.rnn import PackedSequence, _padded
        x, lens = _padded(packed)
        perm, unperm = packed.sorted_indices, packed.unsorted_indices
        if hx is not None and perm is not None:      # the caller's order -> sorted
            hx = tuple(_ops.index_select(h, 1, perm) for h in hx) if isinstance(hx, tuple) \
                else _ops.index_select(hx, 1, perm)
        bf = self.batch_first
        try:
            self.__dict__["batch_first"] = False
            out, hn = self._forward(x, hx, lens)
        finally:
            self.__dict__["batch_first"] = bf
        bs = [int(v) for v in packed.batch_sizes.tolist()]
        data = _ops.cat([out[t, :b] for t, b in enumerate(bs)], 0)
        if unperm is not None:
            hn = tuple(_ops.index_select(h, 1, unperm) for h in hn) if isinstance(hn, tuple) \
                else _ops.index_select(hn, 1, unperm)
        return PackedSequence(data, packed.batch_sizes, perm, unperm), hn

    def _recur(self, gi_all, h, c, weights, lengths, masks, reverse, x):
        """One layer direction's recurrence over the projected inputs gi_all (L, N, gates):
        (output (L, N, H), h_n, c_n). LSTM on cuda/interp: one kernel for the whole
        sequence (kernels/rnn.py; its state is fp32, so not for float64), on cpu one NumPy
        loop (backends/cpu/rnn.py, fp64 state for float64); else per step."""
        w_hh, b_hh, w_hr = weights
        L, N = gi_all.shape[0], gi_all.shape[1]
        lstm = self.mode == "LSTM"
        if lstm and w_hr is None and L and (x.device.type == "cpu" or x.dtype.itemsize <= 4):
            return _lstm_scan(gi_all, w_hh, b_hh, h, c, lengths, reverse)
        seq = [None] * L
        for t in (range(L - 1, -1, -1) if reverse else range(L)):
            gi = gi_all[t]
            h_prev, c_prev = h, c
            if lstm:
                h, c = _lstm_step(gi, h, c, w_hh, b_hh, w_hr)
            elif self.mode == "GRU":
                h = _gru_step(gi, h, w_hh, b_hh)
            else:
                h = _rnn_step(gi, h, w_hh, b_hh, self.mode == "RNN_RELU")
            if lengths is not None and masks[t] is not None:
                # sequences already ended (or, reversed, not yet started) keep their state;
                # their output rows are 0, as torch's packed output
                m = masks[t]
                h = _ops.where(m, h, h_prev)
                if lstm:
                    c = _ops.where(m, c, c_prev)
                seq[t] = _ops.where(m, h, 0.0)
                continue
            seq[t] = h
        out = _ops.stack(seq) if L else zeros((0, N, h.shape[-1]), dtype=x.dtype,
                                                device=x.device)
        return out, h, c

    def _forward(self, input, hx, lengths):  # noqa: A002
        name = type(self).__name__
        if input.ndim not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.ndim}D instead")
        batched = input.ndim == 3
        x = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        L, N, Hin = x.shape
        if Hin != self.input_size:
            raise ValueError(f"input.size(-1) must be equal to input_size. Expected "
                             f"{self.input_size}, got {Hin}")
        lstm = self.mode == "LSTM"
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        if lstm:
            if hx is not None and not (isinstance(hx, tuple) and len(hx) == 2):
                raise TypeError(f"{name}: hx must be a tuple (h_0, c_0), got "
                                f"{type(hx).__name__}")
            h0 = self._initial(None if hx is None else hx[0], N, real_hidden, x.dtype, x.device,
                               batched, "h_0")
            c0 = self._initial(None if hx is None else hx[1], N, self.hidden_size, x.dtype,
                               x.device, batched, "c_0")
        else:
            h0 = self._initial(hx, N, self.hidden_size, x.dtype, x.device, batched, "hx")
        D = 2 if self.bidirectional else 1
        masks = None
        if lengths is not None:
            from ...creation import tensor as _tensor
            lens_t = _tensor(lengths, dtype=_dt.int64, device=x.device).unsqueeze(1)
            masks = [None if min(lengths) > t else _ops.gt(lens_t, t) for t in range(L)]
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(D):
                w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, direction)
                gi_all = _ops.linear(x, w_ih, b_ih)            # (L, N, gates): one matmul
                h = h0[layer * D + direction]
                c = c0[layer * D + direction] if lstm else None
                seq, h, c = self._recur(gi_all, h, c, (w_hh, b_hh, w_hr), lengths, masks,
                                        direction == 1, x)
                outs.append(seq)
                h_n.append(h)
                if lstm:
                    c_n.append(c)
            x = outs[0] if D == 1 else _ops.cat(outs, -1)
            if self.training and self.dropout > 0 and layer < self.num_layers - 1:
                x = _dropout(x, self.dropout, True)
        output = x
        if batched and self.batch_first:
            output = output.transpose(0, 1)
        hn = _ops.stack(h_n)
        if not batched:
            output, hn = output.squeeze(1), hn.squeeze(1)
        if lstm:
            cn = _ops.stack(c_n)
            return output, (hn, cn if batched else cn.squeeze(1))
        return output, hn


class RNN(RNNBase):
    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             f"'relu'.")
        self.__dict__["nonlinearity"] = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         0, device, dtype)


class LSTM(RNNBase):
    """output, (h_n, c_n) = lstm(input, (h_0, c_0)); input (L, N, H_in) or batch_first."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)


class GRU(RNNBase):
    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, 0, device, dtype)


class _CellBase(Module):
    _gates = 1

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        g = self._gates * hidden_size
        self.weight_ih = param((g, input_size), device, dtype)
        self.weight_hh = param((g, hidden_size), device, dtype)
        if bias:
            self.bias_ih = param((g,), device, dtype)
            self.bias_hh = param((g,), device, dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    reset_parameters = RNNBase.reset_parameters

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _prep(self, input, hx):  # noqa: A002
        if input.ndim not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected input to be 1D or 2D, got "
                             f"{input.ndim}D instead")
        batched = input.ndim == 2
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            hx = zeros((x.shape[0], self.hidden_size), dtype=x.dtype, device=x.device)
        elif not batched:
            hx = hx.unsqueeze(0)
        return x, hx, batched


class RNNCell(_CellBase):
    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None,
                 dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        self.__dict__["nonlinearity"] = nonlinearity
        super().__init__(input_size, hidden_size, bias, device, dtype)

    def forward(self, input, hx=None):  # noqa: A002
        x, h, batched = self._prep(input, hx)
        h = _rnn_step(_ops.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh,
                      self.bias_hh, self.nonlinearity == "relu")
        return h if batched else h.squeeze(0)


class LSTMCell(_CellBase):
    _gates = 4

    def forward(self, input, hx=None):  # noqa: A002
        if hx is None:
            x, h, batched = self._prep(input, None)
            c = h
        else:
            x, h, batched = self._prep(input, hx[0])
            c = hx[1] if batched else hx[1].unsqueeze(0)
        h, c = _lstm_step(_ops.linear(x, self.weight_ih, self.bias_ih), h, c, self.weight_hh,
                          self.bias_hh, None)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(_CellBase):
    _gates = 3

    def forward(self, input, hx=None):  # noqa: A002
        x, h, batched = self._prep(input, hx)
        h = _gru_step(_ops.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh,
                      self.bias_hh)
        return h if batched else h.squeeze(0)
