"""The jinja2 sandbox chat templates render in, with bounded time, steps and sizes.

jinja2's sandbox stops a template from reaching Python internals, but not from spending
unbounded time or memory: nested `range()` loops, `10 ** 10 ** 8`, `"x" * 10 ** 9` or a
string doubled forty times all run inside it. A render here has a budget:

* steps: every for-loop iteration (the compiled loop iterates through `bounded()`) and every
  call (macros, methods, recursive `loop()`) costs one; the deadline is checked at each step;
* size: no string, list or output may grow past `max_chars`; the operators and the methods
  and filters that multiply sizes (`*`, `**`, `%`, `~`, `center`, `replace`, `indent`, ...)
  are checked *before* they allocate;
* printed size: whatever becomes text (`{{ x }}`, `~`, `%`, `.format`, and every filter
  that may stringify or serialise, such as join, string, tojson, pprint) has its printed
  length bounded first by a walk over its containers: a list of 10**4 references to one
  10**5-character string costs nothing to build but 10**9 characters to print.

Imported only when a template is compiled (it imports jinja2).
"""
from __future__ import annotations

import contextvars
import re
import time

from jinja2 import TemplateError, TemplateSyntaxError, nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from .tokenizer import ChatTemplateError

MAX_STEPS = 200_000        # loop iterations + calls in one render
MAX_INT_BITS = 1 << 16     # integers from `*` and `**`
MAX_TOJSON_INDENT = 64

_BUDGET: contextvars.ContextVar["_Budget"] = contextvars.ContextVar("nbx_template_budget")


class _Budget:
    def __init__(self, max_chars: int, max_steps: int, seconds: float):
        self.max_chars, self.max_steps, self.seconds = max_chars, max_steps, seconds
        self.steps = 0
        self.deadline = time.monotonic() + seconds

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise ChatTemplateError(f"chat template: more than {self.max_steps} loop iterations "
                                    f"and calls in one render")
        self.check_time()

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template: rendering took longer than "
                                    f"{self.seconds:g} s")

    def size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise ChatTemplateError(f"chat template: {what} would be {n} long, more than the "
                                    f"limit of {self.max_chars}")


def _budget() -> _Budget:
    return _BUDGET.get()


# ----------------------------------------------------------------------------- size estimates
_SIZED = (str, list, tuple)
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d*)(?:\.(\*|\d*))?")
_FIELD = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")


def _check_format(fmt: str, args, b: _Budget, printf: bool) -> None:
    """Widths and precisions of a printf (`%`) or str.format spec may not exceed the size
    limit; a width taken from the arguments (`*`, `{:{}}`) is checked among them."""
    dynamic = False
    if printf:
        for m in _PRINTF.finditer(fmt):
            for g in m.groups():
                if g == "*":
                    dynamic = True
                elif g:
                    b.size(int(g) if len(g) < 12 else 10 ** 12, "a formatted field")
    else:
        for field in _FIELD.findall(fmt):
            dynamic |= field.count("{") > 1
            for d in re.findall(r"\d+", field):
                b.size(int(d) if len(d) < 12 else 10 ** 12, "a formatted field")
    items = args if isinstance(args, (tuple, list)) else (args,)
    if dynamic:
        for a in items:
            if isinstance(a, int):
                b.size(abs(a), "a formatted field")
    # each argument is converted by str() or repr(): a container of big strings is too big
    _check_str(b, "a formatted argument",
               *(items[0].values() if len(items) == 1 and isinstance(items[0], dict)
                 else items))


_CONTAINERS = (list, tuple, set, frozenset, dict, type({}.keys()), type({}.values()),
               type({}.items()))


def _str_len(x, limit: int) -> int:
    """A lower bound of len(str(x)), counted without building the string and given up
    once past `limit`: a list of 10**4 references to one 10**5-character string costs
    nothing to build but 10**9 characters to print, join or serialise. Each item visited
    adds at least one character, so the walk takes at most `limit` steps."""
    b = _BUDGET.get(None)
    n, todo, seen = 0, [x], 0
    while todo and n <= limit:
        v = todo.pop()
        seen += 1
        if b is not None and not seen & 0xFFF:
            b.check_time()
        if isinstance(v, str):
            n += len(v) + 2 if v is not x else len(v)
        elif isinstance(v, dict):
            n += 2 + 4 * len(v)
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, _CONTAINERS):
            n += 2 + 2 * len(v)
            todo.extend(v)
        elif isinstance(v, Namespace):
            n += 13
            todo.append(object.__getattribute__(v, "_Namespace__attrs"))
        elif isinstance(v, int) and not isinstance(v, bool):
            n += 1 + v.bit_length() * 3 // 10
        else:
            n += 1
    return n


