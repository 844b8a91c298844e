"""Test configuration: the device list every op test is parametrised over.

cpu always; interp when triton is installed; cuda when a GPU answers. Set
NBX_TEST_DEVICES=cpu,interp (for example) to restrict the list.
"""
from __future__ import annotations

import builtins
import os
import sys

# One BLAS thread per test worker: `pytest -n 2` on 2 cores with OpenBLAS's own threads on top
# oversubscribes the machine (seen: model decode 10x slower). Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402

# tests/ holds the shared modules (helpers, fakes, reference_models); the area folders hold
# test modules that others import for their builders (test_graphs' tiny Llama, ...)
_TESTS = os.path.dirname(os.path.abspath(__file__))
for _area in ("ops", "runtime", "io", "nn", "models", "cli"):
    sys.path.insert(0, os.path.join(_TESTS, _area))
sys.path.insert(0, _TESTS)


@pytest.fixture
def poison_outputs(monkeypatch):
    """Every float tensor the ops allocate (outputs, workspaces) starts as NaN, so an element a
    kernel fails to write shows. The one poison fixture: a test module opts in with
    `pytestmark = pytest.mark.usefixtures("poison_outputs")`."""
    from helpers import poison_allocations
    poison_allocations(monkeypatch)


# ---- torch stays out of the package: any import of torch while a frame of src/nbxtensor is on
# the stack is recorded, and the session fails at its end (tests may import torch themselves,
# as an optional reference; that is not counted). The first import goes through the meta path
# (the finder below); once a test has imported torch, an `import torch` finds it in sys.modules
# and asks no finder, so `import` statements are watched too (builtins.__import__)
_PKG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src",
                        "nbxtensor") + os.sep
_TORCH_FROM_PACKAGE: list = []


def _is_torch(name) -> bool:
    return name == "torch" or name.startswith("torch.")


def _record_if_from_package(name, f) -> None:
    # the nearest frame decides: torch's own code importing its parts (a torch tensor's
    # __dlpack__ called by nbx.from_dlpack imports torch.utils.dlpack) is not the package's
    while f is not None:
        fn = f.f_code.co_filename
        if f"{os.sep}torch{os.sep}" in fn:
            return
        if fn.startswith(_PKG_DIR) or "/site-packages/nbxtensor/" in fn:
            _TORCH_FROM_PACKAGE.append(f"{name} from {fn}:{f.f_lineno}")
            return
        f = f.f_back


class _TorchImportWatch:
    def find_spec(self, name, path=None, target=None):
        if _is_torch(name):
            _record_if_from_package(name, sys._getframe(1))
        return None   # never resolves anything itself


_builtin_import = builtins.__import__


def _watched_import(name, globals=None, locals=None, fromlist=(), level=0):
    # only modules already imported: the others reach the finder above (a None entry, as
    # the interp runner plants to block Triton's `import torch`, makes the import fail)
    if not level and _is_torch(name) and sys.modules.get(name) is not None:
        _record_if_from_package(name, sys._getframe(1))
    return _builtin_import(name, globals, locals, fromlist, level)


sys.meta_path.insert(0, _TorchImportWatch())
builtins.__import__ = _watched_import


def _available_devices():
    from importlib.util import find_spec
    devs = ["cpu"]
    if find_spec("triton") is not None:
        devs.append("interp")
    try:
        from nbxtensor.backends.cuda import driver
        if driver.availability()[0]:
            devs.append("cuda")
    except Exception:
        pass
    only = os.environ.get("NBX_TEST_DEVICES")
    if only:
        devs = [d for d in devs if d in only.split(",")]
    return devs


DEVICES = _available_devices()


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames and not any(
            m.name == "parametrize" and "device" in m.args[0] for m in metafunc.definition.iter_markers()):
        metafunc.parametrize("device", DEVICES)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec and callspec.params.get("device") == "cuda":
            item.add_marker(pytest.mark.cuda)


@pytest.fixture(autouse=True, scope="session")
def _no_torch_from_the_package():
    yield
    if _TORCH_FROM_PACKAGE:
        raise AssertionError("the package imported torch: " + "; ".join(_TORCH_FROM_PACKAGE[:5]))


# ---- NBX_TEST_CENSUS=PREFIX records every kernel binding of the session (interp binds each
# launch) into PREFIX.<worker>.json, for scripts/compile-check to build for sm_90 on a machine
# without a GPU: compile errors and shared-memory overruns show before the GPU run
@pytest.fixture(autouse=True, scope="session")
def _census_of_the_run():
    prefix = os.environ.get("NBX_TEST_CENSUS")
    if not prefix:
        yield
        return
    from nbxtensor.backends.cuda import census
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with census.record() as c:
        yield
    c.save(f"{prefix}.{worker}.json")
