"""Fuzzing the loaders: safetensors, GGUF, config.json / tokenizer.json and the autotune cache.

Valid small files are built here by hand (every byte under the test's control), then cut at
every section boundary and at random points, given lying lengths, offsets, shapes, dtypes
and key types, duplicated names, and replaced by FIFOs, directories and devices. Every
mutation must end in a named error (ValueError, or its subclass for a non-regular file;
KeyError for a tensor a model lacks) -- never another exception, a hang or a file accepted
that the format's reference reader refuses. A deadline (SIGALRM) turns a hang into a failure.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import struct

import numpy as np
import pytest

from helpers import rng

SEED = 1818            # the random mutation loops: fixed, so a failure reproduces


@contextlib.contextmanager
def deadline(seconds: float, what: str):
    """Fail instead of hanging: SIGALRM interrupts a blocked open() or a runaway loop."""
    def fire(signum, frame):
        raise TimeoutError(f"{what} still running after {seconds} s (a hang)")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def refused(fn, path, *, types=(ValueError,), match=None):
    """fn(path) must raise one of `types`, naming the file (and `match` when given)."""
    with deadline(20, f"loading {os.path.basename(str(path))}"):
        try:
            fn(path)
        except types as e:
            msg = str(e)
            assert os.path.basename(str(path)) in msg, f"the error does not name the file: {msg}"
            if match is not None:
                import re
                assert re.search(match, msg), f"{match!r} not in {msg!r}"
            return e
    pytest.fail(f"{os.path.basename(str(path))} was accepted")


# ----------------------------------------------------------------------------- safetensors
_ST_SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1, "F64": 8}


def st_bytes(header: dict | str, data: bytes) -> bytes:
    js = header if isinstance(header, (str, bytes)) else json.dumps(header)
    js = js.encode() if isinstance(js, str) else js
    return struct.pack("<Q", len(js)) + js + data


def st_valid(g):
    """(header, data): tensors of a few dtypes, one empty and one scalar, in a shuffled
    name order (the data is laid out by offsets, not by name)."""
    specs = [("w", "F32", [3, 5]), ("h", "F16", [7]), ("i", "I64", [2, 2]),
             ("e", "F32", [0, 4]), ("s", "F64", []), ("b", "BF16", [3])]
    header, off = {"__metadata__": {"format": "pt", "who": "fuzz"}}, 0
    for name, dt, shape in specs:
        n = math.prod(shape) * _ST_SIZES[dt]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    order = list(header)
    g.shuffle(order)
    return {k: header[k] for k in order}, g.integers(1, 255, off, dtype=np.uint8).tobytes()


def strict_reference(raw: bytes) -> bool:
    """The Rust `safetensors` crate's acceptance rule, written out independently."""
    if len(raw) < 8:
        return False
    (n,) = struct.unpack("<Q", raw[:8])
    if n > 100_000_000 or 8 + n > len(raw) or not raw[8:9] == b"{":
        return False
    pairs_seen = []

    def hook(pairs):
        keys = [k for k, _ in pairs]
        pairs_seen.append(len(keys) == len(set(keys)))
        return dict(pairs)
    try:
        h = json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=hook,
                       parse_constant=lambda c: 1 / 0)
    except (ValueError, ZeroDivisionError, RecursionError):
        return False
    if not all(pairs_seen) or not isinstance(h, dict):
        return False
    meta = h.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        return False
    infos = []
    for info in h.values():
        try:
            dt, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
            size = _ST_SIZES[dt] if dt in _ST_SIZES else {"I8": 1, "I16": 2, "F8_E4M3": 1,
                                                           "F8_E5M2": 1}[dt]
        except (KeyError, TypeError, ValueError):
            return False
        ints = [*shape, b, e] if isinstance(shape, list) else None
        if ints is None or any(type(v) is not int or v < 0 for v in ints):
            return False
        infos.append((b, e, math.prod(shape) * size))
    at = 0
    for b, e, nbytes in sorted(infos):
        if b != at or e - b != nbytes:
            return False
        at = e
    return 8 + n + at == len(raw)


def st_load(path):
    from nbxtensor.io.safetensors import safe_open
    with safe_open(path) as f:
        return {k: f.get_numpy(k) for k in f.keys()}


def test_safetensors_valid_file_loads(tmp_path):
    """The base every mutation starts from is itself accepted, by us and the reference."""
    header, data = st_valid(rng(SEED))
    raw = st_bytes(header, data)
    assert strict_reference(raw)
    p = tmp_path / "ok.safetensors"
    p.write_bytes(raw)
    got = st_load(p)
    assert got["w"].shape == (3, 5) and got["e"].shape == (0, 4) and got["s"].shape == ()
    b, e = header["w"]["data_offsets"]
    assert got["w"].tobytes() == data[b:e]


