"""Ahead-of-time kernels: an archive of compiled cubins, looked up by launch key.

The launcher asks `lookup` where it would otherwise compile (a miss of its prepared
launches); Triton is imported only when the archive lacks the variant. Without Triton a
missing variant raises `MissingKernelError`, which names the kernel, the key and the fix.

A launch key is what Triton's compile depends on, as the binder computes it (no Triton
needed): the kernel's qualified name, its signature with dtypes, which arguments carry
the 16-byte divisibility attribute, the constexprs (the constant 1 included), the compile
options; the archive is per target architecture. `key_of` writes it as one canonical
JSON string.

Archive file (one per arch, `nbx-kernels-sm_90.bin`):

    b"NBXKERN1"  u64 index length  index (JSON, utf-8)  blobs (zlib-compressed cubins)

The index: {"format", "arch", "cc", "triton", "kernels": {key: entry}, "unbuilt": {key:
why}} where `unbuilt` lists the census keys that do not compile for this arch (Hopper's
Gluon kernels for sm_80: the lookup then names the reason) and an entry is
{"blob": [offset, length], "meta": {name, shared, num_warps, num_ctas, cluster_dims,
global_scratch_size, global_scratch_align, profile_scratch_size, launch_pdl,
launch_cooperative_grid, tensordesc_meta, hash, nparams}, "src": source hash}.
Offsets count from the end of the index; identical cubins are stored once. `nparams` is
the parameter count the kernel's PTX `.entry` declares (the launcher checks its binding
against it, as after a compile). `src` is `source_hash(kernel)`: the source text of the
kernel and of every kernel function it calls, and the module constants it reads; an entry
built from other source is not used.

Cubins are compiled without line-number debug info, so their bytes depend on the code alone
(not on where a function sits in its file): a build on the CPU machine equals one on the GPU.
A device of compute capability 8.x without its own archive loads sm_80's (SASS of 8.0 runs on
every 8.x chip; from 9.0 on Triton targets the `a` variants, which run on their own chip only).

Without Triton the kernel modules import against the stand-in of `_notriton.py` (see
docs/design/aot.md); `NBX_KERNEL_ARCHIVES` names another folder of archives.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import struct
import threading
import zlib

__all__ = ["MissingKernelError", "StaleArchiveError", "Archive", "ArchiveWriter", "key_of",
           "kernel_name", "lookup", "set_archive_dir", "archive_dir", "archive_path", "jit",
           "Param", "params_of", "arch_name", "encode_value", "decode_value", "source_hash",
           "archive_for", "no_line_info", "not_for_arch", "key_not_for_arch"]

MAGIC = b"NBXKERN1"
FORMAT = 1
META_FIELDS = ("name", "shared", "num_warps", "num_ctas", "global_scratch_size",
               "global_scratch_align", "profile_scratch_size", "launch_pdl",
               "launch_cooperative_grid", "tensordesc_meta", "hash")


class MissingKernelError(RuntimeError):
    """The archive lacks a kernel variant and Triton is not installed to compile it."""


class StaleArchiveError(ValueError):
    """An archive file is unreadable or of another format."""


def arch_name(cc: int) -> str:
    return f"sm_{cc}"


# ----------------------------------------------------------------------------- kernel identity

def kernel_name(kernel) -> str:
    """`module:qualname` of the kernel's Python function (a @triton.jit kernel, a @gluon.jit
    one, or one of ours from `jit`)."""
    fn = getattr(kernel, "fn", kernel)
    return f"{fn.__module__}:{fn.__qualname__}"


_src_hashes: dict = {}        # file -> hash of its bytes (read once)
_fn_hashes: dict = {}         # code object -> hash of its function's source text
_deps: dict = {}              # id(kernel) -> (kernel, functions, files, constants) it is built from


def _file_hash(path) -> str:
    h = _src_hashes.get(path)
    if h is None:
        try:
            with open(path, "rb") as f:
                h = hashlib.sha256(f.read()).hexdigest()[:16]
        except (OSError, TypeError):
            # generated code (a `<...>` name): its source as registered in linecache, where
            # Triton reads it too
            import linecache
            lines = linecache.getlines(path) if isinstance(path, str) else []
            h = hashlib.sha256("".join(lines).encode()).hexdigest()[:16] if lines else "unknown"
        _src_hashes[path] = h
    return h


def _function_hash(fn) -> str:
    """Hash of a function's source text (not of where it sits in its file: moving a kernel
    leaves its archive entries valid, as Triton's own cache key)."""
    code = fn.__code__
    h = _fn_hashes.get(code)
    if h is None:
        try:
            # linecache also holds generated code (a `<...>` name), where Triton reads it too
            text = inspect.getsource(fn)
        except (OSError, TypeError):
            text = None
        h = _fn_hashes[code] = (hashlib.sha256(text.encode()).hexdigest()[:16] if text
                                else "file " + _file_hash(code.co_filename))
    return h


