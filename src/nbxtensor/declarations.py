"""The registry of declared ops: the record of an element-wise op, its dtype rules, and the
subscribers that build each artefact from it (docs/design/ops-as-data.md).

The table itself (one line per op) is ops/_declare.py. This module sits at the bottom layer so
that every consumer can read the table without importing the layer above it: ops/elementwise.py
(functions, methods, operators, the cpu entry), kernels/elementwise.py (the kernel branch) and
ops/_table.py (the docs row) each `subscribe()` once and build their artefact for every op
declared now or later; `undeclare()` removes them in the reverse order.
"""
from __future__ import annotations

from dataclasses import dataclass

FLOATS = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
INTS = ("uint8", "int8", "int16", "int32", "int64")
ALL = ("bool",) + INTS + FLOATS

# dtype rule -> (the input dtypes it accepts, what it means, the arities it fits)
RULES = {
    "float": (ALL, "ints/bool promote to the default float", (1,)),
    "keep": (ALL, "result has the input dtype", (1,)),
    "nobool": (INTS + FLOATS, "result has the input dtype; bool refused", (1,)),
    "round": (ALL, "floats rounded; ints/bool copied unchanged", (1,)),
    "pred": (ALL, "bool result", (1,)),
    "bits": (("bool",) + INTS, "integer or bool (bool: logical not)", (1,)),
    "floatonly": (FLOATS, "floating point only; result has the input dtype", (1, 2, 3)),
    # the binary rules name the `kind` of ops/elementwise.py's _binary (BINARY_KIND)
    "arith": (ALL, "torch promotion of the operands", (2, 3)),
    "arithnb": (INTS + FLOATS, "torch promotion; a bool result refused", (2, 3)),
    "tofloat": (ALL, "promotion; ints/bool give the default float", (2,)),
    "cmp": (ALL, "bool result (compared in the promoted dtype)", (2,)),
    "logical": (ALL, "bool result of the operands' truth values", (2,)),
    "int": (("bool",) + INTS, "integer or bool operands", (2,)),
    "shift": (INTS, "integer operands", (2,)),
    "f3264": (("float32", "float64"), "float32 or float64 operands (the result steps in that "
              "dtype)", (2,)),
    "select": (ALL, "condition bool/uint8; promotion of the two values", (3,)),
    "finite": (FLOATS, "floats (the function copies ints/bool unchanged)", (3,)),
}
UNARY_RULES = ("float", "keep", "nobool", "round", "pred", "bits", "floatonly")
BINARY_KIND = {"arith": "arith", "arithnb": "nobool", "tofloat": "float", "cmp": "cmp",
               "logical": "logical", "int": "int", "shift": "shift", "floatonly": "floatonly",
               "f3264": "f3264"}
FORMS = ("math", "binary", "activation", "entry", "call")


@dataclass(frozen=True, eq=False)
class Op:
    """One declared element-wise op.

    name: the public function (and the dispatch entry unless `entry` is given); arity: the
    operands x, y, z the expressions read; form: "math" f(input, *, out=None) [+ f_(self)],
    "binary" f(input, other, *, out=None) [+ f_(self, other)], "activation" f(input, <params>,
    [inplace=False]) (torch.nn.functional), "call" f(<signature>) whose body calls the
    hand-written `runner` of ops/elementwise.py (arguments that are not a formula: pow's integer
    exponent, clamp's optional bounds, where's condition), "entry" no public function (a
    hand-written one, or another declaration's `alpha` / `rounding`, dispatches to it);
    params: the activation's ((name, default), ...) passed to the kernel as p0, p1; alpha: the
    entry a binary dispatches to for alpha != 1 (add's `alpha=`); rounding: {rounding_mode:
    entry} of a binary's `rounding_mode=` (div); signature: a "call" op's parameter list;
    runner: its ops/elementwise.py function, called (op, fname, inplace, *parameters); inplace:
    the in-place form exists (f_ and x.f_(); for activations the `inplace=` argument), "cast"
    for logical_not_ (the bool result cast back into self's dtype); method: Tensor method
    x.name() (and x.name_() when in place), or a parameter list in which `self` stands for the
    function's first parameter (where's x.where(condition, other)); operators: Tensor dunder
    names (a binary's __rX__ is reflected, __iX__ is the in-place form); complex: complex
    operands accepted ("real": a real result, abs); bool_error: the refusal of a bool input
    under rule "nobool" / "arithnb".
    """

    name: str
    arity: int
    rule: str
    np: str
    tl: str
    aliases: tuple = ()
    form: str = "math"
    entry: str = ""
    params: tuple = ()
    alpha: str = ""
    rounding: tuple = ()
    signature: str = ""
    runner: str = ""
    inplace: object = True
    method: object = True
    operators: tuple = ()
    complex: object = False
    bool_error: str = "not supported for bool tensors"
    doc: str = ""

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"declare {self.name}: rule must be one of {sorted(RULES)}, got "
                             f"{self.rule!r}")
        if self.arity not in RULES[self.rule][2]:
            raise ValueError(f"declare {self.name}: arity {self.arity} does not fit rule "
                             f"{self.rule!r}")
        if self.form not in FORMS:
            raise ValueError(f"declare {self.name}: form must be one of {FORMS}, got "
                             f"{self.form!r}")
        if len(self.params) > 2:
            raise ValueError(f"declare {self.name}: at most two parameters (p0, p1), got "
                             f"{len(self.params)}")
        if (self.form == "call") != bool(self.signature and self.runner):
            raise ValueError(f"declare {self.name}: a 'call' op needs a signature and a runner "
                             f"(and only a 'call' op has them)")
        if not self.entry:
            object.__setattr__(self, "entry", self.name)
        if isinstance(self.rounding, dict):
            object.__setattr__(self, "rounding", tuple(self.rounding.items()))

    @property
    def dtypes(self) -> tuple:
        """The input dtype names the rule accepts (docs/ops.md shows them)."""
        return RULES[self.rule][0]

    @property
    def kind(self) -> str:
        """The binary op kind of ops/elementwise.py's _binary."""
        return BINARY_KIND[self.rule]

    @property
    def entries(self) -> tuple:
        """Every dispatch entry a call of this op's function may reach."""
        return (self.entry,) + ((self.alpha,) if self.alpha else ()) + tuple(
            e for _, e in self.rounding)


