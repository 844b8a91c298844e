"""The fakes of the test suite, in one module: stand-ins for libcuda and the GPU, so the
driver, launcher, allocator, graphs, staging, device-facts and DLPack logic runs on machines
without one. Each test module's fixtures wire them in with monkeypatch."""
from __future__ import annotations

import ctypes

import nbxtensor as nbx
from nbxtensor.backends.cuda import driver
from nbxtensor.backends.cuda.memory import FakeRaw
from nbxtensor.device import Device
from nbxtensor.io import staging
from nbxtensor.tensor import Tensor


# ---- from the dlpack tests
class FakeCuda:
    """The driver calls DLPack makes on cuda, recorded (no GPU needed)."""

    def __init__(self, monkeypatch, ndev=1):
        self.calls = []
        self.next = 0xE000
        mp = monkeypatch
        mp.setattr(driver, "availability", lambda: (True, "fake"))
        mp.setattr(driver, "device_count", lambda: ndev)
        mp.setattr(driver, "set_device", lambda i: None)
        mp.setattr(driver, "current_device", lambda: 0)
        mp.setattr(driver, "pointer_device", lambda p: self.calls.append(("pointer", p)) or 0)
        mp.setattr(driver, "event_create", self.event_create)
        mp.setattr(driver, "event_record", lambda e, s=0: self.calls.append(("record", e, s)))
        mp.setattr(driver, "stream_wait_event", lambda s, e: self.calls.append(("wait", s, e)))
        mp.setattr(driver, "event_destroy", lambda e: self.calls.append(("destroy", e)))

    def event_create(self, timing=True):
        assert timing is False      # an ordering event needs no timestamps
        self.next += 1
        self.calls.append(("create", self.next))
        return self.next

    def waits(self):
        """[(waiting stream, stream recorded on)] of each ordering done."""
        rec = {c[1]: c[2] for c in self.calls if c[0] == "record"}
        out = [(c[1], rec[c[2]]) for c in self.calls if c[0] == "wait"]
        assert sorted(c[1] for c in self.calls if c[0] == "destroy") == sorted(rec)
        return out


# ---- from the device_facts tests
# CUdevice_attribute codes (cuda.h) -> what a fake device reports
MULTIPROCESSOR_COUNT, L2_CACHE_SIZE, MAX_REGISTERS_PER_MULTIPROCESSOR = 16, 38, 82
MAX_THREADS_PER_MULTIPROCESSOR = 39
MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


class FakeAttributeDriver:
    """cuDeviceGetAttribute of a fake GPU with `sms` SMs (the other facts an H200's)."""

    def __init__(self, sms):
        self.asked = []
        self.values = {MULTIPROCESSOR_COUNT: sms, L2_CACHE_SIZE: 52428800,
                       MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,
                       MAX_REGISTERS_PER_MULTIPROCESSOR: 65536,
                       MAX_THREADS_PER_MULTIPROCESSOR: 2048, 75: 9, 76: 0}   # major, minor

    def __call__(self, out, attr, index):
        self.asked.append((attr, index))
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.values[attr]
        return 0


# ---- from the staging tests
class MemRaw(FakeRaw):
    """FakeRaw whose segments are backed by host bytearrays (the 'device memory')."""

    def __init__(self):
        super().__init__()
        self.mem = {}

    def malloc(self, nbytes):
        p = super().malloc(nbytes)
        self.mem[p] = bytearray(b"\xee" * nbytes)    # poison: unwritten bytes show
        return p

    def free(self, ptr):
        super().free(ptr)
        del self.mem[ptr]

    def locate(self, ptr, n):
        for base, buf in self.mem.items():
            if base <= ptr and ptr + n <= base + len(buf):
                return buf, ptr - base
        raise AssertionError(f"device range [{ptr:#x}, +{n}) not in any segment")