def test_safetensors_truncated_or_extended_anywhere(tmp_path):
    """Cut at every section boundary (inside the length, the header, each tensor) and at
    random points, or with bytes appended after the last tensor: refused, naming the file
    (the reference reader wants the data covered exactly)."""
    header, data = st_valid(rng(SEED))
    raw = st_bytes(header, data)
    n = struct.unpack("<Q", raw[:8])[0]
    cuts = set(range(0, 9)) | {8 + n - 1, 8 + n, len(raw) - 1}
    for info in header.values():
        if "data_offsets" in info:
            cuts |= {8 + n + o for o in info["data_offsets"]} | {8 + n + info["data_offsets"][1] - 1}
    cuts |= set(rng(SEED).integers(0, len(raw), 60).tolist())
    p = tmp_path / "cut.safetensors"
    for cut in sorted(c for c in cuts if 0 <= c < len(raw)):
        p.write_bytes(raw[:cut])
        refused(st_load, p)
    for extra in (b"\0", b" ", bytes(8), b"x" * 1000):
        p.write_bytes(raw + extra)
        refused(st_load, p, match="trailing bytes")


def _st_mutations(header, data):
    """(name, raw bytes) for each hand-made lie about a valid file."""
    def with_entry(name, **kw):
        h = json.loads(json.dumps(header))
        h[name].update(kw)
        return h
    tensors = sorted((k for k in header if k != "__metadata__"),
                     key=lambda k: header[k]["data_offsets"])
    first, second, last = tensors[0], tensors[1], tensors[-1]
    fb, fe = header[first]["data_offsets"]
    sb, se = header[second]["data_offsets"]
    lb, le = header[last]["data_offsets"]
    js = json.dumps(header)
    out = [
        ("hole between tensors", st_bytes(with_entry(last, data_offsets=[lb + 8, le + 8]),
                                          data + bytes(8))),
        ("trailing bytes", st_bytes(header, data + b"\0" * 3)),
        ("first not at 0", st_bytes({**{k: (dict(v, data_offsets=[v["data_offsets"][0] + 4,
                                                                   v["data_offsets"][1] + 4])
                                             if k != "__metadata__" else v)
                                         for k, v in header.items()}}, bytes(4) + data)),
        ("overlap", st_bytes(with_entry(second, data_offsets=[fb, fb + se - sb]), data)),
        ("duplicate name", st_bytes(js[:-1] + ', "' + first + '": '
                                    + json.dumps(header[first]) + "}", data)),
        ("duplicate field", st_bytes(js.replace('"dtype": "F32"', '"dtype": "F32", "dtype": "F16"', 1),
                                     data)),
        ("metadata int value", st_bytes({**header, "__metadata__": {"a": 1}}, data)),
        ("metadata null", st_bytes({**header, "__metadata__": None}, data)),
        ("metadata list", st_bytes({**header, "__metadata__": []}, data)),
        ("metadata nested", st_bytes({**header, "__metadata__": {"a": {"b": "c"}}}, data)),
        ("unknown dtype", st_bytes(with_entry(first, dtype="C64"), data)),
        ("dtype not a string", st_bytes(with_entry(first, dtype=4), data)),
        ("dtype list", st_bytes(with_entry(first, dtype=["F32"]), data)),
        ("negative dim", st_bytes(with_entry("w", shape=[-3, -5]), data)),
        ("float dim", st_bytes(with_entry("w", shape=[3.0, 5]), data)),
        ("bool dim", st_bytes(with_entry("h", shape=[True] * 7), data)),
        ("string dim", st_bytes(with_entry("h", shape=["7"]), data)),
        ("nested shape", st_bytes(with_entry("h", shape=[[7]]), data)),
        ("shape not a list", st_bytes(with_entry("h", shape=7), data)),
        ("shape lies", st_bytes(with_entry("w", shape=[5, 5]), data)),
        ("dtype lies about size", st_bytes(with_entry("w", dtype="F64"), data)),
        ("offsets reversed", st_bytes(with_entry(first, data_offsets=[fe, fb]), data)),
        ("offsets float", st_bytes(with_entry(first, data_offsets=[float(fb), float(fe)]),
                                   data)),
        ("offsets three", st_bytes(with_entry(first, data_offsets=[fb, fe, fe]), data)),
        ("offsets negative", st_bytes(with_entry(first, data_offsets=[-4, fe - 4]), data)),
        ("offsets huge", st_bytes(with_entry(last, data_offsets=[2**64, 2**64 + le - lb]),
                                  data)),
        ("missing dtype", st_bytes({**header, first: {k: v for k, v in header[first].items()
                                                     if k != "dtype"}}, data)),
        ("entry not an object", st_bytes({**header, "x": [1, 2]}, data)),
        ("header a list", st_bytes("[1, 2]", data)),
        ("header a string", st_bytes('"abc"', data)),
        ("header leading space", st_bytes(" " + js, data)),
        ("header NaN", st_bytes(with_entry(first, data_offsets=[float("nan"), fe]), data)),
        ("header bad utf-8", st_bytes(js.encode().replace(b'"w"', b'"\xff"'), data)),
        ("header deep nesting", st_bytes('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", data)),
        ("header huge int", st_bytes(js.replace(f"[{fb}, {fe}]", f"[{fb}, {'9' * 5000}]", 1),
                                     data)),
        ("header empty", struct.pack("<Q", 0) + data),
        ("header length past the end", struct.pack("<Q", 8 + len(js) + len(data) + 1)
         + js.encode() + data),
        ("header length 2**63", struct.pack("<Q", 2**63) + js.encode() + data),
        ("header length short", struct.pack("<Q", len(js) - 1) + js.encode() + data),
    ]
    return out


def test_safetensors_lying_headers(tmp_path):
    """Each lie is refused by the reference rule and by us, with the file named."""
    header, data = st_valid(rng(SEED))
    p = tmp_path / "lie.safetensors"
    for name, raw in _st_mutations(header, data):
        assert not strict_reference(raw), name
        p.write_bytes(raw)
        e = refused(st_load, p)
        assert e is not None, name


def test_safetensors_messages_say_what_is_wrong(tmp_path):
    header, data = st_valid(rng(SEED))
    muts = dict(_st_mutations(header, data))
    p = tmp_path / "m.safetensors"
    for name, match in [("hole between tensors", "hole of 8 bytes"),
                        ("trailing bytes", "3 trailing bytes"),
                        ("first not at 0", "does not start at 0"),
                        ("overlap", "overlaps"),
                        ("duplicate name", "names '[a-z]' twice"),
                        ("metadata int value", "__metadata__ must map strings to strings"),
                        ("metadata null", "__metadata__ must map strings to strings"),
                        ("unknown dtype", "unknown or unsupported dtype 'C64'"),
                        ("negative dim", "shape must be a list of ints >= 0"),
                        ("header leading space", "JSON object starting with")]:
        p.write_bytes(muts[name])
        refused(st_load, p, match=match)


def test_safetensors_random_mutations(tmp_path):
    """A few hundred random mutations of a valid file (bytes of the header flipped or
    overwritten, the length field changed, bytes cut or appended). Each is refused by
    a ValueError naming the file, or accepted only if the reference rule accepts it too
    and every tensor reads back as the bytes its offsets name."""
    g = rng(SEED)
    p = tmp_path / "r.safetensors"
    accepted = 0
    for it in range(300):
        header, data = st_valid(g)
        raw = bytearray(st_bytes(header, data))
        n = struct.unpack("<Q", raw[:8])[0]
        kind = it % 5
        if kind == 0:                                    # flip bits in the header
            for _ in range(g.integers(1, 4)):
                raw[g.integers(8, 8 + n)] ^= 1 << int(g.integers(0, 8))
        elif kind == 1:                                  # overwrite with JSON-ish bytes
            at = int(g.integers(8, 8 + n))
            raw[at:at + 1] = bytes([int(g.choice(list(b'{}[]",:0123456789-. ')))])
        elif kind == 2:                                  # the length field lies
            struct.pack_into("<Q", raw, 0, max(0, n + int(g.integers(-20, 20))))
        elif kind == 3:                                  # cut or append
            raw = raw[:g.integers(0, len(raw))] if g.random() < 0.5 else \
                raw + bytes(int(g.integers(1, 9)))
        else:                                            # change one digit of an offset
            digits = [i for i in range(8, 8 + n) if 48 <= raw[i] <= 57]
            raw[int(g.choice(digits))] = int(g.integers(48, 58))
        raw = bytes(raw)
        p.write_bytes(raw)
        with deadline(20, f"mutation {it}"):
            try:
                got = st_load(p)
            except ValueError as e:
                assert "r.safetensors" in str(e), (it, str(e))
                continue
        assert strict_reference(raw), f"mutation {it} accepted but the reference refuses it"
        accepted += 1
        (n,) = struct.unpack("<Q", raw[:8])
        h = json.loads(raw[8:8 + n])
        for k, a in got.items():
            b, e = h[k]["data_offsets"]
            assert a.tobytes() == raw[8 + n + b:8 + n + e], (it, k)
    assert accepted < 300


# ----------------------------------------------------------------------------- GGUF
_VT = {"u8": (0, "<B"), "i8": (1, "<b"), "u16": (2, "<H"), "i16": (3, "<h"), "u32": (4, "<I"),
       "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"), "str": (8, None),
       "u64": (10, "<Q"), "i64": (11, "<q"), "f64": (12, "<d")}
_F32 = 0


def _s(x: str) -> bytes:
    b = x.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _val(t, v) -> bytes:
    if t == "str":
        return _s(v)
    if t.startswith("arr:"):
        et = t[4:]
        return (struct.pack("<IQ", _VT[et][0], len(v))
                + b"".join(_val(et, x) for x in v))
    return struct.pack(_VT[t][1], v)


def _vtype(t) -> int:
    return 9 if t.startswith("arr:") else _VT[t][0]


TOKENS = ["<|endoftext|>", "a", "b", "ab", "c", "d", "cd", "e", "f", "g", "h", "i", "j", "k",
          "l", "m"]
D, F, HQ, HKV, HD, V = 8, 16, 2, 1, 4, len(TOKENS)


def gguf_kv(**override):
    """The metadata of a tiny llama: (key, type, value); `override` replaces by key (dots
    as '__'), a (type, value) pair, or None to drop the key."""
    kv = [("general.architecture", "str", "llama"), ("general.alignment", "u32", 32),
          ("llama.block_count", "u32", 1), ("llama.context_length", "u32", 64),
          ("llama.embedding_length", "u32", D), ("llama.feed_forward_length", "u32", F),
          ("llama.attention.head_count", "u32", HQ), ("llama.attention.head_count_kv", "u32", HKV),
          ("llama.attention.layer_norm_rms_epsilon", "f32", 1e-5),
          ("llama.rope.freq_base", "f32", 10000.0),
          ("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", "default"),
          ("tokenizer.ggml.tokens", "arr:str", TOKENS),
          ("tokenizer.ggml.token_type", "arr:i32", [3] + [1] * (V - 1)),
          ("tokenizer.ggml.scores", "arr:f32", [0.0] * V),
          ("tokenizer.ggml.merges", "arr:str", ["a b", "c d"]),
          ("tokenizer.ggml.bos_token_id", "u32", 0), ("tokenizer.ggml.eos_token_id", "u32", 0),
          ("tokenizer.ggml.padding_token_id", "u32", 0),
          ("tokenizer.ggml.add_bos_token", "bool", False)]
    out = []
    for k, t, v in kv:
        o = override.pop(k.replace(".", "__"), "keep")
        if o is None:
            continue
        out.append((k, t, v) if o == "keep" else (k, *o))
    out += [(k.replace("__", "."), *o) for k, o in override.items()]
    return out


def gguf_tensors(g):
    """(name, ggml type, torch-order shape, raw bytes) of the tiny llama, all F32."""
    shapes = {"token_embd.weight": (V, D), "output_norm.weight": (D,),
              "blk.0.attn_norm.weight": (D,), "blk.0.ffn_norm.weight": (D,),
              "blk.0.attn_q.weight": (HQ * HD, D), "blk.0.attn_k.weight": (HKV * HD, D),
              "blk.0.attn_v.weight": (HKV * HD, D), "blk.0.attn_output.weight": (D, HQ * HD),
              "blk.0.ffn_gate.weight": (F, D), "blk.0.ffn_up.weight": (F, D),
              "blk.0.ffn_down.weight": (D, F)}
    return [(n, _F32, s, (g.standard_normal(s) * 0.3).astype(np.float32).tobytes())
            for n, s in shapes.items()]


def gguf_bytes(kv, tensors, *, alignment=32, offsets=None, version=3):
    """A GGUF file and its section boundaries {name: byte offset}."""
    marks = {}
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv)))
    marks["counts"] = 24
    for k, t, v in kv:
        marks[f"kv {k}"] = len(out)
        out += _s(k) + struct.pack("<I", _vtype(t))
        marks[f"kv {k} value"] = len(out)
        out += _val(t, v)
    sizes, run = [], 0
    for name, tid, shape, raw in tensors:
        sizes.append(run)
        run += -(-len(raw) // alignment) * alignment
    offsets = sizes if offsets is None else offsets
    for (name, tid, shape, raw), off in zip(tensors, offsets):
        marks[f"info {name}"] = len(out)
        out += _s(name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", n) for n in reversed(shape))
        out += struct.pack("<IQ", tid, off)
    out += bytes(-len(out) % alignment)
    marks["data"] = len(out)
    data_start = len(out)
    for (name, tid, shape, raw), off in zip(tensors, sizes):
        out += bytes(data_start + off - len(out)) + raw
        marks[f"data {name} end"] = len(out)
    out += bytes(-len(out) % alignment)
    return bytes(out), marks


def gguf_open(path):
    from nbxtensor.io.gguf import GGUFFile
    return GGUFFile(path)


def gguf_model(path):
    """The metadata readers of a model load: config and tokenizer (no weights)."""
    from nbxtensor.models.config import LlamaConfig
    from nbxtensor.models.tokenizer import Tokenizer
    g = gguf_open(path)
    return LlamaConfig.from_gguf(g), Tokenizer.from_gguf(g)


def test_gguf_valid_tiny_model_loads(tmp_path):
    from nbxtensor.models import LlamaModel
    raw, _ = gguf_bytes(gguf_kv(), gguf_tensors(rng(SEED)))
    p = tmp_path / "ok.gguf"
    p.write_bytes(raw)
    m = LlamaModel.from_gguf(str(p), device="cpu")
    assert m.cfg.num_hidden_layers == 1 and m.cfg.vocab_size == V
    assert m.tokenizer.eos_ids == [0] and m.tokenizer.encode("ab") == [3]
    # integer keys of any width are fine
    raw, _ = gguf_bytes(gguf_kv(llama__block_count=("i8", 1),
                                llama__attention__head_count=("u64", HQ),
                                tokenizer__ggml__eos_token_id=("i32", 0)),
                        gguf_tensors(rng(SEED)))
    p.write_bytes(raw)
    assert gguf_model(p)[0].num_hidden_layers == 1


@pytest.mark.parametrize("override,match", [
    ({"llama__block_count": ("str", "2")}, r"'llama\.block_count' has type STRING, expected an integer"),
    ({"llama__block_count": ("f32", 2.7)}, r"'llama\.block_count' has type FLOAT32"),
    ({"llama__block_count": ("bool", True)}, r"'llama\.block_count' has type BOOL"),
    ({"llama__block_count": ("arr:u32", [1])}, r"'llama\.block_count' has type ARRAY of UINT32"),
    ({"llama__block_count": ("u32", 0)}, r"'llama\.block_count' is 0, expected > 0"),
    ({"llama__block_count": None}, r"missing metadata key 'llama\.block_count'"),
    ({"llama__attention__head_count": ("u32", 0)}, r"head_count' is 0, expected > 0"),
    ({"llama__attention__head_count": ("i32", -2)}, r"head_count' is -2, expected > 0"),
    ({"llama__attention__head_count": ("u32", 3)}, r"not a multiple of"),
    ({"llama__embedding_length": ("u32", 0)}, r"embedding_length' is 0"),
    ({"llama__embedding_length": ("u32", 12)}, r"token_embd\.weight' has shape"),
    ({"llama__attention__head_count_kv": ("str", "1")}, r"head_count_kv' has type STRING"),
    ({"llama__attention__layer_norm_rms_epsilon": ("str", "1e-5")}, r"has type STRING"),
    ({"llama__attention__layer_norm_rms_epsilon": ("f32", float("nan"))}, r"finite"),
    ({"llama__attention__layer_norm_rms_epsilon": ("f64", -1e-5)}, r"expected > 0"),
    ({"llama__rope__freq_base": ("u32", 10000)}, r"freq_base' has type UINT32, expected FLOAT"),
    ({"llama__context_length": ("f64", 64.0)}, r"context_length' has type FLOAT64"),
    ({"general__architecture": ("u32", 1)}, r"'general\.architecture' has type UINT32"),
    ({"general__alignment": ("str", "32")}, r"'general\.alignment' has type STRING"),
    ({"general__alignment": ("u32", 48)}, r"not a power of two"),
    ({"tokenizer__ggml__eos_token_id": ("i32", -1)}, r"eos_token_id' is -1, outside"),
    ({"tokenizer__ggml__eos_token_id": ("u32", V)}, rf"eos_token_id' is {V}, outside the vocabulary \[0, {V}\)"),
    ({"tokenizer__ggml__eos_token_id": ("str", "0")}, r"eos_token_id' has type STRING"),
    ({"tokenizer__ggml__bos_token_id": ("u64", 2**40)}, r"bos_token_id' is \d+, outside"),
    ({"tokenizer__ggml__bos_token_id": ("f32", 0.0)}, r"bos_token_id' has type FLOAT32"),
    ({"tokenizer__ggml__padding_token_id": ("i32", -1)}, r"padding_token_id' is -1"),
    ({"tokenizer__ggml__eot_token_id": ("u32", V + 3)}, r"eot_token_id' is \d+, outside"),
    ({"tokenizer__ggml__token_type": ("arr:i32", [1] * (V - 1))}, r"token_type has 15 entries for 16"),
    ({"tokenizer__ggml__token_type": ("arr:i32", [1] * (V + 1))}, r"token_type has 17 entries"),
    ({"tokenizer__ggml__token_type": ("arr:f32", [1.0] * V)}, r"token_type' has type ARRAY of FLOAT32"),
    ({"tokenizer__ggml__scores": ("arr:f32", [0.0] * 3)}, r"scores has 3 entries for 16"),
    ({"tokenizer__ggml__tokens": ("arr:str", TOKENS[:-1] + ["a"])}, r"holds 'a' twice"),
    ({"tokenizer__ggml__tokens": ("arr:str", TOKENS[:-1])}, r"15 tokens but token_embd"),
    ({"tokenizer__ggml__tokens": ("arr:i32", list(range(V)))}, r"tokens' has type ARRAY of INT32"),
    ({"tokenizer__ggml__tokens": ("arr:str", TOKENS[:-1] + ["\udcff"])}, r"not valid UTF-8"),
    ({"tokenizer__ggml__merges": ("arr:str", ["ab"])}, r"merges\[0\] is 'ab'"),
    ({"tokenizer__ggml__merges": ("arr:str", ["x y"])}, r"do not form a BPE tokenizer"),
    ({"tokenizer__ggml__pre": ("arr:str", ["default"])}, r"'tokenizer\.ggml\.pre' has type ARRAY"),
    ({"tokenizer__ggml__model": ("u8", 2)}, r"'tokenizer\.ggml\.model' has type UINT8"),
    ({"tokenizer__ggml__add_bos_token": ("u8", 1)}, r"add_bos_token' has type UINT8, expected BOOL"),
    ({"tokenizer__chat_template": ("arr:str", ["{{ x }}"])}, r"chat_template' has type ARRAY"),
])
def test_gguf_metadata_read_by_declared_type(tmp_path, override, match):
    """llama.cpp's rule: key K has type T, expected U; counts > 0; token ids in [0, vocab);
    per-token arrays one entry per token."""
    raw, _ = gguf_bytes(gguf_kv(**override), gguf_tensors(rng(SEED)))
    p = tmp_path / "meta.gguf"
    p.write_bytes(raw)
    refused(gguf_model, p, match=match)


def test_gguf_truncated_at_every_section(tmp_path):
    """Cut inside the counts, at every metadata key and value, every tensor info, the data
    start and the end of every tensor's data, and at random points: refused by name."""
    tensors = gguf_tensors(rng(SEED))
    raw, marks = gguf_bytes(gguf_kv(), tensors)
    cuts = set(range(0, 25))
    for name, at in marks.items():
        if name.endswith(" end"):
            cuts.add(at - 1)                   # the last byte of a tensor is missing
        else:
            cuts |= {at, at + 1, at + 7, at + 9}
    cuts |= set(rng(SEED).integers(0, marks[f"data {tensors[-1][0]} end"], 80).tolist())
    p = tmp_path / "cut.gguf"
    for cut in sorted(c for c in cuts if c < marks[f"data {tensors[-1][0]} end"]):
        p.write_bytes(raw[:cut])
        refused(gguf_open, p)


def _patched(raw, at, fmt, value):
    b = bytearray(raw)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def test_gguf_lying_tensor_infos(tmp_path):
    """Offsets overlapping, out of order, with gaps or unaligned; dims too many, too big,
    overflowing; unknown and removed types; rows that are not whole blocks; names twice."""
    g = rng(SEED)
    tensors = gguf_tensors(g)
    kv = gguf_kv()
    base, marks = gguf_bytes(kv, tensors)
    sizes = [0]
    for _, _, _, r in tensors[:-1]:
        sizes.append(sizes[-1] + -(-len(r) // 32) * 32)
    p = tmp_path / "info.gguf"
    cases = {
        "overlap": (dict(offsets=[0, 0] + sizes[2:]), r"data offset 0, expected \d+"),
        "out of order": (dict(offsets=[sizes[1], 0] + sizes[2:]), r"expected 0"),
        "gap": (dict(offsets=sizes[:-1] + [sizes[-1] + 32]), r"expected \d+"),
        "unaligned": (dict(offsets=[0, 4] + [s + 4 for s in sizes[2:]]), r"expected"),
    }
    for name, (kw, match) in cases.items():
        raw, _ = gguf_bytes(kv, tensors, **kw)
        p.write_bytes(raw)
        refused(gguf_open, p, match=match)
    # the fields of the first tensor info: name, u32 n_dims, n_dims x u64, u32 type, u64 off
    name0, _, shape0, _ = tensors[0]
    at = marks[f"info {name0}"] + 8 + len(name0)
    ne_at, type_at = at + 4, at + 4 + 8 * len(shape0)
    for fmt, off, value, match in [
            ("<I", at, 5, "5 dimensions"), ("<I", at, 2**32 - 1, "dimensions"),
            ("<Q", ne_at, 2**63, "does not fit int64"), ("<Q", ne_at, 2**40, "truncated"),
            ("<Q", ne_at, 2**62, "does not fit int64"),
            ("<Q", ne_at + 8, 2**40, "truncated"), ("<Q", ne_at, 9, "truncated|expected"),
            ("<I", type_at, 77, "unknown GGML type id 77"),
            ("<I", type_at, 4, "unknown GGML type id 4"),       # Q4_2: removed from ggml
            ("<I", type_at, 8, "not a multiple of the block size 32"),   # Q8_0 rows of 8
            ("<Q", type_at + 4, 2**64 - 32, "expected 0")]:
        p.write_bytes(_patched(base, off, fmt, value))
        refused(gguf_open, p, match=match)
    # a name twice
    dup = [tensors[0], (tensors[0][0],) + tensors[1][1:]] + tensors[2:]
    raw, _ = gguf_bytes(kv, dup)
    p.write_bytes(raw)
    refused(gguf_open, p, match="appears twice")


def test_gguf_lying_lengths_do_not_allocate(tmp_path):
    """A string or array length larger than the file is refused at once (no allocation of
    gigabytes, no long loop)."""
    kv = gguf_kv()
    raw, marks = gguf_bytes(kv, gguf_tensors(rng(SEED)))
    p = tmp_path / "len.gguf"
    tok_val = marks["kv tokenizer.ggml.tokens value"]       # u32 etype, u64 count, strings
    tt_val = marks["kv tokenizer.ggml.token_type value"]
    arch_val = marks["kv general.architecture value"]       # u64 length + bytes
    for at, fmt, value in [(24, "<Q", 2**62),                   # the first key's length
                           (arch_val, "<Q", 2**40), (arch_val, "<Q", len(raw)),
                           (tok_val + 4, "<Q", 2**61), (tok_val + 4, "<Q", 10**9),
                           (tok_val + 12, "<Q", 2**63),        # the first token's length
                           (tt_val + 4, "<Q", 2**60), (tt_val, "<I", 9),   # nested arrays
                           (tt_val, "<I", 13), (16, "<Q", 2**40), (8, "<Q", 2**40)]:
        p.write_bytes(_patched(raw, at, fmt, value))
        refused(gguf_open, p)


def _check_accepted_gguf(g, size):
    """What an accepted file must satisfy: offsets follow the running padded size, every
    tensor's bytes inside the file."""
    run = 0
    for t in g.tensors.values():
        assert t.offset - g.data_offset == run
        assert t.offset + t.raw.nbytes <= size
        run += -(-t.raw.nbytes // g.alignment) * g.alignment


def test_gguf_random_mutations(tmp_path):
    """A few hundred random mutations (bytes of the metadata and tensor infos flipped or
    overwritten, u64 fields replaced by lies, cuts). The parser and the model's metadata
    readers either accept a consistent file or raise a named error; nothing else."""
    g = rng(SEED)
    tensors = gguf_tensors(g)
    base, marks = gguf_bytes(gguf_kv(), tensors)
    head_end = marks["data"]
    p = tmp_path / "r.gguf"
    outcomes = {"parser": 0, "model": 0, "ok": 0}
    for it in range(300):
        raw = bytearray(base)
        kind = it % 4
        if kind == 0:
            for _ in range(g.integers(1, 4)):
                raw[g.integers(4, head_end)] ^= 1 << int(g.integers(0, 8))
        elif kind == 1:
            at = int(g.integers(4, head_end - 8))
            lies = [0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, len(raw), 7]
            struct.pack_into("<Q", raw, at, lies[int(g.integers(len(lies)))])
        elif kind == 2:
            at = int(g.integers(4, head_end - 4))
            struct.pack_into("<I", raw, at, int(g.integers(0, 14)))
        else:
            raw = raw[:g.integers(4, len(raw))]
        raw = bytes(raw)
        p.write_bytes(raw)
        with deadline(20, f"GGUF mutation {it}"):
            try:
                gf = gguf_open(p)
            except ValueError as e:
                assert "r.gguf" in str(e), (it, str(e))
                outcomes["parser"] += 1
                continue
            _check_accepted_gguf(gf, len(raw))
            try:
                gguf_model(p)
            except (ValueError, KeyError) as e:
                assert "r.gguf" in str(e), (it, str(e))
                outcomes["model"] += 1
                continue
            outcomes["ok"] += 1
    assert outcomes["parser"] > 100 and outcomes["model"] > 5, outcomes


# ----------------------------------------------------------------------------- model folders
def _tiny_llama_folder(d, g, cfg_override=None, weight_dtype=None):
    cfg = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
           "num_hidden_layers": 1, "num_attention_heads": HQ, "num_key_value_heads": HKV,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
           "max_position_embeddings": 64, "eos_token_id": 0}
    cfg.update(cfg_override or {})
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v != "DROP"}))
    names = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,),
             "model.layers.0.input_layernorm.weight": (D,),
             "model.layers.0.post_attention_layernorm.weight": (D,),
             "model.layers.0.self_attn.q_proj.weight": (HQ * HD, D),
             "model.layers.0.self_attn.k_proj.weight": (HKV * HD, D),
             "model.layers.0.self_attn.v_proj.weight": (HKV * HD, D),
             "model.layers.0.self_attn.o_proj.weight": (D, HQ * HD),
             "model.layers.0.mlp.gate_proj.weight": (F, D),
             "model.layers.0.mlp.up_proj.weight": (F, D),
             "model.layers.0.mlp.down_proj.weight": (D, F)}
    return _write_weights_and_tokenizer(d, g, names, weight_dtype)


