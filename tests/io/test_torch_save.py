"""nbx.save: torch's zip format, read back by nbx.load (and by torch.load(weights_only=True)
where torch is importable): containers, dtypes, views sharing storage, every device's tensors,
a Module's state dict, file objects, the archive's layout, and the refusals."""
from __future__ import annotations

import collections
import io
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import nbxtensor as nbx
from helpers import rng


def _np(t):
    t = t.cpu()
    if t.dtype in (nbx.bfloat16, nbx.float8_e4m3fn, nbx.float8_e5m2):
        t = t.float()
    return t.numpy()


def _same(a, b):
    assert isinstance(b, nbx.Tensor)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    np.testing.assert_array_equal(_np(a), _np(b))


def _sample(device):
    g = rng()
    w = nbx.tensor(g.standard_normal((5, 7)).astype(np.float32), device=device)
    return {
        "w": w,
        "wt": w.t(),                         # a strided view of w's storage
        "row": w[3],                         # a view at an offset
        "cols": w[:, 2:5],
        "i64": nbx.tensor(g.integers(-9, 9, (4, 3)), device=device),
        "i8": nbx.tensor(g.integers(-9, 9, (6,)).astype(np.int8), device=device),
        "u8": nbx.tensor(g.integers(0, 255, (3,)).astype(np.uint8), device=device),
        "b": nbx.tensor(g.random(5) < 0.5, device=device),
        "h": nbx.tensor(g.standard_normal(9).astype(np.float16), device=device),
        "bf": nbx.tensor(g.standard_normal(9).astype(np.float32), device=device).to(nbx.bfloat16),
        "f8": nbx.tensor(g.standard_normal(4).astype(np.float32), device=device)
              .to(nbx.float8_e4m3fn),
        "f64": nbx.tensor(g.standard_normal((2, 2)), device=device),
        "scalar": nbx.tensor(3.5, device=device),
        "empty": nbx.zeros(0, 3, device=device),
        "nested": [nbx.ones(2, device=device), (1, 2.5, "s", None, True, b"\x00\xff"),
                   {"k": nbx.arange(3, device=device)}],
        "od": collections.OrderedDict(a=1, b=nbx.zeros(1, device=device)),
        "dtype": nbx.float16,
        "set": {1, 2},
    }


def _check_loaded(obj, got):
    assert type(got) is type(obj)
    if isinstance(obj, nbx.Tensor):
        _same(obj, got)
    elif isinstance(obj, dict):
        assert list(got) == list(obj)
        for k in obj:
            _check_loaded(obj[k], got[k])
    elif isinstance(obj, (list, tuple)):
        assert len(got) == len(obj)
        for a, b in zip(obj, got):
            _check_loaded(a, b)
    else:
        assert got == obj


def test_round_trip_through_nbx_load(device, tmp_path):
    obj = _sample(device)
    nbx.save(obj, tmp_path / "m.pth")
    got = nbx.load(tmp_path / "m.pth")
    _check_loaded(obj, got)
    # the views still share one storage after loading, as with torch
    got["w"][0, 0] = 123.0
    assert float(got["wt"][0, 0]) == 123.0
    got["w"][3, 1] = -5.0
    assert float(got["row"][1]) == -5.0
    assert got["wt"].stride() == (1, 7) and got["row"].storage_offset() == 21
    # and map_location puts them on a device
    dev = nbx.load(tmp_path / "m.pth", map_location=device)
    assert dev["w"].device == nbx.device(device)
    _same(obj["cols"], dev["cols"])


def test_archive_layout(tmp_path):
    nbx.save({"a": nbx.ones(3), "b": nbx.arange(10)}, tmp_path / "x.pt")
    raw = (tmp_path / "x.pt").read_bytes()
    with zipfile.ZipFile(tmp_path / "x.pt") as zf:
        names = zf.namelist()
        assert names[0] == "archive/data.pkl"
        for n in ("archive/byteorder", "archive/version", "archive/data/0", "archive/data/1"):
            assert n in names
        assert zf.read("archive/byteorder") == b"little"
        assert zf.read("archive/version") == b"3\n"
        for info in zf.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            # the bytes start at a multiple of 64 (torch's alignment; mmap loads need it)
            n, m = np.frombuffer(raw[info.header_offset + 26:info.header_offset + 30], "<u2")
            start = info.header_offset + 30 + int(n) + int(m)
            assert start % 64 == 0, (info.filename, start)
            assert raw[start:start + info.file_size] == zf.read(info)
        np.testing.assert_array_equal(np.frombuffer(zf.read("archive/data/1"), np.int64),
                                      np.arange(10))


