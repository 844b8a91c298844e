"""Mixture of experts: router top-k, moe_align_block_size, fused_experts, fused_moe.

vLLM's conventions throughout (its `fused_topk` / `grouped_topk`, `moe_align_block_size`,
`fused_experts`, `fused_moe`), with the weight layout w1 (E, 2*I, H) -- the gate rows
first, then the up rows -- and w2 (E, H, I).

moe_topk(gating_output (M, E), topk, renormalize=True, scoring="softmax"|"sigmoid",
         num_expert_group=None, topk_group=None, correction_bias=None,
         routed_scaling_factor=1.0) -> (topk_weights (M, topk) float32, topk_ids int32)
  Scores are softmax over the experts or sigmoid, in fp32 (float64 on cpu). The experts are
  chosen by score + correction_bias; with num_expert_group groups (DeepSeek-V3), each group
  is scored by the sum of its two best selection scores (by its best score when there is
  no bias, as vLLM) and only the topk_group best groups compete. Ties go to the lowest
  expert (group) index; NaN selection scores count as -inf. The weights are the
  uncorrected scores of the chosen experts, divided by their sum if `renormalize`, times
  routed_scaling_factor. The ids come out in decreasing order of selection score.

moe_align_block_size(topk_ids (M, topk) int, block_size, num_experts)
  -> (sorted_token_ids (numel + E*(block_size-1),) int32, expert_ids (cdiv(that, block_size),)
      int32, num_tokens_post_padded (1,) int32)
  The flat slot indices (token * topk + j) grouped by expert (increasing within an expert),
  each expert's segment padded to a multiple of block_size with the sentinel numel =
  M*topk; expert_ids[b] is the expert of block b. Past num_tokens_post_padded the ids are
  the sentinel and the experts -1. Ids outside [0, num_experts) are dropped (as vLLM's -1
  for experts held elsewhere).

fused_experts(hidden_states (M, H), w1, w2, topk_weights, topk_ids, activation="silu"|"gelu")
  sum_j topk_weights[:, j] * w2[e] @ (act(gate) * up), (gate; up) = w1[e] @ x, e =
  topk_ids[:, j]; a slot with an id outside [0, E) contributes nothing. The sum over the
  top-k slots is in slot order (no atomics: the same result on every run). On cuda/interp
  few slots (kernels/moe.py DECODE_MAX_SLOTS) take GEMV kernels that read only the chosen
  experts' weights; more take the aligned grouped GEMMs. The activation between the GEMMs
  is rounded to the input dtype (as vLLM's intermediate cache); everything else
  accumulates in fp32. dtypes: bf16/fp16/fp32 on cuda/interp; fp32/fp64/bf16/fp16 on cpu
  (16-bit computed in fp32). "gelu" is the erf form.

fused_moe(hidden_states, w1, w2, gating_output, topk, renormalize=True, activation="silu",
          *, scoring, num_expert_group, topk_group, correction_bias,
          routed_scaling_factor, shared_w1=None, shared_w2=None, shared_expert_gate=None)
  moe_topk then fused_experts. Shared experts (Qwen2-MoE, DeepSeek) are keyword arguments:
  shared_w1 (2*Is, H) gate then up rows, shared_w2 (H, Is), optional shared_expert_gate
  (1, H): out += sigmoid(x @ gate.T) * shared_mlp(x). Every token uses them and their
  intermediate size differs from the routed experts', so they run as dense GEMMs (linear)
  rather than as one more expert of the grouped kernel.
"""
from __future__ import annotations

import numbers

from .. import dtypes as _dt
from ..dispatch import impl
from ..tensor import Tensor
from ._common import check_tensor

__all__ = ["moe_topk", "moe_align_block_size", "fused_experts", "fused_moe"]

SUPPORTED_DTYPES = {
    "moe_topk": ("float32", "float16", "bfloat16", "float64"),
    "moe_align_block_size": ("int32", "int64"),
    "fused_experts": ("float32", "float16", "bfloat16", "float64"),
}
_ACTS = {"silu": 0, "gelu": 1}
_FLOATS = (_dt.float32, _dt.float16, _dt.bfloat16, _dt.float64)


def _int(v, name, op, low=1):
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < low:
        raise ValueError(f"{op}: {name} must be an int >= {low}, got {v!r}")
    return int(v)


def _check_float(t, name, op):
    if t.dtype not in _FLOATS:
        raise TypeError(f"{op}: {name} must be a float tensor (float32, float16, bfloat16, "
                        f"float64), got {t.dtype.name}")
    if t.dtype is _dt.float64 and t.device.type != "cpu":
        raise TypeError(f"{op}: {name} is float64, which the {t.device} kernels do not take "
                        f"(bfloat16, float16, float32; float64 on cpu)")


def _check_per_token(t, name, columns, op):
    """t is a 2-D (tokens, `columns`) float tensor of a dtype the kernels take."""
    if t.ndim != 2:
        raise ValueError(f"{op}: {name} must be 2-D (tokens, {columns}), got shape "
                         f"{tuple(t.shape)}")
    _check_float(t, name, op)


