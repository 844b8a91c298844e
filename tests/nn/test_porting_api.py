"""The torch API the porting suite needed, op by op: each case of
fixtures/make_porting_api_fixtures.py (CASES, INITS) evaluated with nbxtensor on every device
against torch's stored result; NumPy's protocols against NumPy itself; the new modules
(losses, padding, distances) against nn.functional; torch.testing.assert_close."""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor import nn
from nbxtensor.nn import functional as F
from nbxtensor.nn import init

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
from make_porting_api_fixtures import CASES, INITS  # noqa: E402

REF = np.load(os.path.join(os.path.dirname(__file__), "..", "fixtures", "porting", "api_ref.npz"))
CPU_ONLY = {"svdvals", "pinv"}     # the LU/Cholesky/QR/eigh family runs everywhere
_FACTORIES = ("tensor", "zeros", "ones", "arange", "linspace", "logspace", "eye", "empty", "full",
              "triu_indices", "tril_indices")


class _OnDevice:
    """nbxtensor with its factories defaulting to `device` (as torch.set_default_device)."""

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name):
        f = getattr(nbx, name)
        if name in _FACTORIES:
            def make(*args, **kwargs):
                kwargs.setdefault("device", self._device)
                return f(*args, **kwargs)
            return make
        return f


def _env(device):
    env = {"T": _OnDevice(device)}
    for k in REF.files:
        if k.startswith("in_"):
            env[k[3:]] = nbx.tensor(REF[k], device=device)
    return env


