"""Declared configuration spaces and shape-key bucketing, one `Tunable` per kernel.

A space is a finite list of config dicts. Only configs that are in today's space are ever
used: a cache entry whose config is not (the space shrank, a key was renamed) is ignored.

Shape keys are tuples of ints; the dtype is kept apart (it is its own cache field).
`bucket(key)` maps a raw key to the key the cache stores, so that a new shape finds an
entry tuned for a near one:
  matmul (M, N, K): M rounded up to a power of two (M is the token count: it varies), N and K
                    exact (they are the weight's shape: fixed per layer).
  gemv   (M, N, K): M in {1, 2, 4, 8, 16} (rounded up), N and K exact.
  rms_norm, softmax (R, N): rows rounded up to a power of two, row length N exact.
  attention (L, H, Hk, D, causal): sequence length rounded up to a power of two, the rest exact.
  decode_attention (B*Hk, C, R, D): cache capacity C rounded up to a power of two (near:
                    within 2 octaves), the rest exact.
`near(a, b)` says whether an entry for bucket b may serve bucket a when a has no entry of
its own: same N and K, M within a factor of 4 (distance = |log2 ratio|, nearest wins).

Knobs that count programs (the gemv and decode attention TARGET) are swept in waves:
multiples of the device's SM count `sms` (kernels/_common.device_facts), so a space and the
entries it admits are the device's. A tunable sized so (`sized_by_sms`) takes `sms` in its
space; left out, `sms` is the nominal machine's (kernels/_common.INTERP, shaped like the
H200 the shipped tables were tuned on).

Nothing here imports triton: `pick` (the seam the kernels call) must stay cheap.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

from ..kernels._common import INTERP as _NOMINAL


def _pow2_ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _grid(**axes) -> list[dict]:
    names = list(axes)
    return [dict(zip(names, vals)) for vals in itertools.product(*(axes[n] for n in names))]


def canon(cfg: dict) -> tuple:
    """A hashable, order-free spelling of a config (JSON round-trips lists; normalise them)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in cfg.items()))


def _sms(sms) -> int:
    return _NOMINAL.sms if sms is None else sms


@dataclass
class Tunable:
    name: str
    space: Callable[..., list]            # dtype name (, sms) -> the candidate configs
    bucket: Callable[[tuple], tuple]      # raw shape key -> cache key
    near: Callable[[tuple, tuple], float | None] = None   # distance, None = not usable
    applies: Callable[[dict, tuple], bool] = None  # may this config run this raw key?
    doc: str = ""
    sized_by_sms: bool = False            # space(dtype, sms): knobs in waves of the SMs
    _canon: dict = field(default_factory=dict, repr=False)

    def _space(self, dtype: str, sms) -> list:
        return self.space(dtype, _sms(sms)) if self.sized_by_sms else self.space(dtype)

    def candidates(self, dtype: str, sms: int | None = None) -> list[dict]:
        return [dict(c) for c in self._space(dtype, sms)]

    def contains(self, config: dict, dtype: str, sms: int | None = None) -> bool:
        k = (dtype, _sms(sms) if self.sized_by_sms else None)
        s = self._canon.get(k)
        if s is None:
            s = self._canon[k] = {canon(c) for c in self._space(dtype, sms)}
        try:
            return canon(config) in s
        except TypeError:      # an unhashable value in a hand-edited cache file
            return False


def _m_near(a: tuple, b: tuple) -> float | None:
    if a[1:] != b[1:] or a[0] <= 0 or b[0] <= 0:
        return None
    d = abs(math.log2(b[0] / a[0]))
    return d if d <= 2 else None


# ------------------------------------------------------------------------------ matmul
# Tiled tensor-core kernel (kernels/matmul.py). Keys of kernels.matmul.matmul_config; the
# persistent variant rides on the same kernel family (PERSISTENT / FLATTEN). Configs over
# the sm_90 shared-memory limit are in the space on purpose: the screen rejects them from
# the compiled kernel's metadata before any launch (reported, not silently pruned here).