def _tiny_bert_folder(d, g, weight_dtype=None):
    cfg = {"model_type": "bert", "vocab_size": V, "hidden_size": D, "num_hidden_layers": 1,
           "num_attention_heads": 2, "intermediate_size": F, "max_position_embeddings": 32,
           "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
    (d / "config.json").write_text(json.dumps(cfg))
    shapes = {"embeddings.word_embeddings.weight": (V, D),
              "embeddings.position_embeddings.weight": (32, D),
              "embeddings.token_type_embeddings.weight": (2, D),
              "embeddings.LayerNorm.weight": (D,), "embeddings.LayerNorm.bias": (D,)}
    p = "encoder.layer.0."
    for n in ("attention.self.query", "attention.self.key", "attention.self.value",
              "attention.output.dense"):
        shapes[p + n + ".weight"], shapes[p + n + ".bias"] = (D, D), (D,)
    shapes[p + "intermediate.dense.weight"], shapes[p + "intermediate.dense.bias"] = (F, D), (F,)
    shapes[p + "output.dense.weight"], shapes[p + "output.dense.bias"] = (D, F), (D,)
    for n in ("attention.output.LayerNorm", "output.LayerNorm"):
        shapes[p + n + ".weight"], shapes[p + n + ".bias"] = (D,), (D,)
    return _write_weights_and_tokenizer(d, g, shapes, weight_dtype)


def _write_weights_and_tokenizer(d, g, shapes, weight_dtype):
    """Random float32 weights of `shapes` (one of them recast to `weight_dtype` = (name,
    dtype), the wrong dtype a loader must refuse) as model.safetensors, and a word-level
    tokenizer over TOKENS, into folder d."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from nbxtensor.io.safetensors import save_file
    w = {k: g.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    if weight_dtype is not None:
        name, dt = weight_dtype
        w[name] = (w[name] * 10).astype(dt) if dt is not bool else w[name] > 0
    save_file(w, d / "model.safetensors")
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(TOKENS)}, unk_token="a"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(d / "tokenizer.json"))
    return d


@pytest.mark.parametrize("dt", [np.int32, np.int64, np.uint8, bool])
def test_integer_weights_are_refused_not_cast(tmp_path, device, dt):
    """An I32/I64/U8/BOOL tensor where a float weight belongs: refused, naming the tensor
    (it was cast to the compute dtype and used)."""
    from nbxtensor.models import BertModel, LlamaModel
    g = rng(SEED)
    name = "model.layers.0.self_attn.k_proj.weight"
    (tmp_path / "llama").mkdir()
    d = _tiny_llama_folder(tmp_path / "llama", g, weight_dtype=(name, dt))
    with deadline(60, "a llama folder load"), pytest.raises(ValueError, match=rf"'{name}' is "
                                                                          r"stored as (I|U|B)"):
        LlamaModel.from_folder(str(d), device=device)
    name = "encoder.layer.0.intermediate.dense.weight"
    (tmp_path / "bert").mkdir()
    d = _tiny_bert_folder(tmp_path / "bert", g, weight_dtype=(name, dt))
    with deadline(60, "a bert folder load"), pytest.raises(ValueError, match=rf"'{name}' is "
                                                                          r"stored as (I|U|B)"):
        BertModel.from_folder(str(d), device=device)


def test_tiny_folders_load(tmp_path):
    """The unmutated folders load (so the refusals above are the dtype's doing)."""
    from nbxtensor.models import BertModel, LlamaModel
    g = rng(SEED)
    (tmp_path / "l").mkdir()
    (tmp_path / "b").mkdir()
    m = LlamaModel.from_folder(str(_tiny_llama_folder(tmp_path / "l", g)))
    assert m.cfg.head_dim == HD and m.cfg.eos_token_ids == [0]
    b = BertModel.from_folder(str(_tiny_bert_folder(tmp_path / "b", g)))
    assert b.embed(["a b"]).shape == (1, D)


@pytest.mark.parametrize("override,match", [
    ({"num_attention_heads": "DROP"}, r"config\.json: missing key 'num_attention_heads' "
                                      r"\(needed for llama\)"),
    ({"vocab_size": "DROP"}, r"missing key 'vocab_size'"),
    ({"num_hidden_layers": "2"}, r"'num_hidden_layers' is '2', expected an integer"),
    ({"num_hidden_layers": 2.0}, r"'num_hidden_layers' is 2\.0, expected an integer"),
    ({"num_hidden_layers": True}, r"'num_hidden_layers' is True, expected an integer"),
    ({"num_attention_heads": 0}, r"'num_attention_heads' is 0, expected > 0"),
    ({"num_attention_heads": 3}, r"not a multiple of num_attention_heads 3"),
    ({"hidden_size": -8}, r"'hidden_size' is -8, expected > 0"),
    ({"rms_norm_eps": "1e-5"}, r"'rms_norm_eps' is '1e-5', expected a finite number"),
    ({"rope_theta": 0}, r"'rope_theta' is 0, expected > 0"),
    ({"tie_word_embeddings": 1}, r"'tie_word_embeddings' is 1, expected true or false"),
    ({"rope_scaling": "linear"}, r"'rope_scaling' is 'linear', expected an object"),
    ({"eos_token_id": -1}, r"'eos_token_id' is -1, expected token ids in \[0, 16\)"),
    ({"eos_token_id": [0, 16]}, r"'eos_token_id' is \[0, 16\]"),
    ({"bos_token_id": "0"}, r"'bos_token_id' is '0', expected a token id"),
    ({"model_type": 7}, r"'model_type' is 7, expected a string"),
])
def test_config_json_errors_name_the_key(tmp_path, override, match):
    from nbxtensor.models import LlamaModel
    d = _tiny_llama_folder(tmp_path, rng(SEED), cfg_override=override)
    with pytest.raises(ValueError, match=match):
        LlamaModel.from_folder(str(d))


def test_config_json_not_an_object_or_not_json(tmp_path):
    from nbxtensor.models.config import BertConfig, LlamaConfig
    for text in ("[1, 2]", "{nope", '"x"', "\xff"):
        (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
        for cls in (LlamaConfig, BertConfig):
            with pytest.raises(ValueError, match="config.json"):
                cls.from_folder(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(ValueError, match=r"missing key 'num_attention_heads' \(needed for bert\)"):
        BertConfig.from_folder(str(tmp_path))


# ----------------------------------------------------------------------------- not regular files
def _loaders(tmp_path):
    """name -> (file the loader reads, how to call it)."""
    from nbxtensor.autotune import cache
    from nbxtensor.models.config import BertConfig, LlamaConfig
    from nbxtensor.models.tokenizer import Tokenizer
    from nbxtensor.io.safetensors import load_file
    return {
        "safetensors": (tmp_path / "x.safetensors", st_load),
        "safetensors load_file": (tmp_path / "x.safetensors", load_file),
        "gguf": (tmp_path / "x.gguf", gguf_open),
        "config.json llama": (tmp_path / "config.json",
                              lambda p: LlamaConfig.from_folder(str(p.parent))),
        "config.json bert": (tmp_path / "config.json",
                             lambda p: BertConfig.from_folder(str(p.parent))),
        "tokenizer.json": (tmp_path / "tokenizer.json",
                           lambda p: Tokenizer.from_folder(str(p.parent))),
        "autotune cache": (tmp_path / "autotune.json", lambda p: cache.load_user(str(p))),
    }


@pytest.mark.parametrize("loader", ["safetensors", "safetensors load_file", "gguf",
                                    "config.json llama", "config.json bert", "tokenizer.json",
                                    "autotune cache"])
def test_fifo_directory_and_device_are_refused_before_open(tmp_path, loader):
    """A FIFO blocked open() forever; a directory or a character device in a file's place
    is refused by name as well."""
    from nbxtensor.files import NotARegularFileError
    path, fn = _loaders(tmp_path)[loader]
    os.mkfifo(path)
    try:
        refused(fn, path, types=(NotARegularFileError,), match="FIFO")
    finally:
        # a reader stuck in open() (the failure this test catches) is released by a writer
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        os.unlink(path)
    path.mkdir()
    refused(fn, path, types=(NotARegularFileError,), match="directory")
    path.rmdir()
    if os.path.exists("/dev/zero"):
        os.symlink("/dev/zero", path)
        refused(fn, path, types=(NotARegularFileError,), match="character device")
        path.unlink()
