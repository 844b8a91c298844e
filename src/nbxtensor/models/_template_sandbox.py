"""The jinja2 sandbox chat templates render in, with bounded time, steps and sizes.

jinja2's sandbox stops a template from reaching Python internals, but not from spending
unbounded time or memory: nested `range()` loops, `10 ** 10 ** 8`, `"x" * 10 ** 9` or a
string doubled forty times all run inside it. A render here has a budget:

* steps: every for-loop iteration (the compiled loop iterates through `bounded()`) and every
  call (macros, methods, recursive `loop()`) costs one; the deadline is checked at each step;
* size: no string, list or output may grow past `max_chars`; the operators and the methods
  and filters that multiply sizes (`*`, `**`, `%`, `~`, `center`, `replace`, `indent`, ...)
  are checked *before* they allocate.

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
    if dynamic:
        for a in args if isinstance(args, (tuple, list)) else (args,):
            if isinstance(a, int):
                b.size(abs(a), "a formatted field")


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


# ----------------------------------------------------------------------------- codegen and env
def bounded(iterable):
    """A for loop's iterable: one step an item."""
    b = _budget()
    for x in iterable:
        b.step()
        yield x


class _CodeGenerator(CodeGenerator):
    def visit_Concat(self, node, frame):
        # `a ~ b`: through environment.concat, which checks the size before joining
        self.write("environment.concat(map(str, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose renders spend from a `_Budget` (see `render`)."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.globals.pop("lipsum", None)     # lipsum(10 ** 9) loops in Python; no template needs it
        self.concat = self._concat           # macro results, {% set %} blocks, `~`
        _sized_filters(self)

    def _concat(self, pieces) -> str:
        pieces = [p if isinstance(p, str) else str(p) for p in pieces]
        _budget().size(sum(map(len, pieces)), "a string")
        return "".join(pieces)

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