def _matmul_space(dtype: str) -> list[dict]:
    if dtype in ("bfloat16", "float16"):
        tiles = _grid(BLOCK_M=[64, 128], BLOCK_N=[64, 128, 256], BLOCK_K=[32, 64],
                      num_warps=[4, 8], num_stages=[3, 4], GROUP_M=[8])
        pers = _grid(BLOCK_M=[128], BLOCK_N=[128, 256], BLOCK_K=[64], num_warps=[8],
                     num_stages=[3, 4], GROUP_M=[8], PERSISTENT=[True], FLATTEN=[False, True])
        return tiles + pers + _tma_space(64)
    if dtype == "float32":
        return _grid(BLOCK_M=[64, 128], BLOCK_N=[64, 128], BLOCK_K=[16, 32],
                     num_warps=[4, 8], num_stages=[2, 3, 4], GROUP_M=[8]) + _tma_space(32)
    if dtype == "float64":
        return _grid(BLOCK_M=[32, 64], BLOCK_N=[32, 64], BLOCK_K=[16], num_warps=[4],
                     num_stages=[2], GROUP_M=[8])
    return []


def _tma_space(bk: int) -> list[dict]:
    """The TMA kernel's configs (kernels/matmul.py `_TMA_16`, `_TMA_TF32`), persistent and
    flattened when the items outnumber the SMs; their K split is derived at launch
    (`_tma_split`), so it is not part of the space."""
    return _grid(TMA=[True], BLOCK_M=[128], BLOCK_N=[64, 128, 256], BLOCK_K=[bk],
                 num_warps=[4, 8], num_stages=[3, 4], GROUP_M=[8], FLATTEN=[True])


def _matmul_bucket(key: tuple) -> tuple:
    M, N, K = (int(v) for v in key)
    return (_pow2_ceil(M), N, K)


# ------------------------------------------------------------------------------ gemv
# Decode GEMV (kernels/gemv.py, M <= 16). Keys of kernels.gemv.gemv_config; K_SPLIT is
# derived from TARGET there, so it is not part of the space. TARGET in waves of the SMs.
GEMV_WAVES_ONE, GEMV_WAVES_MANY = (2, 4, 8), (1, 2, 4, 8)


def _gemv_space(dtype: str, sms: int) -> list[dict]:
    if dtype not in ("bfloat16", "float16", "float32"):
        return []
    bks = [128, 256, 512] if dtype != "float32" else [64, 128, 256]
    # num_stages stays at the rule's 4: a streaming loop with few iterations a program
    # gains little from it, and every value doubles the compile time of a cold sweep
    one = _grid(BLOCK_M=[1], BLOCK_N=[16, 32, 64], BLOCK_K=bks, num_warps=[4, 8],
                num_stages=[4], TARGET=[w * sms for w in GEMV_WAVES_ONE])
    many = _grid(BLOCK_M=[16], BLOCK_N=[32, 64, 128], BLOCK_K=[64, 128, 256], num_warps=[4, 8],
                 num_stages=[4], TARGET=[w * sms for w in GEMV_WAVES_MANY])
    return one + many


def _gemv_bucket(key: tuple) -> tuple:
    M, N, K = (int(v) for v in key)
    return (min(_pow2_ceil(M), 16), N, K)


def _gemv_near(a: tuple, b: tuple) -> float | None:
    # never across M == 1: BLOCK_M = 1 configs compute one row only
    return None if (a[0] == 1) != (b[0] == 1) else _m_near(a, b)


def _gemv_applies(cfg: dict, key: tuple) -> bool:
    return cfg.get("BLOCK_M") != 1 or int(key[0]) == 1


def gemv_candidates(dtype: str, M: int, sms: int | None = None) -> list[dict]:
    """The part of the gemv space that applies to M rows (BLOCK_M 1 only for M == 1)."""
    want = 1 if M == 1 else 16
    return [c for c in _gemv_space(dtype, _sms(sms)) if c["BLOCK_M"] == want]


# ------------------------------------------------------------------------------ row kernels
# rms_norm (kernels/norm.py) and softmax (kernels/softmax.py) share the rows rule
# (softmax.row_config): key (R, N) = rows x row length. SINGLE holds a whole row in
# registers and is only correct with BLOCK_N >= N (`applies`); the multi-pass form works for
# any N. Sweeps run through their _OVERRIDE hooks; norm.py (rms_norm and its residual form
# add_rms_norm; layer_norm keeps the rule: no sweep times it) and softmax.py (softmax,
# log_softmax: the same kernel) call pick().

