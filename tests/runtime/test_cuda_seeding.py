"""nbx.cuda's seeding functions (torch.cuda.manual_seed & co) and the
torch.backends.cuda.matmul flags."""
from __future__ import annotations

import numpy as np
import pytest

import nbxtensor as nbx


def test_seeding_without_a_gpu_is_a_no_op_and_checks_its_argument():
    if nbx.cuda.is_available():
        pytest.skip("a GPU is present: see test_seeding_on_the_gpu")
    nbx.cuda.manual_seed(3)
    nbx.cuda.manual_seed_all(4)
    nbx.cuda.seed()
    nbx.cuda.seed_all()
    with pytest.raises(nbx.cuda.CudaUnavailable, match="cuda.initial_seed: no cuda device"):
        nbx.cuda.initial_seed()
    with pytest.raises(TypeError, match="cuda.manual_seed: seed must be an int, got str"):
        nbx.cuda.manual_seed("3")
    with pytest.raises(TypeError, match="cuda.manual_seed_all: seed must be an int"):
        nbx.cuda.manual_seed_all(1.5)


def test_seeding_on_the_gpu():
    if not nbx.cuda.is_available():
        pytest.skip("needs a GPU")
    from nbxtensor import random as R
    nbx.cuda.manual_seed(1234)
    assert nbx.cuda.initial_seed() == 1234
    g = R.default_generator_for("cuda:0")
    a = nbx.rand(1000, device="cuda").numpy()
    nbx.cuda.manual_seed_all(1234)
    assert g.initial_seed() == 1234
    b = nbx.rand(1000, device="cuda").numpy()
    np.testing.assert_array_equal(a, b)
    nbx.cuda.seed()
    assert nbx.cuda.initial_seed() != 1234
    nbx.cuda.seed_all()


def test_backends_cuda_matmul_allow_tf32_is_the_precision_switch():
    nbx.cuda.is_available()      # nbx.cuda (imported on first use) installs the flags
    m = nbx.backends.cuda.matmul
    old = nbx.get_float32_matmul_precision()
    try:
        m.allow_tf32 = True
        assert nbx.get_float32_matmul_precision() == "high" and m.allow_tf32
        m.allow_tf32 = False
        assert nbx.get_float32_matmul_precision() == "highest" and not m.allow_tf32
        with pytest.raises(TypeError, match="allow_tf32 must be a bool"):
            m.allow_tf32 = 1
        assert m.allow_bf16_reduced_precision_reduction in (True, False)
    finally:
        nbx.set_float32_matmul_precision(old)
