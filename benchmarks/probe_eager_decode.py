"""On the GPU: the eager decode step of a bench_decode model shape (random weights, default
SmolLM2-135M), timed (best of 3 x 20 steps), driver calls counted per step, cProfile top
entries. TREE: the source tree to import (its src/ and benchmarks/), for a before/after.

    python3 benchmarks/probe_eager_decode.py TREE [MODEL]"""
import os, sys, time, collections
tree = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.join(tree, "benchmarks")); sys.path.insert(0, os.path.join(tree, "src"))
import numpy as np
import nbxtensor as nbx
print(nbx.__file__)
import bench_decode as bd
from nbxtensor.backends.cuda import driver as D
cnt = collections.Counter()
orig_fn = D.fn
def fn(name):
    f = orig_fn(name)
    def g(*a):
        cnt[name] += 1
        return f(*a)
    return g
cfg = dict(bd.MODELS[sys.argv[2] if len(sys.argv) > 2 else "SmolLM2-135M"])
w = bd.make_weights(cfg)
m = bd.nbx_model(cfg, w)
from nbxtensor.models.graph_decode import GraphDecoder
e = GraphDecoder(m, batch=1, capacity=2000, use_graph=False)
e.start_at(500, np.array([3]))
for _ in range(5): e.step()
nbx.cuda.synchronize()
best = 1e9
for r in range(3):
    nbx.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(20): e.step()
    nbx.cuda.synchronize()
    best = min(best, (time.perf_counter() - t0) / 20)
print(f"eager step: {best*1e6:.0f} us  ({1/best:.1f} tok/s)")
D.fn = fn
for _ in range(10): e.step()
nbx.cuda.synchronize()
print("driver fn calls per step:", {k: v / 10 for k, v in cnt.most_common(20)})
D.fn = orig_fn
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(30): e.step()
nbx.cuda.synchronize()
pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)