def _rows_space(dtype: str) -> list[dict]:
    if dtype not in ("bfloat16", "float16", "float32"):
        return []
    single = [c for c in _grid(BLOCK_N=[1 << i for i in range(0, 15)],
                               BLOCK_R=[1, 2, 4, 8, 16, 32, 64], SINGLE=[True],
                               num_warps=[1, 2, 4, 8, 16])
              if c["BLOCK_N"] * c["BLOCK_R"] <= 16384]
    multi = _grid(BLOCK_R=[1], BLOCK_N=[1024, 2048, 4096, 8192], SINGLE=[False],
                  num_warps=[4, 8, 16])
    return single + multi


def _rows_bucket(key: tuple) -> tuple:
    return (_pow2_ceil(int(key[0])), int(key[1]))


def _rows_applies(cfg: dict, key: tuple) -> bool:
    return not cfg.get("SINGLE") or cfg.get("BLOCK_N", 0) >= int(key[1])


def rows_candidates(dtype: str, N: int) -> list[dict]:
    """The part of the rows space worth sweeping for row length N: SINGLE with
    BLOCK_N = next_pow2(N) (any BLOCK_R, warps), plus the multi-pass forms for N > 4096."""
    bn = _pow2_ceil(N)
    return [c for c in _rows_space(dtype)
            if (c["SINGLE"] and c["BLOCK_N"] == bn) or (not c["SINGLE"] and N > 4096)]


# ------------------------------------------------------------------------ attention prefill
# Flash attention (kernels/attention.py sdpa) of one sequence, no mask, L == S:
# key (L, H, Hk, D, causal) = sequence length, query heads, kv heads, head dim, causal (0/1;
# a 4-long key means causal). BLOCK_M must be a multiple of BLOCK_N (the kernel's causal
# split relies on it). The TMA knob (TMA=True; absent = the pointer kernel) is in the space
# of 16-bit dtypes only and applies only to head dims that are powers of two >= 16 -- the
# kernel's own `_tma_ok` rule for contiguous inputs (sdpa still checks strides/alignment
# at the call and falls back to its default when a TMA entry does not fit the tensors).

def _attn_space(dtype: str) -> list[dict]:
    if dtype not in ("bfloat16", "float16", "float32"):
        return []
    base = [c for c in _grid(BLOCK_M=[16, 32, 64, 128], BLOCK_N=[16, 32, 64, 128],
                             num_warps=[4, 8], num_stages=[1, 2, 3, 4])
            if c["BLOCK_M"] % c["BLOCK_N"] == 0]
    if dtype == "float32":     # the TMA kernel is 16-bit only (kernels/attention.py _tma_ok)
        return base
    tma = [dict(c, TMA=True) for c in base if c["BLOCK_M"] >= 64 and c["num_stages"] >= 2]
    # the warp-specialised kernel only in the settings verified on the H200
    # (kernels/attention.py WS_VERIFIED; non-causal keys only: causal ones refuse it)
    ws = [dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, WS=True)]
    return base + tma + ws


def _attn_key(key: tuple) -> tuple:
    L, H, Hk, D = (int(v) for v in key[:4])
    causal = int(bool(key[4])) if len(key) > 4 else 1
    return L, H, Hk, D, causal


def _attn_bucket(key: tuple) -> tuple:
    L, H, Hk, D, causal = _attn_key(key)
    return (_pow2_ceil(L), H, Hk, D, causal)


def tma_head_dim(D: int) -> bool:
    return D >= 16 and D & (D - 1) == 0


# the head dims of kernels/attention.py WS_VERIFIED (non-causal only; kept equal to it by
# tests/runtime/test_autotune.py -- this module does not import the kernels)
WS_HEAD_DIMS = (128,)


def _ws_applies(D: int, causal) -> bool:
    return D in WS_HEAD_DIMS and not causal


