"""nbx.nn modules and the grad-mode no-ops: forwards against float64 NumPy references,
state dicts, strict/non-strict loading, torch's repr text, hooks, conversions."""
from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor import nn
from nbxtensor.nn import functional as F

from helpers import assert_close, rng

_erf = np.vectorize(math.erf)


def T(a, device, dtype=nbx.float32):
    return nbx.tensor(np.asarray(a).astype(dtype.np), device=device)


def close(got, want, rtol=3e-5, atol=None):
    want = np.asarray(want, np.float64)
    g = got.numpy().astype(np.float64)
    assert g.shape == want.shape, (g.shape, want.shape)
    fin = np.abs(want[np.isfinite(want)])
    scale = max(1.0, float(fin.max())) if fin.size else 1.0
    np.testing.assert_allclose(g, want, rtol=rtol, atol=atol if atol is not None else rtol * scale)


def params64(m):
    return {k: v.numpy().astype(np.float64) for k, v in m.state_dict().items()}


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ------------------------------------------------------------------------------ grad mode
def test_grad_mode_contexts_and_decorators():
    assert nbx.is_grad_enabled() and not nbx.is_inference_mode_enabled()
    with nbx.no_grad():
        assert not nbx.is_grad_enabled()
        with nbx.enable_grad():
            assert nbx.is_grad_enabled()
        assert not nbx.is_grad_enabled()
    assert nbx.is_grad_enabled()

    @nbx.no_grad
    def a():
        return nbx.is_grad_enabled()

    @nbx.no_grad()
    def b():
        return nbx.is_grad_enabled()

    @nbx.inference_mode
    def c():
        return nbx.is_inference_mode_enabled(), nbx.is_grad_enabled()

    @nbx.inference_mode()
    def d():
        return nbx.is_inference_mode_enabled()

    @nbx.inference_mode(False)
    def e():
        return nbx.is_inference_mode_enabled()

    @nbx.set_grad_enabled(False)
    def f():
        return nbx.is_grad_enabled()

    @nbx.no_grad()
    def gen():
        yield nbx.is_grad_enabled()

    assert (a(), b(), c(), d(), e(), f(), list(gen())) == (False, False, (True, False), True,
                                                          False, False, [False])
    assert a.__name__ == "a"
    assert nbx.is_grad_enabled() and not nbx.is_inference_mode_enabled()
    nbx.set_grad_enabled(False)          # as a call: applies at once
    assert not nbx.is_grad_enabled()
    with nbx.set_grad_enabled(True):
        assert nbx.is_grad_enabled()
    assert not nbx.is_grad_enabled()
    nbx.set_grad_enabled(True)
    with pytest.raises(TypeError, match="mode must be a bool"):
        nbx.set_grad_enabled("no")
    try:                                  # a raising body restores the flag
        with nbx.no_grad():
            raise KeyError
    except KeyError:
        pass
    assert nbx.is_grad_enabled()


def test_grad_mode_is_per_thread():
    seen = []
    with nbx.no_grad():
        t = threading.Thread(target=lambda: seen.append(nbx.is_grad_enabled()))
        t.start()
        t.join()
    assert seen == [True]


def test_tensor_autograd_face(device):
    x = T(rng(0).standard_normal((3, 4)), device)
    assert x.requires_grad is False and x.grad is None and x.is_leaf and x.grad_fn is None
    x.requires_grad = False
    assert x.requires_grad_(False) is x
    with pytest.raises(RuntimeError, match="no autograd"):
        x.requires_grad_()
    with pytest.raises(RuntimeError, match="no autograd"):
        x.requires_grad = True
    d = x.detach()
    assert type(d) is nbx.Tensor and d is not x and d.data_ptr() == x.data_ptr()
    d[0, 0] = 7.0                        # a view: writes show through
    assert x[0, 0].item() == 7.0
    assert x.detach_() is x
    assert x.data.data_ptr() == x.data_ptr()
    p = nn.Parameter(nbx.zeros(2, device=device))
    p.data = nbx.ones(3, device=device)
    assert p.shape == (3,) and p.sum().item() == 3.0


# ------------------------------------------------------------------------------ Parameter
def test_parameter_is_a_tensor(device):
    a = rng(1).standard_normal((5, 3))
    p = nn.Parameter(T(a, device))
    assert isinstance(p, nbx.Tensor) and isinstance(p, nn.Parameter)
    assert p.requires_grad is False
    close(p * 2 + 1, a * 2 + 1)
    close(F.linear(T(a, device), p), a @ a.T)
    r = p.sum(0)
    assert type(r) is nbx.Tensor      # ops on a Parameter give plain tensors, as torch's
    assert repr(p).startswith("Parameter containing:\ntensor(")
    with pytest.raises(TypeError, match="must be a Tensor"):
        nn.Parameter([1.0, 2.0])


# ------------------------------------------------------------------------------ layers
def test_linear_and_bilinear(device):
    g = rng(2)
    m = nn.Linear(37, 19).to(device)
    x = g.standard_normal((3, 5, 37))
    w = params64(m)
    close(m(T(x, device)), x @ w["weight"].T + w["bias"])
    xt = T(g.standard_normal((37, 4)), device).t()     # non-contiguous input
    close(m(xt), xt.numpy().astype(np.float64) @ w["weight"].T + w["bias"])
    nb = nn.Linear(6, 3, bias=False, device=device)
    assert nb.bias is None and list(nb.state_dict()) == ["weight"]
    assert nb.weight.device == nbx.device(device)
    b = nn.Bilinear(5, 7, 3).to(device)
    x1, x2 = g.standard_normal((2, 4, 5)), g.standard_normal((2, 4, 7))
    w = params64(b)
    want = np.einsum("...i,oij,...j->...o", x1, w["weight"], x2) + w["bias"]
    close(b(T(x1, device), T(x2, device)), want)