def _tol(dtype):
    return {np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-10}.get(dtype, 0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_torch(name, device):
    want = REF[name]
    env = _env(device)
    if name in CPU_ONLY and device != "cpu":
        with pytest.raises(NotImplementedError, match="only cpu tensors"):
            eval(CASES[name], env)                     # noqa: S307 - our own case table
        return
    got = eval(CASES[name], env)                       # noqa: S307
    assert isinstance(got, nbx.Tensor), type(got)
    if got.device.type != "cpu" or "channels_last" in name or name == "atleast_3d":
        pass
    g = got.cpu().numpy()
    assert g.shape == want.shape, (g.shape, want.shape)
    assert g.dtype == want.dtype, (g.dtype, want.dtype)
    tol = _tol(want.dtype)
    if tol == 0:
        np.testing.assert_array_equal(g, want)
    else:
        scale = max(1.0, float(np.nanmax(np.abs(want)))) if want.size else 1.0
        np.testing.assert_allclose(g, want, rtol=tol * 10, atol=tol * scale, equal_nan=True)


@pytest.mark.parametrize("name", sorted(INITS))
def test_init_draws_match_torch(name, device):
    src, shape = INITS[name]
    nbx.manual_seed(7)
    t = nbx.empty(shape, device=device)
    t.fill_(float("nan"))
    out = eval(src, {"init": init, "t": t})            # noqa: S307
    assert out is t
    np.testing.assert_allclose(t.cpu().numpy(), REF["init_" + name], rtol=1e-5, atol=1e-6)


def test_init_properties():
    nbx.manual_seed(3)
    t = init.trunc_normal_(nbx.empty(4000), mean=0.5, std=2.0, a=-1.0, b=1.5)
    a = t.numpy()
    assert a.min() >= -1.0 and a.max() <= 1.5 and a.std() > 0.3
    q = init.orthogonal_(nbx.empty(6, 10)).numpy().astype(np.float64)
    np.testing.assert_allclose(q @ q.T, np.eye(6), atol=1e-5)
    s = init.sparse_(nbx.empty(10, 4), 0.3).numpy()
    assert ((s == 0).sum(0) == 3).all()
    with pytest.raises(ValueError, match="2 or more"):
        init.orthogonal_(nbx.empty(3))
    with pytest.raises(ValueError, match="3, 4, or 5"):
        init.dirac_(nbx.empty(3, 3))
    with pytest.raises(TypeError, match="floating point"):
        init.trunc_normal_(nbx.empty(3, dtype=nbx.int32))
    assert init._calculate_correct_fan(nbx.empty(4, 3, 2), "fan_out") == 8


def test_refusals():
    with pytest.raises(TypeError, match="histc: input must be a floating point"):
        nbx.histc(nbx.arange(3))
    with pytest.raises(ValueError, match="non-negative"):
        nbx.bincount(nbx.tensor([1, -1]))
    with pytest.raises(TypeError, match="1-D integer"):
        nbx.bincount(nbx.ones(3))
    with pytest.raises(ValueError, match="length 3"):
        nbx.cross(nbx.ones(2, 4), nbx.ones(2, 4), dim=1)
    with pytest.raises(ValueError, match="not divisible"):
        nbx.hsplit(nbx.ones(2, 5), 2)
    with pytest.raises(RuntimeError, match="rank 4"):
        nbx.ones(2, 3).contiguous(memory_format=nbx.channels_last)
    with pytest.raises(TypeError, match="both dim and its alias axis"):
        nbx.ones(2, 3).sum(dim=0, axis=1)
    with pytest.raises(ValueError, match="q values must be in the range"):
        nbx.quantile(nbx.ones(3), 1.5)
    with pytest.raises(TypeError, match="float or double"):
        nbx.quantile(nbx.ones(3, dtype=nbx.float16), 0.5)


def test_channels_last_is_a_view_layout(device):
    g = np.random.default_rng(0)
    a = g.standard_normal((2, 3, 4, 5)).astype(np.float32)
    t = nbx.tensor(a, device=device)
    cl = t.contiguous(memory_format=nbx.channels_last)
    assert cl.is_contiguous(memory_format=nbx.channels_last) and not cl.is_contiguous()
    assert cl.stride() == (60, 1, 15, 3)
    assert cl.contiguous(memory_format=nbx.channels_last) is cl
    np.testing.assert_array_equal(cl.cpu().numpy(), a)
    np.testing.assert_array_equal((cl + 1).cpu().numpy(), a + 1)
    assert cl.contiguous().is_contiguous()
    assert t.clone(memory_format=nbx.channels_last).stride() == (60, 1, 15, 3)


def test_inplace_view_ops(device):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = nbx.tensor(a, device=device)
    assert t.unsqueeze_(0) is t and tuple(t.shape) == (1, 3, 4)
    t.squeeze_(0).t_()
    np.testing.assert_array_equal(t.cpu().numpy(), a.T)
    t.transpose_(0, 1)
    np.testing.assert_array_equal(t.cpu().numpy(), a)
    assert t.is_cpu == (device == "cpu")


def test_numpy_functions_use_numpy_keywords():
    g = np.random.default_rng(5)
    a = g.standard_normal((4, 6)).astype(np.float32)
    t = nbx.tensor(a)
    cases = [(np.sum, {"axis": 0}), (np.sum, {}), (np.mean, {"axis": 1, "keepdims": True}),
             (np.max, {}), (np.min, {"axis": -1}), (np.std, {"ddof": 1}), (np.var, {"axis": 0}),
             (np.prod, {"axis": 1}), (np.argmax, {"axis": 1}), (np.cumsum, {"axis": 0}),
             (np.any, {"axis": 0}), (np.amax, {"axis": (0, 1)})]
    for fn, kw in cases:
        got = fn(t, **kw)
        assert isinstance(got, nbx.Tensor), (fn.__name__, kw, type(got))
        want = fn(a, **kw)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, err_msg=f"{fn.__name__} {kw}")
        assert got.numpy().dtype == np.asarray(want).dtype, (fn.__name__, kw)
    np.testing.assert_allclose(np.clip(t, -0.5, 0.5).numpy(), np.clip(a, -0.5, 0.5))
    np.testing.assert_allclose(np.round(t, 2).numpy(), np.round(a, 2))
    assert isinstance(np.concatenate([t, t]), np.ndarray)      # as torch: NumPy's own result
    with pytest.raises(TypeError, match="out= is not supported"):
        np.sum(t, axis=0, out=np.empty(6, np.float32))