def _attn_applies(cfg: dict, key: tuple) -> bool:
    """TMA only where the TMA kernel runs; the warp-specialised kernel only where sdpa runs
    it (elsewhere it is refused on cuda, or a WS tile would run on the pointer kernel)."""
    L, H, Hk, D, causal = _attn_key(key)
    if cfg.get("WS") and cfg["WS"] != "off":
        return _ws_applies(D, causal)
    return not cfg.get("TMA") or tma_head_dim(D)


def attention_candidates(dtype: str, D: int, causal=None) -> list[dict]:
    """The part of the attention space that applies to head dim D (and `causal` when given):
    TMA only where it runs, WS only at the verified head dims (non-causal)."""
    out = []
    for c in _attn_space(dtype):
        if c.get("WS") and c["WS"] != "off":
            if D in WS_HEAD_DIMS and (causal is None or not causal):
                out.append(c)
        elif not c.get("TMA") or tma_head_dim(D):
            out.append(c)
    return out


def attention_sweep(dtype: str, D: int, causal=None) -> list[dict]:
    """What an attention sweep times (52 of the 122 for a 16-bit power-of-two head dim; 53
    of 123 with the warp-specialised config, D=128 non-causal):
    2 or 3 stages, and no 16-wide key tiles under query tiles of 64+ rows -- each candidate
    is a ~1 s compile on a cold sweep. The rule's config is added by the sweep if missing."""
    return [c for c in attention_candidates(dtype, D, causal)
            if c["num_stages"] in (2, 3) and not (c["BLOCK_M"] >= 64 and c["BLOCK_N"] == 16)]


# --------------------------------------------------------------------- decode attention
# Split-K decode attention (kernels/decode_attention.py): key (B*Hk, C, R, D) = kv rows
# (batch x kv heads), cache capacity, query rows per kv head (group x tokens), head dim.
# TARGET = programs the split aims for, in waves of the SMs (P, the splits, is derived from
# it and BLOCK_N as the rule does); COMBINE = 1 merges the partials in the last split
# program (ticket), 0 in a second launch. The rule's configs (interp: BLOCK_N 16, 1 stage;
# fp32: 64 / 2 stages, halved for wide heads) are in the space.

DECODE_WAVES = (1, 2, 3, 4, 8)


def _decode_space(dtype: str, sms: int) -> list[dict]:
    if dtype not in ("bfloat16", "float16", "float32"):
        return []
    return _grid(TARGET=[w * sms for w in DECODE_WAVES], BLOCK_N=[16, 32, 64, 128],
                 num_warps=[2, 4, 8], num_stages=[1, 2, 3], COMBINE=[0, 1])


def _decode_bucket(key: tuple) -> tuple:
    BH, C, R, D = (int(v) for v in key)
    return (BH, _pow2_ceil(C), R, D)


def _decode_near(a: tuple, b: tuple) -> float | None:
    # the axis that varies between calls of one model is the cache capacity C (index 1)
    if a[0] != b[0] or a[2:] != b[2:] or a[1] <= 0 or b[1] <= 0:
        return None
    d = abs(math.log2(b[1] / a[1]))
    return d if d <= 2 else None


def decode_candidates(dtype: str, sms: int | None = None) -> list[dict]:
    """What a decode sweep times: COMBINE=1 (the rule's) with 4+ warps below 8 waves, plus
    COMBINE=0 at the rule's TARGET (3 waves) -- 108 of the 360 (each candidate is a compile
    on a cold sweep)."""
    sms = _sms(sms)
    return [c for c in _decode_space(dtype, sms)
            if (c["COMBINE"] == 1 and c["num_warps"] >= 4 and c["TARGET"] != 8 * sms)
            or (c["COMBINE"] == 0 and c["TARGET"] == 3 * sms and c["num_warps"] == 4)]


# ------------------------------------------------------------------------------ pruning
# A cold sweep is mostly compiles, so each key sweeps only the configs that can win on it.
# A tile wider than the (power-of-two rounded) extent it covers computes masked-off lanes
# only: the narrower tile of the same config does the same work with less waste. A
# persistent matmul with no more tiles than SMs is the plain kernel plus a loop. The rule's
# own config is never pruned (it is the untuned baseline). Sweeps record what was pruned.


