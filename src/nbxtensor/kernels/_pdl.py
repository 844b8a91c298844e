"""Programmatic Dependent Launch (PDL) for the kernels of the decode step: one policy."""
from __future__ import annotations

import os as _os

import triton
import triton.language as tl

# ------------------------------------------------------------------ PDL policy
# Programmatic Dependent Launch (sm_90+): a kernel launched with launch_pdl=True may start
# while its predecessor in the stream finishes. Every such kernel takes `PDL: tl.constexpr`
# and, when it is set, in EVERY program: reads only read-only data (weights) before
# `gdc_wait()`, reads anything an earlier kernel wrote and writes anything an earlier kernel
# may still read only after it (the caching allocator reuses freed temporaries), then calls
# `gdc_launch_dependents()` so the next kernel's programs become resident and run their own
# prologue (weight prefetch) while this one works. A kernel that is not launched with PDL
# serialises fully, so mixing PDL and plain kernels in one step is correct. The interpreter
# has no griddepcontrol: PDL is off on interp/cpu. NBX_PDL=0 turns it off (A/B comparisons);
# `set_pdl(False)` does the same at run time. One place for the rule: `pdl_enabled(device)`.

_PDL_ON = _os.environ.get("NBX_PDL", "1").strip().lower() not in ("0", "false", "off", "no")


def pdl_enabled(device) -> bool:
    """Whether the decode kernels launched on `device` use PDL (cuda only, NBX_PDL != 0)."""
    return _PDL_ON and getattr(device, "type", device) == "cuda"


def set_pdl(on: bool) -> bool:
    """Turn PDL on or off for later launches (benchmarks, tests); returns the previous value.
    A CUDA graph keeps the setting it was captured with."""
    global _PDL_ON
    if not isinstance(on, bool):
        raise TypeError(f"set_pdl: on must be a bool, got {type(on).__name__}")
    prev, _PDL_ON = _PDL_ON, on
    return prev


def pdl_opts(device) -> dict:
    """The launch keywords for a PDL-capable kernel: PDL constexpr + the launch option."""
    on = pdl_enabled(device)
    return dict(PDL=True, launch_pdl=True) if on else dict(PDL=False)


@triton.jit
def _pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel (its writes are visible after this), then let the next
    kernel's programs launch. No-op without PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


# ------------------------------------------------------------------ L2 bulk prefetch policy
# Weights are read-only during a decode step, so a GEMV program may ask for its WHOLE weight
# slab (all of K for its rows) to be brought into L2 before `gdc_wait`: under PDL its
# programs are resident while the previous kernel still runs, so the HBM stream of
# consecutive kernels overlaps and the K loop after the wait reads L2. sm_90 has
#   cp.async.bulk.prefetch.L2.global [addr], size;   (PTX 8.0, 16-byte aligned, size % 16)
# -- no registers, no shared memory, nothing to wait for. The interpreter has no inline PTX:
# off on interp/cpu (like PDL). Kernels take `L2PF: tl.constexpr` = L2PF_OFF / L2PF_BULK
# (one bulk request per thread chunk) / L2PF_LINE (`prefetch.global.L2::evict_last` per
# 128-byte line, the A/B variant). NBX_L2_PREFETCH=1|bulk|line|0 sets the default (OFF
# until the H200 sweep decides); `set_l2_prefetch(bool)` / `set_l2_prefetch_mode(int)` at
# run time. A CUDA graph keeps the setting it was captured with.
L2PF_OFF, L2PF_BULK, L2PF_LINE = 0, 1, 2
_L2PF_NAMES = {"0": L2PF_OFF, "off": L2PF_OFF, "false": L2PF_OFF, "no": L2PF_OFF, "": L2PF_OFF,
               "1": L2PF_BULK, "on": L2PF_BULK, "true": L2PF_BULK, "yes": L2PF_BULK,
               "bulk": L2PF_BULK, "2": L2PF_LINE, "line": L2PF_LINE}