class FakeGPU:
    """The driver entry points the uploader uses, over host memory, with late execution."""

    def __init__(self, raw: MemRaw):
        self.raw = raw
        self.pinned = {}          # ptr -> ctypes buffer
        self.queues = {}          # stream -> [op]; op = ("copy", dst, src, n, snapshot) | ("event", e)
        self.events = {}          # event -> "created" | "pending" | "done"
        self.log = []
        self.violations = []
        self.fail_copy_at = None  # raise on the n-th async copy
        self.fail_host_alloc = False
        self.ncopies = 0
        self.next = 0x5000

    def _h(self):
        self.next += 0x10
        return self.next

    # pinned memory
    def mem_host_alloc(self, n, portable=True):
        if self.fail_host_alloc:
            raise driver.CudaError(2, f"cuMemHostAlloc(nbytes={n})")
        buf = (ctypes.c_uint8 * n)()
        p = ctypes.addressof(buf)
        self.pinned[p] = buf
        self.log.append(("host_alloc", p, n))
        return p

    def mem_free_host(self, p):
        for q in self.queues.values():
            for op in q:
                if op[0] == "copy" and p <= op[2] < p + len(self.pinned[p]):
                    self.violations.append(f"pinned {p:#x} freed with a copy from it in flight")
        del self.pinned[p]
        self.log.append(("host_free", p))

    def _pinned_of(self, src, n):
        for p, buf in self.pinned.items():
            if p <= src and src + n <= p + len(buf):
                return p
        return None

    # copies
    def memcpy_htod(self, dst, src, n, stream=None):
        self.ncopies += 1
        if self.fail_copy_at == self.ncopies:
            raise driver.CudaError(700, f"cuMemcpyHtoDAsync(nbytes={n})")
        if stream is None or stream not in self.queues:
            self.violations.append("synchronous copy or unknown stream")
        p = self._pinned_of(src, n)
        if p is None:
            self.violations.append(f"copy source {src:#x} is not pinned memory")
        for op in self.queues.get(stream, []):     # a queued copy from the same bytes?
            if op[0] == "copy" and op[2] < src + n and src < op[2] + op[3]:
                self.violations.append(f"staging bytes [{src:#x}, +{n}) reused before the copy "
                                       f"queued from them ran")
        snap = ctypes.string_at(src, n)
        self.queues[stream].append(("copy", dst, src, n, snap))
        self.log.append(("copy", dst, p, src - (p or 0), n))

    def _run(self, stream, until=None):
        q = self.queues[stream]
        while q:
            op = q.pop(0)
            if op[0] == "copy":
                _, dst, src, n, snap = op
                if self._pinned_of(src, n) is None:
                    self.violations.append("copy ran from freed pinned memory")
                    continue
                now = ctypes.string_at(src, n)
                if now != snap:
                    self.violations.append(f"staging bytes [{src:#x}, +{n}) overwritten before "
                                           f"their copy ran")
                buf, off = self.raw.locate(dst, n)
                buf[off:off + n] = now
            else:
                self.events[op[1]] = "done"
                if op[1] == until:
                    return

    # streams and events
    def stream_create(self, nonblocking=True):
        s = self._h()
        self.queues[s] = []
        self.log.append(("stream_create", s))
        return s

    def stream_destroy(self, s):
        if self.queues.pop(s):
            self.violations.append("stream destroyed with work queued")
        self.log.append(("stream_destroy", s))

    def stream_synchronize(self, s):
        self.log.append(("stream_sync", s))
        if s in self.queues:
            self._run(s)

    def event_create(self, timing=True):
        e = self._h()
        self.events[e] = "created"
        return e

    def event_destroy(self, e):
        del self.events[e]

    def event_record(self, e, stream=0):
        self.events[e] = "pending"
        self.queues[stream].append(("event", e))
        self.log.append(("event_record", e))

    def event_synchronize(self, e):
        self.log.append(("event_sync", e))
        if self.events[e] == "pending":
            s = next(s for s, q in self.queues.items() if ("event", e) in q)
            self._run(s, until=e)

    def event_query(self, e):
        return self.events[e] != "pending"

    def read(self, t):
        if t.nbytes == 0:
            return b""
        buf, off = self.raw.locate(t.data_ptr(), t.nbytes)
        return bytes(buf[off:off + t.nbytes])

    def leaks(self):
        """Resources neither freed nor idle in the staging pool."""
        pooled = {p for _, p in staging._POOL._free}
        assert pooled <= set(self.pinned), "the pool holds freed pinned memory"
        return {"pinned": len(set(self.pinned) - pooled), "streams": len(self.queues),
                "events": len(self.events)}


