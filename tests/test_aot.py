"""Ahead-of-time kernels: the census recorder, the archive builder, the launcher loading
from the archive with Triton hidden, the named error for a missing variant.

CI has no GPU: archives are built for sm_90 here (Triton compiles cubins without a GPU);
the launches go to a fake driver (a recording cuLaunchKernel, as in test_launcher.py).
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

import nbxtensor as nbx

triton = pytest.importorskip("triton")

from nbxtensor.backends.cuda import aot, census  # noqa: E402
from nbxtensor.backends.cuda import launcher as L  # noqa: E402

# a kernel module as a user (or a kernel family) writes one for the archive: string
# annotations (`from __future__ import annotations`) and @aot.jit, so no Triton is needed
# to import it or to compute its launch keys
KERNEL_SRC = '''
from __future__ import annotations
from nbxtensor.backends.cuda import aot
try:
    import triton.language as tl   # the body needs it to compile, not to launch from the archive
except ImportError:
    tl = None

@aot.jit(do_not_specialize=["seed"])
def scale(x, out, n, seed, alpha: tl.float32, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out + i, tl.load(x + i, mask=m) * alpha + seed, mask=m)
'''


@pytest.fixture()
def kmod(tmp_path, monkeypatch):
    """The kernel module above, importable as `aot_kmod` (Triton present in this process)."""
    (tmp_path / "aot_kmod.py").write_text(KERNEL_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("aot_kmod", None)
    import aot_kmod
    yield aot_kmod
    sys.modules.pop("aot_kmod", None)


def _fake_cuda(shape, ptr):
    from test_launcher import fake_cuda
    return fake_cuda(shape, ptr=ptr)


def _key(kernel, args, kwargs):
    sig, cx, attrs, opts, _ = L.bind(kernel, args, kwargs)
    return aot.key_of(kernel, sig, cx, attrs, opts)


# ----------------------------------------------------------------------------- binder without Triton

def test_option_names_are_tritons():
    from triton.backends.nvidia.compiler import CUDAOptions
    assert L._option_names() == set(CUDAOptions.__dataclass_fields__)


def test_params_of_matches_triton_kernel_params(kmod):
    """Our parameters, from the Python function alone, read as Triton's KernelParam."""
    from test_launcher import _annotated, _mixed, _nospec, _with_default
    for jf in (_annotated, _mixed, _nospec, _with_default, kmod.scale.jit_function()):
        ours = aot.params_of(jf.fn, jf.do_not_specialize, jf.do_not_specialize_on_alignment)
        for a, b in zip(ours, jf.params, strict=True):
            for f in ("name", "is_constexpr", "is_const", "annotation_type", "has_default",
                      "do_not_specialize", "do_not_specialize_on_alignment"):
                assert getattr(a, f) == getattr(b, f), (jf.fn.__name__, a.name, f)


def test_deferred_kernel_binds_like_its_jit_function(kmod):
    x, o = _fake_cuda((100,), 0x7F0000000000), _fake_cuda((100,), 0x7F0000010000)
    for args in ((x, o, 100, 7, 2.0), (x, o, 33, 32, 0.5), (x, o, 1, 1, 1.0)):
        kw = dict(BLOCK=64, num_warps=4)
        assert L.bind(kmod.scale, args, kw)[:4] == L.bind(kmod.scale.jit_function(), args, kw)[:4]
    # seed is do_not_specialize: 7, 32 and 1 give one key; n's kinds give three
    keys = {_key(kmod.scale, (x, o, 100, s, 2.0), {"BLOCK": 64}) for s in (7, 32, 1)}
    assert len(keys) == 1
    keys = {_key(kmod.scale, (x, o, n, 7, 2.0), {"BLOCK": 64}) for n in (100, 32, 1)}
    assert len(keys) == 3


def test_key_round_trips_through_parts():
    sig = {"x": "*fp32", "n": "i32", "B": "constexpr", "D": "constexpr", "F": "constexpr"}
    cx = {(2,): 128, (3,): triton.language.bfloat16, (4,): 2.0}
    attrs = {(0,): [["tt.divisibility", 16]], (1,): []}
    opts = {"num_warps": 4, "num_stages": 2}
    key = aot.key_from_parts("m:k", sig, cx, attrs, opts)
    name, s2, c2, a2, o2 = aot.parts_of(key)
    assert (name, s2, a2, o2) == ("m:k", sig, attrs, opts)
    assert c2 == cx and type(c2[(4,)]) is float
    # 2, 2.0 and True are different constexprs: different keys
    ks = {aot.key_from_parts("m:k", sig, {(2,): v}, attrs, opts) for v in (2, 2.0, True)}
    assert len(ks) == 3


# ----------------------------------------------------------------------------- census and build

