"""Flash attention forward in Gluon for Hopper (sm_90): FA3's layout written by hand.

Why Gluon: Triton 3.6's automatic warp specialisation computed wrong results for every
causal form tried (docs/design/attention.md). Gluon has no WS pass: the producer /
consumer split, the barriers and every loop's trip count are written here.

One program = one (batch, head, 128-query-row tile), grid (L/128, B*H), causal: the
longest row tiles first. `gl.warp_specialize` forks:
- the loader (a worker of 1 warp): Q once, then the K/V tiles of key block j into a ring
  of STAGES shared-memory slots by TMA; k_ready/v_ready[s] say "arrived" (tx bytes),
  kv_empty[s] says "the consumers are done with slot s";
- the consumers, two warpgroups of 64 query rows each: S = Q K^T (wgmma, both from
  shared memory), online softmax in registers (exp2, scale folded in the FMA), O += P V
  (wgmma, P from registers). FA3's intra-warpgroup overlap: S_j is issued before
  P_{j-1} V_{j-1}, and the softmax of S_j runs while P_{j-1} V_{j-1} is still in flight.
  SPLIT=False (`_gfa_fwd`): one 8-warp partition (warps_per_cta=[8, 1]); SPLIT=True
  (`_gfa_fwd_split`): two 4-warp partitions, not coupled by any barrier.
PAIR=True: a program takes two tiles of one head (causal t and n-1-t: the same n+1 key
blocks for every program, half the prologues; the loader streams the second tile's K/V
through the same ring while the first tile finishes); grid (ceil(n/2), B*H).
Causal: key blocks 0..t only; block t (the diagonal, BLOCK_M == BLOCK_N) is the one
masked step, peeled after the loop. Preconditions (checked by the caller, attention.sdpa
via `applies`): 16-bit q/k/v, D == DV == 128, L == S, S % 128 == 0, no mask, scale > 0,
TMA-able strides. The TMA descriptors are built on the device per (batch, head) (global
scratch, as `_flash_fwd_tma`), so GQA and (B, S, H, D) strided views work.
"""
from __future__ import annotations

from ._triton import gluon, gl, hopper  # Triton, or its stand-in without Triton
from ._common import device_facts
fence_async_shared, mbarrier, tma = hopper.fence_async_shared, hopper.mbarrier, hopper.tma
warpgroup_mma, warpgroup_mma_wait = hopper.warpgroup_mma, hopper.warpgroup_mma_wait

BLOCK = 128          # query rows per program = keys per block = head dim
CONSUMER_WARPS = 8   # two warpgroups
# the launch settings `sdpa_gluon` uses unless told otherwise (the sweep times the others):
# SPLIT=False: one 8-warp consumer partition (`_gfa_fwd`); SPLIT=True: two 4-warp consumer
# partitions (`_gfa_fwd_split`). STAGES: K/V ring slots (2: 164 KB, 3: 229 KB of shared).
# PAIR: two query tiles of one head per program (causal t and n-1-t: equal work for every
# program); needs 2 Q tiles of shared memory, so STAGES 2 only (196 KB).
# PINGPONG (SPLIT only): FA3's named-barrier alternation of the two consumers' wgmmas.
# Measured on the H200 (sweep_attention_gluon.py, B4 H32 S4096 D128 bf16 causal,
# torch SDPA 599 TFLOP/s): SPLIT + STAGES 3 543.7 TFLOP/s = 0.908x torch; SPLIT s2 0.760,
# fused s2 / s3 0.686 / 0.703, PAIR 0.755-0.764, PINGPONG 0.740-0.761; the Triton pointer
# kernel 0.760 in the same run.
DEFAULT = dict(SPLIT=True, STAGES=3, PAIR=False, PINGPONG=False, LOADER_REGS=24,
               CONSUMER_REGS=240)


@gluon.jit
def _gfa_load_q(qd, q0, q1, bar, row, SPLIT: gl.constexpr):
    if SPLIT:
        # two Q halves, one per consumer partition, on one barrier
        mbarrier.expect(bar, 2 * qd.block_type.nbytes)
        tma.async_copy_global_to_shared(qd, [row, 0], bar, q0)
        tma.async_copy_global_to_shared(qd, [row + qd.block_type.shape[0], 0], bar, q1)
    else:
        mbarrier.expect(bar, qd.block_type.nbytes)
        tma.async_copy_global_to_shared(qd, [row, 0], bar, q0)