def test_module_state_dict(device, tmp_path):
    torch_nn = nbx.nn
    m = torch_nn.Sequential(torch_nn.Linear(4, 3), torch_nn.BatchNorm1d(3)).to(device)
    for p in m.parameters():
        p.copy_(nbx.randn(*p.shape, device=device))
    nbx.save(m.state_dict(), tmp_path / "sd.pth")
    sd = nbx.load(tmp_path / "sd.pth", map_location=device)
    m2 = torch_nn.Sequential(torch_nn.Linear(4, 3), torch_nn.BatchNorm1d(3)).to(device)
    m2.load_state_dict(sd, strict=True)
    for (k, a), (k2, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert k == k2
        _same(a, b)


def test_file_object_and_bytesio(tmp_path):
    buf = io.BytesIO()
    nbx.save([nbx.ones(2)], buf)
    (tmp_path / "b.pth").write_bytes(buf.getvalue())
    _same(nbx.ones(2), nbx.load(tmp_path / "b.pth")[0])
    with open(tmp_path / "f.pth", "wb") as f:
        nbx.save({"x": nbx.arange(4)}, f)
    _same(nbx.arange(4), nbx.load(tmp_path / "f.pth")["x"])


def test_refusals(tmp_path):
    p = tmp_path / "r.pth"
    with pytest.raises(TypeError, match="cannot save a .*Linear.*state_dict"):
        nbx.save(nbx.nn.Linear(2, 2), p)
    with pytest.raises(TypeError, match="cannot save a builtins.function"):
        nbx.save({"f": lambda: 0}, p)
    with pytest.raises(TypeError, match="cannot save a numpy.ndarray"):
        nbx.save({"a": np.zeros(2)}, p)
    with pytest.raises(TypeError, match="complex64 is not saved"):
        nbx.save({"c": nbx.zeros(2, dtype=nbx.complex64)}, p)
    x = nbx.zeros(4)
    with pytest.raises(TypeError, match="share memory.*float32 and int32"):
        nbx.save([x, x.view(nbx.int32)], p)
    with pytest.raises(ValueError, match="only torch's default format"):
        nbx.save({}, p, _use_new_zipfile_serialization=False)
    with pytest.raises(TypeError, match="f: expected a file path"):
        nbx.save({}, 3)


def _torch_python():
    """A Python that imports torch: this one, or NBX_TORCH_PYTHON (a scratch venv)."""
    try:
        import torch  # noqa: F401
        return sys.executable
    except ImportError:
        pass
    exe = os.environ.get("NBX_TORCH_PYTHON")
    if exe and subprocess.run([exe, "-c", "import torch"], capture_output=True).returncode == 0:
        return exe
    return None


_TORCH_READ = r"""
import sys, numpy as np, torch
sd = torch.load(sys.argv[1], weights_only=True)
out = {}
for k, v in sd.items():
    if isinstance(v, torch.Tensor):
        out[k] = (v.float() if v.dtype in (torch.bfloat16, torch.float8_e4m3fn) else v).numpy()
        out[k + ".meta"] = np.array([str(v.dtype), str(tuple(v.shape)), str(v.stride()),
                                     str(v.storage_offset())])
    else:
        out[k + ".py"] = np.array(repr(v))
out["shared"] = np.array(sd["wt"].untyped_storage().data_ptr() == sd["w"].untyped_storage().data_ptr())
np.savez(sys.argv[2], **out)
"""


def test_torch_reads_it(tmp_path):
    exe = _torch_python()
    if exe is None:
        pytest.skip("torch is not importable (NBX_TORCH_PYTHON names a Python that has it)")
    obj = {k: v for k, v in _sample("cpu").items() if k not in ("nested", "od", "set")}
    obj["plain"] = [1, (2.5, "s"), None]
    nbx.save(obj, tmp_path / "t.pth")
    subprocess.run([exe, "-c", _TORCH_READ, str(tmp_path / "t.pth"), str(tmp_path / "t.npz")],
                   check=True)
    got = np.load(tmp_path / "t.npz")
    assert bool(got["shared"])
    names = {nbx.float8_e4m3fn: "torch.float8_e4m3fn"}
    for k, v in obj.items():
        if isinstance(v, nbx.Tensor):
            np.testing.assert_array_equal(got[k], _np(v))
            meta = got[k + ".meta"]
            assert meta[0] == names.get(v.dtype, "torch." + v.dtype.name)
            assert meta[1] == str(tuple(v.shape)) and meta[2] == str(v.stride())
            assert meta[3] == str(v.storage_offset())
    assert str(got["dtype.py"]) == "torch.float16"
    assert str(got["plain.py"]) == "[1, (2.5, 's'), None]"


def test_load_reads_file_objects(tmp_path):
    # torch.load(buffer): zip from a BytesIO, and torch's own zip and legacy files opened by hand
    buf = io.BytesIO()
    obj = {"w": nbx.randn(3, 2), "n": 4}
    nbx.save(obj, buf)
    buf.seek(0)
    got = nbx.load(buf, weights_only=True)
    _same(obj["w"], got["w"])
    assert got["n"] == 4
    got["w"][0, 0] = 7.0                              # the tensors own their memory
    assert float(got["w"][0, 0]) == 7.0
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                        "torch_ckpt")
    for name in ("zip.pth", "legacy.pth"):
        path = os.path.join(here, name)
        with open(path, "rb") as f:
            from_file = nbx.load(f)
        from_path = nbx.load(path)
        assert list(from_file) == list(from_path)
        for k, v in from_path.items():
            if isinstance(v, nbx.Tensor):
                _same(v, from_file[k])
    with pytest.raises(ValueError, match="empty file"):
        nbx.load(io.BytesIO(b""))
    with pytest.raises(TypeError, match="binary mode"):
        nbx.load(io.StringIO("x"))
