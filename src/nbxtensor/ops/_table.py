"""The op-support table (docs/ops.md), generated from the code.

Four parts: the public functions of each op family (each family module's `__all__`),
the declared element-wise ops and the declared reductions (ops/_declare.py: one row per
declaration), and every
dispatch entry with the devices that implement it, read from the dispatch registry
(numpy -> cpu; triton -> interp and cuda). A family may declare the dtypes
an entry accepts in a module-level `SUPPORTED_DTYPES = {dispatch_name: (dtype names)}`;
entries without a declaration show "-".

    python -m nbxtensor.ops._table            # rewrite docs/ops.md
    python -m nbxtensor.ops._table --check    # exit 1 if docs/ops.md is stale

tests/ops/test_elementwise.py::test_ops_table_is_fresh fails when the committed table differs.
"""
from __future__ import annotations

import importlib
import os
import sys

FAMILIES = ("elementwise", "reduction", "indexing", "shape", "linalg", "nn", "attention",
            "conv", "pooling", "resample", "compare", "structure", "order", "contract", "losses")
_SHORT = {"bool": "b", "uint8": "u8", "int8": "i8", "int16": "i16", "int32": "i32",
          "int64": "i64", "float16": "f16", "bfloat16": "bf16", "float32": "f32",
          "float64": "f64", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2"}
_DEVICES = {"numpy": "cpu", "triton": "interp, cuda"}


def _registry() -> dict[str, set[str]]:
    """dispatch name -> the families ('numpy', 'triton') that implement it."""
    from .. import dispatch
    for fam in dispatch._FAMILY_PACKAGES:
        try:
            dispatch._load(fam)
        except ImportError:          # triton absent: the table would be incomplete
            raise RuntimeError(f"ops table: cannot import the {fam} backends; the table needs "
                               f"every backend installed (pip install -e '.[cuda]')") from None
    out: dict[str, set[str]] = {}
    for name, fam in dispatch._IMPLS:
        out.setdefault(name, set()).add(fam)
    return out


def _dtypes_of(name: str, declared: dict) -> str:
    d = declared.get(name)
    if not d:
        return "-"
    return " ".join(_SHORT.get(x, x) for x in d)


def _short(names) -> str:
    return " ".join(_SHORT.get(x, x) for x in names)


def _form(op) -> str:
    if op.form == "call":
        return f"call `{op.name}({op.signature})`"
    if op.form == "entry":
        from . import _declare
        for other in _declare.OPS.values():
            if op.entry == other.alpha:
                return f"entry (`{other.name}` with alpha=)"
            for mode, e in other.rounding:
                if op.entry == e:
                    return f"entry (`{other.name}` with rounding_mode={mode!r})"
        return "entry (hand-written function)"
    extra = ([f"alpha= `{op.alpha}`"] if op.alpha else []) + (
        [f"rounding_mode= {', '.join(f'{m}: `{e}`' for m, e in op.rounding)}"]
        if op.rounding else [])
    return op.form + (f" ({'; '.join(extra)})" if extra else "")


def declared_rows() -> list:
    """The declared element-wise ops' table (one row per ops/_declare.py declaration)."""
    from . import _declare
    rows = ["| op | aliases | form | dtype rule | dtypes | method | in-place | out= | operators "
            "| entry |", "|---|---|---|---|---|---|---|---|---|---|"]
    for op in _declare.OPS.values():
        public = op.form != "entry"
        method = (f"`x.{op.name}()`" if op.method and public else "-")
        if isinstance(op.method, str):
            method = f"`x.{op.name}({op.method.replace('self, ', '').replace(', self', '')})`"
        if op.form == "activation":
            inplace = "`inplace=True`" if op.inplace else "-"
            if op.inplace and op.method:
                inplace += f", `{op.name}_`"
            out = "-"
        else:
            inplace = f"`{op.name}_`" if op.inplace and public else "-"
            out = "yes" if public and (op.form != "call" or "out" in op.signature) else "-"
        rows.append(
            f"| `{op.name}` | {', '.join(f'`{a}`' for a in op.aliases) or '-'} | "
            f"{_form(op)} | {op.rule}: "
            f"{_declare.RULES[op.rule][1]} | {_short(op.dtypes)} | {method} | {inplace} | {out} | "
            f"{' '.join(f'`{o}`' for o in op.operators) or '-'} | `{op.entry}` |")
    return rows


def reduction_rows() -> list:
    """The declared reductions' table (one row per ops/_declare.py `reduction(...)`)."""
    from . import _declare
    from ..declarations import REDUCTION_RULES
    rows = ["| op | signature | result rule | empty dim | kernel (PRE COMB POST) | entry |",
            "|---|---|---|---|---|---|"]
    for op in _declare.REDUCTIONS.values():
        empty = ("error" if op.identity is None else
                 "NaN" if op.identity == "nan" else f"{op.identity}")
        rows.append(f"| `{op.name}` | `{op.signature}` | {op.rule}: {REDUCTION_RULES[op.rule]} | "
                    f"{empty} | {' '.join(op.tl)} | `reduce` kind `{op.kind}` |")
    return rows


def generate() -> str:
    """The markdown text of docs/ops.md."""
    declared: dict = {}
    owner: dict = {}
    lines = ["# Op support", "",
             "Generated by `python -m nbxtensor.ops._table` from the dispatch registry; "
             "`tests/ops/test_elementwise.py::test_ops_table_is_fresh` fails when this file is stale.", "",
             "## Public functions by family", ""]
    for fam in FAMILIES:
        mod = importlib.import_module(f"nbxtensor.ops.{fam}")
        names = sorted(getattr(mod, "__all__", []))
        for k, v in getattr(mod, "SUPPORTED_DTYPES", {}).items():
            declared[k] = v
            owner[k] = fam
        lines.append(f"- **{fam}** ({len(names)}): " + (", ".join(f"`{n}`" for n in names)
                                                       if names else "(none yet)"))
    lines += ["", "## Declared element-wise ops", "",
              "Each row is one declaration in `ops/_declare.py` (docs/design/ops-as-data.md): the "
              "function, its Tensor method and operators, the cpu implementation and the kernel "
              "branch are generated from it.", ""]
    lines += declared_rows()
    lines += ["", "## Declared reductions", "",
              "Each row is one `reduction(...)` in `ops/_declare.py`: the function, its Tensor "
              "method, the cpu implementation (a NumPy expression) and the kernel's steps are "
              "generated from it. max/min (values and indices), var/std, the norms, logsumexp, "
              "the nan-reductions and the scans are written by hand.", ""]
    lines += reduction_rows()
    reg = _registry()
    lines += ["", "## Dispatch entries", "",
              "Every entry that an op dispatches to, the devices that implement it, and the "
              "dtypes it accepts where its family declares them "
              "(b bool, u8/i8/i16/i32/i64 integers, f16 bf16 f32 f64 f8e4m3 f8e5m2 floats).", "",
              "| entry | cpu | interp | cuda | dtypes |", "|---|---|---|---|---|"]
    for name in sorted(reg):
        fams = reg[name]
        cpu = "yes" if "numpy" in fams else "-"
        tri = "yes" if "triton" in fams else "-"
        lines.append(f"| `{name}` | {cpu} | {tri} | {tri} | {_dtypes_of(name, declared)} |")
    lines.append("")
    return "\n".join(lines)


def default_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "docs", "ops.md"))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = default_path()
    text = generate()
    if "--check" in argv:
        try:
            with open(path, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print(f"{path} is stale; run: python -m nbxtensor.ops._table", file=sys.stderr)
            return 1
        return 0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
