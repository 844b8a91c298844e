"""nbx.distributed: the stores, the rendezvous, the launcher, every refusal, tensor-parallel
linears and Llama on the fake communicator (host tensors, 2 real processes), and NCCL
(skipped where libnccl is absent; world size 1 on one GPU, the 2-rank tests on two).

Multi-process tests run this file as the rank script: `python -m nbxtensor.distributed.run
-n 2 tests/runtime/test_distributed.py WORKER OUTDIR ...` (see `_WORKERS` at the end). Every wait
is bounded (store timeouts of seconds, subprocess timeouts), so a broken build fails
instead of hanging.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
THIS = os.path.abspath(__file__)
sys.path[:0] = [HERE, os.path.dirname(HERE)]     # this folder and tests/ (helpers, fakes)

import nbxtensor as nbx  # noqa: E402
import nbxtensor.distributed as dist  # noqa: E402
from nbxtensor import config  # noqa: E402
from nbxtensor.distributed import nccl  # noqa: E402
from nbxtensor.distributed.store import FileStore, StoreError, StoreTimeout, TCPStore  # noqa: E402

PROC_TIMEOUT = 240          # a whole launcher run on a loaded 2-core machine, at most


def _launch(n, *args, env=None, timeout=PROC_TIMEOUT, extra=()):
    cmd = [sys.executable, "-m", "nbxtensor.distributed.run", "-n", str(n), *extra, THIS, *args]
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT)


def _backend_for(device):
    """fake on host devices; nccl on cuda (two GPUs and libnccl needed, else skip)."""
    if device != "cuda":
        return "fake"
    if not dist.is_nccl_available():
        pytest.skip("libnccl.so.2 is not installed")
    if nbx.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    return "nccl"


@pytest.fixture
def group():
    """A world-size-1 fake group in this process (its own TCP store), destroyed after."""
    store = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    dist.init_process_group("fake", rank=0, world_size=1, store=store, timeout=5)
    yield store
    if dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- stores
_CLIENT = r"""
import sys, time
sys.path.insert(0, {src!r})
from nbxtensor.distributed.store import TCPStore, FileStore
kind, where, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = TCPStore("127.0.0.1", int(where), timeout=20) if kind == "tcp" else FileStore(where, timeout=20)
s.set(f"hello/{{rank}}", f"from {{rank}}".encode())
n = s.add("count", 10 + rank)
s.wait(["go"])
print(s.get("go").decode(), n, flush=True)
"""


def _clients(kind, where, ranks):
    code = _CLIENT.format(src=os.path.join(ROOT, "src"))
    return [subprocess.Popen([sys.executable, "-c", code, kind, str(where), str(r)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for r in ranks]


@pytest.mark.parametrize("kind", ["tcp", "file"])
def test_store_across_processes(kind, tmp_path):
    """Two client processes set keys and add to a counter; the parent waits for both, then
    releases them through a key they wait on."""
    if kind == "tcp":
        s = TCPStore("127.0.0.1", 0, is_server=True, timeout=30)
        where = s.port
    else:
        where = str(tmp_path / "store")
        s = FileStore(where, timeout=30)
    procs = _clients(kind, where, [1, 2])
    try:
        s.wait(["hello/1", "hello/2"], timeout=60)
        assert s.get("hello/1") == b"from 1" and s.get("hello/2") == b"from 2"
        deadline = time.monotonic() + 60
        while s.add("count", 0) != 23 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.add("count", 0) == 23
        s.set("go", b"released")
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        s.close()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        word, n = out.split()
        assert word == "released" and int(n) in (11, 12, 23)


@pytest.mark.parametrize("kind", ["tcp", "file"])
def test_store_timeout_names_the_key(kind, tmp_path):
    s = (TCPStore("127.0.0.1", 0, is_server=True, timeout=5) if kind == "tcp"
         else FileStore(tmp_path / "st", timeout=5))
    try:
        s.set("a", b"1")
        t0 = time.monotonic()
        with pytest.raises(StoreTimeout, match="'never'") as e:
            s.get("never", timeout=0.3)
        assert 0.25 < time.monotonic() - t0 < 5
        with pytest.raises(StoreTimeout) as e:
            s.wait(["a", "b", "c"], timeout=0.3)
        assert e.value.missing == ["b", "c"]
        with pytest.raises(ValueError, match="timeout"):
            s.get("a", timeout=-1)
        s.delete("a")
        with pytest.raises(StoreTimeout):
            s.get("a", timeout=0.2)
    finally:
        s.close()


def test_tcp_store_unreachable_and_dead_server():
    port = __import__("nbxtensor.distributed.run", fromlist=["free_port"]).free_port()
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=f"could not reach 127.0.0.1:{port} within 0.5 s"):
        TCPStore("127.0.0.1", port, timeout=5, connect_timeout=0.5)
    assert time.monotonic() - t0 < 10
    # a server in another process that dies: the client's next call names the lost store
    code = (f"import sys, time; sys.path.insert(0, {os.path.join(ROOT, 'src')!r}); "
            "from nbxtensor.distributed.store import TCPStore; "
            "s = TCPStore('127.0.0.1', 0, is_server=True); print(s.port, flush=True); "
            "time.sleep(120)")
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        c = TCPStore("127.0.0.1", int(server.stdout.readline()), timeout=30)
        c.set("k", b"v")
        assert c.get("k") == b"v"
        server.kill()
        server.wait(timeout=30)
        with pytest.raises(StoreError, match="lost the connection.*rank 0"):
            c.get("k2", timeout=20)
        c.close()
    finally:
        if server.poll() is None:
            server.kill()
        server.stdout.close()


def test_tcp_store_port_in_use():
    s = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    try:
        with pytest.raises(StoreError, match=f"MASTER_PORT {s.port}"):
            TCPStore("127.0.0.1", s.port, is_server=True, timeout=5)
    finally:
        s.close()


def test_file_store_add_is_atomic(tmp_path):
    """Threads adding at once lose no increment (the flock)."""
    s = FileStore(tmp_path / "st", timeout=5)
    ts = [threading.Thread(target=lambda: [s.add("n", 1) for _ in range(25)]) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert s.add("n", 0) == 100


# ----------------------------------------------------------------------------- refusals
def test_refusals_before_init():
    assert not dist.is_initialized()
    for f, args in ((dist.all_reduce, (nbx.ones(2),)), (dist.get_rank, ()), (dist.barrier, ()),
                    (dist.broadcast, (nbx.ones(2), 0)), (dist.destroy_process_group, ())):
        with pytest.raises(dist.DistError, match="init_process_group"):
            f(*args)


@pytest.mark.parametrize("kw, exc, msg", [
    (dict(rank=0, world_size=0), ValueError, "world_size must be >= 1, got 0"),
    (dict(rank=2, world_size=2), ValueError, r"rank 2 is out of range for world_size 2 \(expected 0..1\)"),
    (dict(rank=-1, world_size=2), ValueError, "rank -1 is out of range"),
    (dict(rank=0, world_size=2.0), TypeError, "world_size must be an int"),
    (dict(rank=0, world_size=1, timeout=0), ValueError, "timeout must be a positive"),
    (dict(rank=0, world_size=1, backend="gloo"), ValueError, "backend must be 'nccl' or 'fake'"),
    (dict(rank=0, world_size=1, device="cuda"), ValueError, "device must be cpu or interp"),
    (dict(rank=0, world_size=1, init_method="udp://x"), ValueError, "expected env://"),
    (dict(rank=0, world_size=1, init_method="tcp://nohost"), ValueError, "tcp://host:port"),
])
def test_init_refusals(kw, exc, msg):
    kw.setdefault("backend", "fake")
    with pytest.raises(exc, match=msg):
        dist.init_process_group(**kw)
    assert not dist.is_initialized()


def test_init_env_needs_the_launch_variables(monkeypatch):
    for k in config.LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="WORLD_SIZE is not set"):
        dist.init_process_group("fake")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero' is not an integer"):
        dist.init_process_group("fake")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="needs MASTER_PORT"):
        dist.init_process_group("fake")
    assert not dist.is_initialized()


def test_double_init_and_state(group):
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_backend() == "fake"
    with pytest.raises(dist.DistError, match="already rank 0 of 1"):
        dist.init_process_group("fake", rank=0, world_size=1, store=group)
    dist.destroy_process_group()
    assert not dist.is_initialized()
    with pytest.raises(dist.DistError):
        dist.destroy_process_group()


def test_collective_refusals(group, device):
    if device == "cuda":
        pytest.skip("the fake group takes host tensors; the nccl checks are below")
    a = nbx.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=device)
    with pytest.raises(ValueError, match=r"tensor must be contiguous \(shape \(3, 2\)"):
        dist.all_reduce(a[:, ::2])
    with pytest.raises(TypeError, match="tensor must be a Tensor, got ndarray"):
        dist.all_reduce(np.ones(3))
    with pytest.raises(TypeError, match="dtype bool, which NCCL does not reduce"):
        dist.all_reduce(nbx.ones(3, dtype=nbx.bool, device=device))
    with pytest.raises(ValueError, match="op must be a ReduceOp"):
        dist.all_reduce(a, op="mean")
    with pytest.raises(ValueError, match=r"src must be a rank in 0..0, got 1"):
        dist.broadcast(a, 1)
    with pytest.raises(ValueError, match="dst 0 is this rank"):
        dist.send(a, 0)
    with pytest.raises(ValueError, match=r"output_tensor has shape \(4, 4\)"):
        dist.all_gather_into_tensor(nbx.empty((4, 4), device=device), a)
    with pytest.raises(TypeError, match="output_tensor has dtype float64"):
        dist.all_gather_into_tensor(nbx.empty((3, 4), dtype=nbx.float64, device=device), a)
    with pytest.raises(ValueError, match=r"input has shape \(3, 4\)"):
        dist.reduce_scatter_tensor(nbx.empty((2, 4), device=device), a)
    with pytest.raises(ValueError, match=r"tensor_list must be a list of world_size \(1\)"):
        dist.all_gather([], a)
    # world size 1: every collective is the identity
    ref = a.numpy().copy()
    for op in ("sum", "prod", "max", "min", "avg"):
        dist.all_reduce(a, op)
    out = nbx.empty((1, 3, 4), device=device)
    dist.all_gather_into_tensor(out, a)
    np.testing.assert_array_equal(a.numpy(), ref)
    np.testing.assert_array_equal(out.numpy()[0], ref)
    dist.barrier()


def test_nccl_group_refuses_host_and_foreign_tensors(monkeypatch, device):
    """The nccl backend's local checks (no NCCL call is reached): a tensor on another
    device than the rank's GPU, and a non-contiguous one."""
    from nbxtensor.device import as_device
    g = dist._Group("nccl", 0, 1, None, None, as_device("cuda:0"), 5.0)
    monkeypatch.setattr(dist, "_group", g)
    with pytest.raises(ValueError, match=r"tensor is on cpu; the nccl backend of rank 0 takes "
                                         r"tensors on cuda:0"):
        dist.all_reduce(nbx.ones(4))
    if device == "cuda":
        t = nbx.ones((4, 4), device="cuda:0")
        with pytest.raises(ValueError, match="must be contiguous"):
            dist.all_reduce(t.t())


