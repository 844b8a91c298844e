"""Fuzzing the weight formats past their field checks: shapes an array cannot have, pickles
whose memo indices ask the C unpickler for gigabytes, zip members whose names do not decode.

Each case was found by a mutation loop over a small valid file (a lying field or a flipped
byte) and is kept here as the generator's smallest form: it must end in a ValueError naming
the file (and the tensor where there is one), or load as torch would load it, within a
deadline and a memory cap -- never another exception, a hang or an allocation the file did
not pay for.
"""
from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from test_fuzz_loaders import deadline, refused

# ----------------------------------------------------------------------------- safetensors
_SIZES = {"F32": 4, "F16": 2, "I64": 8, "U8": 1}


def _st(shape, dtype="F32", nbytes=0):
    """A one-tensor safetensors file of `shape` whose offsets span `nbytes`."""
    js = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}})
    return struct.pack("<Q", len(js)) + js.encode() + bytes(nbytes)


def _unarrayable_shapes():
    """Shapes the offsets can honestly cover (0 bytes) that no array can have: more than
    NumPy's 64 dimensions, or a zero dim beside dims whose product overflows int64."""
    for nd in (65, 100, 1000):
        yield f"{nd}-dims", [1] * (nd - 1) + [0]
    for big in (2**61, 2**62, 2**63 - 1, 2**63, 2**64, 10**30):
        for dt in ("F32", "U8"):
            if big * _SIZES[dt] > 2**63 - 1:
                yield f"{big}x0-{dt}", [big, 0], dt
                yield f"0x{big}-{dt}", [0, big], dt
    yield "product", [0, 2**32, 2**32], "U8"


@pytest.mark.parametrize("case", list(_unarrayable_shapes()), ids=lambda c: c[0])
def test_safetensors_shapes_no_array_can_have(tmp_path, case):
    """Refused by name at open (they reached NumPy's reshape, whose ValueError names
    neither the file nor the tensor: 'Maximum allowed dimension exceeded')."""
    from nbxtensor.io.safetensors import load, load_file, safe_open
    name, shape, *dt = case
    raw = _st(shape, *dt)
    p = tmp_path / "shape.safetensors"
    p.write_bytes(raw)
    for fn in (load_file, lambda q: [f.get_numpy("t") for f in [safe_open(q)]]):
        e = refused(fn, p)
        assert "'t'" in str(e) and ("dimensions" in str(e) or "too large" in str(e)), str(e)
    with pytest.raises(ValueError, match=r"tensor 't'.*(dimensions|too large)"):
        load(raw)


def test_safetensors_the_largest_shapes_an_array_can_have_load(tmp_path):
    """The bounds are NumPy's own: 64 dims, and an empty tensor whose other dims' bytes fit."""
    from nbxtensor.io.safetensors import load_file
    p = tmp_path / "ok.safetensors"
    for shape, dt in (([1] * 63 + [0], "F32"), ([2**40, 0], "F32"), ([0, 2**62], "U8"),
                      ([1] * 64, "U8")):
        p.write_bytes(_st(shape, dt, _SIZES[dt] * (0 if 0 in shape else 1)))
        assert tuple(load_file(p)["t"].shape) == tuple(shape)


def test_safetensors_mutated_shapes_and_offsets(tmp_path):
    """A generator over every dim of a small file: each replaced by a lie (negative, huge,
    a bool, a float, a string, null, a list); the file either loads with what it says or
    is refused by name."""
    from nbxtensor.io.safetensors import load_file
    base = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"dtype": "I64", "shape": [0, 5], "data_offsets": [24, 24]}}
    lies = [-1, 0, 1, 2**31, 2**63, 2**64, 10**30, True, 1.0, "2", None, [2], 1e400]
    p = tmp_path / "m.safetensors"
    n = 0
    for name in base:
        for field in ("shape", "data_offsets"):
            for i in range(len(base[name][field])):
                for lie in lies:
                    h = json.loads(json.dumps(base))
                    h[name][field][i] = lie
                    js = json.dumps(h).encode()
                    p.write_bytes(struct.pack("<Q", len(js)) + js + bytes(24))
                    with deadline(20, f"{name}.{field}[{i}] = {lie!r}"):
                        try:
                            got = load_file(p)
                        except ValueError as e:
                            msg = str(e)
                            assert "m.safetensors" in msg and any(
                                w in msg for w in ("'a'", "'b'", "not JSON", "trailing")), msg
                            n += 1
                            continue
                    assert {k: list(v.shape) for k, v in got.items()} == \
                        {k: h[k]["shape"] for k in h}, (name, field, i, lie)
    assert n > 40


