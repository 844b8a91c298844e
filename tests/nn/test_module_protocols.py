"""Module's shared machinery: the shorthand casts, registering parameters and buffers (with
torch's refusals), forward hooks and their flags, named_parameters/named_buffers, and the
key side of ModuleDict and ParameterDict."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor import nn

from helpers import rng


def _net():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2, bias=False))
    net[2].weight = nn.Parameter(nbx.tensor(rng().standard_normal((2, 4)).astype(np.float32)))
    return net


@pytest.mark.parametrize("name,dtype", [("float", nbx.float32), ("double", nbx.float64),
                                        ("half", nbx.float16), ("bfloat16", nbx.bfloat16)])
def test_module_cast_shorthand_casts_only_floats(name, dtype):
    net = _net().double() if dtype is not nbx.float64 else _net()
    before = {k: v.numpy().astype(np.float64) for k, v in net.state_dict().items()}
    w = net[0].weight
    assert getattr(net, name)() is net
    assert net[0].weight is w                                   # the same Parameter object
    for k, v in net.state_dict().items():
        if k.endswith("num_batches_tracked"):
            assert v.dtype == nbx.int64                         # integers keep their dtype
            continue
        assert v.dtype == dtype, k
        np.testing.assert_array_equal(v.numpy(), before[k].astype(dtype.np))
    assert getattr(nn.Module, name).__name__ == name


def test_register_parameter_and_buffer_refusals():
    class Early(nn.Module):
        def __init__(self):
            self.register_buffer("b", nbx.zeros(1))

    with pytest.raises(AttributeError, match="cannot assign buffer before Module.__init__"):
        Early()

    class EarlyP(nn.Module):
        def __init__(self):
            self.register_parameter("p", None)

    with pytest.raises(AttributeError, match="cannot assign parameter before Module.__init__"):
        EarlyP()
    m = nn.Module()
    with pytest.raises(TypeError, match=r"cannot assign 'Tensor' object to parameter "
                                        r"'w' \(torch.nn.Parameter or None required\)"):
        m.register_parameter("w", nbx.zeros(2))
    with pytest.raises(TypeError, match=r"cannot assign 'int' object to buffer 'b' "
                                        r"\(torch Tensor or None required\)"):
        m.register_buffer("b", 3)
    with pytest.raises(KeyError, match="buffer name can"):
        m.register_buffer("a.b", nbx.zeros(1))
    m.x = 1
    with pytest.raises(KeyError, match="attribute 'x' already exists"):
        m.register_parameter("x", None)
    assert not m._parameters and not m._buffers


def test_register_buffer_persistence_and_plain_tensors():
    m = nn.Module()
    m.register_buffer("a", nbx.ones(2), persistent=False)
    m.register_buffer("b", nn.Buffer(nbx.zeros(3)))
    m.register_parameter("p", nn.Parameter(nbx.ones(1)))
    m.register_buffer("none", None)
    assert type(m.b) is nbx.Tensor                              # a Buffer registers as a Tensor
    assert list(m.state_dict()) == ["p", "b"]
    m.register_buffer("a", nbx.ones(2))                          # re-registered: persistent now
    assert list(m.state_dict()) == ["p", "a", "b"]
    assert [k for k, _ in m.named_buffers()] == ["a", "b"]      # None is not listed


def test_forward_hook_flags_and_removal():
    m = nn.Identity()
    seen = []
    h_pre = m.register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] + 1,), kwargs),
                                        with_kwargs=True)
    m.register_forward_pre_hook(lambda mod, args: seen.append("pre-first"), prepend=True)
    h_always = m.register_forward_hook(lambda mod, args, out: seen.append(("always", out)),
                                       always_call=True)
    m.register_forward_hook(lambda mod, args, kwargs, out: seen.append(sorted(kwargs)) or out * 2,
                            with_kwargs=True, prepend=True)
    y = m(nbx.tensor([1.0]))
    assert y.tolist() == [4.0] and seen[0] == "pre-first" and seen[1] == []
    assert seen[2][0] == "always" and seen[2][1].tolist() == [4.0]
    assert h_pre.id in m._forward_pre_hooks_with_kwargs
    assert h_always.id in m._forward_hooks_always_called
    h_pre.remove()
    h_always.remove()
    assert h_pre.id not in m._forward_pre_hooks_with_kwargs
    assert h_always.id not in m._forward_hooks_always_called

    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    b = Boom()
    calls = []
    b.register_forward_hook(lambda mod, args, out: calls.append(out), always_call=True)
    b.register_forward_hook(lambda mod, args, out: calls.append("not always"))
    with pytest.raises(ValueError, match="boom"):
        b(nbx.zeros(1))
    assert calls == [None]                                      # only the always_call hook ran


def test_named_parameters_and_buffers():
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Linear(2, 2))
    net[2].weight = net[0].weight                               # tied
    assert [k for k, _ in net.named_parameters()] == ["0.weight", "0.bias", "1.weight",
                                                      "1.bias", "2.bias"]
    assert [k for k, _ in net.named_parameters(remove_duplicate=False)] == [
        "0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]
    assert [k for k, _ in net[0].named_parameters(prefix="lin")] == ["lin.weight", "lin.bias"]
    assert list(net.named_parameters(recurse=False)) == []
    assert [k for k, _ in net.named_buffers(prefix="m")] == [
        "m.1.running_mean", "m.1.running_var", "m.1.num_batches_tracked"]
    assert [b is net[1].running_var for b in net.buffers()] == [False, True, False]
    assert [p is net[0].weight for p in net.parameters()] == [True, False, False, False, False]
    assert list(net[1].buffers(recurse=False))[0] is net[1].running_mean


@pytest.mark.parametrize("kind", ["ModuleDict", "ParameterDict"])
def test_dict_containers_key_side(kind):
    make = (lambda: nn.ReLU()) if kind == "ModuleDict" else (lambda: nbx.ones(2))
    d = getattr(nn, kind)({"b": make(), "a": make()})
    d["c"] = make()
    assert len(d) == 3 and list(d) == ["b", "a", "c"] and list(d.keys()) == ["b", "a", "c"]
    assert "a" in d and "z" not in d
    v = d["a"]
    assert d.pop("a") is v
    assert list(d) == ["b", "c"] and "a" not in d and len(d) == 2
    assert not hasattr(d, "a")
    # torch's errors for a missing key: ModuleDict's dict lookup, ParameterDict's getattr
    with pytest.raises(KeyError if kind == "ModuleDict" else AttributeError):
        d.pop("a")
    assert list(d) == ["b", "c"]
    d.clear()
    assert len(d) == 0 and list(d.keys()) == []


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_thin_layer_classes_state_their_dims(nd):
    k = (3, 2, 2)[:nd]
    conv = getattr(nn, f"Conv{nd}d")(4, 6, k, groups=2)
    convt = getattr(nn, f"ConvTranspose{nd}d")(4, 6, k, groups=2)
    assert conv.weight.shape == (6, 2) + k and convt.weight.shape == (4, 3) + k
    assert conv.stride == (1,) * nd and convt.output_padding == (0,) * nd

    class MyConv(getattr(nn, f"Conv{nd}d")):                # a user's subclass keeps the dims
        pass

    assert MyConv(2, 2, 1).kernel_size == (1,) * nd
    x = rng().standard_normal((2, 3) + (4,) * nd).astype(np.float32)
    bn = getattr(nn, f"BatchNorm{nd}d")(3).eval()
    y = bn(nbx.tensor(x)).numpy().astype(np.float64)
    np.testing.assert_allclose(y, x / np.sqrt(1 + 1e-5), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="expected"):
        bn(nbx.zeros(*(2, 3) + (4,) * nd + (1, 1)))
    inorm = getattr(nn, f"InstanceNorm{nd}d")(3)
    assert inorm(nbx.tensor(x)).shape == x.shape and inorm(nbx.tensor(x[0])).shape == x[0].shape
    with pytest.raises(ValueError, match=f"expected {nd + 1}D or {nd + 2}D input"):
        inorm(nbx.zeros(*(2, 3) + (4,) * nd + (1,)))


@pytest.mark.parametrize("kind", ["Embedding", "EmbeddingBag"])
def test_embedding_tables(kind):
    cls = getattr(nn, kind)
    e = cls(5, 3, padding_idx=-1, max_norm=2.0, scale_grad_by_freq=True, sparse=True)
    assert (e.num_embeddings, e.embedding_dim, e.padding_idx) == (5, 3, 4)
    assert (e.max_norm, e.norm_type, e.scale_grad_by_freq, e.sparse) == (2.0, 2.0, True, True)
    assert e.weight.shape == (5, 3) and not e.weight[4].numpy().any()   # padding row zeroed
    assert [k for k, _ in e.named_parameters()] == ["weight"]
    with pytest.raises(ValueError, match="padding_idx must be within num_embeddings"):
        cls(5, 3, padding_idx=5)
    w = rng().standard_normal((4, 2)).astype(np.float32)
    p = cls.from_pretrained(nbx.tensor(w), padding_idx=1)
    assert (p.num_embeddings, p.embedding_dim, p.padding_idx) == (4, 2, 1)
    np.testing.assert_array_equal(p.weight.numpy(), w)                 # given weights kept
    with pytest.raises(ValueError, match="embeddings must be 2-D"):
        cls.from_pretrained(nbx.zeros(4))
    with pytest.raises(ValueError, match="_weight: shape must be"):
        cls(4, 3, _weight=nbx.zeros(4, 2))