def _names(code, out: set) -> set:
    """The names a code object (and the code nested in it) reads: its globals and attributes
    (a superset of the globals it loads: an attribute that shares a global's name only adds
    to the hash)."""
    out.update(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            _names(c, out)
    return out


def _ours(fn) -> bool:
    # Triton's own functions (builtins, Gluon's wrappers) belong to the Triton version, which
    # the archive records; ours (nbxtensor's, a user's) are hashed
    return not (getattr(fn, "__module__", None) or "triton").startswith("triton")


def _reach(fn, fns: dict, files: set, consts: dict, seen: set) -> None:
    """The kernel functions `fn` calls, transitively (helpers of other modules compile into
    it), the files of our modules it reads attributes of, and the plain constants it reads
    from module globals."""
    if id(fn) in seen or not hasattr(fn, "__code__"):
        return
    seen.add(id(fn))
    fns[f"{fn.__module__}:{fn.__qualname__}"] = fn
    g = getattr(fn, "__globals__", {})
    for name in sorted(_names(fn.__code__, set())):
        obj = g.get(name)
        if obj is None:
            continue
        if type(obj).__name__ == "module":
            f = getattr(obj, "__file__", None)
            if f and obj.__name__.startswith("nbxtensor."):
                files.add(f)      # helpers read as module.attribute (tl, libdevice: Triton's)
            continue
        inner = getattr(obj, "fn", None)
        if hasattr(inner, "__code__"):
            if _ours(inner):       # a @triton.jit / @gluon.jit / constexpr function, or a stand-in
                _reach(inner, fns, files, consts, seen)
        elif not hasattr(obj, "__code__"):       # plain functions: host code, not compiled
            v = getattr(obj, "value", obj)       # tl.constexpr(...) or a plain value
            if v is None or type(v) in (int, float, bool, str):
                consts[f"{fn.__module__}.{name}"] = repr(v)


def source_hash(kernel) -> str:
    """Hash of what the kernel is compiled from, beyond its launch key: the source of its
    function and of every kernel function it calls (transitively), the files of our modules
    it reads attributes of, and the constants it reads from module globals. An archive entry
    built from other sources is not used; an edit elsewhere in the kernel's file (host code,
    another kernel) leaves it valid. Computed from the Python functions alone, so Triton's
    kernels and the stand-in's hash alike."""
    d = _deps.get(id(kernel))
    if d is None:
        fn = getattr(kernel, "fn", kernel)
        fns, files, consts = {}, set(), {}
        _reach(fn, fns, files, consts, set())
        d = _deps[id(kernel)] = (kernel, sorted(fns.items()), sorted(files),
                                 sorted(consts.items()))
    _, fns, files, consts = d
    h = hashlib.sha256()
    for name, f in fns:
        h.update(f"{name}={_function_hash(f)};".encode())
    for f in files:
        h.update(f"{os.path.basename(f)}={_file_hash(f)};".encode())
    for k, v in consts:
        h.update(f"{k}={v};".encode())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- keys

def encode_value(v):
    """A constexpr or option value as JSON, its type kept (2, 2.0 and True compile
    differently). Triton dtypes are recognised by their class, without importing Triton."""
    if v is None:
        return ["n"]
    t = type(v)
    if t is bool:
        return ["b", v]
    if t is int:
        return ["i", v]
    if t is float:
        return ["f", repr(v)]     # repr keeps nan/inf and every bit
    if t is str:
        return ["s", v]
    if t in (tuple, list):
        return ["t" if t is tuple else "l", [encode_value(x) for x in v]]
    mod = getattr(t, "__module__", "") or ""
    if (mod.startswith("triton.language") and t.__name__ in ("dtype", "pointer_type")
            or mod == _STAND_IN and t.__name__ == "dtype"):
        return ["tl", str(v)]     # the stand-in's dtypes print as Triton's: one key
    if mod.startswith("nbxtensor") and t.__name__ == "DType":
        return ["nbx", v.name]
    raise TypeError(f"aot: cannot key a value of type {t.__module__}.{t.__name__}: {v!r}")


_STAND_IN = __name__.rpartition(".")[0] + "._notriton"


def decode_value(e):
    """The value `encode_value` encoded (Triton dtypes need Triton: used by the builder)."""
    tag = e[0]
    if tag == "n":
        return None
    if tag in ("b", "i", "s"):
        return e[1]
    if tag == "f":
        return float(e[1])
    if tag in ("t", "l"):
        vals = [decode_value(x) for x in e[1]]
        return tuple(vals) if tag == "t" else vals
    if tag == "tl":
        import triton.language as tl
        s = e[1]
        if s.startswith("pointer<"):
            return tl.pointer_type(tl.dtype(s[len("pointer<"):-1]))
        return tl.dtype(s)
    if tag == "nbx":
        from ... import dtypes
        return dtypes.as_dtype(e[1])
    raise ValueError(f"aot: unknown value tag {tag!r}")


def key_of(kernel, signature: dict, constexprs: dict, attrs: dict, options: dict) -> str:
    """The launch key of a binding (the binder's output, see launcher.bind)."""
    return key_from_parts(kernel_name(kernel), signature, constexprs, attrs, options)


def key_from_parts(name, signature, constexprs, attrs, options) -> str:
    return json.dumps([
        name,
        [[k, v] for k, v in signature.items()],
        sorted([i[0], "D" if a else ""] for i, a in attrs.items()),
        sorted([i[0], encode_value(v)] for i, v in constexprs.items()),
        sorted([k, encode_value(v)] for k, v in options.items()),
    ], separators=(",", ":"))


def parts_of(key: str):
    """(name, signature, constexprs, attrs, options) of a key, as the builder compiles it."""
    name, sig, div, cx, opts = json.loads(key)
    signature = {k: v for k, v in sig}
    constexprs = {(i,): decode_value(v) for i, v in cx}
    attrs = {(i,): ([["tt.divisibility", 16]] if d else []) for i, d in div}
    options = {k: decode_value(v) for k, v in opts}
    return name, signature, constexprs, attrs, options


# ----------------------------------------------------------------------------- archive

class _Meta:
    """The compiled kernel's metadata the launcher reads (as Triton's KernelMetadata)."""

    def __init__(self, d: dict):
        self.__dict__.update(d)


class Archive:
    """A read-only archive file: the index is read on open, a cubin on its first lookup."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            head = f.read(16)
            if len(head) < 16 or head[:8] != MAGIC:
                raise StaleArchiveError(f"aot: {path} is not an nbxtensor kernel archive")
            (n,) = struct.unpack("<Q", head[8:])
            self.index = json.loads(f.read(n))
        if self.index.get("format") != FORMAT:
            raise StaleArchiveError(f"aot: {path} has archive format {self.index.get('format')}, "
                                    f"this nbxtensor reads format {FORMAT}; rebuild it")
        self.base = 16 + n
        self.kernels = self.index["kernels"]
        self.unbuilt = self.index.get("unbuilt") or {}
        self.arch = self.index["arch"]

    def get(self, key: str):
        """(metadata, cubin bytes, source hash) for `key`, or None."""
        e = self.kernels.get(key)
        if e is None:
            return None
        off, ln = e["blob"]
        with open(self.path, "rb") as f:
            f.seek(self.base + off)
            cubin = zlib.decompress(f.read(ln))
        return _Meta(e["meta"]), cubin, e.get("src")


class ArchiveWriter:
    """Collects compiled kernels and writes one archive file: in key order, so the same
    kernels give the same bytes however they were gathered (compiled, or kept from an
    earlier archive)."""

    def __init__(self, arch: str, cc: int, triton_version: str):
        self.index = {"format": FORMAT, "arch": arch, "cc": cc, "triton": triton_version,
                      "kernels": {}, "unbuilt": {}}
        self.entries: dict = {}       # key -> (meta, cubin, src)

    def add(self, key: str, meta: dict, cubin: bytes, src: str) -> None:
        self.entries[key] = (meta, cubin, src)

    def write(self, path: str) -> int:
        blobs, by_digest, size = [], {}, 0
        kernels = self.index["kernels"] = {}
        for key in sorted(self.entries):
            meta, cubin, src = self.entries[key]
            d = hashlib.sha256(cubin).digest()
            blob = by_digest.get(d)
            if blob is None:
                z = zlib.compress(cubin, 9)
                blob = by_digest[d] = [size, len(z)]
                blobs.append(z)
                size += len(z)
            kernels[key] = {"blob": blob, "meta": meta, "src": src}
        idx = json.dumps(self.index, separators=(",", ":"), sort_keys=True).encode()
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(idx)) + idx)
            for b in blobs:
                f.write(b)
        os.replace(tmp, path)
        return os.path.getsize(path)


def meta_of(md, ptx_params: int) -> dict:
    """What the launcher needs of Triton's compiled metadata, as JSON."""
    d = {f: getattr(md, f) for f in META_FIELDS}
    d["tensordesc_meta"] = list(d["tensordesc_meta"] or [])
    d["cluster_dims"] = [md.num_ctas, 1, 1]
    d["nparams"] = ptx_params
    return d


# ----------------------------------------------------------------------------- lookup

_DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "kernel_archives")
_dir: str | None = None       # None: NBX_KERNEL_ARCHIVES, else the package's own folder
_archives: dict = {}          # cc -> Archive or None (no file)
_lock = threading.Lock()


