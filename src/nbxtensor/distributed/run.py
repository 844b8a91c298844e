"""`python -m nbxtensor.distributed.run -n 2 [--master-port P] script.py args...`

Starts N copies of the script, rank r with RANK=r, LOCAL_RANK=r (its CUDA device),
WORLD_SIZE=N, MASTER_ADDR and MASTER_PORT (default: a free port), as torchrun does on one
machine. Each output line is prefixed with its rank ("[rank1] ..."). When a rank fails,
the others are stopped (SIGTERM, then SIGKILL after --grace seconds) and the launcher exits
with the first failure's status (128+N for a rank killed by signal N). SIGINT, SIGTERM and
SIGHUP sent to the launcher are forwarded to every rank.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from .. import config as _config

__all__ = ["main", "free_port"]

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now on `host` (the kernel's pick; another process could take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _pump(stream, out, prefix: bytes, lock):
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
            out.flush()
    stream.close()


def _status(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m nbxtensor.distributed.run",
                                description="Start N ranks of a script on this machine.")
    p.add_argument("-n", "--nproc-per-node", type=int, required=True, metavar="N",
                   help="number of ranks (one per GPU)")
    p.add_argument("--master-addr", default="127.0.0.1", help="the store's host (default %(default)s)")
    p.add_argument("--master-port", type=int, default=None,
                   help="the store's port (default: a free port)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping ranks (default %(default)s)")
    p.add_argument("script", help="the Python script every rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    a = p.parse_args(argv)
    if a.nproc_per_node < 1:
        p.error(f"-n must be >= 1, got {a.nproc_per_node}")
    if a.master_port is not None and not 0 < a.master_port < 65536:
        p.error(f"--master-port must be in 1..65535, got {a.master_port}")
    if a.grace < 0:
        p.error(f"--grace must be >= 0, got {a.grace}")
    return a


class _Ranks:
    def __init__(self, procs, grace):
        self.procs, self.grace = procs, grace

    def signal_all(self, sig):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)      # its own process group: the rank and its children
                except ProcessLookupError:
                    pass

    def stop(self):
        """SIGTERM to every live rank, SIGKILL to those alive `grace` seconds later."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.signal_all(signal.SIGKILL)
        for p in self.procs:
            p.wait()


def main(argv=None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    n = a.nproc_per_node
    port = a.master_port or free_port(a.master_addr)
    lock = threading.Lock()
    procs, pumps = [], []
    received: list = []

    def on_signal(sig, frame):
        received.append(sig)
        # a second signal means the ranks did not stop on the first: no more waiting
        ranks.signal_all(sig if len(received) == 1 else signal.SIGKILL)
    ranks = _Ranks(procs, a.grace)
    old = {s: signal.signal(s, on_signal) for s in _FORWARDED}
    try:
        for r in range(n):
            env = _config.child_env(RANK=r, LOCAL_RANK=r, WORLD_SIZE=n, LOCAL_WORLD_SIZE=n,
                                    MASTER_ADDR=a.master_addr, MASTER_PORT=port)
            p = subprocess.Popen([sys.executable, "-u", a.script, *a.args], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
            procs.append(p)
            for stream, out in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                t = threading.Thread(target=_pump, args=(stream, out, f"[rank{r}] ".encode(), lock),
                                     daemon=True)
                t.start()
                pumps.append(t)
        first = None                     # (rank, status) of the first failure
        while True:
            live = False
            for r, p in enumerate(procs):
                rc = p.poll()
                if rc is None:
                    live = True
                elif rc != 0 and first is None:
                    first = (r, _status(rc))
            if first is not None or not live:
                break
            time.sleep(0.02)
        if first is not None and any(p.poll() is None for p in procs):
            if not received:
                with lock:
                    sys.stderr.write(f"nbx.distributed.run: rank {first[0]} exited with status "
                                     f"{first[1]}; stopping the other ranks\n")
                    sys.stderr.flush()
            ranks.stop()
    except BaseException:
        ranks.stop()
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for t in pumps:
        t.join(timeout=5.0)
    if first is not None:
        return first[1]
    return 128 + received[0] if received else 0


if __name__ == "__main__":
    sys.exit(main())