def _check_str(b: "_Budget", what: str, *values) -> None:
    """Refuse before str(), join or a serialiser turns `values` into more than max_chars."""
    total = 0
    for v in values:
        if not isinstance(v, str):
            total += _str_len(v, b.max_chars - total)
            b.size(total, what)


def _method_size(s: str, name: str, args, kwargs) -> int:
    """An upper bound of len(s.name(*args)) for the str methods that can grow a string by
    more than a constant factor (0 for the others)."""
    a = list(args) + list(kwargs.values())
    if name in ("center", "ljust", "rjust", "zfill") and a and isinstance(a[0], int):
        return max(len(s), a[0])
    if name == "expandtabs":
        tab = a[0] if a and isinstance(a[0], int) else 8
        return len(s) + max(tab, 0) * s.count("\t")
    if name == "replace" and len(a) >= 2 and isinstance(a[0], str) and isinstance(a[1], str):
        n = s.count(a[0]) if a[0] else len(s) + 1
        return len(s) + n * max(len(a[1]) - len(a[0]), 0)
    if name == "join" and a and isinstance(a[0], _SIZED):
        return len(s) * len(a[0]) + sum(len(x) for x in a[0] if isinstance(x, str))
    if name == "translate" and a and isinstance(a[0], dict):
        grow = max((len(v) for v in a[0].values() if isinstance(v, str)), default=1)
        return len(s) * max(grow, 1)
    return 0


def _sized_filters(env) -> None:
    """Wrap the built-in filters that multiply sizes or loop over an int argument."""
    f = env.filters

    def check(name, fn, size):
        def wrapped(*args, **kwargs):
            _budget().size(size(*args, **kwargs), f"the {name} filter's result")
            return fn(*args, **kwargs)
        wrapped.__dict__.update(fn.__dict__)     # keeps jinja2's pass_eval_context marks
        f[name] = wrapped

    def str_of(v):
        return v if isinstance(v, str) else ""
    check("center", f["center"], lambda v, width=80: max(len(str_of(v)), width)
          if isinstance(width, int) else 0)
    check("indent", f["indent"], lambda s, width=4, *a, **k: len(str_of(s)) + (
        width if isinstance(width, int) else len(str(width))) * (str_of(s).count("\n") + 1))
    check("replace", f["replace"], lambda ctx, s, old, new, count=None:
          _method_size(str(s), "replace", (str(old), str(new)), {}))
    check("join", f["join"], lambda ctx, v, d="", attribute=None:
          len(str(d)) * len(v) if isinstance(v, _SIZED) else 0)
    check("batch", f["batch"], lambda v, linecount, *a, **k: linecount
          if isinstance(linecount, int) else 0)
    check("slice", f["slice"], lambda v, slices, *a, **k: slices if isinstance(slices, int) else 0)

    fmt = f["format"]

    def format_(value, *args, **kwargs):
        _check_format(str(value), args or kwargs, _budget(), printf=True)
        return fmt(value, *args, **kwargs)
    f["format"] = format_

    sum_ = f["sum"]

    def sum_filter(*args, **kwargs):
        # list/str "sums" copy the running total at every item: quadratic, in one C call
        start = kwargs.get("start", args[3] if len(args) > 3 else 0)
        if not isinstance(start, (int, float)) or isinstance(start, bool):
            raise ChatTemplateError(f"chat template: the sum filter adds numbers only, got "
                                    f"start={type(start).__name__}")
        return sum_(*args, **kwargs)
    sum_filter.__dict__.update(sum_.__dict__)
    f["sum"] = sum_filter


# filters that never turn their arguments into one string (their results are checked where
# they are printed or joined)
_NO_STR_FILTERS = frozenset((
    "length", "count", "first", "last", "list", "select", "reject", "selectattr",
    "rejectattr", "map", "reverse", "batch", "slice", "items", "dictsort", "sort", "unique",
    "min", "max", "groupby", "default", "d", "attr", "random", "abs", "int", "float", "round",
    "bool", "safe", "sum"))


def _guard_filters(env) -> None:
    """Every filter that may stringify or serialise its arguments (string, join, tojson,
    pprint, upper, ...) first checks their printed size, whoever registered it."""
    for name, fn in list(env.filters.items()):
        if name in _NO_STR_FILTERS or getattr(fn, "_nbx_guarded", False):
            continue

        def guarded(*args, _fn=fn, _name=name, **kwargs):
            _check_str(_budget(), f"the {_name} filter's input",
                       *(a for a in args if not hasattr(a, "environment")),
                       *kwargs.values())
            return _fn(*args, **kwargs)
        guarded.__dict__.update(fn.__dict__)    # keeps jinja2's pass_context marks
        guarded._nbx_guarded = True
        env.filters[name] = guarded