def archive_dir() -> str:
    if _dir is not None:
        return _dir
    from ... import config
    return config.get("NBX_KERNEL_ARCHIVES") or _DEFAULT_DIR


def set_archive_dir(path: str | None) -> None:
    """Where the archives are looked for (None: NBX_KERNEL_ARCHIVES, else the package's own
    `kernel_archives`)."""
    global _dir
    with _lock:
        _dir = None if path is None else str(path)
        _archives.clear()
        _built_with.clear()


def archive_path(cc: int, directory: str | None = None) -> str:
    return os.path.join(directory or archive_dir(), f"nbx-kernels-{arch_name(cc)}.bin")


def archive_for(cc: int, directory: str | None = None) -> str | None:
    """The archive file a device of compute capability `cc` loads from `directory` (default
    archive_dir()): its own, else for 8.x sm_80's; None when there is none."""
    for c in (cc, 80) if cc // 10 == 8 else (cc,):
        p = archive_path(c, directory)
        if os.path.exists(p):
            return p
    return None


def _archive(cc: int):
    a = _archives.get(cc, False)
    if a is False:
        with _lock:
            p = archive_for(cc)
            a = _archives[cc] = Archive(p) if p is not None else None
    return a


def lookup(kernel, key: str, cc: int):
    """(metadata, cubin) of `key` from the archive for `cc`, or None when it lacks it (or
    holds it built from another version of the kernel's source)."""
    a = _archive(cc)
    if a is None:
        return None
    hit = a.get(key)
    if hit is None or hit[2] != source_hash(kernel):
        return None
    return hit[0], hit[1]