def test_axis_aliases(device):
    g = np.random.default_rng(6)
    a = g.standard_normal((3, 5)).astype(np.float32)
    t = nbx.tensor(a, device=device)
    np.testing.assert_allclose(t.sum(axis=1, keepdims=True).cpu().numpy(),
                               a.sum(1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(nbx.mean(t, axis=0).cpu().numpy(), a.mean(0), rtol=1e-6)
    np.testing.assert_array_equal(t.argmax(axis=1).cpu().numpy(), a.argmax(1))
    np.testing.assert_allclose(nbx.cat([t, t], axis=1).cpu().numpy(), np.concatenate([a, a], 1))
    assert t.max(axis=0).values.shape == (5,)


def test_loss_modules_match_functional(device):
    g = np.random.default_rng(8)
    x = nbx.tensor(g.standard_normal((5, 4)).astype(np.float32), device=device)
    y = nbx.tensor(g.standard_normal((5, 4)).astype(np.float32), device=device)
    tgt = nbx.tensor(g.integers(0, 4, (5,)), device=device)
    prob = x.sigmoid()
    lab = (y > 0).float()
    w = nbx.tensor(g.random(4).astype(np.float32) + 0.5, device=device)
    pairs = [
        (nn.CrossEntropyLoss(weight=w, label_smoothing=0.1)(x, tgt),
         F.cross_entropy(x, tgt, weight=w, label_smoothing=0.1)),
        (nn.NLLLoss(reduction="sum")(x.log_softmax(1), tgt),
         F.nll_loss(x.log_softmax(1), tgt, reduction="sum")),
        (nn.MSELoss()(x, y), ((x - y) ** 2).mean()),
        (nn.L1Loss(reduction="none")(x, y), (x - y).abs()),
        (nn.SmoothL1Loss(beta=0.5)(x, y), F.smooth_l1_loss(x, y, beta=0.5)),
        (nn.HuberLoss(delta=0.7)(x, y), F.huber_loss(x, y, delta=0.7)),
        (nn.BCELoss()(prob, lab), F.binary_cross_entropy(prob, lab)),
        (nn.BCEWithLogitsLoss(pos_weight=w)(x, lab),
         F.binary_cross_entropy_with_logits(x, lab, pos_weight=w)),
        (nn.KLDivLoss(reduction="batchmean")(x.log_softmax(1), y.softmax(1)),
         F.kl_div(x.log_softmax(1), y.softmax(1), reduction="batchmean")),
        (nn.MSELoss(size_average=False)(x, y), ((x - y) ** 2).sum()),
        (nn.CosineSimilarity(dim=0)(x, y), F.cosine_similarity(x, y, dim=0)),
        (nn.PairwiseDistance(p=1.0, keepdim=True)(x, y),
         F.pairwise_distance(x, y, p=1.0, keepdim=True)),
    ]
    for k, (got, want) in enumerate(pairs):
        np.testing.assert_allclose(got.cpu().numpy(), want.cpu().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"pair {k}")
    assert "weight" in dict(nn.CrossEntropyLoss(weight=w).named_buffers())


def test_padding_modules(device):
    g = np.random.default_rng(9)
    a = g.standard_normal((2, 3, 4, 5)).astype(np.float32)
    x = nbx.tensor(a, device=device)
    np.testing.assert_array_equal(nn.ZeroPad2d(1)(x).cpu().numpy(),
                                  np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1))))
    np.testing.assert_array_equal(nn.ConstantPad1d((2, 1), 0.5)(x).cpu().numpy(),
                                  np.pad(a, ((0, 0), (0, 0), (0, 0), (2, 1)), constant_values=0.5))
    np.testing.assert_array_equal(nn.ReflectionPad2d((1, 2, 0, 1))(x).cpu().numpy(),
                                  np.pad(a, ((0, 0), (0, 0), (0, 1), (1, 2)), mode="reflect"))
    np.testing.assert_array_equal(nn.ReplicationPad1d(2)(x[0]).cpu().numpy(),
                                  np.pad(a[0], ((0, 0), (0, 0), (2, 2)), mode="edge"))
    np.testing.assert_array_equal(nn.CircularPad2d(1)(x).cpu().numpy(),
                                  np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="wrap"))
    assert repr(nn.ConstantPad2d(1, 3.0)) == "ConstantPad2d(padding=(1, 1, 1, 1), value=3.0)"
    with pytest.raises(ValueError, match="4-tuple"):
        nn.ZeroPad2d((1, 2))


def test_assert_close():
    a = nbx.tensor([1.0, 2.0, float("nan")])
    nbx.testing.assert_close(a, a.clone(), equal_nan=True)
    nbx.testing.assert_close(nbx.tensor([1.0]), nbx.tensor([1.0 + 1e-7]))
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        nbx.testing.assert_close(nbx.tensor([1.0, 2.0]), nbx.tensor([1.0, 2.1]))
    with pytest.raises(AssertionError, match="dtype"):
        nbx.testing.assert_close(nbx.tensor([1.0]), nbx.tensor([1.0], dtype=nbx.float64))
    with pytest.raises(AssertionError, match="Scalars are not close"):
        nbx.testing.assert_close(1.0, 1.5)
    nbx.testing.assert_close({"a": [nbx.ones(2)]}, {"a": [nbx.ones(2)]})
    from nbxtensor.testing import assert_close
    assert_close(nbx.arange(3), nbx.arange(3))