# ----------------------------------------------------------------------------- codegen and env
def bounded(iterable):
    """A for loop's iterable: one step an item."""
    b = _budget()
    for x in iterable:
        b.step()
        yield x


class _CodeGenerator(CodeGenerator):
    def visit_Concat(self, node, frame):
        # `a ~ b`: through environment.concat, which checks the printed sizes before str()
        self.write("environment.concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose renders spend from a `_Budget` (see `render`)."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.globals.pop("lipsum", None)     # lipsum(10 ** 9) loops in Python; no template needs it
        self.concat = self._concat           # macro results, {% set %} blocks, `~`
        self.finalize = self._finalize
        _sized_filters(self)

    def _concat(self, pieces) -> str:
        pieces = list(pieces)
        _check_str(_budget(), "a string", *pieces)
        pieces = [p if isinstance(p, str) else str(p) for p in pieces]
        _budget().size(sum(map(len, pieces)), "a string")
        return "".join(pieces)

    @staticmethod
    def _finalize(value):
        # `{{ value }}` prints str(value): its size is checked before it is built
        if not isinstance(value, str):
            _check_str(_budget(), "a printed value", value)
        return value

    def call_binop(self, context, operator, left, right):
        b = _budget()
        ints = isinstance(left, int) and isinstance(right, int)
        if operator == "**" and ints:
            if right > 0 and abs(left) > 1 and right * (abs(left).bit_length() - 1) > MAX_INT_BITS:
                raise ChatTemplateError(f"chat template: {left} ** {right} has more than "
                                        f"{MAX_INT_BITS} bits")
        elif operator == "*" and ints:
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise ChatTemplateError(f"chat template: a product of more than {MAX_INT_BITS} "
                                        f"bits")
        elif operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, _SIZED) and isinstance(n, int):
                b.size(len(seq) * n, "a repeated string or list")
        elif operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED):
            b.size(len(left) + len(right), "a concatenation")
        elif operator == "%" and isinstance(left, str):
            _check_format(left, right, b, printf=True)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's signature
        b = _budget()
        b.step()
        if isinstance(__obj, LoopContext) and args:      # a recursive loop's next level
            args = (bounded(args[0]),) + args[1:]
        inner = getattr(__obj, "__wrapped__", __obj)      # the sandbox wraps str.format
        owner = getattr(inner, "__self__", None)
        if isinstance(owner, str):
            name = getattr(inner, "__name__", "")
            if name in ("format", "format_map"):
                _check_format(owner, list(args) + list(kwargs.values()), b, printf=False)
            else:
                b.size(_method_size(owner, name, args, kwargs), f"str.{name}()")
        return super().call(__context, __obj, *args, **kwargs)


def compile_template(env: BoundedEnvironment, source: str):
    _guard_filters(env)          # here, so filters added after the environment are guarded
    try:
        ast = env.parse(source)
        for loop in ast.find_all(nodes.For):
            # the compiled loop iterates through bounded(); a template cannot name or rebind
            # an ImportedName
            loop.iter = nodes.Call(nodes.ImportedName(f"{__name__}.bounded"), [loop.iter], [],
                                   None, None).set_lineno(loop.lineno).set_environment(env)
        return env.from_string(ast)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template: syntax error on line {e.lineno}: "
                                f"{e.message}") from e
    except (TemplateError, RecursionError, MemoryError) as e:
        raise ChatTemplateError(f"chat template: {type(e).__name__}: {e}") from e


# what a template's own code can raise (its errors, not ours)
_TEMPLATE_ERRORS = (TemplateError, ArithmeticError, TypeError, ValueError, LookupError,
                    AttributeError, RecursionError, MemoryError)


def render(template, variables: dict, max_chars: int, seconds: float,
           max_steps: int = MAX_STEPS) -> str:
    """Render `template` streaming, within the budget; ChatTemplateError when it fails."""
    b = _Budget(max_chars, max_steps, seconds)
    token = _BUDGET.set(b)
    gen = template.generate(**variables)
    try:
        out, n = [], 0
        for piece in gen:
            n += len(piece)
            b.size(n, "the rendered prompt")
            b.check_time()
            out.append(piece)
        return "".join(out)
    except ChatTemplateError:
        raise
    except _TEMPLATE_ERRORS as e:
        msg = " ".join(str(e).split()) or "(no message)"
        raise ChatTemplateError(f"chat template: {type(e).__name__}: {msg}") from e
    finally:
        gen.close()
        _BUDGET.reset(token)
