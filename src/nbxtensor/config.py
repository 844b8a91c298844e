"""Every environment switch of the package, declared once: name, type, default, what it does.

No other module reads the environment. A switch is parsed on its first `get` and kept;
`refresh()` forgets the parsed values (the next `get` reads the environment again) and
`override(NAME=value, ...)` sets values for the length of a `with` block (tests). A value
that does not parse raises ValueError naming the variable, what it got and what it accepts.
Modules that read a switch at import (a kernel family's default) say so in the doc; their
run-time setters (`set_pdl`, `set_index_check`) change them afterwards.

The README's list of switches is `markdown_table()`; a test keeps the two equal.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

__all__ = ["Switch", "SWITCHES", "get", "refresh", "override", "markdown_table",
           "LAUNCH_VARS", "launch_env", "child_env", "set_nccl_env", "set_omp_env"]

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Switch:
    name: str
    kind: str                 # "bool", "str", "choice" or "int" (>= 0)
    default: object
    doc: str
    choices: tuple = ()

    def parse(self, raw: str | None):
        if raw is None or raw.strip() == "":
            return self.default
        v = raw.strip()
        if self.kind == "bool":
            if v.lower() in _TRUE:
                return True
            if v.lower() in _FALSE:
                return False
            raise ValueError(f"{self.name}={raw!r}: expected one of {_TRUE + _FALSE}")
        if self.kind == "int":
            if not v.isdigit():
                raise ValueError(f"{self.name}={raw!r}: expected an integer >= 0")
            return int(v)
        if self.kind == "choice" and v not in self.choices:
            raise ValueError(f"{self.name}={raw!r}: expected one of {self.choices}")
        return v


SWITCHES: dict[str, Switch] = {s.name: s for s in (
    Switch("NBX_INDEX_CHECK", "choice", "async",
           "when a cuda out-of-range index raises: at the next synchronising call (`async`) or "
           "at the op (`sync`, a device-to-host read per call; for debugging); "
           "`nbx.set_index_check` changes it at run time", ("async", "sync")),
    Switch("NBX_PDL", "bool", True,
           "programmatic dependent launch in the decode kernels (sm_90+); "
           "`kernels.decode_fused.set_pdl` changes it at run time"),
    Switch("NBX_CACHE_DIR", "str", "",
           "the folder of the autotune cache (default `~/.cache/nbxtensor`)"),
    Switch("NBX_AUTOTUNE", "bool", True,
           "use tuned kernel configurations (the user cache and the shipped tables); "
           "off: every kernel takes its rule's config"),
    Switch("NBX_NO_SHIPPED_TABLE", "bool", False,
           "ignore the shipped autotune tables (the user cache still applies)"),
    Switch("NBX_PROGRESS", "choice", "auto",
           "progress bars of large loads: `auto` (on a terminal), `1` always, `0` never",
           ("auto", "1", "0")),
    Switch("NBX_GLUON_ATTN", "bool", True,
           "causal D=128 attention on the Gluon kernel (cuda); off: the Triton kernels"),
    Switch("NBX_GLUON_SORT", "bool", True,
           "the Gluon block sort for short rows and sort tiles (cuda); off: `tl.sort` tiles"),
    Switch("NBX_ARCHIVE_ONLY", "bool", False,
           "cuda kernels come from the kernel archive only: the kernel modules import "
           "against nbxtensor's Triton stand-in even where Triton is installed, and a "
           "variant the archive lacks raises MissingKernelError (read at the kernels' "
           "import; no interp device then)"),
    Switch("NBX_KERNEL_ARCHIVES", "str", "",
           "the folder the cuda launcher reads kernel archives (`nbx-kernels-sm_XX.bin`) "
           "from (default: the package's `kernel_archives`)"),
    Switch("NBX_DIST_DEBUG", "bool", False,
           "nbx.distributed checks every collective across ranks: the ranks exchange "
           "(op, shape, dtype) through the store and raise naming the ranks that differ "
           "(a store round trip per call)"),
    Switch("NBX_CPU_THREADS", "int", 0,
           "threads of the cpu quantised GGUF kernels (numba); `0`: the cores this process "
           "may run on; `backends.cpu.quant.set_threads` changes it at run time"),
    Switch("NBX_CPU_INT8", "bool", True,
           "the cpu quantised GGUF GEMVs quantise the activation to int8 per block of 32 "
           "(a float32 scale each) and use integer dot products, as llama.cpp does; off: "
           "float32 activations (the dequantised float32 path's results within 2e-5)"),
)}

_values: dict[str, object] = {}


def get(name: str):
    """The value of switch `name` (parsed from the environment on first use)."""
    try:
        return _values[name]
    except KeyError:
        pass
    try:
        sw = SWITCHES[name]
    except KeyError:
        raise KeyError(f"no switch {name!r}; the switches are {sorted(SWITCHES)}") from None
    v = _values[name] = sw.parse(os.environ.get(name))
    return v


def refresh() -> None:
    """Forget the parsed values: the next `get` of each switch reads the environment again."""
    _values.clear()


@contextlib.contextmanager
def override(**values):
    """Set switches for the length of the block (values as `get` returns them, or strings)."""
    for k in values:
        if k not in SWITCHES:
            raise KeyError(f"no switch {k!r}; the switches are {sorted(SWITCHES)}")
    saved = {k: _values.get(k, _MISSING) for k in values}
    try:
        for k, v in values.items():
            _values[k] = SWITCHES[k].parse(v) if isinstance(v, str) else v
        yield
    finally:
        for k, v in saved.items():
            if v is _MISSING:
                _values.pop(k, None)
            else:
                _values[k] = v


_MISSING = object()


# ---- the process launch variables of nbx.distributed (torchrun's names, set by
# `python -m nbxtensor.distributed.run`), and the NCCL settings it imposes
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def launch_env() -> dict:
    """The launch variables as the environment has them (None where unset), unparsed:
    nbx.distributed parses them and names the variable in its errors."""
    return {k: os.environ.get(k) for k in LAUNCH_VARS}


def child_env(**values) -> dict:
    """This process's environment with `values` (str) set: for processes the launcher starts."""
    env = dict(os.environ)
    env.update({k: str(v) for k, v in values.items()})
    return env


