"""Key-value stores for the rendezvous: a TCP store (a server thread in rank 0) and a file store.

Both offer `set(key, bytes)`, `get(key, timeout)`, `wait(keys, timeout)`, `add(key, n)`,
`delete(key)`. Every wait is bounded: a key that does not appear in time raises
`StoreTimeout` carrying the keys still missing, so a caller can say which rank is late.
`exchange` is the one pattern built on top: every rank puts a value under a tag and reads
everyone's (the rendezvous, the barrier, the debug signature check and the fake
communicator all use it).

The TCP protocol: each message is a 4-byte count of parts, then each part as a 4-byte
length and its bytes. A request's parts are (command, key, ...); a reply's first part is
b"ok", b"timeout" or b"error". Meant for the machines of one job on trusted networks
(localhost by default): nothing is authenticated.
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
import threading
import time

__all__ = ["Store", "TCPStore", "FileStore", "StoreTimeout", "StoreError", "exchange"]

_POLL_S = 0.01          # the file store's polling period


class StoreError(RuntimeError):
    """The store cannot be used: its server is gone, its folder unusable, a reply malformed."""


class StoreTimeout(TimeoutError):
    """Keys did not appear within the timeout. `.missing` lists them."""

    def __init__(self, missing, timeout: float, message: str | None = None):
        self.missing = list(missing)
        self.timeout = timeout
        super().__init__(message or f"store: key{'s' if len(self.missing) > 1 else ''} "
                         f"{', '.join(map(repr, self.missing[:8]))} did not appear within "
                         f"{timeout:g} s")


def _check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


class Store:
    """The interface; `timeout` is the default bound of get/wait."""

    timeout: float

    def set(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str, timeout: float | None = None) -> bytes:
        raise NotImplementedError

    def wait(self, keys, timeout: float | None = None) -> None:
        raise NotImplementedError

    def add(self, key: str, amount: int = 1) -> int:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- TCP
def _send(sock, *parts: bytes) -> None:
    buf = [struct.pack("!I", len(parts))]
    for p in parts:
        buf.append(struct.pack("!I", len(p)))
        buf.append(p)
    sock.sendall(b"".join(buf))


def _recv_exact(sock, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        c = sock.recv(min(n - got, 1 << 20))
        if not c:
            raise ConnectionError("connection closed")
        chunks.append(c)
        got += len(c)
    return b"".join(chunks)


_MAX_PARTS, _MAX_PART = 1 << 16, 1 << 31


def _recv(sock) -> list:
    (n,) = struct.unpack("!I", _recv_exact(sock, 4))
    if n > _MAX_PARTS:
        raise ConnectionError(f"malformed message: {n} parts")
    parts = []
    for _ in range(n):
        (m,) = struct.unpack("!I", _recv_exact(sock, 4))
        if m > _MAX_PART:
            raise ConnectionError(f"malformed message: a part of {m} bytes")
        parts.append(_recv_exact(sock, m))
    return parts


class _Server:
    """The store's state and one thread per client connection (a job has few ranks)."""

    def __init__(self, host: str, port: int):
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            raise StoreError(f"TCP store: cannot listen on {host}:{port} ({e.strerror or e}); "
                             f"is another job using MASTER_PORT {port}?") from None
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        self.conns: list = []
        threading.Thread(target=self._accept, name="nbx-store-accept", daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="nbx-store-conn",
                             daemon=True).start()

    def _serve(self, conn):
        try:
            while True:
                req = _recv(conn)
                _send(conn, *self._handle(req))
        except (ConnectionError, OSError, struct.error):
            pass
        finally:
            conn.close()

    def _wait_for(self, keys, timeout) -> list:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                missing = [k for k in keys if k not in self.data]
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self.closed:
                    return missing
                self.cond.wait(left)

    def _handle(self, req):
        cmd = req[0]
        if cmd == b"set":
            with self.cond:
                self.data[req[1].decode()] = req[2]
                self.cond.notify_all()
            return (b"ok",)
        if cmd == b"get":
            key = req[1].decode()
            missing = self._wait_for([key], float(req[2]))
            if missing:
                return (b"timeout", key.encode())
            with self.cond:
                return (b"ok", self.data[key])
        if cmd == b"wait":
            missing = self._wait_for([k.decode() for k in req[2:]], float(req[1]))
            return (b"ok",) if not missing else (b"timeout", *[k.encode() for k in missing])
        if cmd == b"add":
            key = req[1].decode()
            with self.cond:
                v = int(self.data.get(key, b"0")) + int(req[2])
                self.data[key] = str(v).encode()
                self.cond.notify_all()
            return (b"ok", str(v).encode())
        if cmd == b"delete":
            with self.cond:
                self.data.pop(req[1].decode(), None)
            return (b"ok",)
        return (b"error", b"unknown command " + cmd[:32])

    def close(self):
        self.closed = True
        with self.cond:
            self.cond.notify_all()
        try:
            self.sock.close()
        except OSError:
            pass
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass


