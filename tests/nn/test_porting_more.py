"""More of the porting suite: torch inference programs of the kinds users port (modules loaded
from a state dict, attention, convolutional nets, recurrent seq2seq, sampling, tensor
manipulation, dtype/device habits, NumPy interop), run unchanged but for their imports.

Each program in fixtures/porting/more/*.py is ordinary torch source (see
fixtures/make_porting_more_fixtures.py for its protocol and for how torch's outputs were made;
the torch version is in fixtures/porting/more/manifest.json). Here the imports are changed as
in test_porting.py, the model (if any) is built, loaded from the state dict torch saved
(.pth through nbx.load, .safetensors through nbxtensor.io.safetensors.load_file) with
strict=True and moved to the device, and `run` gets the inputs on the device. Every output
must be what torch returned: a Tensor where torch gave a Tensor (same shape and dtype, values
within the dtype's tolerance), a NumPy array where torch gave one, a Python int/float/bool/
str/list where torch gave that.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import nbxtensor as nbx
from test_porting import load_program as _load_program

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "porting", "more")
with open(os.path.join(HERE, "manifest.json"), encoding="utf-8") as _f:
    MANIFEST = json.load(_f)["programs"]

_TOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-9,
        np.dtype(np.complex64): 2e-5}


def load_program(name):
    return _load_program(name, HERE, "ported_")


def _close(what, got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch {want.shape}"
    if want.dtype.kind in "iubUS":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    tol = _TOL.get(want.dtype, 2e-5)
    w = want.astype(np.float64)
    finite = np.isfinite(w)
    scale = max(1.0, float(np.abs(w[finite]).max())) if finite.any() else 1.0
    np.testing.assert_allclose(got.astype(np.float64), w, rtol=tol, atol=tol * scale, err_msg=what)


def _check(name, k, kind, got, want, device):
    what = f"{name} output {k}"
    if kind == "tensor":
        assert isinstance(got, nbx.Tensor), f"{what}: {type(got).__name__}, torch gave a Tensor"
        arr = got.cpu().numpy()
        assert arr.dtype == want.dtype, f"{what}: dtype {arr.dtype}, torch {want.dtype}"
        _close(what, arr, want)
        return
    if kind == "ndarray":
        assert isinstance(got, np.ndarray), f"{what}: {type(got).__name__}, torch gave an ndarray"
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, torch {want.dtype}"
        _close(what, got, want)
        return
    if kind == "npscalar":
        assert isinstance(got, np.generic), f"{what}: {type(got).__name__}, torch gave a NumPy scalar"
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, torch {want.dtype}"
        _close(what, got, want)
        return
    py = {"bool": bool, "int": int, "float": float, "str": str, "list": list, "tuple": tuple}[kind]
    assert type(got) is py or (kind == "tuple" and isinstance(got, tuple)), \
        f"{what}: {type(got).__name__} {got!r}, torch gave a {kind}"
    if kind == "float":
        # a Python float is read off a tensor (x.sum().item()), float32 in these programs: its
        # reduction order is the device's, so it carries float32's tolerance, not float64's
        _close(what, np.float32(got), np.float32(want))
        return
    _close(what, got, want)


def _check_sample(name, k, got, want, probs):
    """A draw from the device's generator (not torch's stream off cpu): torch's shape and
    dtype, and every sampled index where the probabilities are > 0."""
    what = f"{name} output {k} (sampled)"
    assert isinstance(got, nbx.Tensor), what
    idx = got.cpu().numpy()
    assert idx.shape == want.shape and idx.dtype == want.dtype, what
    p = probs.cpu().numpy()
    assert (np.take_along_axis(p, idx, axis=-1) > 0).all(), f"{what}: index outside the support"


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_program_matches_torch(name, device):
    meta = MANIFEST[name]
    prog = load_program(name)
    data = np.load(os.path.join(HERE, name + ".npz"))
    args = [nbx.tensor(data[f"in{k}"], device=device) for k in range(meta["inputs"])]
    model = None
    if meta["state"] is not None:
        model = prog.build()
        path = os.path.join(HERE, f"{name}.{meta['state']}")
        if meta["state"] == "safetensors":
            from nbxtensor.io.safetensors import load_file
            state = load_file(path)
        else:
            state = nbx.load(path)
        result = model.load_state_dict(state)    # strict: every key present, none extra
        assert result.missing_keys == [] and result.unexpected_keys == []
        model.to(device)
        args = [model] + args
    outs = prog.run(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert len(outs) == len(meta["outputs"])
    random_outs = getattr(prog, "DEVICE_RANDOM", {}) if device != "cpu" else {}
    for k, (kind, o) in enumerate(zip(meta["outputs"], outs)):
        if model is not None and kind == "tensor":
            where = "cpu" if k in getattr(prog, "HOST_OUTPUTS", ()) else device
            assert o.device == nbx.device(where), f"{name} output {k} on {o.device}"
        if k in random_outs:
            _check_sample(name, k, o, data[f"out{k}"], outs[random_outs[k]])
            continue
        _check(name, k, kind, o, data[f"out{k}"], device)
    if model is not None:
        assert not model.training   # run() called model.eval()
