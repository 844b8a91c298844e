"""One idea a function: no function in the package runs over MAX_LINES lines unless a
`# long: <why>` comment on the line above it (above its decorators) says why it is one piece.

A Triton kernel is one fused program (splitting it into @triton.jit helpers is fine, but
where the body is one loop nest the reason says so); a generated-code template is one
string; everything else is split into named steps.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "src" / "nbxtensor"
MAX_LINES = 80


def _long_functions():
    for p in sorted(ROOT.rglob("*.py")):
        text = p.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text, str(p))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            n = node.end_lineno - node.lineno + 1
            if n <= MAX_LINES:
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            above = lines[first - 2].strip() if first >= 2 else ""
            yield str(p.relative_to(ROOT)), node.name, n, above


def test_long_functions_state_why():
    bad = [f"{path}: {name} ({n} lines)" for path, name, n, above in _long_functions()
           if not (above.startswith("# long:") and len(above) > len("# long:") + 10)]
    assert not bad, (f"functions over {MAX_LINES} lines without a `# long: <why>` comment "
                     f"above them (split them into named steps, or say why not): {bad}")


def test_the_rule_sees_a_long_function(tmp_path, monkeypatch):
    """The walk finds a long function and reads the comment above its decorators."""
    pkg = tmp_path / "nbxtensor"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES + 1))
    (pkg / "a.py").write_text(f"import functools\n\n@functools.cache\ndef f():\n{body}\n")
    (pkg / "b.py").write_text(f"# long: one loop nest, kept whole on purpose\n"
                              f"def g():\n{body}\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", pkg)
    found = {name: above for _, name, _, above in _long_functions()}
    assert set(found) == {"f", "g"}
    assert found["f"] == "" and found["g"].startswith("# long:")