def test_namespaces_import_as_torchs():
    import nbxtensor.linalg as LA
    from nbxtensor.linalg import vector_norm  # noqa: F401
    from nbxtensor.special import expit
    assert nbx.linalg is LA
    np.testing.assert_allclose(expit(nbx.tensor([0.0])).numpy(), [0.5])
    with pytest.raises(AttributeError, match="special.zeta is not implemented"):
        nbx.special.zeta  # noqa: B018
    assert math.isinf(nbx.inf) and nbx.pi == math.pi and nbx.newaxis is None
    nbx.set_num_threads(2)
    assert nbx.get_num_threads() == 2
    nbx.use_deterministic_algorithms(True)
    assert nbx.are_deterministic_algorithms_enabled()
    nbx.use_deterministic_algorithms(False)
    assert nbx.is_floating_point(nbx.ones(1)) and not nbx.is_nonzero(nbx.tensor([0]))
    assert isinstance(nbx.Size([2]) + (3,), nbx.Size) and isinstance((1,) + nbx.Size([2]), nbx.Size)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_packed_sequence_equals_each_sequence_alone(mode, device):
    """A packed batch gives, per sequence, what running that sequence alone gives."""
    from nbxtensor.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
    nbx.manual_seed(11)
    rnn = getattr(nn, mode)(3, 4, bidirectional=True, batch_first=True).to(device)
    g = np.random.default_rng(12)
    lens = [2, 3, 1]
    seqs = [nbx.tensor(g.standard_normal((n, 3)).astype(np.float32), device=device) for n in lens]
    padded = pad_sequence(seqs, batch_first=True, padding_value=float("nan"))
    packed = pack_padded_sequence(padded, nbx.tensor(lens), batch_first=True,
                                  enforce_sorted=False)
    out, hn = rnn(packed)
    h = hn[0] if mode == "LSTM" else hn
    o, olens = pad_packed_sequence(out, batch_first=True)
    assert olens.tolist() == lens
    for i, s in enumerate(seqs):
        ref_out, ref_hn = rnn(s.unsqueeze(0))
        ref_h = ref_hn[0] if mode == "LSTM" else ref_hn
        np.testing.assert_allclose(o[i, :lens[i]].cpu().numpy(), ref_out[0].cpu().numpy(),
                                   rtol=1e-5, atol=1e-6)
        assert (o[i, lens[i]:].cpu().numpy() == 0).all()
        np.testing.assert_allclose(h[:, i].cpu().numpy(), ref_h[:, 0].cpu().numpy(), rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        pack_padded_sequence(padded, nbx.tensor(lens), batch_first=True)


def test_legacy_constructors_and_no_op_wrappers():
    t = nbx.FloatTensor([1, 2])
    assert t.dtype is nbx.float32 and t.tolist() == [1.0, 2.0]
    assert nbx.FloatTensor(2, 3).shape == (2, 3) and nbx.FloatTensor().shape == (0,)
    assert nbx.LongTensor([1, 2]).dtype is nbx.int64 and nbx.BoolTensor(3).shape == (3,)
    assert nbx.FloatTensor(nbx.tensor([1, 2])).dtype is nbx.float32
    lin = nn.Linear(2, 2)
    assert nbx.compile(lin) is lin and nbx.compile(mode="max-autotune")(lin) is lin
    assert nbx.jit.script(lin) is lin and not nbx.jit.is_scripting()
    with nbx.autocast("cuda", enabled=False):
        pass
    with pytest.raises(NotImplementedError, match="no autocast"):
        nbx.autocast("cpu", dtype=nbx.bfloat16)
    nbx.backends.cudnn.benchmark = True
    assert nbx.zeros(2, requires_grad=False, pin_memory=False).shape == (2,)
    with pytest.raises(RuntimeError, match="no autograd"):
        nbx.ones(2, requires_grad=True)
    assert nbx.tensor([0.1]).softmax(0).multinomial(1).tolist() == [0]
    assert nbx.ones(2).get_device() == -1
    assert nbx.ones(2).type() == "torch.FloatTensor" and nbx.ones(2).long().type() == "torch.LongTensor"
    assert nbx.ones(2).type("torch.HalfTensor").dtype is nbx.float16
