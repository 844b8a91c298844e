"""Small torch habits the porting programs met: torch.frombuffer, `v in t`, f"{t:.3f}"."""
from __future__ import annotations

import array

import numpy as np
import pytest

import nbxtensor as nbx


def test_frombuffer_shares_memory():
    b = bytearray(np.arange(6, dtype=np.float32).tobytes())
    t = nbx.frombuffer(b, dtype=nbx.float32)
    assert t.shape == (6,) and t.dtype == nbx.float32 and t.device == nbx.device("cpu")
    t[2] = -1.0
    assert np.frombuffer(b, np.float32)[2] == -1.0              # the buffer's own memory
    part = nbx.frombuffer(b, dtype=nbx.float32, count=2, offset=8)
    np.testing.assert_array_equal(part.numpy(), [-1.0, 3.0])
    ints = nbx.frombuffer(array.array("i", [4, 5, 6]), dtype=nbx.int32)
    np.testing.assert_array_equal(ints.numpy(), [4, 5, 6])
    np.testing.assert_array_equal(nbx.frombuffer(bytearray(b"\x01\x02\x03"), dtype=nbx.uint8)
                                  .numpy(), [1, 2, 3])
    ro = nbx.frombuffer(b"\x00\x00\x80\x3f", dtype=nbx.float32)
    assert float(ro[0]) == 1.0
    with pytest.raises(ValueError):
        ro[0] = 2.0                                              # read-only memory stays so


def test_frombuffer_refusals():
    with pytest.raises(ValueError, match="not a multiple"):
        nbx.frombuffer(bytearray(6), dtype=nbx.float32)
    with pytest.raises(ValueError, match="need 16 bytes"):
        nbx.frombuffer(bytearray(8), dtype=nbx.float32, count=4)
    with pytest.raises(ValueError, match="offset"):
        nbx.frombuffer(bytearray(8), dtype=nbx.uint8, offset=8)
    with pytest.raises(ValueError, match="count"):
        nbx.frombuffer(bytearray(8), dtype=nbx.uint8, count=0)
    with pytest.raises(TypeError, match="buffer protocol"):
        nbx.frombuffer([1, 2], dtype=nbx.uint8)
    with pytest.raises(TypeError):
        nbx.frombuffer(bytearray(8))                             # dtype is required


def test_contains(device):
    x = nbx.tensor([[0.5, 1.0], [2.0, float("nan")]], device=device)
    assert 0.5 in x and 2 in x and nbx.tensor(1.0, device=device) in x
    assert 3.0 not in x and float("nan") not in x               # NaN equals nothing
    assert True in nbx.tensor([False, True], device=device)
    with pytest.raises(TypeError, match="only supports Tensor or scalar"):
        "a" in x  # noqa: B015


def test_format(device):
    assert f"{nbx.tensor(1.23456, device=device):.3f}" == "1.235"
    assert f"{nbx.tensor(7, device=device):>3}" == "  7"
    assert "{}".format(nbx.tensor(2.5, device=device)) == "2.5"
    t = nbx.tensor([1.0, 2.0], device=device)
    assert f"{t}" == str(t)
    with pytest.raises(TypeError):
        f"{t:.2f}"  # noqa: B018 - a tensor with elements has no number format, as torch


def test_categorical(device):
    g = np.random.default_rng()
    logits = g.standard_normal((3, 5)).astype(np.float32)
    logits[1, 2] = -np.inf                                 # an impossible category
    d = nbx.distributions.Categorical(logits=nbx.tensor(logits, device=device))
    lp = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    p = np.exp(lp)
    np.testing.assert_allclose(d.probs.cpu().numpy(), p, rtol=1e-5, atol=1e-7)
    assert d.batch_shape == (3,) and d.event_shape == () and d.param_shape == (3, 5)
    v = nbx.tensor([0, 4, 1], device=device)
    np.testing.assert_allclose(d.log_prob(v).cpu().numpy(), lp[np.arange(3), [0, 4, 1]],
                               rtol=1e-5)
    with np.errstate(invalid="ignore"):
        ent = -np.where(p > 0, p * lp, 0).sum(-1)
    np.testing.assert_allclose(d.entropy().cpu().numpy(), ent, rtol=1e-5)
    s = d.sample((4000,))
    assert s.shape == (4000, 3) and s.dtype == nbx.int64 and s.device == nbx.device(device)
    draws = s.cpu().numpy()
    assert not (draws[:, 1] == 2).any()                     # never the impossible one
    freq = np.stack([np.bincount(draws[:, i], minlength=5) / 4000 for i in range(3)])
    np.testing.assert_allclose(freq, p, atol=0.04)
    q = nbx.distributions.Categorical(probs=nbx.tensor([2.0, 2.0, 4.0], device=device))
    np.testing.assert_allclose(q.probs.cpu().numpy(), [0.25, 0.25, 0.5])
    np.testing.assert_array_equal(q.mode.cpu().numpy(), 2)
    assert q.sample().shape == ()
    with pytest.raises(ValueError, match="not both"):
        nbx.distributions.Categorical(probs=q.probs, logits=q.logits)
    with pytest.raises(TypeError, match="floating"):
        nbx.distributions.Categorical(logits=nbx.arange(3, device=device))