# ---- from the launcher tests
class FakeStorage:
    # _nbx_launch: the launcher's verification mark, as on CudaStorage
    __slots__ = ("device", "ptr", "nbytes", "_nbx_launch", "__weakref__")

    def __init__(self, ptr, nbytes=1 << 20, index=0):
        self.device = Device("cuda", index)
        self.ptr = ptr
        self.nbytes = nbytes


class FakeStorageNoMark:
    """A storage class without the mark slot: verified by id (the `vd` dict) instead."""
    __slots__ = ("device", "ptr", "nbytes", "__weakref__")

    def __init__(self, ptr, nbytes=1 << 20, index=0):
        self.device = Device("cuda", index)
        self.ptr = ptr
        self.nbytes = nbytes


def fake_cuda(shape, dtype=nbx.float32, ptr=0x7F0000000000, offset=0, stride=None, index=0, mark=True):
    from nbxtensor.tensor import contiguous_strides
    st = (FakeStorage if mark else FakeStorageNoMark)(ptr, index=index)
    return Tensor._make(st, shape, stride or contiguous_strides(shape), offset, nbx.dtypes.as_dtype(dtype))


class FakeAllocator:
    def __init__(self, lo=0x7F0000000000, hi=0x7F0000000000 + (1 << 30)):
        self.lo, self.hi, self.calls = lo, hi, 0

    def holds(self, ptr):
        self.calls += 1
        return self.lo <= ptr < self.hi


# ---- from the driver tests
class _FakeFn:
    def __init__(self, impl):
        self.impl, self.argtypes, self.restype = impl, None, None

    def __call__(self, *a):
        return self.impl(*a)


# ---- from the driver tests
class FakeLib:
    """Enough of libcuda for _load: cuInit fails like the stub library does."""

    def __init__(self, init_rc):
        def set_str(p, s):
            p._obj.value = s
            return 0
        names = {34: b"CUDA_ERROR_STUB_LIBRARY", 100: b"CUDA_ERROR_NO_DEVICE"}
        texts = {34: b"CUDA driver is a stub library", 100: b"no CUDA-capable device is detected"}
        self.cuInit = _FakeFn(lambda flags: init_rc)
        self.cuGetErrorName = _FakeFn(lambda c, p: set_str(p, names.get(c, b"CUDA_ERROR_UNKNOWN")))
        self.cuGetErrorString = _FakeFn(lambda c, p: set_str(p, texts.get(c, b"unknown")))


