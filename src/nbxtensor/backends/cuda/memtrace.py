"""Memory traces: record every allocation and free to a TSV, replay a trace offline.

Record (on a GPU):

    with nbx.cuda.record_memory_trace("run.tsv"):
        model(x)

Each line: seq, t_us (since the start), event (alloc, free, segment_alloc, segment_free,
oom), device, stream, ptr, size (the rounded block or segment), requested (bytes asked), and
site (file:line of the first frame outside nbxtensor that led to the call).

Replay (anywhere, no GPU: the allocator runs over FakeRaw):

    python -m nbxtensor.backends.cuda.memtrace replay run.tsv [--json]

reports, per device, the peak of live bytes (the sum of requested sizes alive at once, a
property of the program), the peak of allocated (rounded) and reserved bytes our allocator
reaches on that sequence, and reserved/live: the memory the cache costs over the ideal.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

from . import memory

__all__ = ["Recorder", "record", "read_trace", "replay", "main", "HEADER"]

HEADER = "seq\tt_us\tevent\tdevice\tstream\tptr\tsize\trequested\tsite"
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_CONTEXTLIB = os.sep + "contextlib.py"    # the `with` machinery between a user and our code


def call_site() -> str:
    """file:line of the innermost frame outside the nbxtensor package."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIR) and not fn.endswith(_CONTEXTLIB):
            return f"{os.path.basename(fn)}:{f.f_lineno}"
        f = f.f_back
    return "-"


class Recorder:
    """Writes allocator events to a TSV file (line-buffered by a lock, thread-safe)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._f = open(self.path, "w", encoding="utf-8")
        self._f.write("# nbxtensor memory trace v1\n" + HEADER + "\n")
        self._lock = threading.Lock()
        self._seq = 0
        self._t0 = time.perf_counter_ns()

    def record(self, event, device, stream, ptr, size, requested) -> None:
        site = call_site()
        t = (time.perf_counter_ns() - self._t0) // 1000
        with self._lock:
            if self._f is None:
                return
            self._f.write(f"{self._seq}\t{t}\t{event}\t{device}\t{stream:#x}\t{ptr:#x}\t{size}\t"
                          f"{requested}\t{site}\n")
            self._seq += 1

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


@contextmanager
def record(path):
    """Record every allocator event of every device to `path` inside the block."""
    if memory._trace is not None:
        raise RuntimeError(f"record_memory_trace: already recording to {memory._trace.path!r}; "
                           f"recordings do not nest")
    rec = Recorder(path)
    memory.set_trace(rec)
    try:
        yield rec
    finally:
        memory.set_trace(None)
        rec.close()


def read_trace(path):
    """Yield (event, device, stream, ptr, size, requested, site) from a trace file."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith("#") or line.startswith("seq\t") or not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 9:
                raise ValueError(f"{path}:{lineno}: expected 9 tab-separated fields "
                                 f"({HEADER!r}), got {len(parts)}")
            try:
                yield (parts[2], parts[3], int(parts[4], 16), int(parts[5], 16), int(parts[6]),
                       int(parts[7]), parts[8])
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: bad field: {e}") from None


def _new_report() -> dict:
    return {"live": 0, "peak_live": 0, "allocs": 0, "frees": 0, "unmatched_frees": 0,
            "recorded_reserved": 0, "recorded_peak_reserved": 0}


def replay(events, raw_factory=None) -> dict:
    """Run alloc/free events (from read_trace, or tuples (event, device, stream, ptr, size,
    requested[, site])) through fresh allocators over `raw_factory()` (default FakeRaw).
    Returns, per device, a dict of peak_live, peak_allocated, peak_reserved, ratio
    (reserved/live) and counts. At the end every block still live is freed and the cache
    emptied, so a replay over real device memory gives it all back.

    Frees of blocks allocated before the recording started are counted as unmatched."""
    raw_factory = raw_factory or memory.FakeRaw
    allocs, live, out = {}, {}, {}
    for ev in events:
        kind, dev, stream, ptr = ev[0], ev[1], ev[2], ev[3]
        if kind == "alloc":
            a = allocs.get(dev)
            if a is None:
                a = allocs[dev] = memory.CachingAllocator(raw_factory(), dev)
                a._trace = None
            r = out.get(dev) or out.setdefault(dev, _new_report())
            requested = ev[5]
            live[dev, ptr] = (a.malloc(requested, stream), requested)
            r["allocs"] += 1
            r["live"] += requested
            if r["live"] > r["peak_live"]:
                r["peak_live"] = r["live"]
        elif kind == "free":
            hit = live.pop((dev, ptr), None)
            if hit is None:
                if dev in out:
                    out[dev]["unmatched_frees"] += 1
                continue
            allocs[dev].free(hit[0])
            out[dev]["frees"] += 1
            out[dev]["live"] -= hit[1]
        elif kind in ("segment_alloc", "segment_free"):
            # what the recorded run reserved, for comparison with the replay
            r = out.get(dev) or out.setdefault(dev, _new_report())
            r["recorded_reserved"] += ev[4] if kind == "segment_alloc" else -ev[4]
            r["recorded_peak_reserved"] = max(r["recorded_peak_reserved"], r["recorded_reserved"])
    peaks = {dev: (a.peak_allocated, a.peak_reserved) for dev, a in allocs.items()}
    for (dev, _), (block, _) in live.items():
        allocs[dev].free(block)
    for a in allocs.values():
        a.empty_cache()
    result = {}
    for dev, r in out.items():
        a = allocs.get(dev)
        pa, pr = peaks.get(dev, (0, 0))
        result[dev] = {"peak_live": r["peak_live"], "peak_allocated": pa, "peak_reserved": pr,
                       "ratio": (pr / r["peak_live"]) if r["peak_live"] else float("nan"),
                       "allocs": r["allocs"], "frees": r["frees"],
                       "unmatched_frees": r["unmatched_frees"],
                       "segments": a.num_segment_allocs if a else 0,
                       "recorded_peak_reserved": r["recorded_peak_reserved"]}
    return result


def _format(result: dict) -> str:
    fb = memory.format_bytes
    lines = []
    for dev, r in result.items():
        lines += [f"{dev}: {r['allocs']} allocs, {r['frees']} frees "
                  f"({r['unmatched_frees']} of blocks allocated before the trace), "
                  f"{r['segments']} segments",
                  f"  peak live bytes (requested):    {r['peak_live']:>15,}  {fb(r['peak_live'])}",
                  f"  peak allocated bytes (rounded): {r['peak_allocated']:>15,}  {fb(r['peak_allocated'])}",
                  f"  peak reserved bytes:            {r['peak_reserved']:>15,}  {fb(r['peak_reserved'])}",
                  f"  reserved / live:                {r['ratio']:>15.4f}"]
        if r["recorded_peak_reserved"]:
            lines.append(f"  (recorded run's peak reserved:  {r['recorded_peak_reserved']:>14,})")
    return "\n".join(lines) if lines else "no allocations in the trace"


def main(argv=None) -> int:
    import argparse
    import json
    ap = argparse.ArgumentParser(prog="python -m nbxtensor.backends.cuda.memtrace",
                                 description="Replay an nbxtensor memory trace through the "
                                             "caching allocator (over a fake device, no GPU).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser("replay", help="report peak live, peak reserved and their ratio")
    rp.add_argument("trace", help="a TSV written by nbx.cuda.record_memory_trace")
    rp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    try:
        result = replay(read_trace(args.trace))
    except (OSError, ValueError) as e:
        print(f"memtrace: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else _format(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