def parameters(signature: str) -> list:
    """[(name, default source or None, keyword-only)] of a parameter list."""
    import ast
    a = ast.parse(f"def f({signature}): pass").body[0].args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    out = [(p.arg, None if d is None else ast.unparse(d), False) for p, d in zip(pos, defaults)]
    out += [(p.arg, None if d is None else ast.unparse(d), True)
            for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return out


def parameter_list(params) -> str:
    """The source of a parameter list from `parameters`' answer."""
    parts, star = [], False
    for name, default, kwonly in params:
        if kwonly and not star:
            parts.append("*")
            star = True
        parts.append(name if default is None else f"{name}={default}")
    return ", ".join(parts)


class _Registry:
    """A table of declarations keyed by dispatch name, and the consumers subscribed to it."""

    def __init__(self, table: dict, what: str):
        self.table, self.what, self.subscribers = table, what, []

    def subscribe(self, build, remove=None) -> None:
        """Call build(op) for every declaration now and for each later one; remove(op) on
        undeclare."""
        self.subscribers.append((build, remove))
        for op in list(self.table.values()):
            build(op)

    def declare(self, op):
        key = op.entry if isinstance(op, Op) else op.kind
        if key in self.table:
            raise ValueError(f"declare: {self.what} {key!r} is already declared")
        self.table[key] = op
        built = []
        try:
            for build, remove in self.subscribers:
                build(op)
                built.append(remove)
        except Exception:
            # a refused declaration leaves nothing behind
            self.table.pop(key)
            for remove in reversed(built):
                if remove is not None:
                    remove(op)
            raise
        return op

    def undeclare(self, key: str) -> None:
        """Remove a declaration and every artefact built from it (tests use it)."""
        op = self.table.pop(key)
        for _, remove in reversed(self.subscribers):
            if remove is not None:
                remove(op)


OPS: dict = {}        # entry name -> Op, in declaration order
_ELEMENTWISE = _Registry(OPS, "element-wise op")
subscribe, declare, undeclare = (_ELEMENTWISE.subscribe, _ELEMENTWISE.declare,
                                 _ELEMENTWISE.undeclare)


# ----------------------------------------------------------------------------- reductions
# result rule -> what it means (docs/ops.md shows it)
REDUCTION_RULES = {
    "sum": "ints/bool give int64 unless dtype=; floats keep their dtype (16-bit floats "
           "accumulate in float32)",
    "float": "floating point only (dtype= casts first); the result keeps the dtype",
    "keep": "the result has the input dtype",
    "bool": "bool result (a uint8 input gives uint8)",
    "count": "int64 count",
    "index": "int64 index of the first extreme (NaN counts as the extreme)",
}


@dataclass(frozen=True, eq=False)
class Reduction:
    """One declared reduction.

    name: the public function and Tensor method; rule: the result dtype (REDUCTION_RULES);
    np: the cpu implementation, a NumPy expression over `a` (the input as loaded), `w` (the
    input widened to the accumulation dtype: int64 for ints/bool, float64 for floats), `axis`
    (the reduced dims) and `scale` (1/n, mean), keeping the reduced dims; tl: the kernel's
    (PRE, COMB, POST) steps (kernels/reduction.py's code names); identity: the value of a
    reduction over an empty dim (None: an empty dim is an IndexError; "nan": NaN); signature:
    the function's parameters (dim=, keepdim=, dtype=, out= where it takes them); dims: "many"
    (None, an int or a tuple) or "one" (None or an int; None flattens for an index rule);
    kind: the dispatch kind of `reduce` (default: name); complex: complex inputs go to
    ops/complex.py's reduce_complex; fast: calls with an int or None dim, a bool keepdim and
    no dtype= / out= take the memoised plan (ops/reduction.py's `_fast_plan`).
    """

    name: str
    rule: str
    np: str
    tl: tuple
    identity: object = None
    signature: str = "input, dim=None, keepdim=False, *, dtype=None, out=None"
    dims: str = "many"
    kind: str = ""
    complex: bool = False
    fast: bool = False
    aliases: tuple = ()
    doc: str = ""

    def __post_init__(self):
        if self.rule not in REDUCTION_RULES:
            raise ValueError(f"declare {self.name}: rule must be one of "
                             f"{sorted(REDUCTION_RULES)}, got {self.rule!r}")
        if self.dims not in ("many", "one"):
            raise ValueError(f"declare {self.name}: dims must be 'many' or 'one', got "
                             f"{self.dims!r}")
        if len(self.tl) != 3:
            raise ValueError(f"declare {self.name}: tl must be (PRE, COMB, POST), got "
                             f"{self.tl!r}")
        if not self.kind:
            object.__setattr__(self, "kind", self.name)


REDUCTIONS: dict = {}     # dispatch kind -> Reduction, in declaration order
_REDUCTIONS = _Registry(REDUCTIONS, "reduction")
subscribe_reductions, declare_reduction = _REDUCTIONS.subscribe, _REDUCTIONS.declare
