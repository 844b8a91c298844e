"""A third set of porting programs (fixtures/porting/extra: a DistilBERT-style classifier on
scaled_dot_product_attention, a BatchNorm conv net in eval, generation with top-k/top-p and a
seeded Generator, tensor and dtype habits), run unchanged but for their imports on every device
and checked against torch's stored outputs exactly as test_porting_more.py checks its set
(fixtures/make_porting_extra_fixtures.py made them; the torch version is in the manifest)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import nbxtensor as nbx
from test_porting import load_program as _load_program
from test_porting_more import _check, _check_sample

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "porting",
                    "extra")
with open(os.path.join(HERE, "manifest.json"), encoding="utf-8") as _f:
    MANIFEST = json.load(_f)["programs"]


def load_program(name):
    return _load_program(name, HERE, "ported_extra_")


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_program_matches_torch(name, device):
    meta = MANIFEST[name]
    prog = load_program(name)
    data = np.load(os.path.join(HERE, name + ".npz"))
    args = [nbx.tensor(data[f"in{k}"], device=device) for k in range(meta["inputs"])]
    model = None
    if meta["state"] is not None:
        model = prog.build()
        state = nbx.load(os.path.join(HERE, f"{name}.{meta['state']}"))
        result = model.load_state_dict(state)
        assert result.missing_keys == [] and result.unexpected_keys == []
        model.to(device)
        args = [model] + args
    outs = prog.run(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert len(outs) == len(meta["outputs"])
    random_outs = getattr(prog, "DEVICE_RANDOM", {}) if device != "cpu" else {}
    for k, (kind, o) in enumerate(zip(meta["outputs"], outs)):
        if k in random_outs:
            _check_sample(name, k, o, data[f"out{k}"], outs[random_outs[k]])
            continue
        _check(name, k, kind, o, data[f"out{k}"], device)
    if model is not None:
        assert not model.training
