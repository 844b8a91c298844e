"""nbx.random: torch's CPU generator bit for bit (fixtures made with torch), the Generator
API, refusals, and statistical checks of the distributions."""
from __future__ import annotations

import importlib.util
import json
import math
import os

import numpy as np
import pytest

import nbxtensor as nbx

_spec = importlib.util.spec_from_file_location(
    "make_random_fixtures", os.path.join(os.path.dirname(__file__), "..", "fixtures",
                                         "make_random_fixtures.py"))
F = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(F)
_Z = np.load(F.FIXTURE)
CASES = json.loads(str(_Z["cases"]))


def _skip_unless_cpu(device):
    if device != "cpu":
        pytest.skip("torch's MT19937 stream is the cpu generator's")


@pytest.mark.parametrize("i", range(len(CASES)))
def test_bit_identical_to_torch_cpu(device, i):
    """Every result of every call sequence, and the final get_state() bytes (sha256), equal
    torch's (the fixture records torch's version and CPU capability)."""
    _skip_unless_cpu(device)
    got = F.run(nbx, CASES[i])
    want = [_Z[f"c{i}_{j}"] for j in range(len(got))]
    assert f"c{i}_{len(got)}" not in _Z.files
    for j, (a, e) in enumerate(zip(got, want)):
        assert a.shape == e.shape and np.array_equal(a, e), (CASES[i], j)


def test_fixture_records_torch():
    assert str(_Z["torch_version"]).startswith("2.")
    assert os.path.getsize(F.FIXTURE) < 300_000


def test_default_generator_matches_torch_defaults(device):
    """torch.manual_seed(0); torch.randn(5) (torch 2.13 values) and the default seed."""
    _skip_unless_cpu(device)
    nbx.manual_seed(0)
    assert nbx.randn(5).numpy().tolist() == pytest.approx(
        [1.5409960746765137, -0.293428897857666, -2.1787893772125244, 0.5684312582015991,
         -1.0845223665237427], abs=0)
    assert nbx.initial_seed() == 0
    assert nbx.Generator().initial_seed() == 67280421310721


def test_state_round_trip_and_normal_cache(device):
    _skip_unless_cpu(device)
    g = nbx.Generator().manual_seed(5)
    nbx.randn(3, generator=g, dtype=nbx.float64)          # leaves a cached normal
    st = g.get_state()
    assert st.dtype == nbx.uint8 and tuple(st.shape) == (5056,)
    a = [nbx.randn(3, generator=g, dtype=nbx.float64).numpy(), nbx.rand(700, generator=g).numpy()]
    g2 = nbx.Generator().set_state(st)
    b = [nbx.randn(3, generator=g2, dtype=nbx.float64).numpy(), nbx.rand(700, generator=g2).numpy()]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert g2.initial_seed() == 5
    with pytest.raises(ValueError, match="set_state"):
        g.set_state(nbx.zeros(10, dtype=nbx.uint8))
    bad = st.numpy().copy()
    bad[8:12] = 0                                          # left = 0: not a valid mt19937 state
    with pytest.raises(ValueError, match="invalid mt19937"):
        g.set_state(nbx.from_numpy(bad))


def test_fork_rng_and_seeds(device):
    _skip_unless_cpu(device)
    nbx.manual_seed(123)
    with nbx.random.fork_rng():
        inside = nbx.rand(4).numpy()
    assert np.array_equal(nbx.rand(4).numpy(), inside)
    s = nbx.seed()
    assert nbx.initial_seed() == s and 0 <= s < 2 ** 64
    g = nbx.Generator().manual_seed(-1)                    # torch: two's complement
    assert g.initial_seed() == 2 ** 64 - 1
    assert nbx.manual_seed(7) is nbx.random.default_generator


def test_sampler_keeps_working_with_the_new_generator(device):
    """nbx.sample reads the [seed, step] state every nbx.Generator still carries."""
    g = nbx.Generator(device=device).manual_seed(3)
    assert isinstance(g, nbx.ops.sampling.Generator)
    logits = nbx.tensor(np.linspace(-1, 1, 50, dtype=np.float32), device=device)
    first = nbx.sample(logits, generator=g).numpy().tolist()
    g.manual_seed(3)
    assert nbx.sample(logits, generator=g).numpy().tolist() == first
    legacy = nbx.Generator(3, device=device)               # the sampler's older spelling
    assert nbx.sample(logits, generator=legacy).numpy().tolist() == first


def test_non_cpu_devices_refuse(device):
    """cuda/interp draw with Philox (tests/ops/test_random_cuda.py); the cpu-only rest refuses."""
    if device == "cpu":
        pytest.skip("cpu is implemented")
    for call in (lambda: nbx.poisson(nbx.ones(4, device=device)),
                 lambda: nbx.zeros(4, device=device).geometric_(0.5),
                 lambda: nbx.zeros(4, device=device).cauchy_(),
                 lambda: nbx.zeros(4, device=device).log_normal_()):
        with pytest.raises(NotImplementedError, match=f"on '?{device}"):
            call()