def describe_key(key: str) -> str:
    """A launch key in words: the constexprs, the argument types (with Triton's
    specialisations) and the compile options."""
    try:
        name, sig, div, cx, opts = json.loads(key)
        names = [k for k, _ in sig]
        divisible = {i for i, d in div if d}
        consts = ", ".join(f"{names[i]}={_show(decode_plain(v))}" for i, v in cx)
        args = ", ".join(f"{n}: {t}" + (" (16-divisible)" if i in divisible else "")
                         for i, (n, t) in enumerate(sig) if t != "constexpr")
        options = ", ".join(f"{k}={_show(decode_plain(v))}" for k, v in opts)
    except (ValueError, TypeError, IndexError):
        return key
    return f"constexprs {{{consts}}}, arguments {{{args}}}, options {{{options or 'defaults'}}}"


def decode_plain(e):
    """As decode_value, a Triton dtype kept as its name (no Triton needed)."""
    return ("tl", e[1]) if e[0] == "tl" else decode_value(e)


def _show(v):
    return f"tl.{v[1]}" if isinstance(v, tuple) and len(v) == 2 and v[0] == "tl" else repr(v)


def compile_blocker(kernel) -> str | None:
    """Why `kernel` cannot be compiled in this process (None: it can, Triton imports)."""
    if getattr(kernel, "archive_only", False) is True:
        from ... import config
        if config.get("NBX_ARCHIVE_ONLY"):
            return ("its module was imported without Triton (NBX_ARCHIVE_ONLY=1: kernels come "
                    "from the archive only)")
        err = triton_importable()
        return f"Triton, which would compile it, cannot be imported ({err})"
    err = triton_importable()
    if err is not None:
        return f"Triton, which would compile it, cannot be imported ({err})"
    return None


