"""The porting suite: torch inference programs run unchanged but for their imports.

Each program in fixtures/porting/*.py is ordinary torch source. Here its import lines are
changed the way a user ports (`import torch` -> `import nbxtensor as torch`, `torch.nn` ->
`nbxtensor.nn`, ...) and nothing else; the model is built, loaded from the state dict torch
saved (read by nbx.load) with strict=True, moved to the device, and run on the inputs torch
ran on. Outputs must match torch's (fixtures/make_porting_fixtures.py, torch version in
fixtures/porting/manifest.json).
"""
from __future__ import annotations

import json
import os
import re
import types

import numpy as np
import pytest

import nbxtensor as nbx

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "porting")
with open(os.path.join(HERE, "manifest.json"), encoding="utf-8") as _f:
    PROGRAMS = sorted(json.load(_f)["programs"])

_IMPORTS = [
    (re.compile(r"^(\s*)import torch\s*$", re.M), r"\1import nbxtensor as torch"),
    (re.compile(r"^(\s*)import torch\.([\w.]+) as (\w+)", re.M), r"\1import nbxtensor.\2 as \3"),
    (re.compile(r"^(\s*)from torch(\.[\w.]+)? import", re.M), r"\1from nbxtensor\2 import"),
]


def port(source: str) -> str:
    """The user's one change: the imports."""
    for pat, rep in _IMPORTS:
        source = pat.sub(rep, source)
    assert not re.search(r"^\s*(import|from) torch\b", source, re.M), source
    return source


def load_program(name, folder=HERE, prefix="ported_"):
    """Program `name` of `folder`, its torch imports rewritten by `port`, as a module."""
    path = os.path.join(folder, name + ".py")
    with open(path, encoding="utf-8") as f:
        src = port(f.read())
    mod = types.ModuleType(prefix + name)
    mod.__file__ = path
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def _check(name, k, got, want):
    got = got.numpy() if isinstance(got, nbx.Tensor) else np.asarray(got)
    assert got.shape == want.shape, f"{name} output {k}: shape {got.shape}, torch {want.shape}"
    if want.dtype.kind in "iub":
        assert got.dtype == want.dtype, f"{name} output {k}: dtype {got.dtype}, torch {want.dtype}"
        np.testing.assert_array_equal(got, want, err_msg=f"{name} output {k}")
        return
    assert got.dtype == want.dtype, f"{name} output {k}: dtype {got.dtype}, torch {want.dtype}"
    w = want.astype(np.float64)
    scale = max(1.0, float(np.abs(w).max()))
    np.testing.assert_allclose(got.astype(np.float64), w, rtol=2e-5, atol=2e-5 * scale,
                               err_msg=f"{name} output {k}")


@pytest.mark.parametrize("name", PROGRAMS)
def test_program_matches_torch(name, device):
    prog = load_program(name)
    model = prog.build()
    state = nbx.load(os.path.join(HERE, name + ".pth"))
    result = model.load_state_dict(state)       # strict: every key present, none extra
    assert result.missing_keys == [] and result.unexpected_keys == []
    model.to(device)
    data = np.load(os.path.join(HERE, name + ".npz"))
    n_in = sum(1 for k in data.files if k.startswith("in"))
    inputs = [nbx.tensor(data[f"in{k}"], device=device) for k in range(n_in)]
    outs = prog.run(model, *inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    flat = []
    for o in outs:
        flat.extend(o if isinstance(o, tuple) else (o,))
    n_out = sum(1 for k in data.files if k.startswith("out"))
    assert len(flat) == n_out
    for k, o in enumerate(flat):
        assert o.device == nbx.device(device)
        _check(name, k, o, data[f"out{k}"])
    assert not model.training   # run() called model.eval()


def test_port_changes_only_imports():
    src = "import torch\nimport torch.nn as nn\nfrom torch.nn import functional as F\nx = torch.ones(2)\n"
    assert port(src) == ("import nbxtensor as torch\nimport nbxtensor.nn as nn\n"
                         "from nbxtensor.nn import functional as F\nx = torch.ones(2)\n")
