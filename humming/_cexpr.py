"""Evaluate the small CUDA float-expression language of vLLM's activations with torch ops.

vLLM 0.33 hands Humming each MoE activation as a CUDA C++ expression in ``a`` (and ``b``),
e.g. ``(a / (1.f + expf(-a))) * b`` or an immediately invoked lambda::

    [](float a, float b) {
        const float gate = fminf(a, (7.0f));
        return gate / (1.f + expf(-(1.702f) * gate)) * (b + (1.0f));
    }(a, b)

The GPU compiles that text verbatim (humming.activation). This module parses the same text
into a tree of torch operations so the CPU path computes the same float32 function. Grammar:
float/int literals (``1.f``, ``0.5f``, ``1e-5f``, ``7``), identifiers, calls of CUDA math
functions (``expf``, ``erff``, ``tanhf``, ``fmaxf``, ...), unary ``- + !``, binary
``* / % + - < <= > >= == != && ||``, ``?:``, casts ``(float)x``, parentheses, and lambdas
``[](float p, ...) { [const] float|auto name = expr; ... return expr; }(args)``.
Anything else raises ``ValueError`` naming the position, so an unknown expression fails loudly
instead of computing something else.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any, Callable

import torch

Value = Any  # python number/bool or torch.Tensor
Node = Callable[[dict], Value]

_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[fFlL]?)
  | (?P<id>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op>&&|\|\||<=|>=|==|!=|[-+*/%<>!?:=(),;{}\[\]&])
""", re.VERBOSE | re.DOTALL)

_TYPES = {"float", "double", "int", "auto", "bool", "unsigned", "long"}

# Bounds that keep parsing and evaluation far from Python's recursion limit (an expression past
# them is refused with a ValueError, not a RecursionError): vLLM's activations are a few dozen
# operations nested a few levels deep.
MAX_NESTING = 64  # parentheses, unary operators, calls and lambdas inside one another
MAX_OPERATIONS = 256  # operators, calls, casts and lambdas in the whole expression
MAX_LENGTH = 16384  # characters


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"activation expression: unexpected character {text[pos]!r} at {pos} in {text!r}")
        kind = m.lastgroup
        if kind != "ws":
            out.append((kind, m.group(), pos))
        pos = m.end()
    out.append(("end", "", len(text)))
    return out


# --- value helpers (python scalars stay python; anything with a tensor becomes float32) --------

def _is_t(v: Value) -> bool:
    return isinstance(v, torch.Tensor)


def _f(v: Value) -> torch.Tensor:
    return v if _is_t(v) else torch.tensor(float(v), dtype=torch.float32)


def _is_int(v: Value) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _div(x: Value, y: Value) -> Value:
    if _is_int(x) and _is_int(y):
        return int(x / y)  # C integer division truncates toward zero
    return x / y


def _mod(x: Value, y: Value) -> Value:
    if _is_int(x) and _is_int(y):
        return x - y * int(x / y)
    return torch.fmod(_f(x), _f(y))


def _where(c: Value, x: Value, y: Value) -> Value:
    if not (_is_t(c) or _is_t(x) or _is_t(y)):
        return x if c else y
    return torch.where(_f(c).bool() if not _is_t(c) else c.bool(), _f(x), _f(y))


def _logic(op: str, x: Value, y: Value) -> Value:
    if not (_is_t(x) or _is_t(y)):
        return bool(x) and bool(y) if op == "&&" else bool(x) or bool(y)
    xb, yb = _f(x).bool(), _f(y).bool()
    return torch.logical_and(xb, yb) if op == "&&" else torch.logical_or(xb, yb)


def _unary_fn(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., Value]:
    return lambda x: fn(_f(x))