def _same_device(op, ref, **ts):
    for n, t in ts.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{op}: {n} is on {t.device}, hidden states/gating on {ref.device}")


def moe_topk(gating_output, topk, renormalize=True, scoring="softmax", num_expert_group=None,
             topk_group=None, correction_bias=None, routed_scaling_factor=1.0):
    op = "moe_topk"
    g = check_tensor(gating_output, "gating_output", op)
    _check_per_token(g, "gating_output", "experts", op)
    M, E = g.shape
    if E == 0:
        raise ValueError(f"{op}: gating_output has 0 experts")
    topk = _int(topk, "topk", op)
    if topk > E:
        raise ValueError(f"{op}: topk {topk} exceeds the number of experts {E}")
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"{op}: scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    if (num_expert_group is None) != (topk_group is None):
        raise ValueError(f"{op}: num_expert_group and topk_group go together, got "
                         f"{num_expert_group!r} and {topk_group!r}")
    groups, tg = 1, 1
    if num_expert_group is not None:
        groups = _int(num_expert_group, "num_expert_group", op)
        tg = _int(topk_group, "topk_group", op)
        if E % groups:
            raise ValueError(f"{op}: {E} experts do not split into num_expert_group {groups}")
        if tg > groups:
            raise ValueError(f"{op}: topk_group {tg} exceeds num_expert_group {groups}")
        if topk > tg * (E // groups):
            raise ValueError(f"{op}: topk {topk} exceeds the {tg * (E // groups)} experts of "
                             f"topk_group {tg} groups of {E // groups}")
        if correction_bias is not None and E // groups < 2:
            raise ValueError(f"{op}: groups of {E // groups} expert cannot be scored by their "
                             f"top-2 (num_expert_group {groups}, {E} experts)")
    if correction_bias is not None:
        b = check_tensor(correction_bias, "correction_bias", op)
        if tuple(b.shape) != (E,):
            raise ValueError(f"{op}: correction_bias must have shape ({E},), got "
                             f"{tuple(b.shape)}")
        _check_float(b, "correction_bias", op)
        _same_device(op, g, correction_bias=b)
        if b.stride(0) != 1:
            correction_bias = b.contiguous()
    if not isinstance(routed_scaling_factor, numbers.Real) or isinstance(
            routed_scaling_factor, bool):
        raise TypeError(f"{op}: routed_scaling_factor must be a number, got "
                        f"{type(routed_scaling_factor).__name__}")
    w = Tensor._empty((M, topk), _dt.float32, g.device)
    ids = Tensor._empty((M, topk), _dt.int32, g.device)
    return impl("moe_topk", g.device)(w, ids, g, topk, bool(renormalize), scoring == "sigmoid",
                                      groups, tg, correction_bias, float(routed_scaling_factor))


def _check_ids(topk_ids, op, M=None):
    t = check_tensor(topk_ids, "topk_ids", op)
    if t.ndim != 2 or (M is not None and t.shape[0] != M):
        raise ValueError(f"{op}: topk_ids must be 2-D (tokens{'' if M is None else f' = {M}'}, "
                         f"topk), got shape {tuple(t.shape)}")
    if t.dtype not in (_dt.int32, _dt.int64):
        raise TypeError(f"{op}: topk_ids must be int32 or int64, got {t.dtype.name}")
    return t.to(_dt.int32).contiguous() if t.dtype is not _dt.int32 else t.contiguous()


def moe_align_block_size(topk_ids, block_size, num_experts):
    op = "moe_align_block_size"
    ids = _check_ids(topk_ids, op)
    bs = _int(block_size, "block_size", op)
    E = _int(num_experts, "num_experts", op)
    numel = ids.numel()
    if numel + E * (bs - 1) >= 2 ** 31:
        raise OverflowError(f"{op}: {numel} slots padded to blocks of {bs} for {E} experts "
                            f"exceed int32 indices")
    n_sorted = numel + E * (bs - 1)
    s = Tensor._empty((n_sorted,), _dt.int32, ids.device)
    eids = Tensor._empty((-(-n_sorted // bs),), _dt.int32, ids.device)
    ntpp = Tensor._empty((1,), _dt.int32, ids.device)
    return impl("moe_align_block_size", ids.device)(s, eids, ntpp, ids, bs, E)


def _check_experts(op, x, w1, w2):
    x = check_tensor(x, "hidden_states", op)
    w1 = check_tensor(w1, "w1", op)
    w2 = check_tensor(w2, "w2", op)
    _check_per_token(x, "hidden_states", "hidden", op)
    M, H = x.shape
    if w1.ndim != 3 or w1.shape[2] != H or w1.shape[1] % 2 or w1.shape[1] == 0:
        raise ValueError(f"{op}: w1 must have shape (experts, 2*intermediate, {H}) (gate rows "
                         f"then up rows), got {tuple(w1.shape)}")
    E, I = w1.shape[0], w1.shape[1] // 2
    if tuple(w2.shape) != (E, H, I):
        raise ValueError(f"{op}: w2 must have shape ({E}, {H}, {I}) for w1 "
                         f"{tuple(w1.shape)}, got {tuple(w2.shape)}")
    for n, t in (("w1", w1), ("w2", w2)):
        if t.dtype is not x.dtype:
            raise TypeError(f"{op}: {n} is {t.dtype.name} but hidden_states is {x.dtype.name} "
                            f"(one dtype for activations and expert weights)")
    _same_device(op, x, w1=w1, w2=w2)
    return x, w1, w2


def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, activation="silu"):
    op = "fused_experts"
    x, w1, w2 = _check_experts(op, hidden_states, w1, w2)
    if activation not in _ACTS:
        raise ValueError(f"{op}: activation must be 'silu' or 'gelu', got {activation!r}")
    ids = _check_ids(topk_ids, op, x.shape[0])
    tw = check_tensor(topk_weights, "topk_weights", op)
    if tuple(tw.shape) != tuple(ids.shape):
        raise ValueError(f"{op}: topk_weights has shape {tuple(tw.shape)}, topk_ids "
                         f"{tuple(ids.shape)}")
    if tw.dtype.kind != "f":
        raise TypeError(f"{op}: topk_weights must be a float tensor, got {tw.dtype.name}")
    _same_device(op, x, topk_weights=tw, topk_ids=ids)
    tw = tw.to(_dt.float32).contiguous() if tw.dtype is not _dt.float32 else tw.contiguous()
    out = Tensor._empty(tuple(x.shape), x.dtype, x.device)
    if x.numel() == 0:
        return out
    return impl("fused_experts", x.device)(out, x, w1, w2, tw, ids, _ACTS[activation])


def fused_moe(hidden_states, w1, w2, gating_output, topk, renormalize=True, activation="silu",
              *, scoring="softmax", num_expert_group=None, topk_group=None,
              correction_bias=None, routed_scaling_factor=1.0, shared_w1=None, shared_w2=None,
              shared_expert_gate=None):
    op = "fused_moe"
    x, w1, w2 = _check_experts(op, hidden_states, w1, w2)
    g = check_tensor(gating_output, "gating_output", op)
    if g.ndim != 2 or tuple(g.shape) != (x.shape[0], w1.shape[0]):
        raise ValueError(f"{op}: gating_output must have shape ({x.shape[0]}, {w1.shape[0]}) "
                         f"(tokens, experts), got {tuple(g.shape)}")
    _same_device(op, x, gating_output=g)
    shared = _check_shared(op, x, shared_w1, shared_w2, shared_expert_gate)
    w, ids = moe_topk(g, topk, renormalize, scoring, num_expert_group, topk_group,
                      correction_bias, routed_scaling_factor)
    out = fused_experts(x, w1, w2, w, ids, activation)
    if shared:
        out = _shared_expert(x, out, shared_w1, shared_w2, shared_expert_gate, activation)
    return out


def _check_shared(op, x, sw1, sw2, sg):
    if sw1 is None and sw2 is None:
        if sg is not None:
            raise ValueError(f"{op}: shared_expert_gate needs shared_w1 and shared_w2")
        return False
    if sw1 is None or sw2 is None:
        raise ValueError(f"{op}: shared_w1 and shared_w2 go together")
    H = x.shape[1]
    sw1 = check_tensor(sw1, "shared_w1", op)
    sw2 = check_tensor(sw2, "shared_w2", op)
    if sw1.ndim != 2 or sw1.shape[1] != H or sw1.shape[0] % 2 or sw1.shape[0] == 0:
        raise ValueError(f"{op}: shared_w1 must have shape (2*intermediate, {H}), got "
                         f"{tuple(sw1.shape)}")
    if tuple(sw2.shape) != (H, sw1.shape[0] // 2):
        raise ValueError(f"{op}: shared_w2 must have shape ({H}, {sw1.shape[0] // 2}), got "
                         f"{tuple(sw2.shape)}")
    ts = {"shared_w1": sw1, "shared_w2": sw2}
    if sg is not None:
        sg = check_tensor(sg, "shared_expert_gate", op)
        if tuple(sg.shape) != (1, H):
            raise ValueError(f"{op}: shared_expert_gate must have shape (1, {H}), got "
                             f"{tuple(sg.shape)}")
        ts["shared_expert_gate"] = sg
    for n, t in ts.items():
        if t.dtype is not x.dtype:
            raise TypeError(f"{op}: {n} is {t.dtype.name} but hidden_states is {x.dtype.name}")
    _same_device(op, x, **ts)
    return True


def _shared_expert(x, out, sw1, sw2, sg, activation):
    from . import elementwise as ew
    from .linalg import linear
    Is = sw1.shape[0] // 2
    gu = linear(x, sw1)
    a = ew.silu(gu[:, :Is]) if activation == "silu" else ew.gelu(gu[:, :Is])
    y = linear(ew.mul(a, gu[:, Is:]), sw2)
    if sg is not None:
        y = ew.mul(y, ew.sigmoid(linear(x, sg)))
    return ew.add(out, y)