def test_linear_init_is_torchs():
    # torch 2.13: torch.manual_seed(0); nn.Linear(3, 2) / nn.Embedding(4, 3, padding_idx=1)
    nbx.manual_seed(0)
    lin = nn.Linear(3, 2)
    np.testing.assert_array_equal(lin.weight.numpy(), np.array(
        [[-0.004322517663240433, 0.3097158372402191, -0.4751853346824646],
         [-0.4248946011066437, -0.2223689705133438, 0.15482072532176971]], np.float32))
    np.testing.assert_array_equal(lin.bias.numpy(), np.array(
        [-0.011439144611358643, 0.45777493715286255], np.float32))
    nbx.manual_seed(0)
    emb = nn.Embedding(4, 3, padding_idx=1)
    np.testing.assert_array_equal(emb.weight.numpy()[:2], np.array(
        [[1.5409960746765137, -0.293428897857666, -2.1787893772125244], [0, 0, 0]], np.float32))


def test_embedding_and_bag(device):
    g = rng(3)
    e = nn.Embedding(11, 6, padding_idx=2).to(device)
    idx = g.integers(0, 11, (3, 4))
    w = e.weight.numpy().astype(np.float64)
    assert np.all(w[2] == 0)
    close(e(nbx.tensor(idx, device=device)), w[idx])
    fp = nn.Embedding.from_pretrained(T(w, device))
    close(fp(nbx.tensor(idx, device=device)), w[idx])
    inp = g.integers(0, 11, (9,))
    offs = np.array([0, 3, 3, 7])
    for mode in ("sum", "mean", "max"):
        bag = nn.EmbeddingBag(11, 6, mode=mode).to(device)
        bag.load_state_dict({"weight": T(w, device)})
        got = bag(nbx.tensor(inp, device=device), nbx.tensor(offs, device=device))
        red = {"sum": np.sum, "mean": np.mean, "max": np.max}[mode]
        ends = list(offs[1:]) + [len(inp)]
        want = [red(w[inp[a:b]], 0) if b > a else np.zeros(6) for a, b in zip(offs, ends)]
        close(got, np.stack(want))
        got2 = bag(nbx.tensor(idx, device=device))
        close(got2, red(w[idx], 1))
    bag = nn.EmbeddingBag(11, 6, mode="sum").to(device)
    bag.load_state_dict({"weight": T(w, device)})
    psw = g.standard_normal(idx.shape)
    close(bag(nbx.tensor(idx, device=device), per_sample_weights=T(psw, device)),
          np.einsum("bn,bnd->bd", psw, w[idx]))
    with pytest.raises(ValueError, match="offsets"):
        bag(nbx.tensor(inp, device=device))


def _layer_norm(x, w, b, eps, nd):
    ax = tuple(range(-nd, 0))
    mu = x.mean(ax, keepdims=True)
    var = x.var(ax, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    return y * w + b if w is not None else y


def _perturb(m, g):
    for p in m.parameters():
        p.copy_(nbx.tensor(p.numpy() + g.standard_normal(tuple(p.shape)).astype(np.float32)))
    return m


def test_norms(device):
    g = rng(4)
    x = g.standard_normal((3, 5, 2, 7)) * 3 + 1
    ln = _perturb(nn.LayerNorm((2, 7), eps=1e-4), g).to(device)
    w = params64(ln)
    close(ln(T(x, device)), _layer_norm(x, w["weight"], w["bias"], 1e-4, 2))
    ln2 = nn.LayerNorm(7, elementwise_affine=False).to(device)
    close(ln2(T(x, device)), _layer_norm(x, None, None, 1e-5, 1))
    rms = _perturb(nn.RMSNorm(7, eps=1e-6), g).to(device)
    w = params64(rms)
    close(rms(T(x, device)), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w["weight"])
    gn = _perturb(nn.GroupNorm(5, 5), g).to(device)
    w = params64(gn)
    xs = x.reshape(3, 5, -1)
    y = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5)
    close(gn(T(x, device)), y.reshape(x.shape) * w["weight"][:, None, None]
          + w["bias"][:, None, None])


def test_batch_norm_eval_and_train(device):
    g = rng(5)
    bn = _perturb(nn.BatchNorm2d(5), g)
    bn.running_mean.copy_(T(g.standard_normal(5), "cpu"))
    bn.running_var.copy_(T(g.uniform(0.5, 2, 5), "cpu"))
    bn = bn.to(device).eval()
    x = g.standard_normal((3, 5, 4, 6))
    s = params64(bn)
    sh = (1, 5, 1, 1)
    want = ((x - s["running_mean"].reshape(sh)) / np.sqrt(s["running_var"].reshape(sh) + 1e-5)
            * s["weight"].reshape(sh) + s["bias"].reshape(sh))
    close(bn(T(x, device)), want)
    bn.train()
    mu, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    want = ((x - mu.reshape(sh)) / np.sqrt(var.reshape(sh) + 1e-5) * s["weight"].reshape(sh)
            + s["bias"].reshape(sh))
    close(bn(T(x, device)), want, rtol=1e-4)
    n = x.size / 5
    close(bn.running_mean, 0.9 * s["running_mean"] + 0.1 * mu)
    close(bn.running_var, 0.9 * s["running_var"] + 0.1 * var * n / (n - 1))
    assert bn.num_batches_tracked.item() == 1
    with pytest.raises(ValueError, match="expected 4D input"):
        bn(T(x[0], device))
    b1 = nn.BatchNorm1d(5).to(device).eval()
    close(b1(T(x[..., 0, 0], device)), x[..., 0, 0] / np.sqrt(1 + 1e-5))


def test_instance_norm(device):
    g = rng(6)
    x = g.standard_normal((2, 3, 5, 4)) * 2 + 0.5
    m = _perturb(nn.InstanceNorm2d(3, affine=True), g).to(device)
    s = params64(m)
    mu, var = x.mean((2, 3), keepdims=True), x.var((2, 3), keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-5) * s["weight"][:, None, None] + s["bias"][:, None, None]
    close(m(T(x, device)), want)
    close(m(T(x[0], device)), want[0])          # unbatched
    assert list(m.state_dict()) == ["weight", "bias"]
    m1 = nn.InstanceNorm1d(3).to(device)
    x1 = x[:, :, :, 0]
    close(m1(T(x1, device)), (x1 - x1.mean(-1, keepdims=True))
          / np.sqrt(x1.var(-1, keepdims=True) + 1e-5))


