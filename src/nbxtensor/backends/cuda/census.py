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
    translated: the census recorded on cuda (`python -m nbxtensor.backends.cuda.census
    OUT --device cuda`) is the complete one, the interp census a subset.

Families that know their variants statically list them with a module-level
`census_keys()` returning (kernel, signature, constexprs, attrs, options) bindings;
`static_keys()` collects them from the loaded kernel modules.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time

from . import aot
from . import launcher as L

__all__ = ["Census", "record", "load", "static_keys", "run_workload"]


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
    """The keys the loaded kernel modules list themselves (`census_keys()`)."""
    c = Census(as_cuda=False)
    for name, mod in list(sys.modules.items()):
        if name.startswith("nbxtensor.kernels.") and hasattr(mod, "census_keys"):
            for binding in mod.census_keys():
                c.add(*binding)
    return c


# ----------------------------------------------------------------------------- workload

def run_workload(device: str = "interp", log=None, models: bool = False,
                 only=None) -> None:
    """A representative op workload on `device`: the element-wise, reduction, matmul, norm,
    softmax, indexing, shape, sort and sampling families over the dtypes the models use, at
    sizes that overhang the block sizes, contiguous and strided; with `models`, the shipped
    reference models too (an embedding with minilm, a few tokens of smollm2, their default
    dtypes on `device`). `only`: the names of the steps to run (default all: "elementwise",
    "reduction", "softmax, norm", "matmul", "attention", "indexing, shape", "sort, sampling",
    and "models" with `models`)."""
    import numpy as np

    import nbxtensor as nbx
    rng = np.random.default_rng(0)

    def T(shape, dtype="float32"):
        a = rng.standard_normal(shape).astype(np.float32)
        return nbx.tensor(a, device=device).to(getattr(nbx, dtype))

    steps = []

    def step(name):
        def deco(f):
            steps.append((name, f))
            return f
        return deco

    @step("elementwise")
    def _():
        for dt in ("float32", "float16", "bfloat16"):
            x, y = T((37, 65), dt), T((37, 65), dt)
            for r in (x + y, x * y, x - 1.5, x / y, nbx.exp(x), nbx.silu(x), nbx.gelu(x),
                      nbx.tanh(x), nbx.sigmoid(x), nbx.rsqrt(nbx.abs(x) + 1), x.t() + 1,
                      nbx.where(x > 0, x, y), nbx.maximum(x, y), x.to(nbx.float32)):
                r.numel()
        i = nbx.tensor(rng.integers(0, 100, (300,)), device=device)
        (i + 1, i * 3, i // 7, i % 5, i.to(nbx.float32))

    @step("reduction")
    def _():
        for dt in ("float32", "bfloat16"):
            x = T((33, 257), dt)
            (x.sum(-1), x.mean(0), x.amax(-1), nbx.argmax(x, -1), x.sum(), nbx.cumsum(x, -1),
             nbx.logsumexp(x.to(nbx.float32), -1), x.var(-1))

    @step("softmax, norm")
    def _():
        for dt in ("float32", "bfloat16"):
            x = T((19, 384), dt)
            w, b = T((384,), dt), T((384,), dt)
            (nbx.softmax(x, -1), nbx.log_softmax(x, -1), nbx.layer_norm(x, (384,), w, b),
             nbx.rms_norm(x, (384,), w))

    @step("matmul")
    def _():
        for dt in ("float32", "bfloat16"):
            a, b = T((70, 96), dt), T((96, 130), dt)
            (a @ b, nbx.linear(a, b.t()), a[:1] @ b,
             nbx.bmm(T((3, 17, 32), dt), T((3, 32, 48), dt)))

    @step("attention")
    def _():
        for dt in ("float32", "bfloat16"):
            q, k, v = T((1, 2, 20, 64), dt), T((1, 2, 20, 64), dt), T((1, 2, 20, 64), dt)
            nbx.scaled_dot_product_attention(q, k, v, is_causal=True)
            nbx.scaled_dot_product_attention(q, k, v)

    @step("indexing, shape")
    def _():
        x = T((50, 24))
        idx = nbx.tensor(rng.integers(0, 50, (17,)), device=device)
        (nbx.index_select(x, 0, idx), nbx.embedding(idx, x), x[idx], nbx.cat([x, x], 0),
         x.permute(1, 0).contiguous(), nbx.gather(x, 1, nbx.zeros((50, 3), dtype=nbx.int64,
                                                                   device=device)),
         nbx.tril(x), x.flip(0))

    @step("sort, sampling")
    def _():
        x = T((4, 300))
        (nbx.sort(x, -1), nbx.topk(x, 5, -1), nbx.argsort(x, -1))
        nbx.manual_seed(0)
        (nbx.rand((1000,), device=device), nbx.randn((1000,), device=device),
         nbx.multinomial(nbx.softmax(x, -1), 1))

    if models:
        @step("models")
        def _():
            from ... import models as M
            M.load_model("minilm", device=device).embed(["the launch-key census", "of a model"])
            m = M.load_model("smollm2", device=device)
            ids = m.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
            M.generate(m, ids, max_new_tokens=4, sampler=M.Sampler(0.0, 0, 1.0, 1.0, None))
            M.generate(m, ids, max_new_tokens=4, sampler=M.Sampler(0.7, 40, 0.9, 1.1, 0))

    if only is not None:
        unknown = set(only) - {n for n, _ in steps}
        if unknown:
            raise ValueError(f"run_workload: only={sorted(unknown)} names no step; the steps "
                             f"are {[n for n, _ in steps]}")
        steps = [(n, f) for n, f in steps if n in only]
    for name, f in steps:
        t = time.time()
        try:
            f()
        except Exception as e:  # noqa: BLE001 - a family failing here leaves its keys out, said so
            if log:
                log(f"census: {name}: {type(e).__name__}: {e}")
            continue
        if log:
            log(f"census: {name} ({time.time() - t:.1f} s)")


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m nbxtensor.backends.cuda.census",
                                description="record the launch-key census of the op workload")
    p.add_argument("out")
    p.add_argument("--device", default="interp", choices=("interp", "cuda"))
    p.add_argument("--models", action="store_true", help="run the reference models too")
    a = p.parse_args(argv)
    with record(as_cuda=True) as c:
        run_workload(a.device, log=lambda s: print(s, file=sys.stderr), models=a.models)
    c.merge(static_keys())
    c.save(a.out)
    print(f"{len(c)} launch keys of {len(c.kernels())} kernels -> {a.out}")
    for name, why in c.unkeyable.items():
        print(f"  unkeyable: {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
