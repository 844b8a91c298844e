"""sample(): exact top-k / top-p support on crafted logits, greedy ties, penalty, seeding."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng


def _draws(logits, device, n, **kw):
    g = nbx.Generator(1234, device=device)
    t = nbx.tensor(logits, device=device)
    return [nbx.sample(t, generator=g, **kw).numpy().tolist() for _ in range(n)]


def test_greedy_ties_first_index(device):
    x = rng().standard_normal((3, 37)).astype(np.float32)
    x[0, [5, 20, 36]] = 9.0
    x[1, [0, 36]] = 9.0
    x[2, :] = 1.0
    out = nbx.sample(nbx.tensor(x, device=device), temperature=0)
    assert out.dtype == nbx.int64 and out.device == nbx.device(device)
    assert out.numpy().tolist() == [5, 0, 0]
    h = nbx.sample(nbx.tensor(x[0].astype(np.float16), device=device), temperature=0)
    assert h.shape == () and int(h.numpy()) == 5


def test_greedy_nan_is_the_max_as_torch(device):
    """temperature 0: the first NaN wins, also over an earlier +inf and across blocks
    (argmax semantics; an unhandled NaN once gave the out-of-range token V)."""
    x = rng().standard_normal((3, 1500)).astype(np.float32)
    x[0, 7] = np.nan
    x[1, 3], x[1, 1200], x[1, 1300] = np.inf, np.nan, np.nan
    x[2, 1499] = np.nan
    out = nbx.sample(nbx.tensor(x, device=device), temperature=0).numpy().tolist()
    assert out == [7, 1200, 1499]


def test_top_k_support(device):
    g = rng()
    V = 70
    x = g.permutation(np.arange(V, dtype=np.float32)) * 0.01   # distinct, close values
    x[[3, 50]] = 5.0                                             # tie at the k-th value
    x[11] = 6.0
    n = 12 if device == "interp" else 200
    seen = {t for t in _draws(x, device, n, top_k=2, temperature=10.0)}
    # k=2: values >= the 2nd largest (5.0): 11 and both tied tokens
    assert seen <= {11, 3, 50} and len(seen) >= 2


@pytest.mark.parametrize("top_p,support", [(0.79, {0, 1}), (0.81, {0, 1, 2}), (0.5, {0}),
                                           (0.949, {0, 1, 2}), (0.951, {0, 1, 2, 3})])
def test_top_p_support(device, top_p, support):
    p = np.array([0.5, 0.3, 0.15, 0.05 - 1e-6] + [1e-7] * 10)
    x = np.log(p).astype(np.float32)
    n = 10 if device == "interp" else 300
    seen = set(_draws(x, device, n, top_p=top_p))
    assert seen <= support
    if device != "interp":
        assert seen == support


def test_top_k_then_top_p(device):
    x = np.log(np.array([0.4, 0.1, 0.3, 0.2, 1e-3, 1e-3])).astype(np.float32)
    # top-k=3 keeps {0, 2, 3} (0.4, 0.3, 0.2 renormalised to 4/9, 3/9, 2/9);
    # top-p=0.5: mass above 0.3 is 4/9 < 0.5 -> keep {0, 2}
    n = 8 if device == "interp" else 200
    seen = set(_draws(x, device, n, top_k=3, top_p=0.5))
    assert seen <= {0, 2}


def test_seeded_reproducible(device):
    x = rng().standard_normal((2, 33)).astype(np.float32)
    n = 3
    a = _draws(x, device, n, temperature=2.0)
    b = _draws(x, device, n, temperature=2.0)
    assert a == b
    g = nbx.Generator(99, device=device)
    t = nbx.tensor(x, device=device)
    first = nbx.sample(t, generator=g, temperature=50.0).numpy().tolist()
    later = [nbx.sample(t, generator=g, temperature=50.0).numpy().tolist() for _ in range(4)]
    assert any(r != first for r in later)        # the step advances: new numbers each call
    g.manual_seed(99)
    assert nbx.sample(t, generator=g, temperature=50.0).numpy().tolist() == first


def test_repetition_penalty(device):
    x = np.array([[3.0, 2.9, -1.0, 0.5], [3.0, 2.9, -1.0, 0.5]], np.float32)
    prev = nbx.tensor(np.array([[0, 0, -1], [3, 7, 2]]), device=device)
    out = nbx.sample(nbx.tensor(x, device=device), temperature=0, repetition_penalty=2.0,
                     previous_tokens=prev)
    assert out.numpy().tolist() == [1, 0]       # row 0: 3.0 -> 1.5 (once, not twice)
    x2 = np.array([[1.0, 0.9, -0.1]], np.float32)
    out = nbx.sample(nbx.tensor(x2, device=device), temperature=0, repetition_penalty=20.0,
                     previous_tokens=nbx.tensor(np.array([0, 1]), device=device))
    assert out.numpy().tolist() == [0]          # 1.0/20 = 0.05 > 0.045 > -0.1


def test_refusals(device):
    x = nbx.zeros(2, 5, device=device)
    with pytest.raises(ValueError, match="temperature"):
        nbx.sample(x, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        nbx.sample(x, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        nbx.sample(x, top_p=0.0)
    with pytest.raises(ValueError, match="previous_tokens"):
        nbx.sample(x, repetition_penalty=1.2)
    with pytest.raises(TypeError, match="logits"):
        nbx.sample(nbx.zeros(2, 5, dtype=nbx.int32, device=device))
    with pytest.raises(ValueError, match="seed"):
        nbx.Generator(-1)