@gluon.jit
def _gfa_load_kv(kd, vd, k_smem, v_smem, k_ready, v_ready, kv_empty, base, n_blk,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    # g = base + j counts the ring's use over the program's tiles (slot, parity)
    for j in range(n_blk):
        g = base + j
        s = g % STAGES
        ph = (g // STAGES) & 1
        # a fresh barrier passes a wait for parity 1: the first STAGES blocks do not wait
        mbarrier.wait(kv_empty.index(s), ph ^ 1)
        mbarrier.expect(k_ready.index(s), kd.block_type.nbytes)
        tma.async_copy_global_to_shared(kd, [j * BLOCK_N, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.expect(v_ready.index(s), vd.block_type.nbytes)
        tma.async_copy_global_to_shared(vd, [j * BLOCK_N, 0], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _gfa_loader(qd, kd, vd, qa0, qa1, qb0, qb1, q_bar_a, q_bar_b, k_smem, v_smem, k_ready,
                v_ready, kv_empty, row_a, row_b, n_a, n_b, two, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, SPLIT: gl.constexpr, PAIR: gl.constexpr):
    _gfa_load_q(qd, qa0, qa1, q_bar_a, row_a, SPLIT)
    if PAIR:
        if two:
            _gfa_load_q(qd, qb0, qb1, q_bar_b, row_b, SPLIT)
    _gfa_load_kv(kd, vd, k_smem, v_smem, k_ready, v_ready, kv_empty, 0, n_a, BLOCK_N, STAGES)
    if PAIR:
        if two:
            # the second tile's K/V stream on through the same ring: its first blocks load
            # while the consumers finish the first tile
            _gfa_load_kv(kd, vd, k_smem, v_smem, k_ready, v_ready, kv_empty, n_a, n_b,
                         BLOCK_N, STAGES)


# PINGPONG (split only): FA3's warp-scheduler barriers. Consumer partition w (PP = w + 1)
# issues its wgmmas only after `bar.sync 8 + w` completes, i.e. after the other partition
# issued its own and did `bar.arrive 8 + w`: the two warpgroups' wgmmas alternate and one's
# softmax runs under the other's wgmmas. Named barriers 8/9 (Triton uses 0-2 here); the
# second partition opens with one arrive so the first goes first; both run the same count
# of sync/arrive pairs (1 + n_blk per tile), so the pattern never drifts. (Scalar inline asm:
# every thread of the warpgroup executes it.)
@gluon.jit
def _pp_barrier(PP: gl.constexpr, dep, ARRIVE: gl.constexpr):
    # partition PP (0: no ping-pong, nothing) waits at its own barrier (8 for the first, 9 for
    # the second) or, ARRIVE, signals the OTHER partition's
    if PP != 0:
        INSTR: gl.constexpr = "bar.arrive " if ARRIVE else "bar.sync "
        BAR: gl.constexpr = "8" if (PP == 1) != ARRIVE else "9"
        gl.inline_asm_elementwise(INSTR + BAR + ", 256;\n\tmov.b32 $0, $1;", "=r,r", [dep],
                                  dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gfa_step(j, base, acc, m_i, l_i, p_op, q_smem, k_smem, v_smem, k_ready, v_ready,
              kv_empty, offs_m, offs_n0, zero_s, qk_scale, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, P_LAYOUT: gl.constexpr, MASK: gl.constexpr,
              PP: gl.constexpr):
    """Key block j (ring use base + j): S_j = Q K_j^T overlapped with O += P_{j-1} V_{j-1};
    returns the state with P_j."""
    g = base + j
    s = g % STAGES
    sp = (g - 1) % STAGES
    mbarrier.wait(k_ready.index(s), (g // STAGES) & 1)
    mbarrier.wait(v_ready.index(sp), ((g - 1) // STAGES) & 1)
    _pp_barrier(PP, g, ARRIVE=False)
    qk = warpgroup_mma(q_smem, k_smem.index(s).permute((1, 0)), zero_s, use_acc=False,
                       is_async=True)
    acc = warpgroup_mma(p_op, v_smem.index(sp), acc, is_async=True)
    _pp_barrier(PP, g, ARRIVE=True)
    # wgmma groups retire in order: <= 1 outstanding means S_j is done, P V may run on
    qk = warpgroup_mma_wait(1, deps=(qk,))
    if MASK:
        # the diagonal block: key j <= query i
        offs_n = j * BLOCK_N + offs_n0
        qk = gl.where(offs_n[None, :] <= offs_m[:, None], qk, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
    p = gl.exp2(qk * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    # every warp of the partition must be past its P V before the slot is handed back
    # (the arrive is one thread's)
    gl.thread_barrier()
    mbarrier.arrive(kv_empty.index(sp), count=1)
    acc = acc * alpha[:, None]
    p_op = gl.convert_layout(p.to(p_op.dtype), P_LAYOUT)
    return acc, m_new, l_i, p_op


@gluon.jit
def _gfa_tile(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, od, row0, n_blk,
              base, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              HEAD_D: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
              NW: gl.constexpr, PP: gl.constexpr):
    """One query tile (BLOCK_M rows from row0) against key blocks 0..n_blk-1, ring uses
    base..base+n_blk-1; O goes out by TMA from Q's own shared tile (not waited here)."""
    gl.static_assert(BLOCK_N == HEAD_D)   # S and O share one wgmma layout (one row slice)
    mma_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                    instr_shape=[16, BLOCK_N, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_l, k_width=2)
    dtype: gl.constexpr = q_smem.dtype
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_l))
    offs_n0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_l))
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_l)
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, mma_l)

    # key block 0 (causal: the diagonal only for the first row block, where the mask
    # matters; for later row blocks every key of block 0 is visible and the select keeps all)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(base % STAGES), (base // STAGES) & 1)
    _pp_barrier(PP, base, ARRIVE=False)
    qk = warpgroup_mma(q_smem, k_smem.index(base % STAGES).permute((1, 0)), zero_s,
                       use_acc=False, is_async=True)
    _pp_barrier(PP, base, ARRIVE=True)
    qk = warpgroup_mma_wait(0, deps=(qk,))
    if CAUSAL:
        qk = gl.where(offs_n0[None, :] <= offs_m[:, None], qk, -float("inf"))
    m_i = gl.max(qk, 1) * qk_scale
    p = gl.exp2(qk * qk_scale - m_i[:, None])
    l_i = gl.sum(p, 1)
    p_op = gl.convert_layout(p.to(dtype), p_l)

    if CAUSAL:
        n_main = n_blk - 1
    else:
        n_main = n_blk
    for j in range(1, n_main):
        acc, m_i, l_i, p_op = _gfa_step(j, base, acc, m_i, l_i, p_op, q_smem, k_smem, v_smem,
                                        k_ready, v_ready, kv_empty, offs_m, offs_n0, zero_s,
                                        qk_scale, BLOCK_N, STAGES, p_l, False, PP)
    if CAUSAL:
        if n_blk > 1:
            acc, m_i, l_i, p_op = _gfa_step(n_blk - 1, base, acc, m_i, l_i, p_op, q_smem,
                                            k_smem, v_smem, k_ready, v_ready, kv_empty,
                                            offs_m, offs_n0, zero_s, qk_scale, BLOCK_N,
                                            STAGES, p_l, True, PP)
    g_last = base + n_blk - 1
    mbarrier.wait(v_ready.index(g_last % STAGES), (g_last // STAGES) & 1)
    _pp_barrier(PP, g_last, ARRIVE=False)
    acc = warpgroup_mma(p_op, v_smem.index(g_last % STAGES), acc, is_async=True)
    _pp_barrier(PP, g_last, ARRIVE=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    # hand the last slot back too: a second tile's blocks reuse it
    gl.thread_barrier()
    mbarrier.arrive(kv_empty.index(g_last % STAGES), count=1)

    o = acc / l_i[:, None]       # l >= 1: every row sees its row max
    # Q's tile is free (its last wgmma retired): stage O there for one TMA store
    q_smem.store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(od, [row0, 0], q_smem)


@gluon.jit
def _gfa_consumer(qa, qb, k_smem, v_smem, q_bar_a, q_bar_b, k_ready, v_ready, kv_empty, od,
                  row_a, row_b, n_a, n_b, two, qk_scale, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, CAUSAL: gl.constexpr,
                  STAGES: gl.constexpr, NW: gl.constexpr, PAIR: gl.constexpr,
                  PP: gl.constexpr):
    if PP == 2:
        _pp_barrier(PP, n_a, ARRIVE=True)    # the first partition goes first
    _gfa_tile(qa, k_smem, v_smem, q_bar_a, k_ready, v_ready, kv_empty, od, row_a, n_a, 0,
              qk_scale, BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES, NW, PP)
    if PAIR:
        if two:
            _gfa_tile(qb, k_smem, v_smem, q_bar_b, k_ready, v_ready, kv_empty, od, row_b, n_b,
                      n_a, qk_scale, BLOCK_M, BLOCK_N, HEAD_D, CAUSAL, STAGES, NW, PP)
    if PP == 1:
        # take the second partition's last arrive: none left pending
        _pp_barrier(PP, n_a, ARRIVE=False)
    tma.store_wait(0)


@gluon.jit
def _gfa_setup(q_ptr, k_ptr, v_ptr, o_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh,
               s_vn, s_ob, s_oh, s_om, H, L, S, GROUP: gl.constexpr, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, QROWS: gl.constexpr, HEAD_D: gl.constexpr,
               CAUSAL: gl.constexpr, PAIR: gl.constexpr):
    """The program's tiles and descriptors. Without PAIR: one query tile, causal the
    longest first. With PAIR: two tiles of one head -- causal t and n-1-t (every program
    then has n+1 key blocks: no tail of short programs, half the prologues), non-causal
    2p and 2p+1; `two` is false for an odd count's last program."""
    gl.static_assert(BLOCK_M == BLOCK_N)  # causal: the diagonal is exactly one key block
    n_t = L // BLOCK_M
    p = gl.program_id(0)
    if PAIR:
        if CAUSAL:
            t_a = n_t - 1 - p
            t_b = p
        else:
            t_a = 2 * p
            t_b = 2 * p + 1
    else:
        if CAUSAL:
            t_a = n_t - 1 - p       # the longest rows first
        else:
            t_a = p
        t_b = t_a
    two = (t_b != t_a) & (t_b < n_t)
    if CAUSAL:
        n_a = t_a + 1
        n_b = t_b + 1
    else:
        n_a = S // BLOCK_N
        n_b = S // BLOCK_N
    pid_bh = gl.program_id(1)
    b = (pid_bh // H).to(gl.int64)
    h = pid_bh % H
    hk = (h // GROUP).to(gl.int64)
    h = h.to(gl.int64)
    qd = _gfa_desc(q_ptr + b * s_qb + h * s_qh, L, s_qm, QROWS, HEAD_D)
    kd = _gfa_desc(k_ptr + b * s_kb + hk * s_kh, S, s_kn, BLOCK_N, HEAD_D)
    vd = _gfa_desc(v_ptr + b * s_vb + hk * s_vh, S, s_vn, BLOCK_N, HEAD_D)
    od = _gfa_desc(o_ptr + b * s_ob + h * s_oh, L, s_om, QROWS, HEAD_D)
    return qd, kd, vd, od, t_a * BLOCK_M, t_b * BLOCK_M, n_a, n_b, two


@gluon.constexpr_function
def _tile_layout():
    # the shared layout of every tile: 128-byte swizzle, as TMA writes and wgmma reads it
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


@gluon.jit
def _gfa_desc(base, rows, row_stride, BLOCK_ROWS: gl.constexpr, HEAD_D: gl.constexpr):
    # TMA over one head's (rows, HEAD_D) matrix at base, in tiles of BLOCK_ROWS rows
    return tma.make_tensor_descriptor(base, shape=[rows, HEAD_D], strides=[row_stride, 1],
                                      block_shape=[BLOCK_ROWS, HEAD_D], layout=_tile_layout())


@gluon.jit
def _gfa_ring(dtype: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
              HEAD_D: gl.constexpr, CONSUMERS: gl.constexpr):
    # the K/V ring of STAGES slots and every barrier: (k_smem, v_smem, q_bar_a, q_bar_b,
    # k_ready, v_ready, kv_empty)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], _tile_layout())
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], _tile_layout())
    q_bar_a, q_bar_b, k_ready, v_ready, kv_empty = _gfa_barriers(STAGES, CONSUMERS)
    return k_smem, v_smem, q_bar_a, q_bar_b, k_ready, v_ready, kv_empty


@gluon.jit
def _gfa_barriers(STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar_a = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    q_bar_b = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_l)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_l)
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_l)
    mbarrier.init(q_bar_a, count=1)
    mbarrier.init(q_bar_b, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)   # one arrive per consumer partition
    fence_async_shared()
    return q_bar_a, q_bar_b, k_ready, v_ready, kv_empty


@gluon.jit
def _gfa_fwd(q_ptr, k_ptr, v_ptr, o_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
             s_ob, s_oh, s_om, H, L, S, qk_scale,
             GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             HEAD_D: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
             LOADER_REGS: gl.constexpr, PAIR: gl.constexpr):
    """SPLIT=False: the consumers are ONE 8-warp partition (two warpgroups of 64 rows each
    through warps_per_cta=[8, 1]); a `thread_barrier` before each slot release keeps them
    in step."""
    qd, kd, vd, od, row_a, row_b, n_a, n_b, two = _gfa_setup(
        q_ptr, k_ptr, v_ptr, o_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
        s_ob, s_oh, s_om, H, L, S, GROUP, BLOCK_M, BLOCK_N, BLOCK_M, HEAD_D, CAUSAL, PAIR)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    qa = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], _tile_layout())
    if PAIR:
        qb = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], _tile_layout())
    else:
        qb = qa
    k_smem, v_smem, q_bar_a, q_bar_b, k_ready, v_ready, kv_empty = _gfa_ring(
        dtype, STAGES, BLOCK_N, HEAD_D, 1)
    gl.warp_specialize(
        [(_gfa_consumer, (qa, qb, k_smem, v_smem, q_bar_a, q_bar_b, k_ready, v_ready,
                          kv_empty, od, row_a, row_b, n_a, n_b, two, qk_scale, BLOCK_M,
                          BLOCK_N, HEAD_D, CAUSAL, STAGES, gl.num_warps(), PAIR, 0)),
         (_gfa_loader, (qd, kd, vd, qa, qa, qb, qb, q_bar_a, q_bar_b, k_smem, v_smem, k_ready,
                        v_ready, kv_empty, row_a, row_b, n_a, n_b, two, BLOCK_N, STAGES,
                        False, PAIR))],
        [1], [LOADER_REGS])


@gluon.jit
def _gfa_fwd_split(q_ptr, k_ptr, v_ptr, o_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh,
                   s_vn, s_ob, s_oh, s_om, H, L, S, qk_scale,
                   GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   HEAD_D: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                   LOADER_REGS: gl.constexpr, PAIR: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   PINGPONG: gl.constexpr):
    """SPLIT=True: the two consumer warpgroups are two partitions (rows [0, 64) of each
    tile in the default partition, [64, 128) in a 4-warp worker): no barrier couples them,
    so one's softmax can overlap the other's wgmmas (FA3's ping-pong, left to the
    hardware's scheduling); kv_empty counts one arrive per partition."""
    HALF: gl.constexpr = BLOCK_M // 2
    qd, kd, vd, od, row_a, row_b, n_a, n_b, two = _gfa_setup(
        q_ptr, k_ptr, v_ptr, o_ptr, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
        s_ob, s_oh, s_om, H, L, S, GROUP, BLOCK_M, BLOCK_N, HALF, HEAD_D, CAUSAL, PAIR)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    qa0 = gl.allocate_shared_memory(dtype, [HALF, HEAD_D], _tile_layout())
    qa1 = gl.allocate_shared_memory(dtype, [HALF, HEAD_D], _tile_layout())
    if PAIR:
        qb0 = gl.allocate_shared_memory(dtype, [HALF, HEAD_D], _tile_layout())
        qb1 = gl.allocate_shared_memory(dtype, [HALF, HEAD_D], _tile_layout())
    else:
        qb0, qb1 = qa0, qa1
    k_smem, v_smem, q_bar_a, q_bar_b, k_ready, v_ready, kv_empty = _gfa_ring(
        dtype, STAGES, BLOCK_N, HEAD_D, 2)
    gl.warp_specialize(
        [(_gfa_consumer, (qa0, qb0, k_smem, v_smem, q_bar_a, q_bar_b, k_ready, v_ready,
                          kv_empty, od, row_a, row_b, n_a, n_b, two, qk_scale, HALF,
                          BLOCK_N, HEAD_D, CAUSAL, STAGES, 4, PAIR, 1 if PINGPONG else 0)),
         (_gfa_consumer, (qa1, qb1, k_smem, v_smem, q_bar_a, q_bar_b, k_ready, v_ready,
                          kv_empty, od, row_a + HALF, row_b + HALF, n_a, n_b, two, qk_scale,
                          HALF, BLOCK_N, HEAD_D, CAUSAL, STAGES, 4, PAIR,
                          2 if PINGPONG else 0)),
         (_gfa_loader, (qd, kd, vd, qa0, qa1, qb0, qb1, q_bar_a, q_bar_b, k_smem, v_smem,
                        k_ready, v_ready, kv_empty, row_a, row_b, n_a, n_b, two, BLOCK_N,
                        STAGES, True, PAIR))],
        [4, 1], [CONSUMER_REGS, LOADER_REGS])


def applies(q, k, v, out, mask, scale, is_causal, L, S, D, DV) -> bool:
    """Whether the Gluon kernel can run this call (the rest keeps the Triton kernels)."""
    if q.device.type != "cuda" or mask is not None or not is_causal:
        return False
    if device_facts(q.device).cc < 90:     # TMA and wgmma: Hopper and later
        return False
    if q.dtype.name not in ("float16", "bfloat16") or not (scale > 0) or D != BLOCK \
            or DV != BLOCK:
        return False
    if L != S or S == 0 or S % BLOCK:
        return False
    for t in (q, k, v, out):
        st = t.stride()
        # TMA rows: unit inner stride, 16-byte aligned base and strides, a real row stride
        # (a stride-0 broadcast along the sequence cannot be a tensor-map dimension)
        if t.dtype is not q.dtype or st[3] != 1 or st[2] == 0 or t.data_ptr() % 16 \
                or any((x * 2) % 16 for x in st[:3]):
            return False
    return True


def sdpa_gluon(out, q, k, v, qk_scale, *, causal, **cfg):
    """Launch the Gluon kernel; `qk_scale` = scale * log2(e) (> 0); `cfg` overrides DEFAULT's
    keys. Only the tile is checked here: the caller (attention.sdpa via `applies`, or a
    test/sweep) guarantees dtype, strides and alignment."""
    from ..backends.launch import launch
    B, H, L, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    if D != BLOCK or L % BLOCK or S % BLOCK or L == 0 or S == 0 or (causal and L != S):
        raise ValueError(f"sdpa_gluon: needs D == {BLOCK}, L and S positive multiples of "
                         f"{BLOCK} (L == S when causal); got D={D}, L={L}, S={S}, "
                         f"causal={causal}")
    bad = set(cfg) - set(DEFAULT)
    if bad:
        raise ValueError(f"sdpa_gluon: unknown settings {sorted(bad)}; expected some of "
                         f"{sorted(DEFAULT)}")
    c = dict(DEFAULT, **cfg)
    if c["PINGPONG"] and not c["SPLIT"]:
        raise ValueError("sdpa_gluon: PINGPONG needs SPLIT=True (two consumer partitions)")
    args = (q, k, v, out, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *out.stride()[:3], H, L, S, qk_scale)
    kw = dict(GROUP=H // Hk, BLOCK_M=BLOCK, BLOCK_N=BLOCK, HEAD_D=BLOCK, CAUSAL=bool(causal),
              STAGES=c["STAGES"], LOADER_REGS=c["LOADER_REGS"], PAIR=bool(c["PAIR"]))
    grid = ((L // BLOCK + 1) // 2 if c["PAIR"] else L // BLOCK, B * H)
    if c["SPLIT"]:
        launch(_gfa_fwd_split, grid, *args, CONSUMER_REGS=c["CONSUMER_REGS"],
               PINGPONG=bool(c["PINGPONG"]), num_warps=4, **kw)
    else:
        launch(_gfa_fwd, grid, *args, num_warps=CONSUMER_WARPS, **kw)
    return out
