"""Memory traces: recording allocator events to TSV and replaying them (no GPU: FakeRaw)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import nbxtensor as nbx
from nbxtensor.backends.cuda import memory, memtrace
from nbxtensor.backends.cuda.memory import CachingAllocator, FakeRaw

MiB = 1 << 20
THIS = os.path.basename(__file__)


@pytest.fixture
def alloc(monkeypatch):
    a = CachingAllocator(FakeRaw(), "cuda:0")
    monkeypatch.setitem(memory._allocators, 0, a)
    return a


def _lines(path):
    with open(path) as f:
        return [ln.rstrip("\n").split("\t") for ln in f if not ln.startswith(("#", "seq\t"))]


def test_record_writes_every_event_with_its_call_site(alloc, tmp_path):
    path = tmp_path / "t.tsv"
    early = alloc.malloc(100, stream=0x7)               # recorded only when freed
    with nbx.cuda.record_memory_trace(path):
        x = alloc.malloc(1000, stream=0x5); line_x = sys._getframe().f_lineno  # noqa: E702
        y = alloc.malloc(12 * MiB)
        alloc.free(x); line_free = sys._getframe().f_lineno  # noqa: E702
        alloc.free(early)
        alloc.free(y)
        alloc.empty_cache()
    alloc.malloc(100)                                   # after: not recorded
    rows = _lines(path)
    assert [r[2] for r in rows] == ["segment_alloc", "alloc", "segment_alloc", "alloc", "free", "free",
                                    "free", "segment_free", "segment_free", "segment_free"]
    assert [int(r[0]) for r in rows] == list(range(len(rows)))
    assert all(r[3] == "cuda:0" for r in rows)
    seg_x, ax = rows[0], rows[1]
    assert (ax[4], int(ax[5], 16), ax[6], ax[7]) == ("0x5", x.ptr, "1024", "1000")
    assert ax[8] == f"{THIS}:{line_x}"
    assert seg_x[6] == str(2 * MiB) and seg_x[8] == f"{THIS}:{line_x}"
    assert rows[4][8] == f"{THIS}:{line_free}" and int(rows[4][5], 16) == x.ptr
    assert memory._trace is None and alloc._trace is None


def test_recordings_do_not_nest(alloc, tmp_path):
    with nbx.cuda.record_memory_trace(tmp_path / "a.tsv"):
        with pytest.raises(RuntimeError, match="do not nest"):
            with nbx.cuda.record_memory_trace(tmp_path / "b.tsv"):
                pass
        alloc.malloc(10)
    assert len(_lines(tmp_path / "a.tsv")) == 2


def test_replay_reproduces_the_recorded_peaks(alloc, tmp_path):
    path = tmp_path / "t.tsv"
    gen = np.random.default_rng()
    live, peak_live, cur = [], 0, 0
    with nbx.cuda.record_memory_trace(path):
        for _ in range(300):
            if live and gen.random() < 0.5:
                b = live.pop(int(gen.integers(len(live))))
                cur -= b.requested
                alloc.free(b)
            else:
                n = int(gen.choice([gen.integers(1, 8192), gen.integers(1, 4 * MiB),
                                    gen.integers(10 * MiB, 30 * MiB)]))
                live.append(alloc.malloc(n))
                cur += n
                peak_live = max(peak_live, cur)
    res = memtrace.replay(memtrace.read_trace(path))["cuda:0"]
    assert res["peak_live"] == peak_live
    # the same sequence through the same allocator design: the same peaks
    assert res["peak_allocated"] == alloc.peak_allocated
    assert res["peak_reserved"] == alloc.peak_reserved == res["recorded_peak_reserved"]
    assert res["ratio"] == pytest.approx(alloc.peak_reserved / peak_live)
    assert res["allocs"] + res["frees"] == 300 and res["unmatched_frees"] == 0


def test_replay_counts_frees_of_unknown_blocks_and_gives_everything_back():
    evs = [("alloc", "cuda:0", 0, 0x1000, 512, 100), ("free", "cuda:0", 0, 0x9999, 0, 0),
           ("alloc", "cuda:0", 0, 0x2000, 12 * MiB, 12 * MiB), ("free", "cuda:0", 0, 0x1000, 0, 0),
           ("alloc", "cuda:1", 7, 0x1000, 512, 300)]
    raws = []

    def factory():
        raws.append(FakeRaw())
        return raws[-1]

    res = memtrace.replay(evs, factory)
    r = res["cuda:0"]
    assert (r["allocs"], r["frees"], r["unmatched_frees"]) == (2, 1, 1)
    assert r["peak_live"] == 12 * MiB + 100 and r["peak_reserved"] == 14 * MiB
    assert res["cuda:1"]["peak_live"] == 300 and res["cuda:1"]["peak_reserved"] == 2 * MiB
    # blocks still live at the end are freed and the cache emptied: a device replay leaks nothing
    assert len(raws) == 2 and all(raw.live == {} and raw.malloc_calls for raw in raws)


def test_read_trace_refuses_malformed_lines(tmp_path):
    p = tmp_path / "bad.tsv"
    p.write_text(memtrace.HEADER + "\n0\t1\talloc\tcuda:0\t0x0\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected 9 tab-separated fields"):
        list(memtrace.read_trace(p))


def _write_trace(path):
    evs = [("alloc", 0x1000, 3000), ("alloc", 0x2000, 5 * MiB), ("free", 0x1000, 0),
           ("alloc", 0x3000, 2000), ("free", 0x2000, 0), ("free", 0x3000, 0)]
    with open(path, "w") as f:
        f.write("# nbxtensor memory trace v1\n" + memtrace.HEADER + "\n")
        for i, (ev, ptr, n) in enumerate(evs):
            f.write(f"{i}\t{i}\t{ev}\tcuda:0\t0x0\t{ptr:#x}\t{n}\t{n}\tx.py:1\n")


def test_replay_cli(tmp_path, capsys):
    p = tmp_path / "t.tsv"
    _write_trace(p)
    assert memtrace.main(["replay", str(p)]) == 0
    out = capsys.readouterr().out
    assert "peak live bytes (requested):" in out and f"{3000 + 5 * MiB:,}" in out
    assert "peak reserved bytes:" in out and f"{22 * MiB:,}" in out and "reserved / live:" in out
    assert memtrace.main(["replay", str(p), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["cuda:0"]
    assert r["peak_reserved"] == 22 * MiB and r["peak_live"] == 3000 + 5 * MiB
    assert memtrace.main(["replay", str(tmp_path / "missing.tsv")]) == 2


def test_replay_as_a_module(tmp_path):
    p = tmp_path / "t.tsv"
    _write_trace(p)
    r = subprocess.run([sys.executable, "-m", "nbxtensor.backends.cuda.memtrace", "replay", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "reserved / live:" in r.stdout and "torch" not in r.stderr


def test_call_site_is_the_first_frame_outside_the_package(alloc, tmp_path, monkeypatch):
    from nbxtensor.backends.cuda import storage as st
    monkeypatch.setattr(st.driver, "set_device", lambda i: None)
    monkeypatch.setattr(st, "_stream_handle", lambda i: 0)
    path = tmp_path / "t.tsv"
    with nbx.cuda.record_memory_trace(path):
        t = nbx.empty(10, 20, device="cuda"); line = sys._getframe().f_lineno  # noqa: E702
        del t
    rows = _lines(path)
    assert [r[2] for r in rows] == ["segment_alloc", "alloc", "free"]
    assert rows[1][7] == "800"
    assert [r[8] for r in rows] == [f"{THIS}:{line}", f"{THIS}:{line}", f"{THIS}:{line + 1}"]