# ----------------------------------------------------------------------------- launcher
def test_launcher_all_reduce_through_the_fake(tmp_path):
    r = _launch(2, "allreduce", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = sorted(ln for ln in r.stdout.splitlines() if "sum" in ln)
    # rank r contributes arange(5) + 10r (+ 0.25 for sub-integer bits): sum over 2 ranks
    want = (2 * np.arange(5) + 10 + 0.5).tolist()
    assert lines == [f"[rank0] sum {want}", f"[rank1] sum {want}"], r.stdout
    assert "[rank1] world 2 local_rank 1" in r.stdout
    xs = [(np.arange(6).reshape(3, 2) + 100 * k).astype(np.float64) for k in range(2)]
    rsin = [np.arange(8).reshape(4, 2) * (k + 1.0) for k in range(2)]
    for k in range(2):
        got = np.load(tmp_path / f"coll{k}.npz")
        np.testing.assert_array_equal(got["prod"], xs[0] * xs[1])
        np.testing.assert_array_equal(got["max"], xs[1])
        np.testing.assert_array_equal(got["min"], xs[0])
        np.testing.assert_allclose(got["avg"], (xs[0] + xs[1]) / 2)
        np.testing.assert_array_equal(got["gather"], np.concatenate(xs))
        np.testing.assert_array_equal(got["list0"], xs[0])
        np.testing.assert_array_equal(got["list1"], xs[1])
        np.testing.assert_array_equal(got["rs"], (rsin[0] + rsin[1])[2 * k:2 * k + 2])
        np.testing.assert_array_equal(got["bcast"], xs[1])
        np.testing.assert_array_equal(got["p2p"], xs[1 - k])


def test_launcher_failing_rank_stops_the_others(tmp_path):
    t0 = time.monotonic()
    r = _launch(2, "fail", str(tmp_path), extra=("--grace", "2"))
    took = time.monotonic() - t0
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "rank 1 exited with status 3; stopping the other ranks" in r.stderr
    assert "[rank1] failing now" in r.stdout
    assert "survived" not in r.stdout            # rank 0 sleeps 100 s, then would print this
    assert took < 100
    pid = int((tmp_path / "rank0.pid").read_text())
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("rank 0 was left running after rank 1 failed")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launcher_forwards_signals(tmp_path):
    cmd = [sys.executable, "-m", "nbxtensor.distributed.run", "-n", "2", "--grace", "20", THIS,
           "sigwait", str(tmp_path)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert "[rank0] rank 0 got signal 15" in out and "[rank1] rank 1 got signal 15" in out, err
    assert p.returncode == 7, err         # the ranks' own exit status after the signal


def test_launcher_argument_refusals():
    r = subprocess.run([sys.executable, "-m", "nbxtensor.distributed.run", "-n", "0", THIS],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "-n must be >= 1, got 0" in r.stderr


def test_dead_peer_in_rendezvous_and_in_a_collective(tmp_path):
    """World size 2 with rank 1 never starting: rank 0 names it. Then rank 1 leaves before
    a collective: rank 0's all_reduce names rank 1."""
    store = TCPStore("127.0.0.1", 0, is_server=True, timeout=2)
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreTimeout, match=r"rank 1 did not join within 1 s \(world_size 2\)"):
            dist.init_process_group("fake", rank=0, world_size=2, store=store, timeout=1)
        assert time.monotonic() - t0 < 30 and not dist.is_initialized()
    finally:
        store.close()
    r = _launch(2, "deadpeer", str(tmp_path))
    assert r.returncode == 1, r.stderr
    assert "all_reduce (call 1): rank 1 did not take part within 3 s" in r.stderr, r.stderr


@pytest.mark.parametrize("what", ["shape", "dtype", "op"])
def test_debug_mode_names_the_ranks_that_differ(tmp_path, what):
    r = _launch(2, "mismatch", str(tmp_path), what, env={"NBX_DIST_DEBUG": "1"})
    assert r.returncode == 1, r.stderr
    want = {"shape": ("rank 0: all_reduce((4,) float32, op='sum')",
                      "rank 1: all_reduce((5,) float32, op='sum')"),
            "dtype": ("rank 0: all_reduce((4,) float32", "rank 1: all_reduce((4,) float64"),
            "op": ("rank 0: all_reduce((4,) float32", "rank 1: broadcast((4,) float32")}[what]
    for line in ("[rank0] ", "[rank1] "):
        errs = [ln for ln in r.stderr.splitlines() if ln.startswith(line + "ValueError")]
        assert errs and "the ranks disagree" in errs[0], r.stderr
        assert all(w in errs[0] for w in want), errs[0]


def test_file_init_method_rendezvous_and_reuse(tmp_path):
    folder = tmp_path / "rdzv"
    r = _launch(2, "fileinit", str(tmp_path), str(folder))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("sum 3.0") == 2
    # the same folder again: its keys belong to the finished job
    r = _launch(2, "fileinit", str(tmp_path), str(folder))
    assert r.returncode == 1 and "use a fresh folder per job" in r.stderr


# ----------------------------------------------------------------------------- tensor parallel
def test_head_shards():
    from nbxtensor.distributed.tensor_parallel import head_shards
    assert [head_shards(8, 4, r, 2) for r in range(2)] == [
        dist.tensor_parallel.HeadShard((0, 4), (0, 2)), dist.tensor_parallel.HeadShard((4, 8), (2, 4))]
    # fewer KV heads than ranks: each replicated; a rank's q heads use its KV head
    for r in range(4):
        s = head_shards(8, 2, r, 4)
        assert s.q == (2 * r, 2 * r + 2) and s.kv == (r // 2, r // 2 + 1)
        assert all(h // 4 == s.kv[0] for h in range(*s.q))
    with pytest.raises(ValueError, match="num_attention_heads 6 is not divisible by the world size 4"):
        head_shards(6, 2, 0, 4)
    with pytest.raises(ValueError, match="num_key_value_heads 4 is fewer than the world size 6 "
                                         "and does not divide it"):
        head_shards(12, 4, 0, 6)


def test_parallel_linear_two_ranks(tmp_path, device):
    """Column- then row-parallel linear (Megatron MLP pair) and a gathered column-parallel
    linear, on 2 ranks, against float64 NumPy on the unsharded weights."""
    backend = _backend_for(device)
    r = _launch(2, "linear", str(tmp_path), device, backend)
    assert r.returncode == 0, r.stderr
    rng = np.random.default_rng(7)
    x, w1, b1, w2, b2 = _linear_data(rng)
    h = x.astype(np.float64) @ w1.T.astype(np.float64) + b1
    want = h @ w2.T.astype(np.float64) + b2
    for rank in range(2):
        got = np.load(tmp_path / f"linear{rank}.npz")
        np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got["h"], h, rtol=1e-4, atol=1e-4)
        # a row-parallel linear given the full input (sliced per rank): w1's first 6 rows
        np.testing.assert_allclose(got["rowx"], x.astype(np.float64) @ w1[:6].T.astype(np.float64),
                                   rtol=1e-4, atol=1e-4)


def _linear_data(rng):
    # odd per-rank widths (19 input and 21 hidden features a rank): no block-size luck
    x = rng.standard_normal((5, 38)).astype(np.float32)
    w1 = (rng.standard_normal((42, 38)) / 6).astype(np.float32)
    b1 = rng.standard_normal(42).astype(np.float32)
    w2 = (rng.standard_normal((9, 42)) / 6).astype(np.float32)
    b2 = rng.standard_normal(9).astype(np.float32)
    return x, w1, b1, w2, b2


@pytest.mark.parametrize("V, Hkv", [(97, 2), (98, 1)])
def test_sharded_llama_two_ranks_equals_single(tmp_path, V, Hkv):
    """A tiny random Llama sharded over 2 ranks (heads split or KV heads replicated; lm_head
    replicated for V=97, vocabulary-parallel for V=98): the eager forward, prefill and
    decode steps (fused and unfused) give the single-process logits."""
    r = _launch(2, "llama", str(tmp_path), str(V), str(Hkv))
    assert r.returncode == 0, r.stderr
    ref = _llama_logits(_tiny(V, Hkv), shard=None)
    for rank in range(2):
        got = np.load(tmp_path / f"llama{rank}.npz")
        assert sorted(got.files) == sorted(ref)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=2e-5, atol=2e-5, err_msg=k)
    assert np.abs(ref["forward"]).max() > 1      # not a test on zeros


def _tiny(V, Hkv, F=96):
    from test_graphs import _tiny_llama
    return _tiny_llama("cpu", seed=3, V=V, Hkv=Hkv, Hq=4, L=2, F=F)


_PROMPT = [3, 5, 7, 11, 2]


def _llama_logits(m, shard):
    model = m if shard is None else shard
    out = {"forward": model.forward(_PROMPT, model.new_cache(32), all_logits=True).numpy()}
    for fused in (True, False):
        cache = model.new_kv_cache(1, 16)
        toks = nbx.tensor(np.array([_PROMPT]), dtype=nbx.int64)
        pos = nbx.tensor(np.arange(len(_PROMPT))[None], dtype=nbx.int32)
        out[f"prefill{fused}"] = model.prefill(toks, pos, cache, fused=fused).numpy()
        for i, t in enumerate((13, 17)):
            tt = nbx.tensor(np.array([[t]]), dtype=nbx.int64)
            pp = nbx.tensor(np.array([[len(_PROMPT) + i]]), dtype=nbx.int32)
            out[f"decode{fused}{i}"] = model.decode_step(tt, pp, cache, fused=fused).numpy()
    return out


def test_shard_llama_refusals():
    from nbxtensor.distributed.tensor_parallel import shard_llama
    m = _tiny(97, 2)
    with pytest.raises(ValueError, match="num_attention_heads 4 is not divisible by the world "
                                         "size 3"):
        shard_llama(m, rank=0, world_size=3, device="cpu")
    with pytest.raises(ValueError, match="intermediate_size 98 is not divisible by the world "
                                         "size 4"):
        shard_llama(_tiny(97, 2, F=98), rank=0, world_size=4, device="cpu")
    m.w["layers"][0]["w_extra"] = m.w["layers"][0]["wo"]
    with pytest.raises(NotImplementedError, match=r"layers\[0\] has weights \['w_extra'\]"):
        shard_llama(m, rank=0, world_size=2, device="cpu")


# ----------------------------------------------------------------------------- NCCL
def test_nccl_tables_and_error():
    assert nccl.nccl_dtype(nbx.bfloat16) == 9 and nccl.nccl_dtype(nbx.float32) == 7
    assert nccl.nccl_dtype(nbx.int8) == 0 and nccl.nccl_dtype(nbx.int64) == 4
    with pytest.raises(TypeError, match="NCCL has no data type for int16"):
        nccl.nccl_dtype(nbx.int16)
    assert nccl.REDUCE_OPS == {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
    e = nccl.NcclError(5, "ncclAllReduce", "invalid usage", "peer 1 unreachable")
    assert e.name == "ncclInvalidUsage" and "ncclAllReduce failed: ncclInvalidUsage (5)" in str(e)
    assert "NCCL says: peer 1 unreachable" in str(e)
    assert [nccl.RESULTS[i] for i in (1, 2, 3, 4, 6, 7)] == [
        "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError", "ncclInvalidArgument",
        "ncclRemoteError", "ncclInProgress"]
    u = nccl.UniqueId.from_bytes(bytes(range(128)))
    assert u.to_bytes() == bytes(range(128))
    c = nccl.config(blocking=False)
    assert (c.magic, c.version, c.blocking, c.minCTAs) == (0xcafebeef, 21800, 0, -2**31)
    assert nccl.library_candidates()[-1] == "libnccl.so.2"


def test_nccl_absent_is_said(monkeypatch):
    if dist.is_nccl_available():
        pytest.skip("libnccl is installed here")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    with pytest.raises(dist.NcclUnavailable, match="libnccl.so.2 not found"):
        dist.init_process_group("nccl", rank=0, world_size=1)
    assert not dist.is_initialized()


def test_set_nccl_env_turns_multicast_off(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    config.set_nccl_env()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"


@pytest.mark.cuda
def test_nccl_world_size_one(monkeypatch):
    """One rank through NCCL on cuda:0: every collective, the NVLS switch, graph capture."""
    if not nbx.cuda.is_available() or not dist.is_nccl_available():
        pytest.skip("needs a GPU and libnccl.so.2")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    store = TCPStore("127.0.0.1", 0, is_server=True, timeout=60)
    dist.init_process_group("nccl", rank=0, world_size=1, store=store, timeout=60, device="cuda:0")
    try:
        assert os.environ["NCCL_NVLS_ENABLE"] == "0"
        rng = np.random.default_rng(1)
        a = rng.standard_normal(1000 + 3).astype(np.float32)
        t = nbx.tensor(a, device="cuda:0")
        for op in ("sum", "max", "avg"):
            dist.all_reduce(t, op)
        out = nbx.empty((1, 1003), device="cuda:0")
        dist.all_gather_into_tensor(out, t)
        rs = nbx.empty((1003,), device="cuda:0")
        dist.reduce_scatter_tensor(rs, out)
        dist.broadcast(t, 0)
        dist.barrier()
        np.testing.assert_allclose(rs.numpy(), a, rtol=1e-6)
        with pytest.raises(TypeError, match="int16"):
            dist.all_reduce(nbx.ones(3, dtype=nbx.int16, device="cuda:0"))
        # captured: the all_reduce replays on the graph's stream
        b = nbx.tensor(a, device="cuda:0")
        s = nbx.cuda.Stream()
        with nbx.cuda.stream(s):
            y = b * 2
            dist.all_reduce(y)
            g = nbx.cuda.CUDAGraph()
            with nbx.cuda.graph(g):
                y2 = b * 3
                dist.all_reduce(y2, "sum")
        b.copy_(nbx.tensor(a + 1, device="cuda:0"))
        g.replay()
        nbx.cuda.synchronize()
        np.testing.assert_allclose(y2.numpy(), (a + 1) * 3, rtol=1e-6)
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- rank scripts
def _w_allreduce(out):
    dist.init_process_group("fake", timeout=60)
    r = dist.get_rank()
    env = config.launch_env()
    print(f"world {dist.get_world_size()} local_rank {env['LOCAL_RANK']}", flush=True)
    t = nbx.tensor((np.arange(5) + 10 * r + 0.25).astype(np.float32))
    dist.all_reduce(t)
    print("sum", t.numpy().tolist(), flush=True)
    # every other collective, its result written to OUT/coll{rank}.npz for the test to check
    x = nbx.tensor((np.arange(6).reshape(3, 2) + 100 * r).astype(np.float32))
    res = {}
    for op in ("prod", "max", "min", "avg"):
        y = x.clone()
        dist.all_reduce(y, op)
        res[op] = y.numpy()
    g = nbx.empty((6, 2))
    dist.all_gather_into_tensor(g, x)
    lst = [nbx.empty((3, 2)) for _ in range(2)]
    dist.all_gather(lst, x)
    rs = nbx.empty((2, 2))
    dist.reduce_scatter_tensor(rs, nbx.tensor((np.arange(8).reshape(4, 2) * (r + 1)).astype(np.float32)))
    b = x.clone()
    dist.broadcast(b, 1)
    p2p = nbx.zeros((3, 2))
    if r == 0:
        dist.send(x, 1)
        dist.recv(p2p, 1)
    else:
        dist.recv(p2p, 0)
        dist.send(x, 0)
    dist.barrier()
    np.savez(os.path.join(out, f"coll{r}.npz"), gather=g.numpy(), list0=lst[0].numpy(),
             list1=lst[1].numpy(), rs=rs.numpy(), bcast=b.numpy(), p2p=p2p.numpy(), **res)
    dist.destroy_process_group()


def _w_fail(out):
    if config.launch_env()["RANK"] == "1":
        deadline = time.monotonic() + 60         # fail once rank 0 is up and has said its pid
        while not os.path.exists(os.path.join(out, "rank0.pid")) and time.monotonic() < deadline:
            time.sleep(0.05)
        print("failing now", flush=True)
        sys.exit(3)
    with open(os.path.join(out, "rank0.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(100)
    print("survived", flush=True)


def _w_sigwait(out):
    r = config.launch_env()["RANK"]

    def on(sig, frame):
        print(f"rank {r} got signal {sig}", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, on)
    open(os.path.join(out, f"ready{r}"), "w").close()
    time.sleep(100)


def _w_deadpeer(out):
    dist.init_process_group("fake", timeout=3)
    if dist.get_rank() == 1:
        os._exit(0)             # leaves without taking part (and without destroy)
    dist.all_reduce(nbx.ones(4))


def _w_mismatch(out, what):
    dist.init_process_group("fake", timeout=30)
    r = dist.get_rank()
    n = 5 if (what == "shape" and r == 1) else 4
    dt = nbx.float64 if (what == "dtype" and r == 1) else nbx.float32
    t = nbx.ones(n, dtype=dt)
    if what == "op" and r == 1:
        dist.broadcast(t, 0)
    else:
        dist.all_reduce(t)


def _w_fileinit(out, folder):
    dist.init_process_group("fake", init_method=f"file://{folder}", timeout=30)
    t = nbx.tensor(np.array([dist.get_rank() + 1.0], np.float32))
    dist.all_reduce(t)
    print("sum", float(t.numpy()[0]), flush=True)
    dist.destroy_process_group()


def _w_linear(out, device, backend):
    from nbxtensor.distributed.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    dist.init_process_group(backend, timeout=120, **({"device": device} if backend == "fake" else {}))
    dev = dist.get_device()
    r = dist.get_rank()
    x, w1, b1, w2, b2 = _linear_data(np.random.default_rng(7))
    T = lambda a: nbx.tensor(a, device=dev)  # noqa: E731
    col = ColumnParallelLinear(T(w1), T(b1))
    row = RowParallelLinear(T(w2), T(b2))
    xs = T(x)
    h_local = col(xs)
    assert tuple(h_local.shape) == (5, 21)
    y = row(h_local)
    h = ColumnParallelLinear(T(w1), T(b1), gather_output=True)(xs)
    rowx = RowParallelLinear(T(w1[:6]), input_is_parallel=False)(xs)
    np.savez(os.path.join(out, f"linear{r}.npz"), y=y.numpy(), h=h.numpy(), rowx=rowx.numpy())
    dist.destroy_process_group()


def _w_llama(out, V, Hkv):
    from nbxtensor.distributed.tensor_parallel import shard_llama
    dist.init_process_group("fake", timeout=120)
    m = _tiny(int(V), int(Hkv))
    tp = shard_llama(m)
    assert tp.cfg.num_attention_heads == 2 and tp.w["layers"][0]["w_gate"].shape[0] == 48
    assert tp.vocab_parallel == (int(V) % 2 == 0)
    np.savez(os.path.join(out, f"llama{dist.get_rank()}.npz"), **_llama_logits(m, tp))
    dist.destroy_process_group()


_WORKERS = {"allreduce": _w_allreduce, "fail": _w_fail, "sigwait": _w_sigwait,
            "deadpeer": _w_deadpeer, "mismatch": _w_mismatch, "fileinit": _w_fileinit,
            "linear": _w_linear, "llama": _w_llama}

if __name__ == "__main__":
    _WORKERS[sys.argv[1]](*sys.argv[2:])