def missing(kernel, key: str, cc: int, why) -> MissingKernelError:
    """The error for a variant the archive for `cc` lacks and this process cannot compile
    (`why`: compile_blocker's answer, or an ImportError)."""
    a = _archive(cc)
    where = (f"the kernel archive {a.path} does not hold it" if a is not None else
             f"no kernel archive for {arch_name(cc)} in {archive_dir()}")
    if a is not None and key in a.kernels:
        where = f"the kernel archive {a.path} holds it built from another version of its source"
    elif a is not None and key in a.unbuilt:
        where = (f"it does not compile for {a.arch} (the build of {a.path} said: "
                 f"{a.unbuilt[key]})")
    if isinstance(why, ImportError):
        why = f"Triton, which would compile it, cannot be imported ({why})"
    return MissingKernelError(
        f"kernel {kernel_name(kernel)}: no compiled variant for {arch_name(cc)} with "
        f"{describe_key(key)}: {where}, and {why}. Install the cuda extra "
        f"(pip install 'nbxtensor[cuda]') to compile it on first use, or rebuild the archive "
        f"with `nbx build-kernels --arch {arch_name(cc)}` from a census that includes this "
        f"launch (python -m nbxtensor.cli_census OUT --device cuda). Launch key: {key}")


_built_with: list = []


def kernels_built_with() -> str | None:
    """The Triton version that built the kernel archives, where kernels come from the archives
    only (the stand-in is in use: no Triton, or NBX_ARCHIVE_ONLY=1); None where Triton
    compiles. Tuned configurations are chosen for that version (autotune's tables)."""
    from . import _notriton
    if not _notriton.IN_USE:
        return None
    if not _built_with:
        d, v = archive_dir(), None
        names = sorted(os.listdir(d)) if os.path.isdir(d) else []
        for f in names:
            if f.startswith("nbx-kernels-") and f.endswith(".bin"):
                try:
                    v = Archive(os.path.join(d, f)).index.get("triton")
                except (StaleArchiveError, OSError, ValueError):
                    continue
                break
        _built_with.append(v)
    return _built_with[0]