# Bytes of a weight slab prefetched per program (0 = all of it; -1 = auto: L2PF_BUDGET shared
# by the programs resident at once, ~4 per SM, when that is less than the slab). Only resident
# programs prefetch, but when all of a kernel's programs are resident at once (<= ~528) and
# its weight exceeds L2 (14336x4096: 112 MiB), uncapped requests would evict each other
# before use. A cap asks for row prefixes (what the K loop reads first). Sweep rows in
# benchmarks/sweep_gemv_chain.py decide.
L2PF_CAP = 0
L2PF_BUDGET = 24 << 20
_RESIDENT = 4 * 132
# Smallest chunk one thread asks for (bytes): fewer, larger bulk requests per program.
L2PF_MIN_CHUNK = 4096


def _parse_l2pf(text: str) -> int:
    key = text.strip().lower()
    if key not in _L2PF_NAMES:
        raise ValueError(f"NBX_L2_PREFETCH: expected one of 0/1/off/on/bulk/line, got {text!r}")
    return _L2PF_NAMES[key]


_L2PF_MODE = _parse_l2pf(_os.environ.get("NBX_L2_PREFETCH", "0"))


def l2_prefetch_mode(device) -> int:
    """The L2PF constexpr for decode GEMVs on `device`: L2PF_OFF except on cuda."""
    return _L2PF_MODE if getattr(device, "type", device) == "cuda" else L2PF_OFF


def l2_prefetch_enabled(device) -> bool:
    """Whether the decode GEMVs on `device` prefetch their weight slab into L2."""
    return l2_prefetch_mode(device) != L2PF_OFF


def set_l2_prefetch(on: bool) -> bool:
    """Bulk L2 prefetch of the GEMV weight slabs on (True) or off for later launches; returns
    whether it was on. A CUDA graph keeps the setting it was captured with."""
    global _L2PF_MODE
    if not isinstance(on, bool):
        raise TypeError(f"set_l2_prefetch: on must be a bool, got {type(on).__name__}")
    prev, _L2PF_MODE = _L2PF_MODE != L2PF_OFF, (L2PF_BULK if on else L2PF_OFF)
    return prev


def set_l2_prefetch_mode(mode: int) -> int:
    """L2PF_OFF / L2PF_BULK / L2PF_LINE for later launches (A/B sweeps); returns the previous."""
    global _L2PF_MODE
    if type(mode) is not int or mode not in (L2PF_OFF, L2PF_BULK, L2PF_LINE):
        raise ValueError(f"set_l2_prefetch_mode: mode must be 0 (off), 1 (bulk) or 2 (line), "
                         f"got {mode!r}")
    prev, _L2PF_MODE = _L2PF_MODE, mode
    return prev


def l2pf_opts(device, w, num_warps: int, programs: int = 0, slab_bytes: int = 0,
              slabs: int = 1) -> dict:
    """The prefetch constexprs of a GEMV over weight `w` (rows, K): L2PF, and when on the
    lanes (threads), whether rows are contiguous (one slab) and the cap (bytes per slab).
    programs (distinct weight blocks), slab_bytes and slabs (per program: 2 for GLU / RoPE
    pairs) size the auto cap (L2PF_CAP = -1)."""
    mode = l2_prefetch_mode(device)
    if mode == L2PF_OFF:
        return dict(L2PF=L2PF_OFF)
    cap = L2PF_CAP
    if cap < 0:       # auto: the budget over the programs resident at once, a power of two
        share = L2PF_BUDGET // (max(1, min(programs, _RESIDENT)) * slabs)
        cap = 0 if share >= slab_bytes else max(16384, 1 << (share.bit_length() - 1))
    # contiguous rows (stride(0) == K): one slab; else (or capped) row by row
    rowwise = w.stride(0) != w.shape[1] or cap > 0
    return dict(L2PF=mode, PF_LANES=32 * num_warps, PF_ROWWISE=rowwise, PF_CAP=cap,
                PF_MIN=L2PF_MIN_CHUNK)