def _record_small(device="interp"):
    x = nbx.tensor([[1.0, -2.0, 3.5]] * 5, device=device)
    with census.record() as c:
        (x + x, nbx.softmax(x, -1), x.sum(-1))
    return c


def test_census_records_and_archive_bytes_equal_jit(tmp_path):
    c = _record_small()
    names = set(c.kernels())
    assert {"nbxtensor.kernels.elementwise:_ew_flat_kernel",
            "nbxtensor.kernels.softmax:_softmax_kernel"} <= names, names
    # interp's INTERP=True is recorded as cuda's INTERP=False
    flat = [k for k, v in c.keys.items() if v["kernel"].endswith("_ew_flat_kernel")]
    _, sig, cx, _, _ = aot.parts_of(flat[0])
    assert cx[(list(sig).index("INTERP"),)] is False
    r = aot.build(c.keys, 90, str(tmp_path))
    assert not r["failed"] and r["kernels"] == len(c)
    arch = aot.Archive(r["path"])
    assert arch.arch == "sm_90" and set(arch.kernels) == set(c.keys)
    for key in c.keys:
        name, sig, cx, attrs, opts = aot.parts_of(key)
        kernel = aot.resolve(name)
        ck = L._compile(kernel, sig, cx, attrs, opts, 90)     # the JIT path, same key
        md, cubin, src = arch.get(key)
        assert cubin == ck.asm["cubin"], name
        assert (md.name, md.shared, md.num_warps, md.hash) == (
            ck.metadata.name, ck.metadata.shared, ck.metadata.num_warps, ck.metadata.hash)
        assert md.nparams == L.declared_param_count(ck.asm["ptx"])
        assert src == aot.source_hash(kernel)


def missing_from_archive(keys, archive: aot.Archive) -> list:
    return sorted(k for k in keys if k not in archive.kernels)


def test_census_check_fails_on_a_missing_variant(tmp_path):
    c = _record_small()
    keys = sorted(c.keys)
    r = aot.build(keys[1:], 90, str(tmp_path))       # one dispatchable variant left out
    assert missing_from_archive(c.keys, aot.Archive(r["path"])) == keys[:1]


@pytest.mark.parametrize("cc", [80, 86, 89, 90, 100])
def test_shipped_archives_hold_the_census(cc):
    path = aot.archive_path(cc, aot._DEFAULT_DIR)
    if not os.path.exists(path):
        pytest.skip(f"no shipped archive for sm_{cc} (built by `nbx build-kernels`)")
    c = census.load(os.path.join(aot._DEFAULT_DIR, "census.json"))
    assert missing_from_archive(c.keys, aot.Archive(path)) == []


def test_census_file_round_trip_and_refusals(tmp_path):
    c = _record_small()
    p = tmp_path / "c.json"
    c.save(str(p))
    assert census.load(str(p)).keys.keys() == c.keys.keys()
    (tmp_path / "bad.json").write_text(json.dumps({"keys": 3}))
    with pytest.raises(ValueError, match="not a census file"):
        census.load(str(tmp_path / "bad.json"))