def triton_importable() -> ImportError | None:
    """None when Triton imports, else the ImportError."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return e
    return None


# ----------------------------------------------------------------- kernels without Triton

_CANON = {"bool": "u1", "int1": "u1", "uint1": "u1", "i1": "u1", "float16": "fp16", "half": "fp16",
          "bfloat16": "bf16", "float": "fp32", "float32": "fp32", "double": "fp64",
          "float64": "fp64", "int8": "i8", "int16": "i16", "int": "i32", "int32": "i32",
          "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
          "float8e4nv": "fp8e4nv", "float8e5": "fp8e5", "float8e4b15": "fp8e4b15",
          "float8e4b8": "fp8e4b8", "float8e5b16": "fp8e5b16"}
_CANON.update({v: v for v in list(_CANON.values())})


def _normalize(ann) -> str:
    """Triton 3.6's `_normalize_ty` for string annotations (a module with `from __future__
    import annotations` keeps them as strings, so no Triton object is needed)."""
    if ann is inspect.Parameter.empty or not ann:
        return ""
    if not isinstance(ann, str):
        name = getattr(ann, "__name__", None) or str(ann)
        if name == "constexpr" or type(ann).__name__ == "constexpr_type":
            return "constexpr"
        ann = str(ann)
    ty = ann.strip()
    if ty.startswith("const "):
        return "*k" + _normalize(ty.removeprefix("const"))[1:]
    if ty.endswith("*"):
        return "*" + _normalize(ty[:-1])
    if ty.startswith("*"):
        return "*" + _normalize(ty[1:])
    if ty.startswith("tl."):
        return _normalize(ty.removeprefix("tl."))
    if ty.startswith("triton.language."):
        return _normalize(ty.removeprefix("triton.language."))
    return _CANON.get(ty, ty)


class Param:
    """One parameter of a kernel, with the attributes the binder reads of Triton's
    KernelParam, computed from the Python function alone."""

    __slots__ = ("num", "name", "annotation", "default", "has_default", "do_not_specialize",
                 "do_not_specialize_on_alignment")

    def __init__(self, num, p: inspect.Parameter, dns: bool, dnsa: bool):
        self.num, self.name = num, p.name
        self.annotation = _normalize(p.annotation)
        self.default = p.default
        self.has_default = p.default is not inspect.Parameter.empty
        self.do_not_specialize, self.do_not_specialize_on_alignment = dns, dnsa

    @property
    def is_constexpr(self) -> bool:
        return "constexpr" in self.annotation

    @property
    def is_const(self) -> bool:
        return not self.is_constexpr and ("const" in self.annotation
                                          or self.annotation.startswith("*k"))

    @property
    def annotation_type(self) -> str:
        a = self.annotation
        a = a[2:] if a.startswith("*k") else a[1:] if a.startswith("*") else a
        return self.annotation if a in _CANON.values() else ""


def params_of(fn, do_not_specialize=(), do_not_specialize_on_alignment=()) -> list:
    """The kernel parameters of a Python function (names or positions in the two lists,
    as @triton.jit takes them)."""
    sig = inspect.signature(fn)
    names = list(sig.parameters)

    def pos(lst):
        return {names.index(x) if isinstance(x, str) else x for x in lst}

    dns, dnsa = pos(do_not_specialize), pos(do_not_specialize_on_alignment)
    return [Param(i, p, i in dns, i in dnsa) for i, p in enumerate(sig.parameters.values())]


class Kernel:
    """A kernel whose Triton JIT function is made on first need: launching from the archive
    needs only `fn` and `params` (both without Triton); a compile (a variant the archive
    lacks, or the interpreter) makes the @triton.jit function then."""

    def __init__(self, fn, do_not_specialize=(), do_not_specialize_on_alignment=(), **jit_kwargs):
        self.fn = fn
        self.__name__, self.__doc__ = fn.__name__, fn.__doc__
        self._dns = (do_not_specialize, do_not_specialize_on_alignment)
        self._params = None
        self.debug = jit_kwargs.get("debug")
        self._jit_kwargs = dict(jit_kwargs, do_not_specialize=list(do_not_specialize),
                                do_not_specialize_on_alignment=list(do_not_specialize_on_alignment))
        self._jit = None

    @property
    def params(self) -> list:
        # read on the first bind: a module defines many kernels, a process launches few
        if self._params is None:
            self._params = params_of(self.fn, *self._dns)
        return self._params

    @property
    def arg_names(self) -> list:
        return [p.name for p in self.params]

    @property
    def cache_key(self) -> str:
        return kernel_name(self)

    def jit_function(self):
        """The @triton.jit function of this kernel (imports Triton)."""
        if self._jit is None:
            import triton
            self._jit = triton.jit(self.fn, **self._jit_kwargs)
        return self._jit

    def is_gluon(self) -> bool:
        return False

    def __repr__(self):
        return f"<nbx kernel {kernel_name(self)}>"


def jit(fn=None, **kwargs):
    """`@aot.jit` (or `@aot.jit(do_not_specialize=[...])`): a kernel launchable from the
    archive without Triton; Triton's @triton.jit is applied on the first compile."""
    if fn is None:
        return lambda f: Kernel(f, **kwargs)
    return Kernel(fn, **kwargs)


def compile_target(kernel):
    """What Triton compiles for `kernel`: its JIT function (ours are made here)."""
    return kernel.jit_function() if isinstance(kernel, Kernel) else kernel


# ----------------------------------------------------------------------------- build

def resolve(name: str):
    """The kernel object `module:qualname` names (imports its module)."""
    import importlib
    mod, _, qual = name.partition(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def no_line_info():
    """Triton compiles without line-number debug info inside the block (the cubin's bytes
    then depend on the code alone): config.triton_without_line_info."""
    from ... import config
    return config.triton_without_line_info()


def _warm(keys, cc: int, fresh: bool) -> int:
    """A build worker: compile `keys` into Triton's on-disk cache (failures are left for the
    parent, which compiles them again and reports them)."""
    import triton

    from .launcher import _compile
    triton.knobs.compilation.always_compile = fresh
    n = 0
    for key in keys:
        name, signature, constexprs, attrs, options = parts_of(key)
        try:
            _compile(resolve(name), signature, constexprs, attrs, options, cc)
            n += 1
        except Exception:  # noqa: BLE001 - the parent's compile reports it
            pass
    return n


def build(keys, cc: int, out_dir: str, log=None, jobs: int = 1, fresh: bool = False,
          reuse: str | None = None) -> dict:
    """Compile every launch key in `keys` for compute capability `cc` with Triton (without
    line info: `no_line_info`) and write the archive into `out_dir`. Returns {"path", "size",
    "kernels", "failed": {key: error}, "seconds"}; the failed keys are the archive's
    `unbuilt`. `jobs` > 1 compiles in that many processes first (through Triton's on-disk
    cache, which the archive is then read from); `fresh` compiles every key even where
    Triton's cache holds it (the cache's entries without line info depend on the code only,
    so this is for a suspect cache). `reuse`: an earlier archive whose entries of the same
    key, kernel source hash, Triton version and arch are kept without a compile (a rebuild
    after a kernel edit compiles that kernel's variants only); "kept" in the result counts
    them."""
    import time

    import triton

    from ... import config
    if config.get("NBX_ARCHIVE_ONLY"):
        raise RuntimeError("aot.build compiles Triton's kernels; with NBX_ARCHIVE_ONLY=1 the "
                           "kernel modules import against the stand-in, which does not compile: "
                           "unset it")
    t0 = time.time()
    w = ArchiveWriter(arch_name(cc), cc, triton.__version__)
    failed: dict = {}
    keys = sorted(keys)
    kept = _kept(keys, cc, reuse, w) if reuse and not fresh else set()
    with no_line_info():
        _build_all([k for k in keys if k not in kept], cc, w, failed, log, t0, jobs, fresh)
    w.index["unbuilt"] = dict(sorted(failed.items()))
    os.makedirs(out_dir, exist_ok=True)
    path = archive_path(cc, out_dir)
    size = w.write(path)
    return {"path": path, "size": size, "kernels": len(w.index["kernels"]), "failed": failed,
            "kept": len(kept), "seconds": time.time() - t0}


def key_not_for_arch(key: str, cc: int) -> bool:
    """Whether census key `key` (a JSON launch key) need not compile for `cc`: its kernel is
    one of `not_for_arch`'s, or it launches with programmatic dependent launch, which the
    dispatch uses on sm_90 and newer only (kernels/_pdl.py)."""
    k = json.loads(key)
    if not_for_arch(k[0], cc):
        return True
    return cc < 90 and ["launch_pdl", ["b", True]] in k[-1]


def not_for_arch(name: str, cc: int) -> bool:
    """Whether kernel `name` is one that need not compile for compute capability `cc`:
    Gluon's kernels use Hopper's wgmma, TMA and mbarriers (below sm_90 their keys are the
    archive's `unbuilt`, by design). Plain Triton kernels compile for every arch (Triton
    lowers tensor descriptors to pointer loads below sm_90)."""
    if cc >= 90:
        return False
    try:
        kernel = resolve(name)
    except (ImportError, AttributeError):
        return False
    return bool(getattr(kernel, "is_gluon", lambda: False)())


def _kept(keys, cc: int, path: str, w: ArchiveWriter) -> set:
    """The keys of `keys` taken from the archive at `path` (same Triton, arch and sources)."""
    import triton
    try:
        prev = Archive(path)
    except (OSError, StaleArchiveError, ValueError):
        return set()
    if prev.index.get("triton") != triton.__version__ or prev.index.get("cc") != cc:
        return set()
    kept, hashes = set(), {}
    for key in keys:
        e = prev.kernels.get(key)
        if e is None:
            continue
        name = json.loads(key)[0]
        if name not in hashes:
            try:
                hashes[name] = source_hash(resolve(name))
            except (ImportError, AttributeError):
                hashes[name] = None
        if e.get("src") != hashes[name]:
            continue
        md, cubin, src = prev.get(key)
        w.add(key, dict(vars(md)), cubin, src)
        kept.add(key)
    return kept


def _build_all(keys, cc, w, failed, log, t0, jobs, fresh) -> None:
    import time

    import triton
    if not keys:
        return
    always = triton.knobs.compilation.always_compile
    if jobs > 1 and len(keys) > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        # round robin: one kernel's variants spread over the workers
        parts = [keys[i::jobs] for i in range(min(jobs, len(keys)))]
        with cf.ProcessPoolExecutor(len(parts), mp_context=mp.get_context("spawn")) as ex:
            done = sum(ex.map(_warm, parts, [cc] * len(parts), [fresh] * len(parts)))
        if log:
            log(f"[{arch_name(cc)}] {done}/{len(keys)} compiled by {len(parts)} processes "
                f"({time.time() - t0:.0f} s)")
        fresh = False          # the workers' results, from Triton's cache
    triton.knobs.compilation.always_compile = fresh
    try:
        _build_keys(keys, cc, w, failed, log, t0)
    finally:
        triton.knobs.compilation.always_compile = always


def _build_keys(keys, cc, w, failed, log, t0) -> None:
    import time

    from .launcher import _compile, declared_param_count
    for n, key in enumerate(keys, 1):
        name, signature, constexprs, attrs, options = parts_of(key)
        try:
            kernel = resolve(name)
            ck = _compile(kernel, signature, constexprs, attrs, options, cc)
        except Exception as e:  # noqa: BLE001 - reported per key; the others still build
            failed[key] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if log:
                log(f"[{arch_name(cc)} {n}/{len(keys)}] {name}: FAILED {failed[key]}")
            continue
        w.add(key, meta_of(ck.metadata, declared_param_count(ck.asm["ptx"])), ck.asm["cubin"],
              source_hash(kernel))
        if log and (n % 10 == 0 or n == len(keys)):
            log(f"[{arch_name(cc)} {n}/{len(keys)}] {name} ({time.time() - t0:.0f} s)")