@triton.jit
def _pf_issue(p, nbytes, L2PF: tl.constexpr):
    """Per element: prefetch [p, p + nbytes) into L2 (nothing where nbytes <= 0). The range
    is widened to 16-byte alignment (same 16-byte blocks, so the same mapped pages)."""
    if L2PF == 1:
        tl.inline_asm_elementwise(
            """{
            .reg .pred pf_p;
            .reg .b64 pf_a, pf_e;
            .reg .b32 pf_n;
            setp.gt.s32 pf_p, $2, 0;
            and.b64 pf_a, $1, -16;
            cvt.s64.s32 pf_e, $2;
            add.s64 pf_e, pf_e, $1;
            add.s64 pf_e, pf_e, 15;
            and.b64 pf_e, pf_e, -16;
            sub.s64 pf_e, pf_e, pf_a;
            cvt.u32.u64 pf_n, pf_e;
            @pf_p cp.async.bulk.prefetch.L2.global [pf_a], pf_n;
            mov.u32 $0, 0;
            }""", "=r,l,r", [p, nbytes], dtype=tl.int32, is_pure=False, pack=1)
    elif L2PF == 2:
        # one 128-byte line per request, walking the chunk
        ISZ: tl.constexpr = p.dtype.element_ty.primitive_bitwidth // 8
        nmax = tl.max(nbytes, axis=0)
        for off in range(0, nmax, 128):
            tl.inline_asm_elementwise(
                """{
                .reg .pred pf_p;
                setp.gt.s32 pf_p, $2, 0;
                @pf_p prefetch.global.L2::evict_last [$1];
                mov.u32 $0, 0;
                }""", "=r,l,r", [p + off // ISZ, nbytes - off], dtype=tl.int32, is_pure=False,
                pack=1)


@triton.jit
def _l2_chunks(row0, nrows, s_row, K, ROWS: tl.constexpr, PF_LANES: tl.constexpr,
               PF_ROWWISE: tl.constexpr, PF_CAP: tl.constexpr, PF_MIN: tl.constexpr):
    """The chunks `_l2_prefetch` asks for: (start pointers, byte counts), one per lane; a
    count <= 0 means the lane asks for nothing. Rows [0, nrows) (<= ROWS) of K elements from
    the row pointer row0, s_row elements apart. Contiguous rows (not PF_ROWWISE) form one
    slab split over all lanes; else each row is a segment of PF_LANES // ROWS lanes (only its
    first PF_CAP // ROWS bytes when PF_CAP > 0). A chunk is an equal share of its segment,
    at least PF_MIN bytes, a multiple of 16 bytes."""
    ISZ: tl.constexpr = row0.dtype.element_ty.primitive_bitwidth // 8
    lane = tl.arange(0, PF_LANES)
    if PF_ROWWISE:
        LPS: tl.constexpr = PF_LANES // ROWS          # lanes per row
        seg = lane // LPS
        j = lane % LPS
        seg_len = tl.where(seg < nrows, K, 0) + tl.full((), 0, tl.int64)
        if PF_CAP > 0:
            seg_len = tl.minimum(seg_len, PF_CAP // ROWS // ISZ)
        base = row0 + seg.to(tl.int64) * s_row
        nl: tl.constexpr = LPS
    else:
        j = lane
        seg_len = tl.full((), 0, tl.int64) + nrows * K
        base = row0
        nl: tl.constexpr = PF_LANES
    E16: tl.constexpr = 16 // ISZ
    ch = tl.maximum((seg_len + nl - 1) // nl, PF_MIN // ISZ)     # elements
    ch = (ch + E16 - 1) // E16 * E16
    off = j.to(tl.int64) * ch
    nb = (tl.minimum(seg_len - off, ch) * ISZ).to(tl.int32)
    return base + off, nb


@triton.jit
def _l2_prefetch(row0, nrows, s_row, K, ROWS: tl.constexpr, L2PF: tl.constexpr,
                 PF_LANES: tl.constexpr, PF_ROWWISE: tl.constexpr, PF_CAP: tl.constexpr,
                 PF_MIN: tl.constexpr):
    """Ask for a program's weight slab (see `_l2_chunks`) to be brought into L2, one chunk
    per thread. Only read-only data: call it before the PDL wait. No-op when L2PF == 0."""
    if L2PF:
        p, nb = _l2_chunks(row0, nrows, s_row, K, ROWS, PF_LANES, PF_ROWWISE, PF_CAP, PF_MIN)
        _pf_issue(p, nb, L2PF)