# ---- from the graphs tests
class FakeDriver:
    """Stands in for libcuda behind driver.fn(name): records calls, hands out handles,
    emulates stream capture (ops on a capturing stream are recorded into the graph, a
    synchronising call during capture invalidates it, as the real driver does)."""

    def __init__(self):
        self.calls = []          # (name, args) in order
        self.next = 0x1000
        self.capturing = {}      # stream -> list of recorded ops
        self.invalidated = set()
        self.graphs = {}         # graph handle -> ops
        self.execs = {}          # exec handle -> ops
        self.launched = []       # (exec, stream)
        self.destroyed = []
        self.thread_mode = driver.CAPTURE_MODE_GLOBAL

    def _handle(self):
        self.next += 0x100
        return self.next

    @staticmethod
    def _out(arg, value):
        arg._obj.value = value          # byref(x) -> write x

    def fn(self, name):
        def call(*args):
            a = [(x.value or 0) if isinstance(x, ctypes.c_void_p) else x for x in args]
            self.calls.append((name, a))
            return self.handle(name, args, a)
        return call

    def handle(self, name, args, a):
        if name == "cuDeviceGetCount":
            self._out(args[0], 1)
        elif name == "cuThreadExchangeStreamCaptureMode":
            prev = self.thread_mode
            self.thread_mode = args[0]._obj.value
            args[0]._obj.value = prev
        elif name == "cuMemAlloc":
            if self.capturing and self.thread_mode != driver.CAPTURE_MODE_RELAXED:
                for s in self.capturing:     # unsafe under a global capture: invalidates it
                    self.invalidated.add(s)
                return 900
            self._out(args[0], self._handle() << 20)
        elif name in ("cuStreamCreate", "cuEventCreate"):
            self._out(args[0], self._handle())
        elif name == "cuStreamBeginCapture":
            if not a[0]:
                return 1
            self.capturing[a[0]] = []
        elif name == "cuStreamEndCapture":
            ops = self.capturing.pop(a[0], None)
            if ops is None:
                return 1
            if a[0] in self.invalidated:
                self.invalidated.discard(a[0])
                return 901
            h = self._handle()
            self.graphs[h] = ops
            self._out(args[1], h)
        elif name == "cuGraphGetNodes":
            ops = self.graphs[a[0]]
            args[2]._obj.value = len(ops)
        elif name == "cuGraphInstantiateWithFlags":
            h = self._handle()
            self.execs[h] = list(self.graphs[a[1]])
            self._out(args[0], h)
        elif name == "cuGraphLaunch":
            self.launched.append((a[0], a[1]))
        elif name in ("cuGraphExecDestroy", "cuGraphDestroy", "cuStreamDestroy"):
            self.destroyed.append((name, a[0]))
        elif name in ("cuMemsetD32Async", "cuMemcpyDtoDAsync", "cuMemcpyHtoDAsync"):
            s = a[-1]
            if s in self.capturing:
                self.capturing[s].append((name, a[:-1]))
        elif name in ("cuCtxSynchronize", "cuStreamSynchronize", "cuMemcpyDtoH", "cuMemcpyHtoD"):
            for s in self.capturing:         # what the real driver does: the capture is lost
                self.invalidated.add(s)
        return 0

    def names(self):
        return [n for n, _ in self.calls]


# ---- from the transfer tests
class FakeTransferGPU(FakeGPU):
    """FakeGPU with the legacy stream (0) as a queue, synchronous copies that first drain it
    (the legacy stream's ordering) and device-to-host copies, sync and async (late, like the
    host-to-device ones: an async copy lands only when its stream or an event after it is
    synchronised)."""

    def __init__(self, raw):
        super().__init__(raw)
        self.queues[0] = []

    def memcpy_htod(self, dst, src, n, stream=None):
        if stream is not None:
            return super().memcpy_htod(dst, src, n, stream)
        self._run(0)
        self.log.append(("sync_htod", dst, src, n))
        buf, off = self.raw.locate(dst, n)
        buf[off:off + n] = ctypes.string_at(src, n)

    def memcpy_dtoh(self, dst, src, n, stream=None):
        if stream is None:
            self._run(0)
            self.log.append(("sync_dtoh", dst, src, n))
            buf, off = self.raw.locate(src, n)
            ctypes.memmove(dst, bytes(buf[off:off + n]), n)
            return
        if self._pinned_of(dst, n) is None:
            self.violations.append(f"async copy destination {dst:#x} is not pinned memory")
        self.queues[stream].append(("dtoh", dst, src, n))
        self.log.append(("dtoh", dst, src, n))

    def _run(self, stream, until=None):
        q = self.queues[stream]
        while q:
            op = q.pop(0)
            if op[0] == "dtoh":
                _, dst, src, n = op
                if self._pinned_of(dst, n) is None:
                    self.violations.append("copy ran into freed pinned memory")
                    continue
                buf, off = self.raw.locate(src, n)
                ctypes.memmove(dst, bytes(buf[off:off + n]), n)
            elif op[0] == "copy":           # as FakeGPU runs a host-to-device copy
                _, dst, src, n, snap = op
                if self._pinned_of(src, n) is None:
                    self.violations.append("copy ran from freed pinned memory")
                    continue
                now = ctypes.string_at(src, n)
                if now != snap:
                    self.violations.append(f"pinned bytes [{src:#x}, +{n}) overwritten before "
                                           f"their copy ran")
                buf, off = self.raw.locate(dst, n)
                buf[off:off + n] = now
            else:
                self.events[op[1]] = "done"
                if op[1] == until:
                    return

    def stream_synchronize(self, s):
        self.log.append(("stream_sync", s))
        self._run(s)

    def pending(self, stream=0):
        return len(self.queues[stream])
