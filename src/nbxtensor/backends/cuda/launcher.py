"""Our Triton launcher: bind arguments, compile (Triton, on-disk cache), load, launch.

Triton is only the compiler here. Everything between `nbx.launch(kernel, grid, ...)`
and the GPU is ours:

  bind      each argument gets Triton 3.6's specialisation (see `spec_of`): a tensor
            becomes a typed pointer (`*fp16`), marked 16-byte aligned ('D' ->
            `tt.divisibility=16`) when its address is; an int becomes i32/i64/u64 by
            range, marked divisible by 16 when it is, and the constant 1 when it equals
            1; a float is fp32; a bool u1; None a constexpr.
  compile   first the kernel archive (aot.py: cubins built ahead of time by `nbx
            build-kernels`, looked up by launch key without Triton); else
            `triton.compile(ASTSource(...), target=GPUTarget('cuda', cc, 32))`; Triton's
            on-disk cache makes a second process's compile a file read.
  load      cuModuleLoadData through our driver; above 48 KB of shared memory the
            dynamic shared-memory opt-in, above the device's opt-in limit a refusal.
  launch    the kernel-parameter buffer is kept per (kernel, argument kinds) and
            rewritten in place by one `struct.pack_into`, then one cuLaunchKernel (or
            cuLaunchKernelEx, its CUlaunchConfig in the same buffer: the fast launchers
            where the driver has it, and entries with launch attributes).
  fast      after its first launch, each prepared entry gets a generated Python function
            (`_fast_launcher`, built once with exec, as Triton generates its binder) that
            checks the arguments still have the entry's kinds, packs and launches: no key
            building, no dict lookup. `nbx.launch` tries this thread's recent ones for the
            kernel first; `prepare()` hands one to our own kernel wrappers directly.

The parameter list replicates Triton 3.6's generated C launcher exactly: the kernel's
non-constexpr arguments in order, then two trailing pointers (global scratch, profile
scratch), block = 32*num_warps, grid x multiplied by num_ctas, and cuLaunchKernelEx with
a cluster dimension when num_ctas > 1. The count is checked against the `.entry`
parameters declared in the kernel's PTX before the first launch.
"""
from __future__ import annotations

import ctypes
import re
import struct
import threading
import weakref

from ... import plans as _plans
from ...tensor import Tensor
from . import driver as drv
from .storage import forget_launch_tokens, launch_token
from .streams import current_cstreams as _streams   # device -> the current stream (c_void_p)

__all__ = ["launch", "prepare", "bind", "spec_of", "KernelArgumentError", "ForeignPointerError",
           "OutOfResourcesError", "GridError", "cache_info", "clear_cache"]


class KernelArgumentError(TypeError):
    """The arguments do not match the kernel's parameters (count, kind, keyword)."""


class ForeignPointerError(ValueError):
    """A tensor argument's memory was not handed out by nbxtensor's cuda allocator."""


class OutOfResourcesError(RuntimeError):
    """The compiled kernel needs more of a per-block resource than the device has."""


class GridError(ValueError, TypeError):
    """The grid has no dimensions or more than 3: a ValueError (a TypeError too, as before)."""


# ----------------------------------------------------------------------------- binder

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U64_MAX = (1 << 64) - 1


def _int_type(v: int, argname: str) -> str:
    if _I32_MIN <= v <= _I32_MAX:
        return "i32"
    if _I64_MIN <= v <= _I64_MAX:
        return "i64"
    if 0 <= v <= _U64_MAX:
        return "u64"
    raise KernelArgumentError(f"launch: {argname}={v} does not fit a 64-bit integer")


def spec_of(value, *, is_const=False, specialize=True, align=True, argname="argument"):
    """Triton 3.6's specialisation of one runtime argument: (type, attr).

    The same answers as triton's `native_specialize_impl` (tested against it):
    tensor -> ('*<dtype>' or '*k<dtype>' for const, 'D' if 16-byte aligned else '');
    bool -> ('u1', None); int == 1 -> ('constexpr', 1) when specialised; other ints ->
    (i32|i64|u64, 'D' if divisible by 16 else ''), or attr None when not specialised;
    float -> ('fp32', None); None -> ('constexpr', None). `align=False` drops the 'D'.
    """
    if isinstance(value, Tensor):
        t = ("*k" if is_const else "*") + value._dtype.triton
        return t, ("D" if align and value.data_ptr() % 16 == 0 else "")
    if isinstance(value, bool):
        return "u1", None
    if isinstance(value, int):
        if not specialize:
            return _int_type(value, argname), None
        if value == 1:
            return "constexpr", 1
        return _int_type(value, argname), ("D" if align and value % 16 == 0 else "")
    if isinstance(value, float):
        return "fp32", None
    if value is None:
        return "constexpr", None
    raise KernelArgumentError(
        f"launch: {argname} is a {type(value).__name__}; expected a Tensor, int, float, bool or None "
        f"(pass constexprs such as dtypes or strings as keyword arguments)")


class _Sig:
    """What the binder needs to know about a @triton.jit kernel's parameters, computed once."""

    __slots__ = ("fn", "name", "params", "names", "index", "constexpr_pos")

    def __init__(self, kernel):
        params = getattr(kernel, "params", None)
        if params is None or not hasattr(kernel, "arg_names") or not hasattr(kernel, "cache_key"):
            raise KernelArgumentError(
                f"launch: expected a @triton.jit kernel, got {type(kernel).__name__} {kernel!r}"
                + (" (TRITON_INTERPRET=1 turns kernels into interpreted functions; unset it for cuda)"
                   if type(kernel).__name__ == "InterpretedFunction" else ""))
        self.fn = kernel
        self.name = kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel)
        self.params = list(params)
        self.names = [p.name for p in self.params]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.constexpr_pos = tuple(i for i, p in enumerate(self.params) if p.is_constexpr)

    def describe(self) -> str:
        return f"{self.name}({', '.join(self.names)})"


_sigs = _plans.PlanCache("launcher.signatures", 4096)


def _sig_of(kernel) -> _Sig:
    # keyed by id: JITFunction hashes in Python (slow); the _Sig keeps the kernel alive, so
    # the id is not reused while its entry lives
    s = _sigs.get(id(kernel))
    if s is None:
        s = _Sig(kernel)
        _sigs.put(id(kernel), s)
    return s