_A = 1.6732632423543772848170429916717
_S = 1.0507009873554804934193349852946
_ACTS = [
    (nn.ReLU(), lambda x: np.maximum(x, 0)),
    (nn.ReLU6(), lambda x: np.clip(x, 0, 6)),
    (nn.GELU(), lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
    (nn.GELU(approximate="tanh"),
     lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
    (nn.SiLU(), lambda x: x * sigmoid(x)),
    (nn.Sigmoid(), sigmoid),
    (nn.Tanh(), np.tanh),
    (nn.Softmax(dim=1), lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True)),
    (nn.Softmin(dim=-1), lambda x: np.exp(-x) / np.exp(-x).sum(-1, keepdims=True)),
    (nn.LogSoftmax(dim=-1), lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True))),
    (nn.LeakyReLU(0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    (nn.ELU(0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
    (nn.CELU(1.5), lambda x: np.where(x > 0, x, 1.5 * np.expm1(x / 1.5))),
    (nn.SELU(), lambda x: _S * np.where(x > 0, x, _A * np.expm1(x))),
    (nn.Hardswish(), lambda x: x * np.clip(x + 3, 0, 6) / 6),
    (nn.Hardsigmoid(), lambda x: np.clip(x + 3, 0, 6) / 6),
    (nn.Hardtanh(-0.5, 2.0), lambda x: np.clip(x, -0.5, 2.0)),
    (nn.Mish(), lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    (nn.Softplus(beta=2.0, threshold=3.0),
     lambda x: np.where(2 * x > 3, x, np.log1p(np.exp(2 * x)) / 2)),
    (nn.Threshold(0.3, -2.0), lambda x: np.where(x > 0.3, x, -2.0)),
    (nn.LogSigmoid(), lambda x: -np.log1p(np.exp(-x))),
    (nn.Softsign(), lambda x: x / (1 + np.abs(x))),
    (nn.Tanhshrink(), lambda x: x - np.tanh(x)),
    (nn.Softshrink(0.4), lambda x: np.where(x > 0.4, x - 0.4, np.where(x < -0.4, x + 0.4, 0))),
    (nn.Hardshrink(0.4), lambda x: np.where(np.abs(x) > 0.4, x, 0)),
    (nn.GLU(dim=1), lambda x: x[:, :3] * sigmoid(x[:, 3:])),
    (nn.RReLU().eval(), lambda x: np.where(x >= 0, x, x * (1 / 8 + 1 / 3) / 2)),
    (nn.Identity(54, unused=True), lambda x: x),
]


@pytest.mark.parametrize("k", range(len(_ACTS)), ids=[type(m).__name__ for m, _ in _ACTS])
def test_activation_modules(k, device):
    m, ref = _ACTS[k]
    x = rng(7).standard_normal((4, 6, 5)) * 4
    x[0, 0, :3] = [np.inf, -np.inf, 0.0]
    got = m(T(x, device))
    with np.errstate(all="ignore"):
        want = ref(x)
    if isinstance(m, (nn.Softmax, nn.Softmin, nn.LogSoftmax, nn.GLU)):
        got, want = got[1:], want[1:]     # softmaxes of rows with inf are NaN rows
    close(got, want)


def test_prelu_and_inplace(device):
    g = rng(8)
    x = g.standard_normal((2, 3, 5))
    p = nn.PReLU(3).to(device)
    p.weight.copy_(T([0.1, -0.5, 2.0], device))
    close(p(T(x, device)), np.where(x >= 0, x, x * np.array([0.1, -0.5, 2.0])[:, None]))
    close(nn.PReLU()(T(x, "cpu")), np.where(x >= 0, x, 0.25 * x))
    for m, ref in [(nn.ReLU(inplace=True), lambda a: np.maximum(a, 0)),
                   (nn.Hardtanh(inplace=True), lambda a: np.clip(a, -1, 1)),
                   (nn.SELU(inplace=True), lambda a: _S * np.where(a > 0, a, _A * np.expm1(a)))]:
        t = T(x, device)
        assert m(t) is t
        close(t, ref(x))


def test_dropout(device):
    x = T(rng(9).standard_normal((50, 40)) + 3, device)
    for m in (nn.Dropout(0.3), nn.Dropout1d(0.3), nn.Dropout2d(0.3), nn.AlphaDropout(0.3)):
        assert m.eval()(x) is x
    assert nn.Dropout(0.0)(x) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)
    d = nn.Dropout(0.25)          # training mode draws on every device (cpu: MT19937; else Philox)
    y = d(x).numpy()
    xs = x.numpy()
    kept = y != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(y[kept], xs[kept] / 0.75, rtol=1e-6)
    y2 = nn.Dropout2d(0.5)(T(np.ones((4, 30, 3, 3)), device)).numpy()
    per_channel = y2.reshape(4, 30, 9)
    assert np.all((per_channel == per_channel[..., :1]))   # one draw per channel
    assert set(np.unique(y2)) <= {0.0, 2.0}


def test_flatten_unflatten(device):
    x = T(rng(10).standard_normal((2, 3, 4, 5)), device)
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(0, 2)(x).shape == (24, 5)
    assert nn.Unflatten(1, (3, 1, 1))(nn.Flatten(1, 1)(x)).shape == (2, 3, 1, 1, 4, 5)


# ------------------------------------------------------------------------------ attention
def _mha_ref(m, q, k, v, kpm=None, mask=None, batch_first=False):
    s = params64(m)
    E, H = m.embed_dim, m.num_heads
    hd = E // H
    if batch_first:
        q, k, v = (a.transpose(1, 0, 2) for a in (q, k, v))
    if m._qkv_same_embed_dim:
        wq, wk, wv = np.split(s["in_proj_weight"], 3)
    else:
        wq, wk, wv = s["q_proj_weight"], s["k_proj_weight"], s["v_proj_weight"]
    bq, bk, bv = np.split(s["in_proj_bias"], 3)
    Q, K, V = q @ wq.T + bq, k @ wk.T + bk, v @ wv.T + bv        # (L, N, E)
    L, N, _ = Q.shape
    S = K.shape[0]
    Q = Q.reshape(L, N, H, hd).transpose(1, 2, 0, 3)
    K = K.reshape(S, N, H, hd).transpose(1, 2, 0, 3)
    V = V.reshape(S, N, H, hd).transpose(1, 2, 0, 3)
    sc = Q @ K.transpose(0, 1, 3, 2) / math.sqrt(hd)
    if mask is not None:
        sc = sc + (np.where(mask, -np.inf, 0) if mask.dtype == bool else mask)
    if kpm is not None:
        sc = sc + np.where(kpm, -np.inf, 0)[:, None, None, :]
    w = np.exp(sc - sc.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    o = (w @ V).transpose(2, 0, 1, 3).reshape(L, N, E) @ s["out_proj.weight"].T + s["out_proj.bias"]
    if batch_first:
        o = o.transpose(1, 0, 2)
    return o, w


def test_multihead_attention(device):
    g = rng(11)
    m = _perturb(nn.MultiheadAttention(12, 3, batch_first=True), g).to(device).eval()
    assert [k for k in m.state_dict()] == ["in_proj_weight", "in_proj_bias", "out_proj.weight",
                                           "out_proj.bias"]
    x = g.standard_normal((2, 7, 12))
    kpm = np.zeros((2, 7), bool)
    kpm[1, 4:] = True
    causal = np.triu(np.ones((7, 7), bool), 1)
    xt = T(x, device)
    out, w = m(xt, xt, xt, key_padding_mask=nbx.tensor(kpm, device=device),
               attn_mask=nbx.tensor(causal, device=device))
    ro, rw = _mha_ref(m, x, x, x, kpm, causal, batch_first=True)
    close(out, ro)
    close(w, rw.mean(1))
    out2, none = m(xt, xt, xt, key_padding_mask=nbx.tensor(kpm, device=device),
                   need_weights=False)
    assert none is None
    close(out2, _mha_ref(m, x, x, x, kpm, batch_first=True)[0])
    fmask = g.standard_normal((7, 7))
    _, w3 = m(xt, xt, xt, attn_mask=T(fmask, device), average_attn_weights=False)
    close(w3, _mha_ref(m, x, x, x, None, fmask, batch_first=True)[1])
    # kdim / vdim: separate projection weights; (L, N, E) layout; unbatched
    m2 = _perturb(nn.MultiheadAttention(8, 2, kdim=5, vdim=3), g).to(device)
    assert "q_proj_weight" in m2.state_dict() and "in_proj_weight" not in m2.state_dict()
    q, k, v = g.standard_normal((4, 2, 8)), g.standard_normal((6, 2, 5)), g.standard_normal((6, 2, 3))
    o, w = m2(T(q, device), T(k, device), T(v, device))
    ro, rw = _mha_ref(m2, q, k, v)
    close(o, ro)
    close(w, rw.mean(1))
    o1, w1 = m2(T(q[:, 0], device), T(k[:, 0], device), T(v[:, 0], device))
    close(o1, ro[:, 0])
    close(w1, rw.mean(1)[0])
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        m(xt, xt, xt, is_causal=True)
    with pytest.raises(ValueError, match="2D attn_mask"):
        m(xt, xt, xt, attn_mask=nbx.tensor(causal[:5], device=device))


def test_multihead_attention_bias_kv_and_zero_attn(device):
    g = rng(12)
    m = _perturb(nn.MultiheadAttention(6, 2, add_bias_kv=True, add_zero_attn=True), g).to(device)
    assert list(m.state_dict()) == ["in_proj_weight", "in_proj_bias", "bias_k", "bias_v",
                                    "out_proj.weight", "out_proj.bias"]
    x = g.standard_normal((5, 2, 6))
    o, w = m(T(x, device), T(x, device), T(x, device))
    s = params64(m)
    # reference: k, v get the learned row, then a zero row (after projection, per head)
    E, H, hd = 6, 2, 3
    wq, wk, wv = np.split(s["in_proj_weight"], 3)
    bq, bk, bv = np.split(s["in_proj_bias"], 3)
    Q, K, V = x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv
    K = np.concatenate([K, np.broadcast_to(s["bias_k"], (1, 2, 6)), np.zeros((1, 2, 6))])
    V = np.concatenate([V, np.broadcast_to(s["bias_v"], (1, 2, 6)), np.zeros((1, 2, 6))])
    Q = Q.reshape(5, 2, H, hd).transpose(1, 2, 0, 3)
    K = K.reshape(7, 2, H, hd).transpose(1, 2, 0, 3)
    V = V.reshape(7, 2, H, hd).transpose(1, 2, 0, 3)
    sc = Q @ K.transpose(0, 1, 3, 2) / math.sqrt(hd)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ro = (p @ V).transpose(2, 0, 1, 3).reshape(5, 2, E) @ s["out_proj.weight"].T + s["out_proj.bias"]
    close(o, ro)
    close(w, p.mean(1))


# ------------------------------------------------------------------------------ recurrent
def _rnn_ref(mode, s, x, h0, c0, layers, D, H):
    L = x.shape[0]
    hn, cn = [], []
    for layer in range(layers):
        outs = []
        for d in range(D):
            suf = f"_l{layer}" + ("_reverse" if d else "")
            wih, whh = s["weight_ih" + suf], s["weight_hh" + suf]
            bih, bhh = s.get("bias_ih" + suf, 0), s.get("bias_hh" + suf, 0)
            h, c = h0[layer * D + d], c0[layer * D + d] if c0 is not None else None
            seq = [None] * L
            for t in (range(L - 1, -1, -1) if d else range(L)):
                gi, gh = x[t] @ wih.T + bih, h @ whh.T + bhh
                if mode == "LSTM":
                    i, f, gg, o = np.split(gi + gh, 4, -1)
                    c = sigmoid(f) * c + sigmoid(i) * np.tanh(gg)
                    h = sigmoid(o) * np.tanh(c)
                elif mode == "GRU":
                    ir, iz, in_ = np.split(gi, 3, -1)
                    hr, hz, hn_ = np.split(gh, 3, -1)
                    r, z = sigmoid(ir + hr), sigmoid(iz + hz)
                    n = np.tanh(in_ + r * hn_)
                    h = (1 - z) * n + z * h
                else:
                    h = np.tanh(gi + gh)
                seq[t] = h
            outs.append(np.stack(seq))
            hn.append(h)
            cn.append(c)
        x = np.concatenate(outs, -1)
    return x, np.stack(hn), (np.stack(cn) if c0 is not None else None)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_recurrent_modules(mode, device):
    g = rng(13)
    cls = getattr(nn, mode)
    H, layers = 5, 2
    m = cls(4, H, num_layers=layers, bidirectional=True, batch_first=True).to(device)
    names = list(m.state_dict())
    assert names[:5] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                         "weight_ih_l0_reverse"]
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[mode]
    assert tuple(m.weight_ih_l1.shape) == (G * H, 2 * H)
    x = g.standard_normal((3, 6, 4))
    h0 = g.standard_normal((4, 3, H))
    c0 = g.standard_normal((4, 3, H)) if mode == "LSTM" else None
    s = params64(m)
    hx = (T(h0, device), T(c0, device)) if mode == "LSTM" else T(h0, device)
    out, state = m(T(x, device), hx)
    ro, rh, rc = _rnn_ref(mode, s, x.transpose(1, 0, 2), h0, c0, layers, 2, H)
    close(out, ro.transpose(1, 0, 2))
    if mode == "LSTM":
        close(state[0], rh)
        close(state[1], rc)
    else:
        close(state, rh)
    # zero initial state, unbatched, single layer unidirectional
    m1 = cls(4, H, bias=False).to(device)
    assert "bias_ih_l0" not in m1.state_dict()
    out1, st1 = m1(T(x[0], device))
    z = np.zeros((1, 1, H))
    r1, rh1, _ = _rnn_ref(mode, params64(m1), x[0][:, None], z, z if mode == "LSTM" else None,
                          1, 1, H)
    close(out1, r1[:, 0])
    close(st1[0] if mode == "LSTM" else st1, rh1[:, 0])
    with pytest.raises(ValueError, match="input_size"):
        m(T(g.standard_normal((3, 6, 5)), device))


def test_cells(device):
    g = rng(14)
    x, h, c = g.standard_normal((3, 4)), g.standard_normal((3, 5)), g.standard_normal((3, 5))
    cell = nn.LSTMCell(4, 5).to(device)
    s = params64(cell)
    gates = x @ s["weight_ih"].T + s["bias_ih"] + h @ s["weight_hh"].T + s["bias_hh"]
    i, f, gg, o = np.split(gates, 4, -1)
    rc = sigmoid(f) * c + sigmoid(i) * np.tanh(gg)
    h2, c2 = cell(T(x, device), (T(h, device), T(c, device)))
    close(c2, rc)
    close(h2, sigmoid(o) * np.tanh(rc))
    gru = nn.GRUCell(4, 5).to(device)
    s = params64(gru)
    ir, iz, in_ = np.split(x @ s["weight_ih"].T + s["bias_ih"], 3, -1)
    hr, hz, hn = np.split(h @ s["weight_hh"].T + s["bias_hh"], 3, -1)
    r, z = sigmoid(ir + hr), sigmoid(iz + hz)
    n = np.tanh(in_ + r * hn)
    close(gru(T(x, device), T(h, device)), (1 - z) * n + z * h)
    rnn = nn.RNNCell(4, 5, nonlinearity="relu").to(device)
    s = params64(rnn)
    close(rnn(T(x[0], device)), np.maximum(x[0] @ s["weight_ih"].T + s["bias_ih"] + s["bias_hh"], 0))


# ------------------------------------------------------------------------------ Module
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, padding_idx=0)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.GELU(approximate="tanh"),
                                                   nn.Dropout(0.1)) for _ in range(3)])
        self.extra = nn.ModuleDict({"norm": nn.LayerNorm(4, eps=1e-6),
                                    "act": nn.LeakyReLU(0.2, inplace=True)})
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.rnn = nn.LSTM(4, 3, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(4, 3, bias=False)
        self.bn = nn.BatchNorm1d(4)
        self.head = nn.Sequential(OrderedDict(flat=nn.Flatten(), fc=nn.Linear(4, 2, bias=False),
                                              out=nn.LogSoftmax(dim=-1)))
        self.params = nn.ParameterList([nn.Parameter(nbx.ones(2, 3)), nn.Parameter(nbx.zeros(4))])


# print(repr(Net())) under torch 2.13 (its dtype prints as torch.float32, ours nbxtensor.float32)
TORCH_REPR = "Net(\n  (emb): Embedding(10, 4, padding_idx=0)\n  (blocks): ModuleList(\n    (0-2): 3 x Sequential(\n      (0): Linear(in_features=4, out_features=4, bias=True)\n      (1): GELU(approximate='tanh')\n      (2): Dropout(p=0.1, inplace=False)\n    )\n  )\n  (extra): ModuleDict(\n    (norm): LayerNorm((4,), eps=1e-06, elementwise_affine=True, bias=True)\n    (act): LeakyReLU(negative_slope=0.2, inplace=True)\n  )\n  (attn): MultiheadAttention(\n    (out_proj): NonDynamicallyQuantizableLinear(in_features=4, out_features=4, bias=True)\n  )\n  (rnn): LSTM(4, 3, num_layers=2, batch_first=True, bidirectional=True)\n  (gru): GRU(4, 3, bias=False)\n  (bn): BatchNorm1d(4, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)\n  (head): Sequential(\n    (flat): Flatten(start_dim=1, end_dim=-1)\n    (fc): Linear(in_features=4, out_features=2, bias=False)\n    (out): LogSoftmax(dim=-1)\n  )\n  (params): ParameterList(\n      (0): Parameter containing: [torch.float32 of size 2x3]\n      (1): Parameter containing: [torch.float32 of size 4]\n  )\n)"  # noqa: E501

# torch 2.13's repr of single modules
TORCH_REPRS = {
    "Hardswish()": nn.Hardswish(), "Softshrink(0.5)": nn.Softshrink(),
    "RReLU(lower=0.125, upper=0.3333333333333333)": nn.RReLU(),
    "PReLU(num_parameters=1)": nn.PReLU(), "Threshold(threshold=0.1, value=2.0)":
    nn.Threshold(0.1, 2.0), "Softplus(beta=1.0, threshold=20.0)": nn.Softplus(),
    "CELU(alpha=1.0)": nn.CELU(), "ReLU6()": nn.ReLU6(),
    "Hardtanh(min_val=-1.0, max_val=1.0)": nn.Hardtanh(), "Identity()": nn.Identity(),
    "Unflatten(dim=1, unflattened_size=(2, 3))": nn.Unflatten(1, (2, 3)),
    "EmbeddingBag(10, 3, mode='mean')": nn.EmbeddingBag(10, 3),
    "InstanceNorm1d(3, eps=1e-05, momentum=0.1, affine=False, bias=False, "
    "track_running_stats=False)": nn.InstanceNorm1d(3),
    "GroupNorm(2, 4, eps=1e-05, affine=True, bias=True)": nn.GroupNorm(2, 4),
    "RMSNorm((4,), eps=None, elementwise_affine=True)": nn.RMSNorm(4),
    "Bilinear(in1_features=2, in2_features=3, out_features=4, bias=True)": nn.Bilinear(2, 3, 4),
    "RNN(3, 4)": nn.RNN(3, 4, nonlinearity="relu"),
    "RNNCell(3, 4, nonlinearity=relu)": nn.RNNCell(3, 4, nonlinearity="relu"),
    "LSTMCell(3, 4)": nn.LSTMCell(3, 4), "ReLU(inplace=True)": nn.ReLU(inplace=True),
    "AlphaDropout(p=0.2, inplace=False)": nn.AlphaDropout(0.2), "Softmax(dim=-1)": nn.Softmax(-1),
    "ParameterList(  (0): Parameter containing: [torch.float32 of size 2x3])":
    nn.ParameterList([nn.Parameter(nbx.ones(2, 3))]),
}


def test_repr_is_torchs():
    assert repr(Net()) == TORCH_REPR.replace("torch.float32", "nbxtensor.float32")
    for want, m in TORCH_REPRS.items():
        assert repr(m) == want.replace("torch.float32", "nbxtensor.float32")


def test_registration_and_traversal():
    net = Net()
    names = [n for n, _ in net.named_modules()]
    assert names[:6] == ["", "emb", "blocks", "blocks.0", "blocks.0.0", "blocks.0.1"]
    assert [n for n, _ in net.named_children()][:3] == ["emb", "blocks", "extra"]
    pn = [n for n, _ in net.named_parameters()]
    assert pn[:3] == ["emb.weight", "blocks.0.0.weight", "blocks.0.0.bias"]
    assert "params.1" in pn and len(list(net.parameters())) == len(pn)
    assert [n for n, _ in net.bn.named_buffers(prefix="bn")] == [
        "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert [n for n, _ in net.named_parameters(recurse=False)] == []
    assert net.get_submodule("blocks.1.0") is net.blocks[1][0]
    assert net.get_parameter("extra.norm.weight") is net.extra["norm"].weight
    with pytest.raises(AttributeError, match="has no attribute `nope`"):
        net.get_submodule("blocks.nope")
    with pytest.raises(AttributeError, match="object has no attribute 'missing'"):
        net.missing  # noqa: B018
    m = nn.Module()
    m.register_buffer("a", nbx.ones(2))
    m.register_buffer("b", nbx.ones(2), persistent=False)
    m.c = nn.Buffer(nbx.zeros(1), persistent=False)
    m.w = nn.Parameter(nbx.zeros(3))
    m.add_module("sub", nn.Linear(2, 2))
    assert list(m.state_dict()) == ["w", "a", "sub.weight", "sub.bias"]
    assert [n for n, _ in m.named_buffers()] == ["a", "b", "c"]
    with pytest.raises(TypeError, match="parameter 'w'"):
        m.w = nbx.zeros(3)
    with pytest.raises(KeyError, match="contain"):
        m.register_buffer("x.y", nbx.ones(1))
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("sub", nbx.ones(1))
    m.w = None
    assert m.w is None and "w" not in m.state_dict()
    del m.sub
    assert not hasattr(m, "sub")
    # a shared (tied) parameter is listed once unless asked for duplicates
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    s = nn.Sequential(a, b)
    assert len(list(s.parameters())) == 3
    assert len(list(s.named_parameters(remove_duplicate=False))) == 4
    assert list(s.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_containers():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert isinstance(seq[0], nn.Linear) and isinstance(seq[-1], nn.Linear)
    sub = seq[1:]
    assert isinstance(sub, nn.Sequential) and len(sub) == 2 and list(sub._modules) == ["1", "2"]
    seq.append(nn.Sigmoid())
    assert len(seq) == 4 and isinstance(seq[3], nn.Sigmoid)
    del seq[1]
    assert list(seq._modules) == ["0", "1", "2"] and isinstance(seq[1], nn.Linear)
    seq[2] = nn.Tanh()
    assert isinstance(seq[2], nn.Tanh)
    with pytest.raises(IndexError):
        seq[5]  # noqa: B018
    x = nbx.tensor(rng(15).standard_normal((4, 2)).astype(np.float32))
    w = params64(seq)
    close(seq(x), np.tanh(np.maximum(x.numpy() @ w["0.weight"].T + w["0.bias"], 0)
                          @ w["1.weight"].T + w["1.bias"]) if False else
          np.tanh((x.numpy() @ w["0.weight"].T + w["0.bias"]) @ w["1.weight"].T + w["1.bias"]))
    ml = nn.ModuleList([nn.ReLU()])
    ml.append(nn.Tanh())
    ml.extend([nn.GELU()])
    ml.insert(0, nn.SiLU())
    assert [type(m).__name__ for m in ml] == ["SiLU", "ReLU", "Tanh", "GELU"]
    assert len(ml[1:]) == 3
    md = nn.ModuleDict({"a": nn.ReLU()})
    md["b"] = nn.Tanh()
    assert list(md.keys()) == ["a", "b"] and "b" in md and len(md) == 2
    pl = nn.ParameterList([nbx.ones(2), nn.Parameter(nbx.zeros(3))])
    assert all(isinstance(p, nn.Parameter) for p in pl) and len(pl) == 2
    pd = nn.ParameterDict({"x": nbx.ones(2)})
    pd["y"] = nbx.zeros(1)
    assert list(pd.keys()) == ["x", "y"] and isinstance(pd["y"], nn.Parameter)
    holder = nn.Module()
    holder.pl, holder.pd = pl, pd
    assert list(holder.state_dict()) == ["pl.0", "pl.1", "pd.x", "pd.y"]


def test_state_dict_round_trip_and_errors(device):
    src = _perturb(Net(), rng(16)).to(device)
    sd = src.state_dict()
    assert all(type(v) is nbx.Tensor for v in sd.values())
    assert src.state_dict(keep_vars=True)["emb.weight"] is src.emb.weight
    assert "bn.num_batches_tracked" in sd and sd["bn.num_batches_tracked"].dtype == nbx.int64
    dst = Net()
    r = dst.load_state_dict(sd)
    assert repr(r) == "<All keys matched successfully>"
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), sd[k].numpy())
        assert v.device == nbx.device("cpu")     # copied into the model's own tensors
    # strict: missing and unexpected keys, torch's message
    bad = dict(sd)
    del bad["emb.weight"], bad["head.fc.weight"]
    bad["head.extra"] = sd["bn.running_mean"]
    bad["blocks.7.0.weight"] = sd["bn.running_mean"]
    with pytest.raises(RuntimeError) as ei:
        Net().load_state_dict(bad)
    assert str(ei.value) == (
        'Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: "emb.weight", '
        '"head.fc.weight". \n\tUnexpected key(s) in state_dict: "blocks.7.0.weight", '
        '"head.extra". ')
    r = Net().load_state_dict(bad, strict=False)
    assert r.missing_keys == ["emb.weight", "head.fc.weight"]
    assert sorted(r.unexpected_keys) == ["blocks.7.0.weight", "head.extra"]
    # a shape mismatch is an error in both modes
    bad = dict(sd)
    bad["bn.weight"] = nbx.zeros(5)
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=r"size mismatch for bn.weight: copying a param "
                           r"with shape torch.Size\(\[5\]\) from checkpoint, the shape in "
                           r"current model is torch.Size\(\[4\]\)."):
            Net().load_state_dict(bad, strict=strict)
    with pytest.raises(TypeError, match="dict-like"):
        Net().load_state_dict([("a", 1)])
    # assign=True takes the checkpoint's tensors themselves
    lin = nn.Linear(2, 2)
    w = nbx.ones(2, 2, dtype=nbx.float64)
    lin.load_state_dict({"weight": w, "bias": nbx.zeros(2, dtype=nbx.float64)}, assign=True)
    assert lin.weight.dtype == nbx.float64 and lin.weight.data_ptr() == w.data_ptr()
    assert isinstance(lin.weight, nn.Parameter)
    # without assign the model's dtype wins (torch's copy_)
    lin2 = nn.Linear(2, 2)
    lin2.load_state_dict({"weight": w, "bias": nbx.zeros(2, dtype=nbx.float64)})
    assert lin2.weight.dtype == nbx.float32 and lin2.weight.sum().item() == 4.0