def test_archive_refuses_other_files(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\0" * 40)
    with pytest.raises(aot.StaleArchiveError, match="not an nbxtensor kernel archive"):
        aot.Archive(str(tmp_path / "x.bin"))


# ----------------------------------------------------------------------------- no Triton

NO_TRITON = r'''
import ctypes, hashlib, json, sys
sys.modules["triton"] = None          # `import triton` raises ImportError from here on
sys.path[:0] = [{kdir!r}, {tdir!r}]
import nbxtensor as nbx
from nbxtensor.device import Device
from nbxtensor.tensor import Tensor, contiguous_strides
from nbxtensor.backends.cuda import aot, launcher as L
import aot_kmod

class St:
    __slots__ = ("device", "ptr", "nbytes", "_nbx_launch", "__weakref__")
    def __init__(self, ptr):
        self.device, self.ptr, self.nbytes = Device("cuda", 0), ptr, 1 << 20

def fake(n, ptr):
    return Tensor._make(St(ptr), (n,), contiguous_strides((n,)), 0, nbx.float32)

class Alloc:
    def holds(self, p):
        return 0x7F0000000000 <= p < 0x7F0000000000 + (1 << 30)

loaded, calls = [], []
L._allocator_for = lambda dev: Alloc()
L._device_info = lambda dev: (90, 232448, 49152)
L._load = lambda md, cubin, dev: loaded.append((md.name, hashlib.sha256(cubin).hexdigest())) or 0xF00
L._cuLaunchKernel = lambda f, gx, gy, gz, bx, by, bz, sh, st, params, extra: calls.append((f.value, gx, bx, sh)) or 0
L._cuLaunchKernelEx = None
L._use_ex, L._single = False, True
L._streams = {{0: ctypes.c_void_p(0)}}
L.drv.set_device = lambda i: setattr(L.drv._tls, "device", i)
aot.set_archive_dir({adir!r})

x, o = fake(100, 0x7F0000000000), fake(100, 0x7F0000010000)
nbx.launch(aot_kmod.scale, (2,), x, o, 100, 5, 2.0, BLOCK=64, num_warps=4)
nbx.launch(aot_kmod.scale, (2,), x, o, 100, 9, 2.0, BLOCK=64, num_warps=4)   # the fast launcher
out = {{"loaded": loaded, "calls": calls, "triton": repr(sys.modules.get("triton"))}}
try:
    nbx.launch(aot_kmod.scale, (2,), x, o, 32, 5, 2.0, BLOCK=64, num_warps=4)  # n=32 (divisible by 16): not built
except aot.MissingKernelError as e:
    out["missing"] = str(e)
print(json.dumps(out))
'''


def test_launch_from_archive_without_triton(kmod, tmp_path):
    x, o = _fake_cuda((100,), 0x7F0000000000), _fake_cuda((100,), 0x7F0000010000)
    key = _key(kmod.scale, (x, o, 100, 5, 2.0), {"BLOCK": 64, "num_warps": 4})
    adir = tmp_path / "archives"
    r = aot.build([key], 90, str(adir))
    assert not r["failed"]
    md, cubin, _ = aot.Archive(r["path"]).get(key)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "no_triton.py"
    script.write_text(NO_TRITON.format(kdir=str(kmod.__file__.rsplit(os.sep, 1)[0]),
                                       tdir=tests_dir, adir=str(adir)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    import hashlib
    assert out["triton"] == "None"
    assert out["loaded"] == [[md.name, hashlib.sha256(cubin).hexdigest()]]
    assert out["calls"] == [[0xF00, 2, 32 * 4, md.shared]] * 2
    msg = out["missing"]
    assert "kernel aot_kmod:scale" in msg and "sm_90" in msg and '["n","i32"]' in msg and '[2,"D"]' in msg
    assert "nbxtensor[cuda]" in msg and "nbx build-kernels --arch sm_90" in msg
    assert "does not hold it" in msg


def test_stale_source_is_not_loaded(kmod, tmp_path, monkeypatch):
    x, o = _fake_cuda((100,), 0x7F0000000000), _fake_cuda((100,), 0x7F0000010000)
    key = _key(kmod.scale, (x, o, 100, 5, 2.0), {"BLOCK": 64})
    r = aot.build([key], 90, str(tmp_path))
    monkeypatch.setattr(aot, "_dir", str(tmp_path))
    monkeypatch.setattr(aot, "_archives", {})
    assert aot.lookup(kmod.scale, key, 90) is not None
    monkeypatch.setitem(aot._src_hashes, kmod.scale.fn.__code__.co_filename, "other")
    assert aot.lookup(kmod.scale, key, 90) is None
    err = aot.missing(kmod.scale, key, 90, ImportError("no triton"))
    assert "another version of its source" in str(err) and r["path"] in str(err)


# ----------------------------------------------------------------------------- CLI

def test_cli_build_kernels_errors(tmp_path, capsys):
    from nbxtensor.cli import main
    with pytest.raises(SystemExit) as ex:
        main(["build-kernels", "--arch", "sm_91"])
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nbx: error:") and "sm_91" in err[0], err
    assert main(["build-kernels", "--arch", "sm_90", "--census", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nbx: error: --census: no census file"), err


def test_cli_build_kernels(tmp_path, capsys):
    c = _record_small()
    c.save(str(tmp_path / "c.json"))
    from nbxtensor.cli import main
    assert main(["build-kernels", "--arch", "sm_90,sm_80", "--out", str(tmp_path / "a"),
                 "--census", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr()
    assert "progress" in out.err
    for cc in (90, 80):
        a = aot.Archive(aot.archive_path(cc, str(tmp_path / "a")))
        assert set(a.kernels) == set(c.keys) and a.index["cc"] == cc
        assert f"sm_{cc}: {len(c)} kernels" in out.out


def test_draw_kernel_seed_and_offset_do_not_multiply_variants():
    """The RNG kernel's seed and offset are do_not_specialize: every seed and offset of the
    same integer width is one variant (they were 3 each: == 1, divisible by 16, other)."""
    from nbxtensor.kernels.random import _draw_kernel
    o = _fake_cuda((1000,), 0x7F0000000000)
    kw = dict(KIND=0, WIDE=False, FROM_PAIR=False, INTERP=False, BLOCK=512, num_warps=4)
    keys = {_key(_draw_kernel, (o, o, o, seed, off, 1000, 250, 1, 0.0, 1.0, 0), kw)
            for seed in (1, 16, 7) for off in (1, 32, 5)}
    assert len(keys) == 1