# ----------------------------------------------------------------------------- GGUF
@pytest.mark.parametrize("shape", [(0, 2**62), (2**62, 0), (0, 2**63 - 1), (2**40, 0, 2**40),
                                   (0, 2**31, 2**31, 2**31)], ids=str)
def test_gguf_empty_tensor_with_dims_no_array_can_have(tmp_path, shape):
    """0 bytes of data, so the offsets hold; NumPy's 'array is too big' came out of
    dequantize() naming neither file nor tensor."""
    from test_fuzz_loaders import gguf_bytes, gguf_kv, gguf_open
    raw, _ = gguf_bytes(gguf_kv(), [("x", 0, shape, b"")])
    p = tmp_path / "empty.gguf"
    p.write_bytes(raw)
    refused(gguf_open, p, match=r"tensor 'x' has shape .* does not fit int64")


def test_gguf_empty_and_scalar_tensors_still_load(tmp_path):
    from test_fuzz_loaders import gguf_bytes, gguf_kv, gguf_open
    raw, _ = gguf_bytes(gguf_kv(), [("e", 0, (0, 2**40), b""), ("s", 0, (), bytes(4))])
    p = tmp_path / "ok.gguf"
    p.write_bytes(raw)
    g = gguf_open(p)
    assert g.tensors["e"].dequantize().shape == (0, 2**40)
    assert g.tensors["s"].dequantize().shape == ()


def test_gguf_truncated_at_every_byte(tmp_path):
    """Every prefix of a small valid model file: the parser and the model's metadata readers
    refuse it by name (KeyError for a tensor or key the cut removed)."""
    from helpers import rng
    from test_fuzz_loaders import gguf_bytes, gguf_kv, gguf_model, gguf_tensors
    raw, marks = gguf_bytes(gguf_kv(), gguf_tensors(rng(5)))
    p = tmp_path / "cut.gguf"
    # every other byte of the header (inside most fields, at the edge of every section
    # the other tests cut at), the data part (plain floats) every 61st byte
    cuts = list(range(0, marks["data"] + 1, 2)) + list(range(marks["data"] + 1, len(raw), 61))
    for n in cuts:
        p.write_bytes(raw[:n])
        refused(gguf_model, p, types=(ValueError, KeyError))


# ----------------------------------------------------------------------------- torch checkpoints
sys.path.insert(0, str(Path(__file__).parent))
import test_torch_checkpoint as tt  # noqa: E402 - the hand-made checkpoint builders

_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    cap = int(sys.argv[2]) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    from nbxtensor.io import load_torch
    t = time.perf_counter()
    try:
        obj = load_torch(sys.argv[1])
        out = {"ok": {k: v.numpy().tolist() for k, v in obj.items()}}
    except ValueError as e:
        out = {"error": str(e)}
    out["seconds"] = time.perf_counter() - t
    print(json.dumps(out))
