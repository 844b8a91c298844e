"""The census workload: the ops and models whose launches make the launch-key census.

    python -m nbxtensor.cli_census OUT [--device interp|cuda] [--models]

records every kernel variant the workload makes the dispatch choose (the recorder is
backends/cuda/census.py) into OUT, the file `nbx build-kernels --census` compiles. The
workload runs the public ops and the reference models, so it sits with the command line,
above everything it exercises.
"""
from __future__ import annotations

import sys
import time

from .backends.cuda import census

__all__ = ["run_workload", "main"]


# long: a flat list of workload steps, one short block per op family
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
            from . import models as M
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
    p = argparse.ArgumentParser(prog="python -m nbxtensor.cli_census",
                                description="record the launch-key census of the op workload")
    p.add_argument("out")
    p.add_argument("--device", default="interp", choices=("interp", "cuda"))
    p.add_argument("--models", action="store_true", help="run the reference models too")
    a = p.parse_args(argv)
    with census.record(as_cuda=True) as c:
        run_workload(a.device, log=lambda s: print(s, file=sys.stderr), models=a.models)
    c.merge(census.static_keys())
    c.save(a.out)
    print(f"{len(c)} launch keys of {len(c.kernels())} kernels -> {a.out}")
    for name, why in c.unkeyable.items():
        print(f"  unkeyable: {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