class TCPStore(Store):
    """A client of the store at host:port; with `is_server` it also runs the server (rank 0).

    port=0 with is_server picks a free port (`.port` says which). The client connects within
    `connect_timeout` (default: `timeout`), retrying while the server is not up yet."""

    def __init__(self, host: str, port: int, *, is_server: bool = False, timeout: float = 120.0,
                 connect_timeout: float | None = None):
        self.timeout = _check_timeout(timeout)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"TCPStore: port must be an int in [0, 65535], got {port!r}")
        if port == 0 and not is_server:
            raise ValueError("TCPStore: port 0 (any free port) needs is_server=True")
        self.host = host
        self._server = _Server(host, port) if is_server else None
        self.port = self._server.port if is_server else port
        self._lock = threading.Lock()
        self._sock = self._connect(_check_timeout(connect_timeout or timeout))

    def _connect(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                s = socket.create_connection((self.host, self.port), timeout=min(timeout, 5.0))
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise StoreError(f"TCP store: could not reach {self.host}:{self.port} within "
                                     f"{timeout:g} s ({e.strerror or e}); has rank 0 started?"
                                     ) from None
                time.sleep(0.05)

    def _call(self, *parts, wait: float | None = None):
        with self._lock:
            if self._sock is None:
                raise StoreError("TCP store: used after close()")
            # a waiting request has the server answer at its deadline; the socket waits longer
            self._sock.settimeout(None if wait is None else wait + 30.0)
            try:
                _send(self._sock, *parts)
                rep = _recv(self._sock)
            except (ConnectionError, OSError) as e:
                self._sock.close()
                self._sock = None
                raise StoreError(f"TCP store: lost the connection to {self.host}:{self.port} "
                                 f"({e}); rank 0, which hosts the store, may have died") from None
        if rep[0] == b"error":
            raise StoreError(f"TCP store: {rep[1].decode(errors='replace')}")
        return rep

    def set(self, key, value):
        self._call(b"set", key.encode(), bytes(value))

    def get(self, key, timeout=None):
        t = _check_timeout(timeout or self.timeout)
        rep = self._call(b"get", key.encode(), repr(t).encode(), wait=t)
        if rep[0] == b"timeout":
            raise StoreTimeout([key], t)
        return rep[1]

    def wait(self, keys, timeout=None):
        keys = list(keys)
        t = _check_timeout(timeout or self.timeout)
        rep = self._call(b"wait", repr(t).encode(), *[k.encode() for k in keys], wait=t)
        if rep[0] == b"timeout":
            raise StoreTimeout([k.decode() for k in rep[1:]], t)

    def add(self, key, amount=1):
        return int(self._call(b"add", key.encode(), str(int(amount)).encode())[1])

    def delete(self, key):
        self._call(b"delete", key.encode())

    def close(self):
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        if self._server is not None:
            self._server.close()
            self._server = None


# ----------------------------------------------------------------------------- file
class FileStore(Store):
    """A store in a folder every rank can read: one file per key, written atomically
    (a temporary file renamed over the key), read by polling; `add` under an flock."""

    def __init__(self, path, timeout: float = 120.0):
        self.timeout = _check_timeout(timeout)
        self.path = os.fspath(path)
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise StoreError(f"file store: cannot create the folder {self.path!r} ({e})") from None
        if not os.path.isdir(self.path):
            raise StoreError(f"file store: {self.path!r} is not a folder")

    def _file(self, key: str) -> str:
        return os.path.join(self.path, key.encode().hex())

    def set(self, key, value):
        f = self._file(key)
        tmp = f"{f}.tmp{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "wb") as fh:
            fh.write(bytes(value))
        os.replace(tmp, f)

    def _read(self, key):
        try:
            with open(self._file(key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def get(self, key, timeout=None):
        t = _check_timeout(timeout or self.timeout)
        deadline = time.monotonic() + t
        while True:
            v = self._read(key)
            if v is not None:
                return v
            if time.monotonic() >= deadline:
                raise StoreTimeout([key], t)
            time.sleep(_POLL_S)

    def wait(self, keys, timeout=None):
        t = _check_timeout(timeout or self.timeout)
        deadline = time.monotonic() + t
        missing = list(keys)
        while True:
            missing = [k for k in missing if not os.path.exists(self._file(k))]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise StoreTimeout(missing, t)
            time.sleep(_POLL_S)

    def add(self, key, amount=1):
        with open(os.path.join(self.path, "lock"), "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            try:
                v = int(self._read(key) or b"0") + int(amount)
                self.set(key, str(v).encode())
                return v
            finally:
                fcntl.flock(lk, fcntl.LOCK_UN)

    def delete(self, key):
        try:
            os.remove(self._file(key))
        except FileNotFoundError:
            pass


# ----------------------------------------------------------------------------- exchange
def exchange(store: Store, tag: str, rank: int, world_size: int, value: bytes,
             timeout: float, what: str, late: str = "did not take part") -> list:
    """Every rank's `value` under `tag`, in rank order. A rank that does not contribute
    within `timeout` is named: "<what>: rank 1 did not take part within 30 s". The last
    rank to read removes the keys."""
    store.set(f"{tag}/{rank}", value)
    keys = [f"{tag}/{r}" for r in range(world_size)]
    try:
        store.wait(keys, timeout)
    except StoreTimeout as e:
        ranks = [k.rsplit("/", 1)[1] for k in e.missing]
        raise StoreTimeout(e.missing, timeout,
                           f"{what}: rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)} "
                           f"{late} within {timeout:g} s") from None
    vals = [value if r == rank else store.get(keys[r], timeout) for r in range(world_size)]
    if store.add(f"{tag}/read", 1) == world_size:
        for k in keys + [f"{tag}/read"]:
            store.delete(k)
    return vals