def _cap(v: int, floor: int) -> int:
    return max(floor, _pow2_ceil(v))


# per kernel: (tile knob, the key's index of the extent it covers, the floor of that
# extent's power-of-two cap, the reason recorded when the tile is wider)
_TILE_EXTENTS = {
    "matmul": (("BLOCK_M", 0, 64, "BLOCK_M beyond M"), ("BLOCK_N", 1, 64, "BLOCK_N beyond N"),
               ("BLOCK_K", 2, 16, "BLOCK_K beyond K")),
    "gemv": (("BLOCK_N", 1, 16, "BLOCK_N beyond N"), ("BLOCK_K", 2, 64, "BLOCK_K beyond K")),
    "rms_norm": (("BLOCK_R", 0, 1, "BLOCK_R beyond the rows"),),
    "softmax": (("BLOCK_R", 0, 1, "BLOCK_R beyond the rows"),),
    "attention": (("BLOCK_M", 0, 16, "tile beyond the sequence"),
                  ("BLOCK_N", 0, 16, "tile beyond the sequence")),
    "decode_attention": (("BLOCK_N", 1, 16, "BLOCK_N beyond the cache"),),
}


def _prune_reason(kernel: str, key: tuple, c: dict, sms: int) -> str | None:
    k = tuple(int(v) for v in key)
    for knob, i, floor, why in _TILE_EXTENTS.get(kernel, ()):
        if c[knob] > _cap(k[i], floor):
            return why
    if kernel == "matmul" and c.get("PERSISTENT") and -(-k[0] // 128) * -(-k[1] // 128) <= sms:
        return "persistent with no more 128x128 tiles than SMs"
    return None


def prune(kernel: str, key: tuple, candidates: list[dict], keep: dict | None = None,
          sms: int | None = None):
    """(kept, {reason: count}): the candidates that can win on `key` on a device of `sms`
    SMs (`keep`, the rule's config, is never pruned)."""
    kept, why = [], {}
    kc = canon(keep) if keep else None
    for c in candidates:
        r = _prune_reason(kernel, key, c, _sms(sms))
        if r is None or canon(c) == kc:
            kept.append(c)
        else:
            why[r] = why.get(r, 0) + 1
    return kept, why


TUNABLES: dict[str, Tunable] = {}


def register_tunable(t: Tunable) -> Tunable:
    """Declare a tunable kernel (tests register toy ones); the name must be new."""
    if t.name in TUNABLES and TUNABLES[t.name] is not t:
        raise ValueError(f"register_tunable: {t.name!r} is already declared")
    TUNABLES[t.name] = t
    return t


def unregister_tunable(name: str) -> None:
    TUNABLES.pop(name, None)


def get_tunable(name: str) -> Tunable:
    t = TUNABLES.get(name)
    if t is None:
        raise KeyError(f"autotune: no tunable kernel {name!r}; declared: {', '.join(sorted(TUNABLES))}")
    return t


register_tunable(Tunable("matmul", _matmul_space, _matmul_bucket, _m_near, None,
                         doc="tiled matmul (kernels/matmul.py), x[M,K] @ W[N,K]^T"))
register_tunable(Tunable("gemv", _gemv_space, _gemv_bucket, _gemv_near, _gemv_applies,
                         doc="decode GEMV (kernels/gemv.py), M <= 16", sized_by_sms=True))
register_tunable(Tunable("rms_norm", _rows_space, _rows_bucket, _m_near, _rows_applies,
                         doc="rms_norm rows (kernels/norm.py), key (rows, N)"))
register_tunable(Tunable("softmax", _rows_space, _rows_bucket, _m_near, _rows_applies,
                         doc="softmax rows (kernels/softmax.py), key (rows, N)"))
register_tunable(Tunable("attention", _attn_space, _attn_bucket, _m_near, _attn_applies,
                         doc="flash attention prefill (kernels/attention.py), "
                             "key (L, H, Hk, D, causal)"))
register_tunable(Tunable("decode_attention", _decode_space, _decode_bucket, _decode_near, None,
                         doc="split-K decode attention (kernels/decode_attention.py), "
                             "key (B*Hk, C, R, D)", sized_by_sms=True))
