"""The launch-key census: every kernel variant a workload makes the dispatch choose.

    with census.record() as c:
        run_some_workload()
    c.save("census.json")

While recording, every binding the launcher makes is logged with its full key (see
aot.key_of): on cuda each miss of the prepared launches (the place it would compile), on
interp every launch (the interpreter binds each one). Both devices run the same kernels
with the same keys, except where a rule branches on the device type:

  * the `INTERP` constexpr (libdevice on cuda, NumPy stand-ins on interp): recorded as
    False on interp (`as_cuda=True`, the default), the value cuda passes;
  * configs chosen by device type (block sizes and tiles of the random, reduction, sort,
    sampling, indexing, shape and attention families; the models' bf16 on cuda; cuda-only
    kernels: Gluon attention and sort, PDL variants, CUDA-graph decode). These are not
    translated: the census recorded on cuda (`python -m nbxtensor.cli_census OUT --device
    cuda`, the workload of cli_census.py) is the complete one, the interp census a subset.

Families that know their variants statically list them with a module-level
`census_keys()` returning (kernel, signature, constexprs, attrs, options) bindings;
`static_keys()` collects them from the loaded kernel modules.
"""
from __future__ import annotations

import contextlib
import json
import sys

from . import aot
from . import launcher as L

__all__ = ["Census", "record", "load", "static_keys"]


class Census:
    """Recorded launch keys: key -> {"kernel": module:qualname}; and bindings no key can
    describe (a constexpr of an unknown type), by kernel."""

    def __init__(self, as_cuda: bool = True):
        self.keys: dict = {}
        self.unkeyable: dict = {}
        self.as_cuda = as_cuda

    def __len__(self):
        return len(self.keys)

    def add(self, kernel, signature, constexprs, attrs, options) -> None:
        if self.as_cuda:
            idx = [i for i, n in enumerate(signature) if n == "INTERP"]
            if idx and constexprs.get((idx[0],)) is True:
                constexprs = dict(constexprs)
                constexprs[(idx[0],)] = False
        name = aot.kernel_name(kernel)
        try:
            key = aot.key_of(kernel, signature, constexprs, attrs, options)
        except TypeError as e:
            self.unkeyable.setdefault(name, str(e))
            return
        if key not in self.keys:
            self.keys[key] = {"kernel": name}

    def kernels(self) -> dict:
        """kernel name -> number of variants."""
        out: dict = {}
        for v in self.keys.values():
            out[v["kernel"]] = out.get(v["kernel"], 0) + 1
        return out

    def merge(self, other: "Census") -> None:
        for k, v in other.keys.items():
            self.keys.setdefault(k, v)
        self.unkeyable.update(other.unkeyable)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"format": 1, "keys": sorted(self.keys), "unkeyable": self.unkeyable}, f,
                      indent=0)


def load(path: str) -> Census:
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"census: cannot read {path}: {e}") from None
    if not isinstance(d, dict) or d.get("format") != 1 or not isinstance(d.get("keys"), list):
        raise ValueError(f"census: {path} is not a census file (format 1 with a 'keys' list)")
    c = Census()
    for k in d["keys"]:
        c.keys[k] = {"kernel": json.loads(k)[0]}
    c.unkeyable = dict(d.get("unkeyable") or {})
    return c


@contextlib.contextmanager
def record(as_cuda: bool = True):
    """Record every binding the launcher makes inside the block (one recorder at a time)."""
    if L._recorder is not None:
        raise RuntimeError("census.record: a census is already recording")
    c = Census(as_cuda)
    L._recorder = c.add
    try:
        yield c
    finally:
        L._recorder = None


def static_keys() -> Census:
    """The keys the kernel modules list themselves (`census_keys()`), every module imported
    (a dispatch imports only the modules of the ops it runs)."""
    from ... import dispatch
    dispatch._load("triton")
    c = Census(as_cuda=False)
    for name, mod in list(sys.modules.items()):
        if name.startswith("nbxtensor.kernels.") and hasattr(mod, "census_keys"):
            for binding in mod.census_keys():
                c.add(*binding)
    return c