def set_nccl_env() -> None:
    """Settings NCCL reads from the environment at communicator init: NVLink multicast
    (NVLS) stays off whatever the caller's environment says, because its multicast objects
    are not to be created on the machines this package runs on."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"


def set_omp_env() -> None:
    """The OpenMP runtime's wait policy for the cpu quantised kernels (numba's omp layer),
    set before numba starts its threads, unless the caller's environment chose one: threads
    sleep between parallel regions instead of spinning. A decode step opens ~150 regions; on
    a machine whose cores are busy with other work, spinning threads took the cores from
    each other and decode ran 20x slower (0.5 tok/s against 10.8 with passive waiting)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@contextlib.contextmanager
def triton_without_line_info():
    """Triton compiles without line-number debug info inside the block: the variable Triton
    reads at each compile and puts in its cache key (set in the environment, not as its
    knob, so a cached cubin with line info is not taken for one without; spawned workers
    inherit it). The kernel archive's builds use it (backends/cuda/aot.py)."""
    old = os.environ.get("TRITON_DISABLE_LINE_INFO")
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_DISABLE_LINE_INFO", None)
        else:
            os.environ["TRITON_DISABLE_LINE_INFO"] = old


def markdown_table() -> str:
    """The README's list of switches."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    for s in SWITCHES.values():
        d = {True: "1", False: "0"}.get(s.default, s.default) if s.kind == "bool" else s.default
        rows.append(f"| `{s.name}` | `{d}` | {s.doc} |" if d != "" else
                    f"| `{s.name}` | (unset) | {s.doc} |")
    return "\n".join(rows)
