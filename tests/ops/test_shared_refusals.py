"""The refusals that several ops share one check for: each op still refuses with its own
name, the argument and what it got (the error type and the message a caller reads)."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx

F = nbx.nn.functional


def _t(*shape, dtype=np.float32, seed=0):
    return nbx.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


# ------------------------------------------------------------------ random / sampling
@pytest.mark.parametrize("dtype", [nbx.int8, nbx.int32, nbx.float16])
def test_random_full_range_needs_a_wide_dtype(dtype):
    with pytest.raises(TypeError, match=rf"random_: the full 64-bit range needs int64, float64, "
                                        rf"float32 or bfloat16, got {dtype.name}"):
        nbx.zeros(4, dtype=dtype).random_(-(1 << 63), None)


@pytest.mark.parametrize("lo, hi, what", [(5, 5, "less than"), (0, 300, "out of bounds")])
def test_random_range_refusals(lo, hi, what):
    with pytest.raises(ValueError, match=what):
        nbx.zeros(4, dtype=nbx.uint8).random_(lo, hi)


def test_random_range_draws_inside_it():
    lo, hi = int(np.random.default_rng().integers(-100, 0)), int(np.random.default_rng().integers(1, 100))
    v = nbx.zeros(1000, dtype=nbx.int64).random_(lo, hi).numpy()
    assert v.min() >= lo and v.max() < hi


@pytest.mark.parametrize("method, kwargs, shown", [
    ("cauchy_", {"sigma": 0.0}, "sigma"), ("log_normal_", {"std": -1.0}, "std"),
    ("exponential_", {"lambd": 0.0}, "lambda")])
def test_scale_must_be_positive(method, kwargs, shown):
    with pytest.raises(ValueError, match=rf"{method}: expects {shown} > 0\.0, but found {shown}="):
        getattr(nbx.zeros(3), method)(**kwargs)


@pytest.mark.parametrize("call, argname", [
    (lambda x: nbx.multinomial(x, 1), "input"), (lambda x: nbx.poisson(x), "input"),
    (lambda x: nbx.sample(x), "logits"), (lambda x: x.cauchy_(), "self")])
@pytest.mark.parametrize("dtype", [nbx.int32, nbx.float8_e4m3fn])
def test_draws_refuse_non_float_dtypes(call, argname, dtype):
    x = nbx.zeros(2, 5, dtype=dtype)
    with pytest.raises(TypeError, match=rf"{argname} must be float16/bfloat16/float32/float64, "
                                        rf"got {dtype.name}"):
        call(x)


# ------------------------------------------------------------------ decode attention
def test_decode_attention_lengths_and_out():
    q, k, v = _t(2, 4, 1, 8), _t(2, 2, 16, 8, seed=1), _t(2, 2, 16, 8, seed=2)
    bad = nbx.from_numpy(np.array([3.0, 4.0], np.float32))
    with pytest.raises(TypeError, match=r"decode_attention: lengths must be an int32/int64 tensor "
                                        r"of shape \(\) or \(2,\), got float32 \(2,\)"):
        nbx.decode_attention(q, k, v, bad)
    lengths = nbx.from_numpy(np.array([3, 16], np.int32))
    with pytest.raises(ValueError, match=r"decode_attention: out must be float32 \(2, 4, 1, 8\) on "
                                         r"cpu, got float32 \(2, 4, 1, 7\) on cpu"):
        nbx.decode_attention(q, k, v, lengths, out=nbx.zeros(2, 4, 1, 7))
    out = nbx.full((2, 4, 1, 8), float("nan"))
    assert nbx.decode_attention(q, k, v, lengths, out=out) is out
    assert np.isfinite(out.numpy()).all()


def test_kv_cache_appends_check_their_operands():
    for cache, op in ((nbx.KVCache(1, 2, 2, 8, 4), "KVCache.append"),
                      (nbx.PagedKVCache(4, 16, 1, 2, 4), "PagedKVCache.append")):
        if isinstance(cache, nbx.PagedKVCache):
            cache.allocate([8, 8])
        k, v = nbx.zeros(2, 2, 3, 4), nbx.zeros(2, 2, 2, 4)
        pos = nbx.from_numpy(np.arange(3, dtype=np.int64))
        with pytest.raises(ValueError, match=rf"{op}: k has 3 tokens but v has 2"):
            cache.append(0, k, v, pos)
        with pytest.raises(ValueError, match=rf"{op}: v must have shape \(2, 2, T, 4\), got "
                                             rf"\(2, 2, 3, 5\)"):
            cache.append(0, k, nbx.zeros(2, 2, 3, 5), pos)


# ------------------------------------------------------------------ families' shared checks
def test_float_and_like_input_checks():
    x = _t(1, 2, 5, 5)
    with pytest.raises(TypeError, match=r"conv2d: input must have a float16, bfloat16, float32 or "
                                        r"float64 dtype, got int32"):
        nbx.conv2d(nbx.zeros(1, 2, 5, 5, dtype=nbx.int32), _t(3, 2, 3, 3))
    with pytest.raises(TypeError, match=r"conv2d: input \(float32\) and bias \(float64\) must have "
                                        r"the same dtype"):
        nbx.conv2d(x, _t(3, 2, 3, 3), _t(3, dtype=np.float64))
    with pytest.raises(ValueError, match=r"conv_transpose2d: groups=2 must divide in_channels = "
                                         r"weight.shape\[0\] = 3"):
        nbx.conv_transpose2d(_t(1, 3, 5, 5), _t(3, 2, 3, 3), groups=2)
    with pytest.raises(TypeError, match=r"grid_sample: input \(float32\) and grid \(float64\) must "
                                        r"have the same dtype"):
        F.grid_sample(x, _t(1, 4, 4, 2, dtype=np.float64), align_corners=False)
    with pytest.raises(TypeError, match=r"binary_cross_entropy: input must have a float16, "
                                        r"bfloat16, float32 or float64 dtype, got int64"):
        F.binary_cross_entropy(nbx.zeros(3, dtype=nbx.int64), nbx.zeros(3))
    with pytest.raises(ValueError, match=r"binary_cross_entropy_with_logits: target must have "
                                         r"input's shape \(3,\), got \(4,\)"):
        F.binary_cross_entropy_with_logits(_t(3), nbx.zeros(4))


def test_shape_refusals():
    with pytest.raises(ValueError, match=r"unfold: expected a 3-D \(unbatched\) or 4-D input, got "
                                         r"shape \(5, 5\)"):
        F.unfold(_t(5, 5), 2)
    with pytest.raises(ValueError, match=r"fold: expected a 2-D \(unbatched\) or 3-D input, got "
                                         r"shape \(1, 4, 9, 1\)"):
        F.fold(_t(1, 4, 9, 1), (4, 4), 2)
    with pytest.raises(ValueError, match=r"pixel_unshuffle: downscale_factor must be a positive "
                                         r"int, got 0"):
        nbx.pixel_unshuffle(_t(1, 4, 4, 4), 0)
    with pytest.raises(ValueError, match=r"pixel_shuffle: expected an input of at least 3 dims"):
        nbx.pixel_shuffle(_t(4, 4), 2)
    with pytest.raises(ValueError, match=r"stft: expected a 1-D \(L\) or 2-D \(B, L\) input, got "
                                         r"shape \(1, 2, 64\)"):
        nbx.stft(_t(1, 2, 64), 16, return_complex=True)
    spec = nbx.stft(_t(64), 16, return_complex=True)
    with pytest.raises(ValueError, match=r"istft: expected a \(n_freq, n_frames\) or \(B, n_freq, "
                                         r"n_frames\) input, got shape \(9,\)"):
        nbx.istft(spec[:, 0], 16)


def test_gather_and_scatter_index_rules():
    x, idx = _t(3, 4), nbx.from_numpy(np.zeros((3, 5), np.int64))
    for op, call in (("gather", lambda: nbx.gather(x, 0, idx)),
                     ("scatter", lambda: nbx.scatter(x, 0, idx, _t(3, 5)))):
        with pytest.raises(ValueError, match=rf"{op}: index.size\(1\) = 5 exceeds input.size\(1\) "
                                             rf"= 4 \(shapes \(3, 5\), \(3, 4\)\)"):
            call()
    with pytest.raises(TypeError, match=r"scatter: src must have input's dtype float32, got "
                                        r"float64"):
        nbx.scatter(x, 0, nbx.from_numpy(np.zeros((3, 4), np.int64)), _t(3, 4, dtype=np.float64))


def test_moe_inputs_are_per_token():
    with pytest.raises(ValueError, match=r"moe_topk: gating_output must be 2-D \(tokens, experts\), "
                                         r"got shape \(8,\)"):
        F.moe_topk(_t(8), 2)
    with pytest.raises(ValueError, match=r"fused_moe: hidden_states must be 2-D \(tokens, hidden\), "
                                         r"got shape \(1, 2, 4\)"):
        F.fused_moe(_t(1, 2, 4), _t(2, 6, 4), _t(2, 4, 3), _t(2, 2), 1)


@pytest.mark.parametrize("call, text", [
    (lambda: nbx.linalg.inv(nbx.zeros(2, 2)), r"linalg.inv: The diagonal element 1 is zero"),
    (lambda: nbx.linalg.cholesky(-nbx.eye(2)), r"linalg.cholesky: The factorization could not "
                                               r"be completed .* minor of order 1 is not"),
    (lambda: nbx.linalg.lu_factor(nbx.zeros(2, 2)), r"torch.linalg.lu_factor: U\[1,1\] is zero"),
    (lambda: nbx.linalg.solve(nbx.zeros(2, 2), nbx.zeros(2, 1)),
     r"^torch.linalg.solve: The solver failed because the input matrix is singular\.$"),
    (lambda: nbx.linalg.inv(nbx.zeros(3, 2, 2)),
     r"^\(Batch element 0\): linalg.inv: The diagonal element 1 is zero, the inversion could "
     r"not be completed because the input matrix is singular\.$")])
def test_linalg_failures_name_the_op(call, text):
    with pytest.raises(nbx.linalg.LinAlgError, match=text):
        call()


def test_module_names_may_not_shadow_attributes():
    m = nbx.nn.Linear(2, 2)
    m.extra = 1
    for register in (lambda: m.register_buffer("extra", None),
                     lambda: m.register_parameter("extra", None),
                     lambda: m.add_module("extra", None)):
        with pytest.raises(KeyError, match="attribute 'extra' already exists"):
            register()
    m.register_buffer("weight2", nbx.zeros(2))       # a new name is fine
    assert "weight2" in dict(m.named_buffers())
