"""Layers hold: no module imports from a layer above its own (docs/architecture.md).

The imports are read from the source (every `import`/`from` statement, function-local ones
included). KNOWN lists the crossings the package still has; each is debt to remove (issue 19),
and the test fails both on a new crossing and on a KNOWN entry that no longer exists, so the
list only shrinks and stays true.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "src" / "nbxtensor"

# bottom to top; a module may import its own layer and those below. "nbxtensor" (the package
# root, the public API) and the public nbx.cuda module sit with the ops surface.
LAYER = {
    "config": 0, "dtypes": 0, "device": 0, "storage": 0, "tensor": 0, "_format": 0,
    "creation": 0, "dispatch": 0, "plans": 0, "files": 0, "index_errors": 0, "declarations": 0,
    "backends": 1,
    "kernels": 2, "autotune": 2, "kernel_archives": 2,
    # grad_mode is torch's API surface and attaches Tensor methods, as an op family does
    "ops": 3, "cuda": 3, "random": 3, "fft": 3, "signal": 3, "dlpack": 3, "kv_cache": 3,
    "linalg": 3, "special": 3, "testing": 3, "jit": 3, "grad_mode": 3, "distributions": 3,
    "__root__": 3,
    "nn": 4,
    "io": 5, "audio": 5,
    "models": 6, "distributed": 6,
    "cli": 7, "cli_commands": 7, "cli_tune": 7, "cli_census": 7,
}

KNOWN: set = set()     # every crossing is gone; a new one fails test_no_new_upward_import


def _key(dotted: str) -> str:
    rest = dotted.split(".")[1:]
    return ".".join(rest) if rest else "__root__"


def _layer(key: str):
    return LAYER.get(key.split(".")[0])


def _imports(path: pathlib.Path, module: str, package: str):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "nbxtensor":
                yield from ("nbxtensor." + a.name if ("nbxtensor." + a.name).split(".")[1]
                            in LAYER else "nbxtensor" for a in node.names)
            elif name.startswith("nbxtensor."):
                yield name
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "nbxtensor")


def crossings() -> set:
    found = set()
    for p in sorted(ROOT.rglob("*.py")):
        rel = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        module = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
        package = module if p.name == "__init__.py" else module.rsplit(".", 1)[0]
        me = _key(module)
        mine = _layer(me)
        if mine is None or me == "__root__":   # the root is the facade that re-exports all
            continue
        for target in _imports(p, module, package):
            t = _key(target)
            theirs = _layer(t)
            if theirs is not None and theirs > mine and t.split(".")[0] != me.split(".")[0]:
                found.add((me, t))
    return found


def test_every_top_level_module_has_a_layer():
    names = {p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "__main__")}
    names |= {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert sorted(names - set(LAYER)) == []


def test_no_new_upward_import():
    new = sorted(crossings() - KNOWN)
    assert new == [], f"imports from a higher layer (see docs/architecture.md): {new}"


def test_known_crossings_still_exist():
    gone = sorted(KNOWN - crossings())
    assert gone == [], f"these crossings are gone: remove them from KNOWN: {gone}"


# modules asked for through sys.modules ("only if it is loaded"), bypassing the layers
KNOWN_REACH: set = set()


def _reach_arounds() -> set:
    hits = set()
    for p in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key, base = node.slice.value, node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "get" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                key, base = node.args[0].value, node.func.value
            if isinstance(key, str) and key.startswith("nbxtensor") \
                    and isinstance(base, ast.Attribute) and base.attr == "modules":
                hits.add((str(p.relative_to(ROOT)), key))
    return hits


def test_no_new_sys_modules_reach_around():
    found = _reach_arounds()
    assert sorted(found - KNOWN_REACH) == []
    assert sorted(KNOWN_REACH - found) == [], "gone: remove them from KNOWN_REACH"