def _binary_fn(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[..., Value]:
    return lambda x, y: fn(_f(x), _f(y))


_FUNCS: dict[str, tuple[int, Callable[..., Value]]] = {}
for _names, _fn in (
    (("expf", "exp", "__expf"), torch.exp), (("exp2f", "exp2"), torch.exp2), (("expm1f", "expm1"), torch.expm1),
    (("logf", "log", "__logf"), torch.log), (("log2f", "log2"), torch.log2), (("log10f", "log10"), torch.log10),
    (("log1pf", "log1p"), torch.log1p), (("sqrtf", "sqrt"), torch.sqrt), (("rsqrtf", "rsqrt"), torch.rsqrt),
    (("tanhf", "tanh"), torch.tanh), (("sinhf", "sinh"), torch.sinh), (("coshf", "cosh"), torch.cosh),
    (("sinf", "sin", "__sinf"), torch.sin), (("cosf", "cos", "__cosf"), torch.cos), (("tanf", "tan"), torch.tan),
    (("erff", "erf"), torch.erf), (("erfcf", "erfc"), torch.erfc), (("fabsf", "fabs", "abs"), torch.abs),
    (("floorf", "floor"), torch.floor), (("ceilf", "ceil"), torch.ceil), (("truncf", "trunc"), torch.trunc),
    (("roundf", "round"), lambda t: torch.sign(t) * torch.floor(t.abs() + 0.5)),  # C rounds halves away from 0
    (("rintf", "rint"), torch.round),
    (("__saturatef",), lambda t: t.clamp(0.0, 1.0)),
):
    for _n in _names:
        _FUNCS[_n] = (1, _unary_fn(_fn))
for _names, _fn in (
    (("fmaxf", "fmax", "max"), torch.fmax), (("fminf", "fmin", "min"), torch.fmin),
    (("powf", "pow", "__powf"), torch.pow), (("copysignf", "copysign"), torch.copysign),
    (("fmodf", "fmod"), torch.fmod), (("__fdividef", "fdividef"), torch.div),
):
    for _n in _names:
        _FUNCS[_n] = (2, _binary_fn(_fn))
_FUNCS["fmaf"] = _FUNCS["fma"] = (3, lambda x, y, z: _f(x) * _f(y) + _f(z))

_CONSTANTS = {"INFINITY": math.inf, "NAN": math.nan, "M_PI": math.pi, "M_PI_F": math.pi, "true": True,
              "false": False}

_BINARY: dict[str, tuple[int, Callable[[Value, Value], Value]]] = {
    "||": (2, lambda x, y: _logic("||", x, y)), "&&": (3, lambda x, y: _logic("&&", x, y)),
    "==": (4, lambda x, y: x == y), "!=": (4, lambda x, y: x != y),
    "<": (5, lambda x, y: x < y), "<=": (5, lambda x, y: x <= y), ">": (5, lambda x, y: x > y),
    ">=": (5, lambda x, y: x >= y),
    "+": (6, lambda x, y: x + y), "-": (6, lambda x, y: x - y),
    "*": (7, lambda x, y: x * y), "/": (7, _div), "%": (7, _mod),
}


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.depth = 0
        self.ops = 0

    def op(self) -> None:
        """Count one operation of the tree (its evaluation depth is at most the count)."""
        self.ops += 1
        if self.ops > MAX_OPERATIONS:
            raise self.error(f"more than {MAX_OPERATIONS} operations (expected an activation of at most that many)")

    # token helpers
    def peek(self, ahead: int = 0) -> tuple[str, str, int]:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)]

    def take(self) -> tuple[str, str, int]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def error(self, what: str) -> ValueError:
        _, val, pos = self.peek()
        return ValueError(f"activation expression: {what} at position {pos} (near {val!r}) in {_clip(self.text)}")

    def expect(self, value: str) -> None:
        if self.peek()[1] != value:
            raise self.error(f"expected {value!r}")
        self.take()

    # grammar
    def parse(self) -> Node:
        node = self.expr(0)
        if self.peek()[0] != "end":
            raise self.error("unexpected trailing text")
        return node

    def expr(self, min_prec: int) -> Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"nesting deeper than {MAX_NESTING} levels (expected an activation nested at most that "
                             "deep)")
        try:
            return self._expr(min_prec)
        finally:
            self.depth -= 1

    def _expr(self, min_prec: int) -> Node:
        left = self.prefix()
        while True:
            _, op, _ = self.peek()
            if op == "?" and min_prec <= 1:
                self.op()
                self.take()
                then = self.expr(0)
                self.expect(":")
                other = self.expr(1)
                left = (lambda env, c=left, t=then, o=other: _where(c(env), t(env), o(env)))
                continue
            if op in _BINARY and _BINARY[op][0] >= max(min_prec, 2) and self.peek()[0] == "op":
                self.op()
                prec, fn = _BINARY[op]
                self.take()
                right = self.expr(prec + 1)
                left = (lambda env, l=left, r=right, f=fn: f(l(env), r(env)))
                continue
            return left

    def prefix(self) -> Node:
        kind, val, _ = self.peek()
        if kind == "num":
            self.take()
            return self.number(val)
        if kind == "id":
            return self.identifier()
        if val == "(":
            self.take()
            if self.peek()[1] in _TYPES and self.peek(1)[1] == ")":
                self.op()
                cast = self.take()[1]
                self.take()
                inner = self.expr(8)
                if cast == "int":
                    return lambda env, x=inner: (torch.trunc(_f(x(env))) if _is_t(x(env)) else int(x(env)))
                return lambda env, x=inner: (x(env).float() if _is_t(x(env)) else float(x(env)))
            node = self.expr(0)
            self.expect(")")
            return node
        if val in ("-", "+", "!"):
            self.op()
            self.take()
            inner = self.expr(8)
            if val == "-":
                return lambda env, x=inner: -x(env)
            if val == "+":
                return inner
            return lambda env, x=inner: (torch.logical_not(_f(x(env)).bool()) if _is_t(x(env)) else not x(env))
        if val == "[":
            return self.lambda_call()
        raise self.error("expected an expression")

    @staticmethod
    def number(text: str) -> Node:
        body = text.rstrip("fFlL")
        is_float = text[-1:] in ("f", "F") or any(c in body for c in ".eE")
        value: Value = float(body) if is_float else int(body)
        return lambda env, v=value: v

    def identifier(self) -> Node:
        _, name, pos = self.take()
        if self.peek()[1] == "(":
            if name not in _FUNCS:
                raise ValueError(f"activation expression: unknown function {name!r} at position {pos} in {_clip(self.text)}")
            arity, fn = _FUNCS[name]
            self.op()
            args = self.call_args()
            if len(args) != arity:
                raise ValueError(f"activation expression: {name} takes {arity} argument(s), got {len(args)}")
            return lambda env, f=fn, a=tuple(args): f(*(x(env) for x in a))
        if name in _CONSTANTS:
            return lambda env, v=_CONSTANTS[name]: v

        def var(env: dict, n: str = name, p: int = pos) -> Value:
            try:
                return env[n]
            except KeyError:
                raise ValueError(f"activation expression: unknown name {n!r} at position {p} in {_clip(self.text)}") from None

        return var

    def call_args(self) -> list[Node]:
        self.expect("(")
        args: list[Node] = []
        if self.peek()[1] != ")":
            while True:
                args.append(self.expr(0))
                if self.peek()[1] != ",":
                    break
                self.take()
        self.expect(")")
        return args

    def lambda_call(self) -> Node:
        self.op()
        self.expect("[")
        while self.peek()[1] != "]":  # captures ([], [=], [&]) do not matter: the body sees only its params
            if self.peek()[0] == "end":
                raise self.error("unterminated lambda capture")
            self.take()
        self.take()
        self.expect("(")
        params: list[str] = []
        if self.peek()[1] != ")":
            while True:
                while self.peek()[1] in _TYPES or self.peek()[1] == "const":
                    self.take()
                kind, name, _ = self.take()
                if kind != "id":
                    raise self.error("expected a parameter name")
                params.append(name)
                if self.peek()[1] != ",":
                    break
                self.take()
        self.expect(")")
        if self.peek()[1] == "->":  # pragma: no cover - tokenizer splits '->'; trailing return types are rare
            raise self.error("trailing return types are not supported")
        self.expect("{")
        body: list[tuple[str | None, Node]] = []
        returned = False
        while self.peek()[1] != "}":
            if self.peek()[1] == "return":
                self.take()
                body.append((None, self.expr(0)))
                returned = True
            else:
                saw_type = False
                while self.peek()[1] in _TYPES or self.peek()[1] == "const":
                    saw_type = saw_type or self.peek()[1] in _TYPES
                    self.take()
                kind, name, _ = self.take()
                if kind != "id" or not saw_type:
                    raise self.error("expected a declaration 'const float name = ...;' or 'return ...;'")
                self.expect("=")
                body.append((name, self.expr(0)))
            self.expect(";")
            if returned:
                break
        self.expect("}")
        if not returned:
            raise self.error("lambda without a return statement")
        args = self.call_args()
        if len(args) != len(params):
            raise self.error(f"lambda takes {len(params)} argument(s), called with {len(args)}")

        def call(env: dict, ps=tuple(params), stmts=tuple(body), a=tuple(args)) -> Value:
            scope = {p: x(env) for p, x in zip(ps, a)}
            for name, node in stmts:
                value = node(scope)
                if name is None:
                    return value
                scope[name] = value
            raise AssertionError("unreachable")

        return call


@lru_cache(maxsize=256)
def compile_expression(text: str) -> Node:
    """Parse a CUDA float expression in ``a``/``b`` into a function ``env -> value`` (cached)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"activation expression must be a non-empty string, got {_clip(text)}")
    if len(text) > MAX_LENGTH:
        raise ValueError(f"activation expression must be at most {MAX_LENGTH} characters, got {len(text)}: "
                         f"{_clip(text)}")
    return _Parser(text).parse()


def _clip(text, limit: int = 120) -> str:
    t = repr(text)
    return t if len(t) <= limit else t[:limit] + f"... ({len(text)} characters)"


def evaluate(text: str, a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``text`` applied elementwise to float32 tensors ``a`` (and ``b``); returns float32."""
    env = {"a": a.float()}
    if b is not None:
        env["b"] = b.float()
    out = compile_expression(text)(env)
    return _f(out).float().expand_as(env["a"])