def _option_names():
    # Triton 3.6's CUDAOptions fields, kept here so binding needs no Triton (a test keeps the
    # two equal where Triton is installed)
    return {"allowed_dot_input_precisions", "arch", "backend_name", "debug",
            "default_dot_input_precision", "deprecated_fp8_dot_operand_dtypes", "enable_fp_fusion",
            "enable_reflect_ftz", "extern_libs", "instrumentation_mode", "ir_override",
            "launch_cooperative_grid", "launch_pdl", "max_num_imprecise_acc_default", "maxnreg",
            "num_ctas", "num_stages", "num_warps", "ptx_options", "ptx_version", "sanitize_overflow",
            "supported_fp8_dtypes", "warp_size"}


_OPTIONS: set | None = None
_recorder = None     # census.record(): called with every binding (kernel, signature, ...)


# long: Triton 3.6's binding and specialisation rules, step by step in Triton's own order, so the two can be read side by side
def bind(kernel, args, kwargs):
    """Bind `args`/`kwargs` to `kernel`'s parameters the way Triton 3.6 does.

    Returns (signature, constexprs, attrs, options, runtime) where signature is
    {name: type} for every parameter ('constexpr' for constants), constexprs is
    {(i,): value}, attrs is {(i,): [['tt.divisibility', 16]]}, options the compile
    options, and runtime the list of (param index, type, value) passed at launch.
    Raises KernelArgumentError when the arguments do not match the parameters.
    """
    global _OPTIONS
    if _OPTIONS is None:
        _OPTIONS = _option_names()
    sig = _sig_of(kernel)
    n = len(sig.params)
    if len(args) > n:
        raise KernelArgumentError(
            f"launch: kernel {sig.describe()} takes {n} arguments, got {len(args)} positional")
    values: dict = dict(enumerate(args))
    options = {}
    for k, v in kwargs.items():
        i = sig.index.get(k)
        if i is None:
            if k in _OPTIONS:
                options[k] = v
                continue
            raise KernelArgumentError(
                f"launch: unknown keyword argument {k!r} for kernel {sig.describe()}; keywords "
                f"must name a parameter or a compile option (num_warps, num_stages, num_ctas, "
                f"maxnreg, ...)")
        if i in values:
            raise KernelArgumentError(f"launch: kernel {sig.name}: argument {k!r} given both by "
                                      f"position and by keyword")
        values[i] = v
    missing = []
    for i, p in enumerate(sig.params):
        if i not in values:
            if p.has_default:
                values[i] = p.default
            else:
                missing.append(p.name)
    if missing:
        raise KernelArgumentError(
            f"launch: kernel {sig.describe()} takes {n} arguments; missing {', '.join(missing)} "
            f"(got {len(args)} positional and keywords {sorted(kwargs) or 'none'})")
    if getattr(kernel, "debug", None) and "debug" not in options:
        options["debug"] = True

    signature, constexprs, attrs, runtime = {}, {}, {}, []
    for i, p in enumerate(sig.params):
        v = values[i]
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[(i,)] = v
            continue
        if isinstance(v, (tuple, list)):
            raise KernelArgumentError(f"launch: kernel {sig.name}: tuple argument {p.name!r} is not "
                                      f"supported by the nbxtensor launcher")
        argname = f"argument {p.name!r} of {sig.name}"
        spec = not p.do_not_specialize
        align = not p.do_not_specialize_on_alignment
        ann = p.annotation_type
        if ann:
            # an annotated parameter keeps its type; only the divisibility attribute is taken
            # from the value, and never for floats and bools (Triton's rule)
            if ann == "u1" or ann[:2] in ("fp", "bf"):
                ty, attr = ann, None
            else:
                _, attr = spec_of(v, is_const=p.is_const, specialize=spec, align=align, argname=argname)
                ty = ann
                if not isinstance(attr, str):
                    attr = None
        else:
            ty, attr = spec_of(v, is_const=p.is_const, specialize=spec, align=align, argname=argname)
        signature[p.name] = ty
        if ty == "constexpr":
            constexprs[(i,)] = v
            continue
        if isinstance(attr, str):
            # as Triton: every string attr gets an entry ('' -> []), so the compile key matches
            attrs[(i,)] = [["tt.divisibility", 16]] if "D" in attr else []
        runtime.append((i, ty, v))
    if _recorder is not None:
        _recorder(kernel, signature, constexprs, attrs, options)
    return signature, constexprs, attrs, options, runtime


# ----------------------------------------------------------------------------- compile, load

_devinfo: dict = {}


def _device_info(index: int):
    """(compute capability as major*10+minor, opt-in shared limit, static limit) of a device."""
    d = _devinfo.get(index)
    if d is None:
        p = drv.device_properties(index)
        d = _devinfo[index] = (p["major"] * 10 + p["minor"], p["max_shared_memory_per_block_optin"],
                               p["max_shared_memory_per_block"])
    return d


