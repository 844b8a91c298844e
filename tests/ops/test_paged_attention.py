"""Paged KV cache and paged decode attention (kernels/paged_attention.py, ops/paged_attention.py,
kv_cache.PagedKVCache): against a float64 NumPy reference and the contiguous decode kernel at
lengths 1, page_size, page_size + 1 mixed in one batch, shuffled block tables, NaN canaries in
every page no sequence owns (never read), the split-K merge forced on interp, lengths past
the table's capacity and unassigned pages flagged; the model-level paged step."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.kernels import paged_attention as KP

from helpers import rng


def _ref(q, k_seq, v_seq, lens):
    """q (B, Hq, T, D); k_seq/v_seq: per sequence (Hk, n, D) float64 -> (B, Hq, T, Dv)."""
    B, Hq, T, D = q.shape
    out = np.zeros((B, Hq, T, v_seq[0].shape[-1]))
    for b in range(B):
        n = lens[b]
        g = Hq // k_seq[b].shape[0]
        K = np.repeat(k_seq[b][:, :n], g, 0)
        V = np.repeat(v_seq[b][:, :n], g, 0)
        s = q[b] @ K.transpose(0, 2, 1) / np.sqrt(D)
        keep = np.arange(n)[None, :] <= (n - T + np.arange(T))[:, None]
        s = np.where(keep, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[b] = (p / p.sum(-1, keepdims=True)) @ V
    return out


def _append_all(cache, device, k, v, lens, dtype):
    """Each sequence's tokens written by its own append (the other rows rewrite slot 0 of
    their own first page with their own token 0: valid data)."""
    B = len(lens)
    for b, n in enumerate(lens):
        for t in range(n):
            kb = k[:, :, [0]].copy()
            vb = v[:, :, [0]].copy()
            kb[b], vb[b] = k[b, :, [t]].transpose(1, 0, 2), v[b, :, [t]].transpose(1, 0, 2)
            pos = np.zeros((B, 1), np.int32)
            pos[b] = t
            cache.append(0, nbx.tensor(kb.astype(np.float32), device=device).to(dtype),
                         nbx.tensor(vb.astype(np.float32), device=device).to(dtype),
                         nbx.tensor(pos, device=device))


def _setup(device, lens, PS, Hk=2, D=32, dtype=nbx.float32, seed=0, T=1):
    g = rng(seed)
    B = len(lens)
    need = [-(-n // PS) for n in lens]
    NB = sum(need) + 5
    cache = nbx.PagedKVCache(NB, PS, 1, Hk, D, dtype=dtype, device=device)
    cache.k.fill_(float("nan"))          # canaries: any page or slot read that nobody wrote
    cache.v.fill_(float("nan"))
    pages = g.permutation(NB)
    tab = np.full((B, max(need) + 1), -1, np.int32)     # a spare -1 column, never read
    i = 0
    for b, n in enumerate(need):
        tab[b, :n] = pages[i:i + n]
        i += n
    cache.set_block_tables(nbx.tensor(tab, device=device))
    Tm = max(lens)
    k = g.standard_normal((B, Hk, Tm, D))
    v = g.standard_normal((B, Hk, Tm, D))
    _append_all(cache, device, k, v, lens, dtype)
    rnd = lambda a: nbx.tensor(a.astype(np.float32)).to(dtype).to(nbx.float32).numpy()  # noqa: E731
    return cache, rnd(k).astype(np.float64), rnd(v).astype(np.float64), tab


@pytest.mark.parametrize("split,prefetch", [(False, True), (True, True), (True, False)])
def test_paged_matches_reference_and_contiguous(device, split, prefetch, monkeypatch):
    if split and device == "cpu":
        pytest.skip("the split-K merge is the kernel's")
    if split:     # (prefetch: the page ids of the next key tile load one step ahead)
        monkeypatch.setattr(KP, "_OVERRIDE", {"P": 3, "BLOCK_N": 16, "ONE_MAX": 0,
                                              "PF": prefetch})
    PS = 4
    lens = [1, PS, PS + 1, 3 * PS + 3, 14 * PS + 1]   # the last: several key tiles a split
    Hq, Hk, D = 4, 2, 40                   # D overhangs the 64-wide tile
    cache, k, v, _ = _setup(device, lens, PS, Hk, D)
    B = len(lens)
    cache.lengths.copy_(nbx.tensor(np.array(lens, np.int32), device=device))
    g = rng(1)
    q = g.standard_normal((B, Hq, 1, D))
    qt = nbx.tensor(q.astype(np.float32), device=device)
    kp, vp, bt, ln = cache.view(0)
    out = nbx.paged_decode_attention(qt, (kp, vp), bt, ln).numpy()
    assert np.isfinite(out).all()          # no canary was read
    ref = _ref(q, k, v, lens)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # the contiguous kernel on the same data
    C = 64
    kc = np.zeros((B, Hk, C, D), np.float32)
    vc = np.zeros((B, Hk, C, D), np.float32)
    for b, n in enumerate(lens):
        kc[b, :, :n], vc[b, :, :n] = k[b, :, :n], v[b, :, :n]
    cont = nbx.decode_attention(qt, nbx.tensor(kc, device=device), nbx.tensor(vc, device=device),
                                nbx.tensor(np.array(lens, np.int32), device=device)).numpy()
    np.testing.assert_allclose(out, cont, rtol=1e-5, atol=1e-6)


def test_paged_bf16_and_multi_token(device):
    """bf16 pages, T = 2 query tokens (bottom-right causal), GQA group 3, page size 8."""
    PS = 8
    lens = [2, PS, PS + 1]
    Hq, Hk, D, T = 6, 2, 16, 2
    cache, k, v, _ = _setup(device, lens, PS, Hk, D, dtype=nbx.bfloat16, seed=3)
    cache.lengths.copy_(nbx.tensor(np.array(lens, np.int32), device=device))
    g = rng(4)
    q = g.standard_normal((len(lens), Hq, T, D))
    qt = nbx.tensor(q.astype(np.float32), device=device).to(nbx.bfloat16)
    kp, vp, bt, ln = cache.view(0)
    out = nbx.paged_decode_attention(qt, (kp, vp), bt, ln).to(nbx.float32).numpy()
    q64 = qt.to(nbx.float32).numpy().astype(np.float64)
    np.testing.assert_allclose(out, _ref(q64, k, v, lens), rtol=2e-2, atol=2e-2)


def test_append_writes_the_right_page(device):
    PS = 4
    lens = [PS + 1, 2]
    cache, k, v, tab = _setup(device, lens, PS, 2, 8)
    kp = cache.k.to(nbx.float32).numpy()[0]
    for b, n in enumerate(lens):
        for j in range(n):
            np.testing.assert_array_equal(kp[tab[b, j // PS], j % PS], k[b, :, j].astype(np.float32))
    # the last append put row 1's token 1 and row 0's slot 0: lengths = last position + 1
    assert cache.lengths.numpy().tolist() == [1, 2]
    # pages nobody owns still hold their canaries
    owned = set(tab[tab >= 0].tolist())
    for p in range(cache.num_blocks):
        if p not in owned:
            assert np.isnan(kp[p]).all()


def test_lengths_beyond_capacity_flagged(device):
    PS = 4
    cache, *_ = _setup(device, [3, 5], PS, 2, 8)
    kp, vp, bt, ln = cache.view(0)
    C = bt.shape[1] * PS
    q = nbx.tensor(rng(5).standard_normal((2, 2, 1, 8)).astype(np.float32), device=device)

    def now(fn):
        """Run fn and read the flags at once (cuda leaves a bad index pending to the next sync)."""
        fn()
        if device != "cpu":
            nbx.check_index_errors()

    def lens(*v):
        return nbx.tensor(np.array(v, np.int32), device=device)
    with pytest.raises(IndexError, match="lengths"):
        now(lambda: nbx.paged_decode_attention(q, (kp, vp), bt, lens(3, C + 1)))
    # a length inside the table's capacity over an unassigned (-1) page is flagged, not read
    with pytest.raises(IndexError, match="block_tables"):
        now(lambda: nbx.paged_decode_attention(q, (kp, vp), bt, lens(3, C)))
    # appending past the assigned pages / the capacity
    k1 = nbx.tensor(np.ones((2, 2, 1, 8), np.float32), device=device)
    with pytest.raises(IndexError, match="positions"):
        now(lambda: cache.append(0, k1, k1, nbx.tensor(np.array([[0], [C]], np.int32),
                                                      device=device)))
    with pytest.raises(IndexError, match="block_tables"):
        now(lambda: cache.append(0, k1, k1, nbx.tensor(np.array([[0], [C - 1]], np.int32),
                                                      device=device)))


def test_refusals(device):
    cache = nbx.PagedKVCache(4, 4, 1, 2, 8, dtype=nbx.float32, device=device)
    with pytest.raises(RuntimeError, match="allocate"):
        cache.view(0)
    with pytest.raises(ValueError, match="pages needed"):
        cache.allocate([16, 4])
    tables, lengths = cache.allocate([5, 3])
    assert tables.numpy().tolist() == [[0, 1], [2, -1]]
    kp, vp, bt, ln = cache.view(0)
    q = nbx.zeros(2, 2, 1, 8, device=device)
    with pytest.raises(TypeError, match="block_tables"):
        nbx.paged_decode_attention(q, (kp, vp), bt.to(nbx.int64), ln)
    with pytest.raises(ValueError, match="head dim"):
        nbx.paged_decode_attention(nbx.zeros(2, 2, 1, 4, device=device), (kp, vp), bt, ln)
    with pytest.raises(ValueError, match="num_blocks"):
        nbx.PagedKVCache(0, 4, 1, 2, 8)
    cache.release()
    assert cache.allocate([16])[0].numpy().tolist() == [[0, 1, 2, 3]]


def test_model_generate_batch_on_paged_cache(device):
    """LlamaModel.generate_batch (forward_paged: each prompt prefilled into its pages, then
    batched decode at different lengths) gives each prompt's greedy tokens of the model's
    own batch-1 forward."""
    import sys
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_graphs import _model_greedy, _tiny_llama
    m = _tiny_llama(device, L=1) if device == "interp" else _tiny_llama(device)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
    res = m.generate_batch(prompts, max_new_tokens=3, block_size=4)
    for p, toks in zip(prompts, res):
        assert toks == _model_greedy(m, p, 3), (p, toks)


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    pytest.importorskip("triton")
    sys_path = __file__.rsplit("/", 1)[0]
    import sys
    sys.path.insert(0, sys_path)
    from test_moe import _compile
    for dt, pf in (("bf16", True), ("fp32", True), ("bf16", False)):
        k = _compile(KP._paged_decode_split,
                     {"q_ptr": "*" + dt, "k_ptr": "*" + dt, "v_ptr": "*" + dt, "bt_ptr": "*i32",
                      "len_ptr": "*i32", "o_ptr": "*" + dt, "po_ptr": "*fp32", "pml_ptr": "*fp32",
                      "cnt_ptr": "*i32", "flag_ptr": "*i64", "qk_scale": "fp32"},
                     dict(PAGE=16, GROUP=4, BLOCK_H=16, BLOCK_R=4, BLOCK_N=128 if dt == "bf16"
                          else 64, BLOCK_D=128, BLOCK_DV=128,
                          PREC="tf32" if dt == "bf16" else "ieee", CHUNK_P=8, BLOCK_P=8,
                          s_qd=1, s_kd=1, s_vd=1, s_od=1, PF=pf),
                     num_warps=4, num_stages=3 if dt == "bf16" else 2)
        assert k.metadata.shared <= 227 * 1024
        _compile(KP._paged_append_kernel,
                 {"k_ptr": "*" + dt, "v_ptr": "*" + dt, "ck_ptr": "*" + dt, "cv_ptr": "*" + dt,
                  "bt_ptr": "*i32", "pos_ptr": "*i32", "len_ptr": "*i32", "flag_ptr": "*i64"},
                 dict(PAGE=16, BLOCK_D=128, BLOCK_DV=128), num_warps=1)
