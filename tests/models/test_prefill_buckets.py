"""GraphDecoder's padded prefill of short prompts (models/graph_decode.py, PREFILL_BUCKET).

A prompt padded on the right must give the unpadded prefill's next-token logits (the pad
tokens come after every real one, so causal attention never sees them) and the same greedy
continuation (the decode steps overwrite the pad tokens' cache slots); the cache holds the
real length. On cuda a bucket's second prefill is a replayed graph with the eager run's
bits. Padding is on for cuda by default; here it is forced on for every device.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import nbxtensor as nbx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "runtime"))
from test_graphs import _tiny_llama  # noqa: E402


def _decoder(m, padded, capacity=40, batch=2, **kw):
    from nbxtensor.models.graph_decode import GraphDecoder
    d = GraphDecoder(m, batch=batch, capacity=capacity, **kw)
    if padded:      # (instance attributes: the class keeps its settings)
        d.PREFILL_DEVICES = ("cpu", "interp", "cuda")
    else:
        d.PREFILL_GRAPH_MAX = 0
    return d


def _prompts(T, g, V=97):
    return [g.integers(0, V, T).tolist() for _ in range(2)]


@pytest.mark.parametrize("T", [1, 5, 16, 17])
def test_padded_prefill_matches_unpadded(device, T):
    m = _tiny_llama(device, L=1 if device == "interp" else 2)
    g = np.random.default_rng(T)
    prompts = _prompts(T, g)
    exact = _decoder(m, padded=False, use_graph=False)
    padded = _decoder(m, padded=True, use_graph=False)
    assert padded._bucket(T) == -(-T // 16) * 16
    for d in (exact, padded):
        d.prefill(prompts)
    # the next token and every logit (float32: the same sums in another tile order)
    np.testing.assert_array_equal(padded.tokens.numpy(), exact.tokens.numpy())
    assert padded.cache.lengths.numpy().tolist() == [T, T]
    steps = 3 if device == "interp" else 6
    got, want = [], []
    for _ in range(steps):
        got.append(padded.step().numpy().copy())
        want.append(exact.step().numpy().copy())
    np.testing.assert_array_equal(np.concatenate(got, 1), np.concatenate(want, 1))
    np.testing.assert_allclose(padded.logits.numpy(), exact.logits.numpy(), rtol=1e-4, atol=1e-4)


def test_padded_prefill_logits_match_forward(device, monkeypatch):
    """The padded prefill's logits against the model's own forward() (float32)."""
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _tiny_llama(device, L=1)
    monkeypatch.setattr(GraphDecoder, "PREFILL_DEVICES", ("cpu", "interp", "cuda"))
    prompt = [3, 14, 15, 92, 65, 35, 89]
    seen = {}
    real = m.prefill

    def spy(*a, **k):
        seen["logits"] = out = real(*a, **k)
        seen["T"] = a[0].shape[1]
        return out
    monkeypatch.setattr(m, "prefill", spy)
    d = GraphDecoder(m, batch=1, capacity=40, use_graph=False)
    d.prefill(prompt)
    assert seen["T"] == 16                       # it ran padded
    ref = m.forward(prompt, m.new_cache(32)).numpy().astype(np.float64)
    np.testing.assert_allclose(seen["logits"].numpy()[0], ref.reshape(-1), rtol=2e-4, atol=2e-4)


def test_long_prompts_and_full_buckets_run_unpadded(monkeypatch):
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _tiny_llama("cpu", L=1)
    monkeypatch.setattr(GraphDecoder, "PREFILL_DEVICES", ("cpu",))
    d = GraphDecoder(m, batch=1, capacity=20, use_graph=False)
    assert d._bucket(3) == 16
    assert d._bucket(17) == 17                   # 32 would not leave room in capacity 20
    d2 = GraphDecoder(m, batch=1, capacity=400, use_graph=False)
    assert d2._bucket(129) == 129                # past PREFILL_GRAPH_MAX
    monkeypatch.setattr(GraphDecoder, "PREFILL_DEVICES", ("cuda",))
    assert d2._bucket(3) == 3                    # padding is for the devices listed


def test_prefill_last_refusals():
    m = _tiny_llama("cpu", L=1)
    cache = m.new_kv_cache(1, 16)
    ids = nbx.tensor(np.array([[1, 2, 3]], np.int64))
    pos = nbx.tensor(np.array([[0, 1, 2]], np.int32))
    for bad in (nbx.tensor(np.array([2], np.int32)), nbx.tensor(np.array([1, 2], np.int64)), [2]):
        with pytest.raises(ValueError, match="last must be a \\(1,\\) int64 tensor"):
            m.prefill(ids, pos, cache, last=bad)


@pytest.mark.cuda
def test_bucket_graph_replays_the_eager_bits(monkeypatch):
    from test_graphs import _cuda_ok
    if not _cuda_ok():
        pytest.skip("needs a GPU")
    from nbxtensor.models.graph_decode import GraphDecoder
    m = _tiny_llama("cuda", dtype=nbx.bfloat16)
    d = GraphDecoder(m, batch=2, capacity=64)
    assert d.use_graph
    g = np.random.default_rng(3)
    outs = []
    for i in range(3):
        prompts = _prompts(5, g) if i < 2 else _prompts(11, g)   # the same bucket, other ids
        d.prefill(prompts)
        outs.append((prompts, d.tokens.numpy().copy()))
    e = d._prefills[16]
    assert e["graph"] is not None and e["uses"] == 3          # captured at the second use
    # the replays give what an eager padded prefill of the same prompts gives
    eager = GraphDecoder(m, batch=2, capacity=64, use_graph=False)
    for prompts, toks in outs:
        eager.prefill(prompts)
        np.testing.assert_array_equal(eager.tokens.numpy(), toks)
    r1 = GraphDecoder(m, batch=2, capacity=64, use_graph=False).generate(outs[2][0], 8)
    r2 = d.generate(outs[2][0], 8)
    assert r1.tokens == r2.tokens