""")


def _load_capped(path, cap_mib=3072, timeout=60):
    """load_torch(path) in a child whose address space is capped: an allocation the file
    did not pay for fails there (MemoryError) instead of swapping this machine."""
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(cap_mib)],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def _memo_pickle(index: int, legacy: bool) -> bytes:
    """{'w': tensor} whose key is memoised at `index` with LONG_BINPUT (pickle allows any
    index; torch's own weights_only unpickler keeps its memo in a dict)."""
    t = tt._tensor("FloatStorage", "0", 4, 0, (4,), (1,), legacy=legacy)
    return b"\x80\x02}(" + tt._frag("w") + b"r" + struct.pack("<I", index) + t + b"u."


@pytest.mark.parametrize("index", [2**30, 2**32 - 1])
@pytest.mark.parametrize("fmt", ["zip", "legacy"])
def test_pickle_memo_index_does_not_allocate(tmp_path, fmt, index):
    """LONG_BINPUT 2**30 made the C unpickler size its memo array to 8 GiB (zeroed: minutes,
    then the OOM killer; here, under the cap, MemoryError). The file loads, as torch loads
    it, in well under a second and a few hundred MiB."""
    import numpy as np
    data = np.arange(1, 5, dtype=np.float32).tobytes()
    p = tmp_path / "memo.pth"
    if fmt == "zip":
        tt._write_zip(p, _memo_pickle(index, False), {"0": data})
    else:
        p.write_bytes(tt._legacy_bytes(_memo_pickle(index, True), [("0", 4, data)]))
    got = _load_capped(p)
    assert got.get("ok") == {"w": [1.0, 2.0, 3.0, 4.0]}, got
    assert got["seconds"] < 10, got


def _zip_with_bad_local_name(path) -> None:
    """A good zip whose data.pkl local header names it with a byte that is not UTF-8 while
    the central directory says the names are UTF-8 (flag bit 11)."""
    tt._good_zip(path)
    raw = bytearray(path.read_bytes())
    name = b"archive/data.pkl"
    loc = 0                             # _write_zip writes data.pkl first
    assert raw[loc + 30:loc + 30 + len(name)] == name
    raw[loc + 30 + 8] = 0x84
    cen = raw.index(b"PK\x01\x02")
    flags = struct.unpack_from("<H", raw, cen + 8)[0]
    struct.pack_into("<H", raw, cen + 8, flags | 0x800)
    path.write_bytes(bytes(raw))


def test_zip_member_name_that_does_not_decode(tmp_path):
    """zipfile's UnicodeDecodeError (a ValueError naming neither the file nor the member)
    came out of load_torch as it was."""
    p = tmp_path / "badname.pth"
    _zip_with_bad_local_name(p)
    e = refused(tt.load_torch, p)
    assert "data.pkl" in str(e) and "corrupt" in str(e), str(e)


def test_zip_pickle_member_too_large(tmp_path):
    """A data.pkl the directory says is larger than any state dict's pickle is refused
    before it is inflated (a deflate bomb of one opcode repeated would build a stack of
    billions of objects)."""
    from nbxtensor.io import torch_checkpoint as tc
    p = tmp_path / "bomb.pth"
    tt._good_zip(p)
    raw = bytearray(p.read_bytes())
    cen = raw.index(b"PK\x01\x02")
    struct.pack_into("<I", raw, cen + 24, tc._MAX_PICKLE + 1)      # uncompressed size
    p.write_bytes(bytes(raw))
    refused(tt.load_torch, p, match="limit on a checkpoint's pickle")


def test_mutated_checkpoints_end_in_a_named_error(tmp_path):
    """Byte flips and u32/u64 lies at random offsets of both formats (the loop that found
    the memo bomb): each load ends in a ValueError naming the file, or loads, in time."""
    from helpers import rng
    g = rng(1818)
    for fmt in ("zip", "legacy"):
        base = (tt._good_zip if fmt == "zip" else tt._good_legacy)(tmp_path / f"g.{fmt}.pth")
        base = base.read_bytes()
        p = tmp_path / f"m.{fmt}.pth"
        for it in range(150):
            raw = bytearray(base)
            at = int(g.integers(0, len(raw) - 8))
            if it % 3 == 0:
                raw[at] ^= 1 << int(g.integers(0, 8))
            else:
                lie = [0, 1, 7, 255, 2**31, 2**32 - 1][int(g.integers(6))]
                struct.pack_into("<I", raw, at, lie)
            p.write_bytes(bytes(raw))
            with deadline(20, f"{fmt} mutation {it}"):
                try:
                    tt.load_torch(p)
                except ValueError as e:
                    assert p.name in str(e), (fmt, it, str(e))
    assert os.path.exists(p)


# ----------------------------------------------------------------------------- config vs weights
@pytest.mark.parametrize("key,value", [
    ("vocab_size", 10**20), ("vocab_size", 17), ("intermediate_size", 10**20),
    ("intermediate_size", 32), ("hidden_size", 16), ("num_key_value_heads", None),
    ("num_key_value_heads", 2), ("head_dim", 8), ("num_attention_heads", 1)])
def test_llama_config_that_lies_about_a_size(tmp_path, key, value):
    """A config size the weights contradict was accepted (the weights' own sizes used) or
    met as `view: ... is invalid` mid-forward; now refused at load naming the tensor, as HF
    refuses a size mismatch."""
    from helpers import rng
    from test_fuzz_loaders import _tiny_llama_folder

    from nbxtensor.models import LlamaModel
    d = _tiny_llama_folder(tmp_path, rng(3), {key: "DROP" if value is None else value})
    with deadline(60, "a llama folder load"), pytest.raises(
            ValueError, match=r"tensor 'model\.(embed_tokens|layers\.0\.[a-z_.]+)\.weight' has "
                              r"shape \(\d+(, \d+)?\), but the config .* needs"):
        LlamaModel.from_folder(str(d), device="cpu")


@pytest.mark.parametrize("key,value", [
    ("vocab_size", 10**20), ("intermediate_size", 10**20), ("max_position_embeddings", None),
    ("max_position_embeddings", 64), ("type_vocab_size", 10**20), ("hidden_size", 16)])
def test_bert_config_that_lies_about_a_size(tmp_path, key, value):
    import json as _json

    from helpers import rng
    from test_fuzz_loaders import _tiny_bert_folder

    from nbxtensor.models import BertModel
    d = _tiny_bert_folder(tmp_path, rng(3))
    cfg = _json.loads((d / "config.json").read_text())
    cfg.pop(key) if value is None else cfg.__setitem__(key, value)
    if key == "hidden_size":
        cfg["num_attention_heads"] = 2
    (d / "config.json").write_text(_json.dumps(cfg))
    with deadline(60, "a bert folder load"), pytest.raises(
            ValueError, match=r"model.safetensors: tensor '[a-z_.0-9A-Z]+' has shape .* but "
                              r"config.json .* needs"):
        BertModel.from_folder(str(d), device="cpu")


@pytest.mark.parametrize("override", [
    {"llama__feed_forward_length": ("u32", 32)}, {"llama__embedding_length": ("u32", 16)},
    {"llama__attention__head_count_kv": ("u32", 2)}])
def test_gguf_metadata_that_lies_about_a_size(tmp_path, override):
    """llama.cpp refuses a tensor whose dims disagree with the hyperparameters; so do we."""
    from helpers import rng
    from test_fuzz_loaders import gguf_bytes, gguf_kv, gguf_tensors

    from nbxtensor.models import LlamaModel
    raw, _ = gguf_bytes(gguf_kv(**override), gguf_tensors(rng(3)))
    p = tmp_path / "lie.gguf"
    p.write_bytes(raw)
    with deadline(60, "a GGUF load"):
        refused(lambda q: LlamaModel.from_gguf(str(q), device="cpu"), p,
                match=r"tensor '(token_embd|blk\.0\.[a-z_]+)\.weight' has shape .* "
                      r"(needs|expected)")


def test_models_with_honest_configs_still_load(tmp_path):
    from helpers import rng
    from test_fuzz_loaders import _tiny_bert_folder, _tiny_llama_folder, gguf_bytes, gguf_kv, \
        gguf_tensors

    from nbxtensor.models import BertModel, LlamaModel
    (tmp_path / "l").mkdir()
    (tmp_path / "b").mkdir()
    m = LlamaModel.from_folder(str(_tiny_llama_folder(tmp_path / "l", rng(3))), device="cpu")
    assert m.cfg.vocab_size == 16
    BertModel.from_folder(str(_tiny_bert_folder(tmp_path / "b", rng(3))), device="cpu")
    raw, _ = gguf_bytes(gguf_kv(), gguf_tensors(rng(3)))
    (tmp_path / "ok.gguf").write_bytes(raw)
    LlamaModel.from_gguf(str(tmp_path / "ok.gguf"), device="cpu")


@pytest.mark.parametrize("kv", [3, 128, 2**31 + 1])
def test_config_checks_name_the_file(tmp_path, kv):
    """LlamaConfig's own checks (heads that do not divide) said 'LlamaConfig: ...' without
    the file the numbers came from."""
    import json as _json

    from helpers import rng
    from test_fuzz_loaders import _tiny_llama_folder, gguf_bytes, gguf_kv, gguf_model, \
        gguf_tensors

    from nbxtensor.models.config import LlamaConfig
    raw, _ = gguf_bytes(gguf_kv(llama__attention__head_count_kv=("u32", kv)),
                        gguf_tensors(rng(3)))
    p = tmp_path / "heads.gguf"
    p.write_bytes(raw)
    refused(gguf_model, p, match="not a multiple of num_key_value_heads")
    (tmp_path / "f").mkdir()
    d = _tiny_llama_folder(tmp_path / "f", rng(3), {"num_key_value_heads": kv})
    with pytest.raises(ValueError, match=r"config\.json: .*not a multiple"):
        LlamaConfig.from_folder(str(d))
    assert _json.loads((d / "config.json").read_text())["num_key_value_heads"] == kv


@pytest.mark.parametrize("only", [[True], [1, False]])
def test_moe_mlp_only_layers_must_be_ints(only):
    """true is not layer 1 (bool passed the int check)."""
    from nbxtensor.models.moe import MoeConfig
    cfg = {"model_type": "qwen2_moe", "vocab_size": 16, "hidden_size": 8,
           "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 1, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 8, "mlp_only_layers": only}
    with pytest.raises(ValueError, match="mlp_only_layers must be a list of layer indices"):
        MoeConfig.from_hf(cfg)
    cfg["mlp_only_layers"] = [1]
    assert MoeConfig.from_hf(cfg).sparse_layers == [0]


@pytest.mark.parametrize("member", ["archive/data/0", "archive/data.pkl", "archive/byteorder"])
def test_zip_member_twice(tmp_path, member):
    """A second member of one name was read instead of the first (zeros for a storage, an
    empty dict for the pickle), silently: which copy is meant is unknowable."""
    import warnings
    p = tmp_path / "dup.pth"
    tt._good_zip(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # zipfile warns about the duplicate it writes
        with zipfile.ZipFile(p, "a") as z:
            z.writestr(member, bytes(48) if member.endswith("/0") else
                       b"\x80\x02}." if member.endswith(".pkl") else b"little")
    refused(tt.load_torch, p, match=f"zip member '{member}' appears twice")