def test_batchnorm_state_dict_without_counter():
    bn = nn.BatchNorm1d(3)
    sd = {k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"}
    assert nn.BatchNorm1d(3).load_state_dict(sd).missing_keys == []


def test_load_sharded(tmp_path):
    import json
    from nbxtensor.io import save_file
    net = _perturb(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)), rng(17))
    sd = {k: v.contiguous() for k, v in net.state_dict().items()}
    keys = list(sd)
    save_file({k: sd[k] for k in keys[:2]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: sd[k] for k in keys[2:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    wm = {k: f"model-0000{1 if i < 2 else 2}-of-00002.safetensors" for i, k in enumerate(keys)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    loaded = nbx.io.load_sharded(tmp_path)
    fresh = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    fresh.load_state_dict(loaded)
    for k in keys:
        np.testing.assert_array_equal(fresh.state_dict()[k].numpy(), sd[k].numpy())
    wm[keys[0]] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(KeyError, match="lacks"):
        nbx.io.load_sharded(tmp_path)


def test_hooks(device):
    m = nn.Linear(3, 2).to(device)
    calls = []
    h1 = m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    h2 = m.register_forward_hook(lambda mod, args, out: calls.append(out.shape) or out + 1)
    x = T(rng(18).standard_normal((4, 3)), device)
    w = params64(m)
    close(m(x), (x.numpy() * 2) @ w["weight"].T + w["bias"] + 1)
    assert calls == [(4, 2)]
    h1.remove()
    h2.remove()
    close(m(x), x.numpy() @ w["weight"].T + w["bias"])
    assert len(calls) == 1
    order = []
    m.register_forward_hook(lambda *a: order.append("b"))
    m.register_forward_hook(lambda *a: order.append("a"), prepend=True)
    m.register_forward_hook(lambda mod, args, kwargs, out: order.append(sorted(kwargs)),
                            with_kwargs=True)
    m(input=x)
    assert order == ["a", "b", ["input"]]


def test_modes_apply_and_conversions(device):
    net = Net()
    assert net.training and net.blocks[0][2].training
    assert net.eval() is net and not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(ValueError, match="boolean"):
        net.train("no")
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen[0] == "Embedding"
    assert net.requires_grad_(False) is net
    with pytest.raises(RuntimeError, match="no autograd"):
        net.requires_grad_()
    net.zero_grad()
    w = net.emb.weight
    net.to(device, nbx.float16)
    assert net.emb.weight is w                                 # the same Parameter object
    assert w.dtype == nbx.float16 and w.device == nbx.device(device)
    assert net.bn.num_batches_tracked.dtype == nbx.int64       # only floats change dtype
    assert net.bn.running_mean.dtype == nbx.float16
    net.float()
    assert all(p.dtype == nbx.float32 for p in net.parameters())
    net.double().cpu()
    assert all(p.dtype == nbx.float64 and p.device == nbx.device("cpu")
               for p in net.parameters())
    net.bfloat16()
    assert net.head.fc.weight.dtype == nbx.bfloat16
    net.to(dtype=nbx.float32)
    assert net.head.fc.weight.dtype == nbx.float32
    with pytest.raises(TypeError, match="floating point"):
        net.to(nbx.int32)
    # a model in float64 computes in float64
    lin = nn.Linear(5, 3).double().to(device)
    x = rng(19).standard_normal((2, 5))
    y = lin(T(x, device, nbx.float64))
    assert y.dtype == nbx.float64
    w = params64(lin)
    assert_close(y, x @ w["weight"].T + w["bias"], dtype=nbx.float64)
    # tied weights stay tied through .to
    a = nn.Sequential(nn.Embedding(4, 3), nn.Linear(3, 4, bias=False))
    a[1].weight = a[0].weight
    a.half()
    assert a[1].weight is a[0].weight and a[0].weight.dtype == nbx.float16


def test_init_functions():
    from nbxtensor.nn import init
    t = nbx.empty(300, 200)
    init.xavier_uniform_(t)
    bound = math.sqrt(6 / 500)
    a = t.numpy()
    assert a.min() >= -bound and a.max() <= bound and a.std() > bound / 2
    init.kaiming_normal_(t, nonlinearity="relu")
    assert abs(t.numpy().std() - math.sqrt(2 / 200)) < 0.01
    init.constant_(t, 0.5)
    assert np.all(t.numpy() == 0.5)
    init.zeros_(t)
    init.eye_(t)
    assert t.numpy().trace() == 200
    assert init.calculate_gain("tanh") == 5 / 3
    with pytest.raises(ValueError, match="fewer than 2"):
        init.xavier_uniform_(nbx.empty(3))


def test_forward_required_and_call():
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        nn.Module()()

    class Two(nn.Module):
        def forward(self, a, b=1):
            return a + b

    assert Two()(1, b=2) == 3


@pytest.mark.parametrize("dtype", [nbx.float32, nbx.bfloat16, nbx.float64])
def test_lstm_scan_tiles_lengths_and_directions(dtype, device, monkeypatch):
    """nn.LSTM's one-launch recurrence (kernels/rnn.py on cuda/interp; float64 through the
    per-step ops, to the last bits) against float64:
    hidden 40 over 16-row, 32-column tiles (a tail of each), two layers both ways, a packed
    batch of lengths 6/3/1 (the reverse direction starts at each sequence's end), outputs of
    the finished steps 0."""
    from nbxtensor.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    if device != "cpu":
        import nbxtensor.kernels.rnn as kr
        monkeypatch.setattr(kr, "_OVERRIDE", dict(BLOCK_R=16, BLOCK_K=32))
    g = rng(31)
    H, lens = 40, [6, 3, 1]
    m = nn.LSTM(6, H, num_layers=2, bidirectional=True, batch_first=True).to(device)
    s = params64(m)
    m = m.to(dtype)
    s = {k: v.astype(dtype.np).astype(np.float64) for k, v in s.items()}
    x = g.standard_normal((3, 6, 6))
    xq = x.astype(dtype.np).astype(np.float64)
    tol = {nbx.float32: dict(rtol=3e-5, atol=3e-5), nbx.bfloat16: dict(rtol=0.03, atol=0.03),
           nbx.float64: dict(rtol=1e-12, atol=1e-12)}[dtype]   # float64: never through fp32
    out, (hn, cn) = m(T(x, device, dtype))
    z = np.zeros((4, 3, H))
    ro, rh, rc = _rnn_ref("LSTM", s, xq.transpose(1, 0, 2), z, z, 2, 2, H)
    np.testing.assert_allclose(out.double().numpy(), ro.transpose(1, 0, 2), **tol)
    np.testing.assert_allclose(hn.double().numpy(), rh, **tol)
    np.testing.assert_allclose(cn.double().numpy(), rc, **tol)
    packed = pack_padded_sequence(T(x, device, dtype), nbx.tensor(lens), batch_first=True)
    po, (ph, pc) = m(packed)
    po, _ = pad_packed_sequence(po, batch_first=True)
    for b, n in enumerate(lens):            # each sequence as if it ran alone
        r1, rh1, rc1 = _rnn_ref("LSTM", s, xq[b, :n][:, None], z[:, :1], z[:, :1], 2, 2, H)
        np.testing.assert_allclose(po.double().numpy()[b, :n], r1[:, 0], **tol)
        assert not po.double().numpy()[b, n:].any()
        np.testing.assert_allclose(ph.double().numpy()[:, b], rh1[:, 0], **tol)
        np.testing.assert_allclose(pc.double().numpy()[:, b], rc1[:, 0], **tol)


@pytest.mark.parametrize("N", [1, 2, 45])
def test_lstm_scan_split_across_programs(N, device):
    """cuda: hidden 256 split over 16-, 32- or 64-row programs of a sequence that meet at a
    barrier each step (N = 1, 2), and one program a sequence when N * G would not fit the
    SMs (N = 45); two calls in a row (the barrier's counters reset), against float64."""
    if device != "cuda":
        pytest.skip("the split recurrence runs on cuda only (interp runs programs in turn)")
    import nbxtensor.kernels.rnn as kr
    H = 256
    sms = kr.device_facts(nbx.device("cuda")).sms
    block_r, G = kr._split("cuda", sms, N, H)
    assert (G > 1) == (N * 16 <= sms)
    g = rng(37 + N)
    m = nn.LSTM(24, H, bidirectional=True).to(device)
    s = params64(m)
    for rep in range(2):
        x = g.standard_normal((33, N, 24))
        h0, c0 = g.standard_normal((2, 2, N, H)) * 0.5
        out, (hn, cn) = m(T(x, device), (T(h0, device), T(c0, device)))
        ro, rh, rc = _rnn_ref("LSTM", s, x, h0, c0, 1, 2, H)
        np.testing.assert_allclose(out.double().numpy(), ro, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(hn.double().numpy(), rh, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(cn.double().numpy(), rc, rtol=1e-4, atol=1e-4)