def _compile(kernel, signature, constexprs, attrs, options, cc: int):
    import triton
    from triton.backends.compiler import GPUTarget

    from .aot import compile_target
    if getattr(kernel, "is_gluon", lambda: False)():
        # a @gluon.jit kernel compiles from its own source class (Gluon's language)
        from triton.experimental.gluon._runtime import GluonASTSource as source
    else:
        from triton.compiler import ASTSource as source
    src = source(fn=compile_target(kernel), signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


def _compiled(kernel, signature, constexprs, attrs, options, cc: int):
    """(metadata, cubin, parameters the PTX .entry declares) of a binding: from the kernel
    archive when it holds the variant, else compiled by Triton (imported only then)."""
    from . import aot
    key = aot.key_of(kernel, signature, constexprs, attrs, options)
    hit = aot.lookup(kernel, key, cc)
    if hit is not None:
        md, cubin = hit
        return md, cubin, md.nparams
    why = aot.compile_blocker(kernel)
    if why is not None:
        raise aot.missing(kernel, key, cc, why)
    ck = _compile(kernel, signature, constexprs, attrs, options, cc)
    return ck.metadata, ck.asm["cubin"], declared_param_count(ck.asm["ptx"])


_ENTRY_RE = re.compile(r"\.entry\s+[\w$]+\s*\(([^)]*)\)", re.S)


def declared_param_count(ptx: str) -> int:
    """How many parameters the kernel's PTX `.entry` declares."""
    m = _ENTRY_RE.search(ptx)
    if m is None:
        raise KernelArgumentError("launch: no .entry in the compiled kernel's PTX")
    return len(re.findall(r"\.param\b", m.group(1)))


def check_shared(name: str, shared: int, optin: int) -> None:
    if shared > optin:
        raise OutOfResourcesError(
            f"launch: kernel {name} needs {shared} bytes of shared memory per block, but the device "
            f"allows at most {optin} (opt-in limit); use a smaller BLOCK or fewer num_stages")


_modules: dict = {}          # (compiled hash, device) -> (CUmodule, CUfunction); loaded once
_modules_lock = threading.Lock()


def _load(md, cubin: bytes, dev: int):
    key = (md.hash, dev)
    with _modules_lock:
        hit = _modules.get(key)
        if hit is not None:
            return hit[1]
        drv.set_device(dev)
        mod = drv.module_load_data(cubin)
        f = drv.module_get_function(mod, md.name)
        _, optin, _ = _device_info(dev)
        if md.shared > 49152 and optin > 49152:
            # above the default 48 KB a kernel must opt in to dynamic shared memory
            drv.func_set_cache_config(f, drv.FUNC_CACHE_PREFER_SHARED)
            static = drv.func_get_attribute(f, "SHARED_SIZE_BYTES")
            drv.func_set_attribute(f, "MAX_DYNAMIC_SHARED_SIZE_BYTES", optin - static)
        _modules[key] = (mod, f)
        return f


# ----------------------------------------------------------------------------- prepared launches

# struct codes, each padded to an 8-byte slot so every parameter is naturally aligned
_PACK = {
    "i1": "b7x", "i8": "b7x", "i16": "h6x", "i32": "i4x", "i64": "q", "u1": "B7x", "u8": "B7x",
    "u16": "H6x", "u32": "I4x", "u64": "Q", "fp16": "e6x", "bf16": "H6x", "fp32": "f4x",
    "f32": "f4x", "fp64": "d",
}


def _bf16_bits(x: float) -> int:
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    if (b & 0x7F800000) == 0x7F800000 and b & 0x7FFFFF:
        return 0x7FC0                                     # NaN
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even


class _Entry:
    """One prepared launch: the function, its parameter buffer and launch configuration."""

    __slots__ = ("f", "name", "pack", "xpack", "buf", "params", "block", "shared", "ctas", "sel", "tail",
                 "fix", "conv", "ex", "config", "cfgp", "attrs", "gsize", "galign", "gslot", "types",
                 "names", "cpos", "variants", "fast", "kernel", "__weakref__")


def _make_fix(sel, tail, conv):
    def fix(vals):
        if sel is not None:
            vals = [vals[i] for i in sel]
        if tail:
            vals = list(vals) + list(tail)
        if conv is not None:
            for k, c in conv:
                vals[k] = c(vals[k])
        return vals
    return fix


def check_keywords(sig, kwargs) -> None:
    """Keywords name constexprs or options: a runtime parameter given by keyword is refused
    (cuda and interp alike)."""
    bad = [k for k in kwargs if k in sig.index and not sig.params[sig.index[k]].is_constexpr]
    if bad:
        raise KernelArgumentError(f"launch: kernel {sig.describe()}: {', '.join(map(repr, bad))} "
                                  f"are not constexpr parameters; pass them positionally")


def _prepare(kernel, args, kwargs, dev: int, variant: bool = False) -> _Entry:
    sig = _sig_of(kernel)
    cpos = tuple(i for i in sig.constexpr_pos if i < len(args))
    if cpos and not variant:
        # constexprs passed positionally: this entry only dispatches on their values
        e = _Entry()
        e.cpos, e.variants, e.kernel = cpos, {}, kernel
        return e
    check_keywords(sig, kwargs)
    signature, constexprs, attrs, options, runtime = bind(kernel, args, kwargs)
    cc, optin, _ = _device_info(dev)
    md, cubin, declared = _compiled(kernel, signature, constexprs, attrs, options, cc)
    check_shared(sig.name, md.shared, optin)
    if md.profile_scratch_size:
        raise OutOfResourcesError(f"launch: kernel {sig.name} needs a profile scratch buffer "
                                  f"(instrumentation); the nbxtensor launcher does not provide one")
    if getattr(md, "tensordesc_meta", None):
        raise KernelArgumentError(f"launch: kernel {sig.name} takes tensor descriptors; the "
                                  f"nbxtensor launcher does not support them")
    if declared != len(runtime) + 2:
        raise KernelArgumentError(
            f"launch: kernel {sig.name} declares {declared} parameters, but the binder prepared "
            f"{len(runtime)} arguments + 2 scratch pointers; refusing to launch")
    f = _load(md, cubin, dev)

    e = _Entry()
    e.f, e.name = ctypes.c_void_p(f), sig.name
    e.types = [ty for _, ty, _ in runtime]
    e.names = [sig.names[i] for i, _, _ in runtime]
    npos = len(args)
    # the positional args that are packed, and the runtime params that come from defaults
    pos_rt = [i for i, _, _ in runtime if i < npos]
    e.sel = None if pos_rt == list(range(npos)) else tuple(pos_rt)
    e.tail = tuple(v for i, _, v in runtime if i >= npos)   # runtime params from defaults
    fmt = "<" + "".join("Q" if ty[0] == "*" else _PACK[ty] for ty in e.types)
    e.pack = struct.Struct(fmt).pack_into
    # bf16 scalars have no struct code: convert them to their bits first
    e.conv = tuple((k, _bf16_bits) for k, ty in enumerate(e.types) if ty == "bf16") or None
    e.fix = None if (e.sel is None and not e.tail and e.conv is None) else _make_fix(e.sel, e.tail, e.conv)
    n = len(e.types)
    # one buffer: the n 8-byte parameter slots, then a CUlaunchConfig (56 bytes, 8-aligned).
    # `xpack` writes the parameters AND the config's head (grid, block, shared, stream) in one
    # pack_into for cuLaunchKernelEx; attrs/numAttrs lie past its end, written once here
    e.buf = (ctypes.c_uint64 * (n + _CFG_WORDS))()
    e.gslot = ctypes.c_uint64(0)      # global scratch pointer
    pslot = ctypes.c_uint64(0)        # profile scratch pointer (always null here)
    base = ctypes.addressof(e.buf)
    e.params = (ctypes.c_void_p * (n + 2))(*[base + 8 * k for k in range(n)],
                                           ctypes.addressof(e.gslot), ctypes.addressof(pslot))
    e.block = 32 * md.num_warps
    e.shared = md.shared
    e.ctas = md.num_ctas
    e.gsize, e.galign = md.global_scratch_size, md.global_scratch_align
    e.ex = md.num_ctas != 1 or bool(md.launch_cooperative_grid) or bool(md.launch_pdl)
    e.xpack = struct.Struct(fmt + _CFG_HEAD).pack_into
    e.config = _launch_config(e, md, f, 8 * n)
    e.cfgp = ctypes.c_void_p(base + 8 * n)
    e.attrs = (e.gslot, pslot, e.config)   # keep the slots (and the attributes) alive with the entry
    e.cpos = None
    e.fast = None     # the generated guarded launcher, made on the first launch (`_fast_launcher`)
    e.kernel = kernel  # caches are keyed by id(kernel): keep it alive so the id is not reused
    return e


_CFG_WORDS = drv.LAUNCH_CONFIG_WORDS
_CFG_HEAD = drv.LAUNCH_CONFIG_HEAD    # the CUlaunchConfig head the fast path packs (driver.py)


def _launch_config(e: _Entry, md, f, offset: int):
    """The entry's CUlaunchConfig, a view into its buffer at `offset`, with the launch
    attributes of the compiled kernel (PDL, cooperative, cluster) set once."""
    return drv.launch_config(e.buf, offset, e.block, e.shared, f, pdl=bool(md.launch_pdl),
                             cooperative=bool(md.launch_cooperative_grid),
                             num_ctas=md.num_ctas)


# ----------------------------------------------------------------------------- pointer check

# per device: id(storage) -> weakref to it, for storages whose memory the allocator holds.
# A weakref callback drops the entry when the storage dies (before its id can be reused),
# so `id(st) in verified` means "this live storage was checked": one check per storage.
_verified: dict = {}


def _allocator_for(dev: int):
    from . import memory
    return memory.allocator_for(dev)


def _verify(st, argname: str, dev: int, kname: str) -> None:
    d = st.device
    if d.type != "cuda" or (d.index or 0) != dev:
        raise ValueError(f"launch: {argname} of kernel {kname} is on {d}, but the launch is on "
                         f"cuda:{dev} (the device of the first tensor argument); move it first")
    # an empty storage owns no memory (address 0): a kernel can only fault on it, not corrupt
    if not (st.ptr == 0 and getattr(st, "nbytes", None) == 0) and not _allocator_for(dev).holds(st.ptr):
        raise ForeignPointerError(
            f"launch: {argname} of kernel {kname} points at {st.ptr:#x}, which nbxtensor's cuda "
            f"allocator on cuda:{dev} did not hand out; refusing to launch on foreign memory")
    vd = _verified.setdefault(dev, {})
    k = id(st)
    try:
        vd[k] = weakref.ref(st, lambda _, k=k, vd=vd: vd.pop(k, None))
    except TypeError:
        pass  # a storage without weak references is simply checked on every launch
    try:
        # the fast launchers' check: a mark on the storage itself (a slot of CudaStorage) is
        # one attribute load, and dies with the storage (no id reuse). Its address and device
        # never change while it lives, so the check holds for its lifetime
        st._nbx_launch = _vtoken(dev)
    except AttributeError:
        pass  # no slot for it: the fast launchers fall back to `id(storage) in vd`


# device -> the object a storage verified on it is marked with (kept with the storage class,
# which marks what the allocator hands out)
_vtoken = launch_token


def _forget_verified() -> None:
    """Forget every verification (tests): new tokens, so old marks no longer match; fast
    launchers generated before hold the old token, so their caches are dropped too."""
    _verified.clear()
    forget_launch_tokens()
    clear_cache()


# ----------------------------------------------------------------------------- scratch

_scratch: dict = {}   # device -> allocator Block used as Triton's global scratch


def _global_scratch(e: _Entry, dev: int, nprog: int, stream: int) -> None:
    need = nprog * e.ctas * e.gsize + e.galign
    blk = _scratch.get(dev)
    alloc = _allocator_for(dev)
    if blk is None or blk.size < need:
        if blk is not None:
            alloc.free(blk)
        blk = _scratch[dev] = alloc.malloc(need, stream)
    e.gslot.value = (blk.ptr + e.galign - 1) // e.galign * e.galign


# ----------------------------------------------------------------------------- launch

_state = threading.local()    # prepared entries are per thread: their buffers are rewritten
# per thread: (kernel, device, constexprs, argument kinds) -> the prepared _Entry (compiled,
# loaded, its parameter buffer); and id(kernel) -> the record of its fast launchers (bounded
# by construction: _FAST_KW_VARIANTS constexpr variants of _FAST_PER_KERNEL launchers each)
_ENTRIES = _plans.PerThread("launcher.entries", 4096)
_FASTS = _plans.PerThread("launcher.fast", plain=True)
_tls = drv._tls               # the driver's per-thread current device
_NULL = ctypes.c_void_p(0)
_MAX_X, _MAX_YZ = (1 << 31) - 1, 65535

def launch(kernel, grid, args, kwargs, dev) -> None:
    """Launch a @triton.jit `kernel` on cuda device `dev` (a Device) with `args` and `kwargs`."""
    return _launch(kernel, grid, args, kwargs, dev.index or 0)


def launch_public(kernel, grid, *args, **kwargs) -> None:
    """`nbx.launch`: the generated fast launchers first, then the general path.

    This thread's fast launchers of `kernel` (one per prepared entry launched recently, see
    `_fast_launcher`) are tried in turn: each checks that the arguments have exactly the
    kinds its entry was compiled for and launches, or declines without side effects.
    """
    # fast launchers are indexed by the constexpr keywords, so a kernel launched with many
    # constexpr variants (one flat element-wise kernel serves every op) finds its own at once;
    # the keywords of the kernel's last launch are compared first (a dict == is ~4x cheaper
    # than building and hashing the key tuple)
    try:
        rec = _state.fast[id(kernel)]
        # values compare equal across types (2 == 2.0 == True), so the types are compared too
        if rec[0] == kwargs and rec[5] == [*map(type, kwargs.values())]:
            fns = rec[1]
        else:
            fns = rec[2].get(_kw_key(kwargs), ())
            if fns:
                rec[0], rec[1], rec[5] = kwargs, fns, [*map(type, kwargs.values())]
    except Exception:   # no launchers yet (AttributeError, KeyError), unhashable or odd values
        fns = ()
    for fn in fns:
        if fn(grid, args):
            return
    if args:
        a = args[0]
        if type(a) is Tensor:
            dev = a._storage.device
            if dev.type == "cuda":
                _launch(kernel, grid, args, kwargs, dev.index or 0)
                return
    from ..launch import launch_other
    return launch_other(kernel, grid, args, kwargs)


def launch_items(kernel, grid, args, items) -> None:
    """`nbx.launch(kernel, grid, *args, **dict(items))` for a caller that keeps its launch:
    `args` a tuple, `items` a tuple of (keyword, value) pairs built ONCE and kept (e.g. in a
    cached plan) with immutable values (ints, bools, strings, dtypes).

    A tuple cannot change, so when `items` is the very object of this kernel's last such
    launch, its fast launchers are taken without building, comparing or hashing a keywords
    dict (the ** call and the dict == cost ~1 us for the flat element-wise kernel's 14
    keywords here). Otherwise they are looked up by value, as `launch_public` does. Everything
    the fast launchers check per call (argument kinds, storages, alignment, grid) is the same.
    """
    try:
        rec = _state.fast[id(kernel)]
        if rec[3] is items:
            fns = rec[4]
        else:
            fns = rec[2].get((items, tuple([type(v) for _, v in items])), ())
            if fns:
                rec[3], rec[4] = items, fns
    except Exception:   # no launchers yet (AttributeError, KeyError), unhashable or odd values
        fns = ()
    for fn in fns:
        if fn(grid, args):
            return
    try:
        _state.fast[id(kernel)][3] = None     # the general path may install a newer list
    except Exception:  # noqa: BLE001 - nothing recorded yet
        pass
    launch_public(kernel, grid, *args, **dict(items))


def _lookup(kernel, args, kwargs, idx: int):
    """The prepared entry for these arguments' kinds (verified, compiled, loaded), and the
    values to pack (before `e.fix`)."""
    key = [id(kernel), idx, _kw_key(kwargs) if kwargs else None]
    vals = []
    ap = key.append
    vp = vals.append
    try:
        vd = _verified[idx]
    except KeyError:
        vd = _verified[idx] = {}
    V = _vtoken(idx)
    # each argument adds its kind to the key: a tensor its DType then its address mod 16; an
    # int True/False (i32, divisible by 16 or not), 2 (the constant 1), or a string (wider);
    # a DType is always followed by its alignment, so the key reads back unambiguously
    for a in args:
        t = type(a)
        if t is Tensor:
            st = a._storage
            if getattr(st, "_nbx_launch", None) is not V and id(st) not in vd:
                _verify(st, f"argument {len(vals)}", idx, _sig_of(kernel).name)
            dt = a._dtype
            p = st.ptr + a._offset * dt.itemsize
            ap(dt)
            ap(p & 15)
            vp(p)
        elif t is int:
            if _I32_MIN <= a <= _I32_MAX:
                ap(not a & 15 if a != 1 else 2)
            else:
                ap(_wide_int_key(a))
            vp(a)
        elif t is float:
            ap("fp32")
            vp(a)
        else:
            ap(_slow_key(kernel, a, len(vals), idx, vd))
            vp(a.data_ptr() if isinstance(a, Tensor) else a)
    key = tuple(key)
    try:
        entries = _state.entries    # this thread's PlanCache of _ENTRIES
    except AttributeError:
        entries = _state.entries = _ENTRIES.local()
    e = entries.get(key)
    if e is None:
        e = _prepare(kernel, args, kwargs, idx)
        entries.put(key, e)
    if e.cpos is not None:
        # constexprs passed positionally: their values, not their kinds, pick the kernel
        e = _by_constexpr_values(e, kernel, args, kwargs, idx)
    return e, vals


def _launch(kernel, grid, args, kwargs, idx: int) -> None:
    """The general path: build the key, one dict lookup, one struct.pack_into into the
    prepared buffer, one cuLaunchKernel (cuLaunchKernelEx for launch attributes); then this
    entry's fast launcher is put first in line for the next launch of `kernel` with these
    keywords."""
    e, vals = _lookup(kernel, args, kwargs, idx)
    try:
        if _tls.device != idx:
            drv.set_device(idx)
    except AttributeError:
        drv.set_device(idx)

    # grid: a tuple of 1 to 3 positive ints (checked: the raw call passes C ints), or a callable
    if type(grid) is not tuple:
        grid = _grid_of(grid, _sig_of(kernel), args, kwargs)
    n = len(grid)
    if n == 1:
        gx = grid[0]
        gy = gz = 1
        if type(gx) is not int or not 0 < gx <= _MAX_X:
            if _bad_grid(grid):
                return
    else:
        if not 2 <= n <= 3:
            raise GridError(f"launch: grid must have 1 to 3 dimensions, got {grid!r}")
        gx = grid[0]
        gy = grid[1]
        gz = grid[2] if n == 3 else 1
        if (type(gx) is not int or type(gy) is not int or type(gz) is not int
                or not 0 < gx <= _MAX_X or not 0 < gy <= _MAX_YZ or not 0 < gz <= _MAX_YZ):
            if _bad_grid(grid):
                return

    if e.fix is not None:   # constants dropped, defaults appended, bf16 converted
        vals = e.fix(vals)
    try:
        e.pack(e.buf, 0, *vals)
    except (struct.error, OverflowError) as err:
        raise _value_error(e, vals, err) from None

    stream = _streams.get(idx, _NULL)
    if e.gsize:
        _global_scratch(e, idx, gx * gy * gz, stream.value or 0)
    if e.ex:
        if gx * e.ctas > _MAX_X:    # Triton's rule: grid x times num_ctas is the launched x
            raise ValueError(f"launch: grid={grid!r} times num_ctas={e.ctas} exceeds CUDA's grid "
                             f"limit {_MAX_X} in x")
        # the parameters are packed again with the config head (a failed fast pack may have
        # zeroed it): grid, block, shared, stream; attrs were set once at prepare. Everything
        # here was checked, so this pack cannot fail
        e.xpack(e.buf, 0, *vals, gx * e.ctas, gy, gz, e.block, 1, 1, e.shared, stream.value or 0)
        rc = _cuLaunchKernelEx(e.cfgp, e.f, e.params, None)
        if rc:
            _launch_failed_ex(rc, e)
    else:
        # the raw (argtypes-free) entry point: every argument is a ctypes object or a checked C int
        rc = _cuLaunchKernel(e.f, gx, gy, gz, e.block, 1, 1, e.shared, stream, e.params, None)
        if rc:
            _launch_failed(rc, e.name, gx, gy, gz, e.block, e.shared, stream)
    _install_fast(kernel, e, args, kwargs, idx)


def _launch_failed(rc, name, gx, gy, gz, block, shared, stream):
    drv.check_launch_error(rc, f"cuLaunchKernel(kernel={name}, grid=({gx}, {gy}, {gz}), "
                               f"block=({block}, 1, 1), shared_bytes={shared}, "
                               f"stream={stream.value or 0:#x})")


def _launch_failed_ex(rc, e: _Entry):
    c = e.config
    drv.check_launch_error(rc, f"cuLaunchKernelEx(kernel={e.name}, grid=({c.gridDimX}, {c.gridDimY}, "
                               f"{c.gridDimZ}), block=({c.blockDimX}, {c.blockDimY}, {c.blockDimZ}), "
                               f"shared_bytes={c.sharedMemBytes}, stream={c.hStream or 0:#x}, "
                               f"attrs={[c.attrs[i].id for i in range(c.numAttrs)]})")


# ----------------------------------------------------------------------------- fast launchers

_FAST_PER_KERNEL = 4      # fast launchers kept per (kernel, constexprs) and thread, newest first
_FAST_KW_VARIANTS = 256   # constexpr variants of one kernel with fast launchers, per thread
_NO_FAST = object()       # an entry whose arguments the fast launcher cannot guard


def _install_fast(kernel, e: _Entry, args, kwargs, idx: int) -> None:
    fn = e.fast
    if fn is None:
        fn = e.fast = _fast_launcher(e, args, idx) or _NO_FAST
    if fn is _NO_FAST:
        return
    try:
        fast = _state.fast
    except AttributeError:   # the hot paths read this thread's records as `_state.fast`
        fast = _state.fast = _FASTS.local()
    rec = fast.get(id(kernel))
    if rec is None:     # [keywords of the last launch, their launchers, by keywords (typed:
        # `_kw_key`), the items tuple of the last launch_items and its launchers, the types
        # of the last launch's keyword values]
        rec = fast[id(kernel)] = [None, (), {}, None, (), None]
    by_kw = rec[2]
    try:
        key = _kw_key(kwargs)
        fl = by_kw.get(key)
    except TypeError:           # an unhashable constexpr value: no fast launcher
        return
    if fl is None:
        if len(by_kw) >= _FAST_KW_VARIANTS:
            by_kw.clear()       # bounded: a kernel swept over many configs starts afresh
            rec[3] = None       # (launch_items' list may be one of those just dropped)
        fl = by_kw[key] = []
    rec[0], rec[1], rec[5] = dict(kwargs), fl, [*map(type, kwargs.values())]
    if fn in fl:
        k = fl.index(fn)
        if k:
            fl.insert(0, fl.pop(k))
        return
    fl.insert(0, fn)
    del fl[_FAST_PER_KERNEL:]


# long: a code generator: it writes one launcher function as source text, branch by branch in the order the generated code runs
def _fast_launcher(e: _Entry, args, idx: int, device_check: bool | None = None):
    """Generate `fast(grid, args) -> bool` for entry `e` from the arguments that built its key.

    It launches only when every argument has the kind this entry was compiled for, with the
    same classes the general path keys on (tensor: exact dtype, storage already verified on
    device `idx`, 16-byte aligned or not; int: exact type, the constant 1 / i32 / i64 / u64
    by range, divisible by 16 or not; float; bool; None), the grid is a tuple of in-range
    ints and device `idx` is current (a check left out when the process has one device, see
    `_single_device`). Otherwise it returns False having changed nothing that matters (the
    general path then re-dispatches, refuses or raises the documented error).

    With cuLaunchKernelEx (the default where the driver has it) one pack_into writes the
    parameters and the entry's CUlaunchConfig head (grid, block, shared, stream) and the
    call has 4 arguments; launch attributes (PDL, cooperative, clusters) are part of the
    config, so those entries get a fast launcher too. Without Ex: cuLaunchKernel, and no
    fast launcher for entries with attributes. None for entries that need more than one
    call (global scratch), bf16 scalars, or positional constexprs.
    """
    use_ex = _ex_available()
    if (e.ex and not use_ex) or e.gsize or e.conv is not None or e.cpos is not None:
        return None
    if device_check is None:
        device_check = not _single_device()
    n = len(args)
    packed = list(e.sel) if e.sel is not None else list(range(n))
    # pack_into a memoryview of the buffer: a little cheaper than through the ctypes array
    env = {"T": Tensor, "vd": _verified.setdefault(idx, {}), "V": _vtoken(idx),
           "pack": e.xpack if use_ex else e.pack, "buf": memoryview(e.buf).cast("B"), "F": e.f,
           "PARAMS": e.params, "NAME": e.name, "TAIL": e.tail, "E": e, "CFG": e.cfgp}
    names = [f"a{i}" for i in range(n)]
    if n:
        body = ["try:", f"    {', '.join(names)}{',' if n == 1 else ''} = args",
                "except ValueError:", "    return False"]
    else:
        body = ["if args:", "    return False"]
    types, tensors, checks, aligned, unaligned = [], [], [], [], []
    for i, v in enumerate(args):
        a = names[i]
        t = type(v)
        if t is Tensor:
            types.append(f"type({a}) is not T")
            tensors.append(i)
            env[f"D{i}"] = v._dtype
            p = v._storage.ptr + v._offset * v._dtype.itemsize
            (aligned if p % 16 == 0 else unaligned).append(i)
        elif t is int:
            types.append(f"type({a}) is not int")
            if _I32_MIN <= v <= _I32_MAX:
                # no range test: the parameter is then packed as i32 (whose struct code refuses
                # wider values: the general path takes over), or has an annotated type that
                # a wider value compiles to as well, or is the constant 1
                rng = ""
            elif _I64_MIN <= v <= _I64_MAX:
                rng = (f" or not ({a} < {_I32_MIN} or {a} > {_I32_MAX})"
                       f" or not {_I64_MIN} <= {a} <= {_I64_MAX}")
            else:
                rng = f" or not {_I64_MAX} < {a} <= {_U64_MAX}"
            if v == 1:
                checks.append(f"{a} != 1")
            elif v % 16 == 0:
                checks.append(f"{a} & 15{rng}")
            else:
                checks.append(f"not {a} & 15 or {a} == 1{rng}")
        elif t is float:
            types.append(f"type({a}) is not float")
        elif t is bool:
            types.append(f"type({a}) is not bool")
        elif v is None:
            types.append(f"{a} is not None")
        else:
            return None   # subclasses and the rest: the general path only
    if types:
        body += [f"if {' or '.join(types)}:", "    return False"]
    if tensors:
        body.append("; ".join(f"s{i} = a{i}._storage" for i in tensors))
        # a storage marked V (or, without the slot for the mark, one in `vd`) was checked
        # against device idx's allocator and is on device idx; an unmarked storage or one
        # of another class raises AttributeError: the general path verifies or refuses it
        marked = [i for i in tensors if _has_mark_slot(args[i]._storage)]
        byid = [i for i in tensors if i not in marked]
        conds = [f"s{i}._nbx_launch is not V" for i in marked] + [f"id(s{i}) not in vd" for i in byid]
        if marked:
            body += ["try:", f"    if {' or '.join(conds)}:", "        return False",
                     "except AttributeError:", "    return False"]
        else:
            body += [f"if {' or '.join(conds)}:", "    return False"]
        body += [f"if {' or '.join(f'a{i}._dtype is not D{i}' for i in tensors)}:", "    return False"]
        for i in tensors:
            body.append(f"p{i} = s{i}.ptr + a{i}._offset * {args[i]._dtype.itemsize}")
        if aligned:
            body += [f"if ({' | '.join(f'p{i}' for i in aligned)}) & 15:", "    return False"]
        if unaligned:
            body += [f"if {' or '.join(f'not p{i} & 15' for i in unaligned)}:", "    return False"]
    if checks:
        body += [f"if {' or '.join(f'({c})' for c in checks)}:", "    return False"]
    # grid x is launched times num_ctas (clusters): its bound is CUDA's limit over num_ctas
    maxx = _MAX_X // e.ctas
    body += [
        "if type(grid) is not tuple:", "    return False",
        "ng = len(grid)",
        "if ng == 1:",
        "    gx = grid[0]; gy = gz = 1",
        f"    if type(gx) is not int or not 0 < gx <= {maxx}:", "        return False",
        "elif ng == 2:",
        "    gx, gy = grid; gz = 1",
        f"    if type(gx) is not int or type(gy) is not int or not 0 < gx <= {maxx} "
        f"or not 0 < gy <= {_MAX_YZ}:", "        return False",
        "elif ng == 3:",
        "    gx, gy, gz = grid",
        "    if (type(gx) is not int or type(gy) is not int or type(gz) is not int",
        f"            or not 0 < gx <= {maxx} or not 0 < gy <= {_MAX_YZ} or not 0 < gz <= {_MAX_YZ}):",
        "        return False",
        "else:", "    return False",
    ]
    if device_check:
        body += [
            "try:",
            f"    if _tls.device != {idx}:", "        return False",
            "except AttributeError:", "    return False",
        ]
    vals = [f"p{i}" if i in tensors else f"a{i}" for i in packed]
    if e.tail:
        vals.append("*TAIL")
    if use_ex:
        gxe = "gx" if e.ctas == 1 else f"gx * {e.ctas}"
        # parameters, then the config head: grid, block, shared, stream (a c_void_p: its value
        # is None for the null stream)
        vals += [gxe, "gy", "gz", str(e.block), "1", "1", str(e.shared),
                 f"_streams.get({idx}, _NULL).value or 0"]
        body += [
            "try:",
            f"    pack(buf, 0, {', '.join(vals)})",
            "except (struct_error, OverflowError):",
            "    return False   # the general path names the argument that does not fit",
            "rc = _cuLaunchKernelEx(CFG, F, PARAMS, None)",
            "if rc:",
            "    _launch_failed_ex(rc, E)",
            "return True",
        ]
    else:
        body += [
            "try:",
            f"    pack(buf, 0{''.join(', ' + v for v in vals)})",
            "except (struct_error, OverflowError):",
            "    return False   # the general path names the argument that does not fit",
            f"stream = _streams.get({idx}, _NULL)",
            f"rc = _cuLaunchKernel(F, gx, gy, gz, {e.block}, 1, 1, {e.shared}, stream, PARAMS, None)",
            "if rc:",
            f"    _launch_failed(rc, NAME, gx, gy, gz, {e.block}, {e.shared}, stream)",
            "return True",
        ]
    src = (f"def make({', '.join(env)}):\n    def fast(grid, args):\n"
           + "".join(f"        {line}\n" for line in body) + "    return fast\n")
    ns = {}
    # module globals: `_streams`, `_cuLaunchKernel(Ex)`, `_tls` are read at call time (they change)
    exec(compile(src, f"<nbx fast launcher {e.name}>", "exec"), globals(), ns)
    fast = ns["make"](**env)
    fast.source = src
    fast.kernel = e.kernel   # keyed by id(kernel) in the fast lists: keep the id from reuse
    fast.ex = use_ex
    return fast


def _has_mark_slot(st) -> bool:
    """Whether storage `st`'s class has the `_nbx_launch` slot the verification mark uses."""
    return hasattr(type(st), "_nbx_launch")


struct_error = struct.error


def prepare(kernel, *example_args, **kwargs):
    """A launcher of `kernel` prepared for arguments of the kinds of `example_args` (cuda
    tensors, ints, floats, bools, None) with the constexprs and options `kwargs` fixed.

        add = prepare(add_kernel, x, y, out, n, BLOCK=1024, num_warps=4)   # binds, compiles
        add((triton.cdiv(n, 1024),), x, y, out, n)                          # launches

    The call skips the keyword matching of `nbx.launch` and goes straight to the generated
    fast launchers. Each still checks every argument's kind (dtype, storage verified on the
    device, 16-byte alignment, integer range and divisibility, the constant 1), the grid and
    (with more than one device, see `_single_device`) the current device; arguments of
    another kind are re-dispatched through the general path (new kinds are compiled and join
    the prepared launchers), so a call is never wrong, only slower. Nothing is launched by
    `prepare` itself. Used from another thread, the call takes the general path (prepared
    buffers belong to the thread that prepared them).
    """
    for a in example_args:
        if isinstance(a, Tensor):
            dev = a.device
            break
    else:
        raise ValueError("prepare: no tensor argument, so the device is unknown")
    if dev.type != "cuda":
        raise ValueError(f"prepare: tensors on {dev}; prepared launches are for cuda tensors "
                         f"(use nbx.launch on other devices)")
    idx = dev.index or 0
    kw = dict(kwargs)
    e, _ = _lookup(kernel, example_args, kw, idx)
    drv.set_device(idx)   # as a launch would: the fast launchers may rely on it (one device)
    fn = e.fast
    if fn is None:
        fn = e.fast = _fast_launcher(e, example_args, idx) or _NO_FAST
    fns = [] if fn is _NO_FAST else [fn]
    # the owner thread, by a per-thread object: a thread ident can be reused by a new thread
    # (which has neither this thread's buffers' ownership nor its current device)
    owner = _thread_token()
    st = _state

    def prepared(grid, *args):
        try:
            mine = st.token is owner
        except AttributeError:
            mine = False
        if mine:
            for f in fns:
                if f(grid, args):
                    return
        launch_public(kernel, grid, *args, **kw)
        if mine:   # what the general path prepared joins this launcher
            for f in _fast_list(kernel, kw):
                if f not in fns:
                    fns.insert(0, f)
                    del fns[_FAST_PER_KERNEL:]

    prepared.kernel, prepared.kwargs, prepared.launchers = kernel, kw, fns
    prepared.__doc__ = f"prepared launch of {e.name} with {kw}: prepared(grid, *args)"
    return prepared


def _thread_token():
    t = getattr(_state, "token", None)
    if t is None:
        t = _state.token = object()
    return t


def _kw_key(kwargs) -> tuple:
    """Constexprs and options as a cache key: the values and their types. 2, 2.0 and True
    compare and hash equal but compile to different kernels (int32, fp32, int1), as Triton's
    own cache tells them apart."""
    return tuple(kwargs.items()), tuple(map(type, kwargs.values()))


def _wide_int_key(a: int) -> str:
    if _I64_MIN <= a <= _I64_MAX:
        return "i64D" if not a & 15 else "i64"
    return "u64D" if not a & 15 else "u64"


def _by_constexpr_values(e, kernel, args, kwargs, idx: int):
    vals = tuple([args[i] for i in e.cpos])
    vals = (vals, tuple(map(type, vals)))     # 2, 2.0 and True are different constexprs
    sub = e.variants.get(vals)
    if sub is None:
        sub = e.variants[vals] = _prepare(kernel, args, kwargs, idx, variant=True)
        sub.fast = _NO_FAST   # picked by values, which a fast launcher does not guard
    return sub


def _slow_key(kernel, a, pos: int, idx: int, vd: dict):
    """Key part for arguments off the fast path: bools, None, Tensor subclasses, the rest."""
    if a is None or type(a) is bool:
        return "u1" if a is not None else None
    if isinstance(a, Tensor):   # a Tensor subclass: one key part with dtype and alignment
        st = a._storage
        if id(st) not in vd:
            _verify(st, f"argument {pos}", idx, _sig_of(kernel).name)
        return ("tensor", a._dtype, a.data_ptr() & 15)
    if isinstance(a, int):     # int subclasses (IntEnum): the kind, as for ints
        t, attr = spec_of(int(a))
        return "int:" + t + (attr or "") if t != "constexpr" else "int:c1"
    if isinstance(a, float):   # float subclasses (numpy.float64)
        return "fp32"
    # anything else (the binder refuses it): keyed by type and identity, never reused
    return (type(a), id(a))


def _grid_of(grid, sig, args, kwargs):
    if callable(grid):
        grid = grid(_meta(sig, args, kwargs))
    if isinstance(grid, list):
        grid = tuple(grid)
    if type(grid) is not tuple:
        raise TypeError(f"launch: grid must be a tuple of 1 to 3 ints or a callable returning one, "
                        f"got {grid!r}")
    if not grid:
        raise GridError(f"launch: grid must have 1 to 3 dimensions, got {grid!r}")
    return grid


def _bad_grid(grid) -> bool:
    """True for a grid with a zero dimension (nothing to launch, as Triton); raises for an
    invalid one (GridError: no dimension or more than 3; TypeError: not ints; ValueError:
    outside CUDA's limits)."""
    if not 1 <= len(grid) <= 3:
        raise GridError(f"launch: grid must have 1 to 3 dimensions, got {grid!r}")
    for g in grid:
        if type(g) is not int:
            raise TypeError(f"launch: grid must hold ints, got {grid!r}")
    if 0 in grid and min(grid) >= 0:
        return True
    lim = (_MAX_X, _MAX_YZ, _MAX_YZ)
    for k, g in enumerate(grid):
        if not 0 <= g <= lim[k]:
            raise ValueError(f"launch: grid dimension {k} = {g} is outside [0, {lim[k]}] "
                             f"(CUDA's limit); grid={grid!r}")
    return False


class _LazyFn:
    """A raw driver entry (cuLaunchKernel / cuLaunchKernelEx), resolved from the driver on
    first call, then called directly (the module global is rebound to it)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *a):
        f = drv.fn_raw(self.name)
        globals()["_" + self.name] = f
        return f(*a)


_cuLaunchKernel = _LazyFn("cuLaunchKernel")
_cuLaunchKernelEx = _LazyFn("cuLaunchKernelEx")
_use_ex: bool | None = None    # None: decided on the first fast launcher (does the driver have Ex?)


def _ex_available() -> bool:
    """Whether the fast launchers call cuLaunchKernelEx (4 ctypes arguments; grid and stream
    packed with the parameters). cuLaunchKernelEx exists from CUDA 12.0 drivers on; older
    ones keep cuLaunchKernel (and their PDL / cluster entries get no fast launcher)."""
    global _use_ex
    if _use_ex is None:
        if not isinstance(_cuLaunchKernelEx, _LazyFn):
            _use_ex = True          # already resolved (or replaced by a test's stub)
        else:
            try:
                globals()["_cuLaunchKernelEx"] = drv.fn_raw("cuLaunchKernelEx")
                _use_ex = True
            except drv.CudaUnavailable:
                _use_ex = False
    return _use_ex


_single: bool | None = None


def _single_device() -> bool:
    """True when the process sees exactly one cuda device. Then a fast launcher need not check
    this thread's current device: it only runs in a thread that made device `idx` current (its
    entry's general-path launch, or `prepare`), and `set_device` cannot make another one
    current (there is none), so `_tls.device == idx` holds on every call."""
    global _single
    if _single is None:
        try:
            _single = drv.device_count() == 1
        except (drv.CudaUnavailable, drv.CudaError):
            _single = False
    return _single


def _meta(sig: _Sig, args, kwargs) -> dict:
    # what Triton hands a grid callable: every bound argument by name, defaults included
    meta = {p.name: p.default for p in sig.params if p.has_default}
    meta.update(zip(sig.names, args))
    meta.update(kwargs)
    return meta


def _value_error(e: _Entry, vals, err) -> Exception:
    for v, ty, name in zip(vals, e.types, e.names):
        try:
            struct.pack("<" + ("Q" if ty[0] == "*" else _PACK[ty]), v)
        except (struct.error, OverflowError):
            return KernelArgumentError(f"launch: argument {name!r} of {e.name} = {v!r} does not fit "
                                       f"the kernel's {ty} parameter")
    return KernelArgumentError(f"launch: cannot pack the arguments of {e.name}: {err}")


def cache_info() -> dict:
    """Sizes of the launcher's caches (this thread's prepared launches and fast launchers,
    loaded modules)."""
    return {"prepared": len(_ENTRIES.local()), "modules": len(_modules),
            "kernels": len(_sigs),
            "fast": sum(len(fl) for rec in getattr(_state, "fast", {}).values()
                        for fl in rec[2].values())}


def _fast_list(kernel, kwargs) -> list:
    """This thread's fast launchers of `kernel` for constexprs/options `kwargs`, newest first
    (the list itself: tests and the benchmark rearrange it)."""
    rec = getattr(_state, "fast", {}).get(id(kernel))
    return rec[2].get(_kw_key(kwargs), []) if rec is not None else []


def clear_cache() -> None:
    """Forget prepared launches and fast launchers (this thread) and bound signatures;
    loaded modules stay. Launchers made by `prepare` keep their own entries."""
    _ENTRIES.local().clear()
    getattr(_state, "fast", {}).clear()
    _sigs.clear()