def test_refusals(device):
    _skip_unless_cpu(device)
    with pytest.raises(ValueError, match="low < high"):
        nbx.randint(5, 5, (3,))
    with pytest.raises(TypeError, match="dtype"):
        nbx.rand(3, dtype=nbx.int64)
    with pytest.raises(TypeError, match="dtype"):
        nbx.randn(3, dtype=nbx.float8_e4m3fn)
    with pytest.raises(ValueError, match="std >= 0"):
        nbx.zeros(4).normal_(0, -1)
    with pytest.raises(ValueError, match="from"):
        nbx.zeros(4).uniform_(2, 1)
    with pytest.raises(ValueError, match="out of bounds"):
        nbx.zeros(4, dtype=nbx.uint8).random_(0, 300)
    with pytest.raises(ValueError, match=r"p to be in \[0, 1\]"):
        nbx.zeros(4).bernoulli_(1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        nbx.zeros(3).bernoulli_(nbx.tensor([0.5, float("nan"), 0.2]))
    with pytest.raises(ValueError, match="lambda > 0"):
        nbx.zeros(4).exponential_(0)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        nbx.zeros(4).geometric_(1.0)
    with pytest.raises(TypeError, match="float16/bfloat16/float32/float64"):
        nbx.zeros(4, dtype=nbx.int32).exponential_()
    with pytest.raises(ValueError, match="inf, nan or element < 0"):
        nbx.multinomial(nbx.tensor([0.5, -0.1, 0.6]), 1)
    with pytest.raises(ValueError, match="inf, nan or element < 0"):
        nbx.multinomial(nbx.tensor([0.5, float("nan")]), 1)
    with pytest.raises(ValueError, match="sum of probabilities"):
        nbx.multinomial(nbx.tensor([[0.5, 0.5], [0.0, 0.0]]), 1)
    with pytest.raises(ValueError, match="without replacement"):
        nbx.multinomial(nbx.tensor([0.5, 0.5]), 3)
    with pytest.raises(TypeError, match="float16"):
        nbx.multinomial(nbx.tensor([1, 2]), 1)
    with pytest.raises(ValueError, match="non-negative"):
        nbx.poisson(nbx.tensor([1.0, -2.0]))
    with pytest.raises(ValueError, match="n must be"):
        nbx.randperm(-1)
    with pytest.raises(TypeError, match="generator"):
        nbx.rand(3, generator=object())
    with pytest.raises(TypeError, match="seed"):
        nbx.manual_seed(1.5)
    with pytest.raises(ValueError, match="seed"):
        nbx.manual_seed(2 ** 64)


def test_poisson_moments(device):
    """Mean and variance of Poisson(lam) within 5 standard errors (seeded, n = 4000)."""
    _skip_unless_cpu(device)
    g = nbx.Generator().manual_seed(31)
    n = 4000
    for lam in (0.7, 6.0, 40.0):
        x = nbx.poisson(nbx.full((n,), lam, dtype=nbx.float64), generator=g).numpy()
        assert np.all(x == np.round(x)) and x.min() >= 0
        assert abs(x.mean() - lam) < 5 * math.sqrt(lam / n)
        assert abs(x.var() - lam) < 5 * lam * math.sqrt(2.0 / n) + 5 * math.sqrt(lam / n)


@pytest.mark.parametrize("replacement", [True, False])
def test_multinomial_frequencies(device, replacement):
    """Chi-square of first draws against p (7 dof: p < 1e-4 at 29.9), n = 3000 rows."""
    _skip_unless_cpu(device)
    g = nbx.Generator().manual_seed(77)
    p = np.array([0.05, 0.1, 0.2, 0.05, 0.3, 0.1, 0.15, 0.05])
    probs = nbx.tensor(np.tile(p * 3.0, (3000, 1)).astype(np.float32))   # unnormalised
    k = 2 if replacement else 1
    idx = nbx.multinomial(probs, k, replacement, generator=g).numpy()
    assert idx.shape == (3000, k) and idx.dtype == np.int64
    counts = np.bincount(idx[:, 0], minlength=8)
    chi2 = ((counts - 3000 * p) ** 2 / (3000 * p)).sum()
    assert chi2 < 29.9
    if not replacement:
        two = nbx.multinomial(probs[:50], 8, False, generator=g).numpy()
        assert all(sorted(r) == list(range(8)) for r in two.tolist())


def test_continuous_distributions_ks(device):
    """KS distance of n = 5000 draws to the exact CDF below 1.63 / sqrt(n) (alpha = 0.01)."""
    _skip_unless_cpu(device)
    g = nbx.Generator().manual_seed(2)
    n = 5000
    cdfs = {
        "rand": (lambda: nbx.rand(n, generator=g, dtype=nbx.float64), lambda x: x),
        "randn": (lambda: nbx.randn(n, generator=g, dtype=nbx.float32),
                  lambda x: 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
        "exponential": (lambda: nbx.empty(n, dtype=nbx.float64).exponential_(2.0, generator=g),
                        lambda x: 1 - np.exp(-2.0 * x)),
        "cauchy": (lambda: nbx.empty(n, dtype=nbx.float64).cauchy_(1.0, 0.5, generator=g),
                   lambda x: 0.5 + np.arctan((x - 1.0) / 0.5) / math.pi),
    }
    for name, (draw, cdf) in cdfs.items():
        x = np.sort(draw().numpy().astype(np.float64))
        c = cdf(x)
        ks = max((np.arange(1, n + 1) / n - c).max(), (c - np.arange(n) / n).max())
        assert ks < 1.63 / math.sqrt(n), name


def test_torch_live_random_seeds(device):
    """With torch installed: fresh seeds and shapes against torch's CPU generator."""
    _skip_unless_cpu(device)
    torch = pytest.importorskip("torch")
    r = np.random.default_rng(11)
    for _ in range(20):
        s, n = int(r.integers(0, 2 ** 63)), int(r.integers(1, 300))
        tg, ng = torch.Generator().manual_seed(s), nbx.Generator().manual_seed(s)
        for dt in F.FLOATS:
            a = torch.randn(n, generator=tg, dtype=getattr(torch, dt))
            b = nbx.randn(n, generator=ng, dtype=getattr(nbx, dt))
            assert np.array_equal(F._bits(torch, a), F._bits(nbx, b)), (s, n, dt)
