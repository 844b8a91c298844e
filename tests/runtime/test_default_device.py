"""nbx.set_default_device / get_default_device and `with nbx.device(...)`: the factories follow
the default device; ops on existing tensors, from_numpy and the loaders do not (torch's rule)."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx

FACTORIES = {
    "tensor": lambda: nbx.tensor([1.0, 2.0]),
    "as_tensor": lambda: nbx.as_tensor([1, 2]),
    "zeros": lambda: nbx.zeros(2, 3),
    "ones": lambda: nbx.ones(2),
    "empty": lambda: nbx.empty(4),
    "full": lambda: nbx.full((2,), 7.0),
    "arange": lambda: nbx.arange(5),
    "linspace": lambda: nbx.linspace(0, 1, 4),
    "logspace": lambda: nbx.logspace(0, 1, 4),
    "eye": lambda: nbx.eye(3),
    "scalar_tensor": lambda: nbx.scalar_tensor(1.5),
    "rand": lambda: nbx.rand(3),
    "randn": lambda: nbx.randn(3),
    "randint": lambda: nbx.randint(0, 5, (3,)),
    "randperm": lambda: nbx.randperm(6),
    "hann_window": lambda: nbx.hann_window(8),
    "triu_indices": lambda: nbx.triu_indices(3, 3),
    "legacy Tensor": lambda: nbx.Tensor(2, 2),
}


@pytest.fixture
def restore_default():
    yield
    nbx.set_default_device(None)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories_follow_the_default(name, device, restore_default):
    assert nbx.get_default_device() == nbx.device("cpu")
    nbx.set_default_device(device)
    assert nbx.get_default_device() == nbx.device(device)
    t = FACTORIES[name]()
    assert t.device == nbx.device(device), (name, t.device)
    nbx.set_default_device(None)
    assert FACTORIES[name]().device == nbx.device("cpu")


def test_context_manager_nests_and_restores(device, restore_default):
    with nbx.device(device) as d:
        assert d == nbx.device(device) and nbx.get_default_device() == d
        assert nbx.zeros(1).device == d
        with nbx.device("cpu"):
            assert nbx.zeros(1).device == nbx.device("cpu")
        assert nbx.ones(1).device == d
    assert nbx.get_default_device() == nbx.device("cpu")
    with pytest.raises(KeyError):
        with nbx.device(device):
            raise KeyError("inside")
    assert nbx.get_default_device() == nbx.device("cpu")     # restored on an exception too


def test_what_does_not_follow_the_default(device, restore_default, tmp_path):
    src = nbx.arange(3.0)                    # made on cpu before the switch
    nbx.set_default_device(device)
    assert nbx.from_numpy(np.zeros(2)).device == nbx.device("cpu")
    assert (src + 1).device == nbx.device("cpu")        # ops keep their inputs' device
    assert nbx.zeros_like(src).device == nbx.device("cpu")
    assert nbx.tensor(src).device == nbx.device("cpu")  # a tensor's data keeps its device
    assert nbx.Generator().device == nbx.device("cpu")
    nbx.save({"w": src}, tmp_path / "w.pth")
    assert nbx.load(tmp_path / "w.pth")["w"].device == nbx.device("cpu")
    assert nbx.zeros(2, device="cpu").device == nbx.device("cpu")   # explicit wins


def test_refusals(restore_default):
    with pytest.raises(ValueError, match="unknown device type"):
        nbx.set_default_device("tpu")
    with pytest.raises(TypeError):
        nbx.set_default_device(3.5)
    assert nbx.get_default_device() == nbx.device("cpu")
