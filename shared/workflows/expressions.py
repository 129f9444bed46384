"""The expression sandbox: CEL for trigger rules, branch conditions and `${{ … }}` templates.

Library choice: `common-expression-language` (module `cel`, Rust bindings of the `cel` crate)
over the pure-Python `cel-python`:
- its `matches()` uses the Rust `regex` crate, which runs in linear time, so a customer's
  pattern cannot backtrack catastrophically (cel-python hands patterns to Python's `re`);
- it is ~50x faster per evaluation, and admission evaluates a rule per event per binding;
- only the CEL core library is exposed (we never add its optional Python "stdlib"), so there
  is no function that reads files, the clock, or the network, and no attribute access to host
  objects: the scope is converted to plain JSON-like values before it crosses into CEL.

What the library does not give us is a cost limit, and it holds the GIL while it evaluates, so
a watchdog thread could not interrupt it. CEL has no loops or recursion: the only work that
grows faster than the source is a comprehension macro (`all`, `exists`, `exists_one`, `map`,
`filter`) iterating a collection, possibly nested. So the budget is enforced *before*
evaluation, from the shape of the expression (a lexer finds the macros and their nesting) and
the size of the scope it will see: an expression whose worst case exceeds the budget for this
scope is stopped with an `ExpressionError` instead of running. The measured `map`/`filter`
cost in this library is quadratic in the list length (it copies its accumulator), and the
estimate charges for that.

The scope (`event`, `trigger`, `record`, and for steps `steps` and `run`) is built by
shared/workflows/scope.py, and only there; its docstring says what each root holds.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import cached_property, lru_cache
from typing import Any

import cel

MAX_SOURCE_LENGTH = 2_000
# Worst-case evaluation work units (one unit ≈ one comprehension iteration); ~0.1 s here.
MAX_COST = 250_000
# Worst-case bytes an expression may build (a comprehension copying strings from the scope).
MAX_ALLOCATION_BYTES = 32 * 1024 * 1024
# A rendered value larger than this is refused: step inputs are journaled as jsonb.
MAX_RESULT_BYTES = 256 * 1024
MAX_COMPREHENSION_DEPTH = 3

# The scope's roots; shared/workflows/scope.py builds them and documents what each holds.
ROOTS = frozenset({"event", "trigger", "record", "steps", "run", "iteration"})
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
# map/filter copy their accumulator on every iteration in this library (measured: 4 000
# elements take ~0.5 s), so they cost L + L²/16 units instead of L.
_COPYING_MACROS = frozenset({"map", "filter"})
# The CEL core functions available to customers. Operators (`_+_`, `@in`, `!_`…) are allowed.
FUNCTIONS = frozenset(
    {
        "size",
        "int",
        "uint",
        "double",
        "string",
        "bytes",
        "bool",
        "timestamp",
        "duration",
        "dyn",
        "type",
        "contains",
        "startsWith",
        "endsWith",
        "matches",
        "max",
        "min",
        "getFullYear",
        "getMonth",
        "getDate",
        "getDayOfMonth",
        "getDayOfWeek",
        "getDayOfYear",
        "getHours",
        "getMinutes",
        "getSeconds",
        "getMilliseconds",
    }
)

# Operator overload names as the library reports them: `_+_`, `_[_]`, `!_`, `@in`…
_OPERATOR = re.compile(r"^(?:[_!\-][^A-Za-z0-9]*|@[a-z_]+)$")

# `${{ expr }}`; an expression cannot contain `}}` (write `} }` inside a map literal).
TEMPLATE = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)


class ExpressionError(ValueError):
    """An expression that does not compile, or that was stopped or failed at evaluation."""

    def __init__(self, message: str, *, source: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.source = source

    def __str__(self) -> str:
        if self.source is None:
            return self.message
        shown = self.source if len(self.source) <= 80 else self.source[:77] + "..."
        return f"{self.message} (in expression `{shown}`)"


@dataclass(frozen=True)
class Comprehension:
    """One macro call found in the source, with the macros nested inside it."""

    name: str
    children: tuple[Comprehension, ...] = ()


@dataclass(frozen=True)
class CompiledExpression:
    source: str
    program: Any = field(repr=False, compare=False)  # cel.Program (no type information)
    variables: frozenset[str] = frozenset()
    step_refs: frozenset[str] = frozenset()
    # `steps` is read other than as `steps.<id>` / `steps["<id>"]` (`size(steps)`,
    # `steps[trigger.x]`…): which outputs it reads is unknown before it runs.
    reads_any_step: bool = False
    comprehensions: tuple[Comprehension, ...] = ()
    # Upper bound on string concatenations, for the allocation estimate.
    concatenations: int = 0


# ---------------------------------------------------------------- lexing (shape analysis only)

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>[rRbB]{0,2}(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"
                           |'(?:\\.|[^\\'\n])*'|"(?:\\.|[^\\"\n])*"))
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[uU]?|0[xX][0-9a-fA-F]+[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str


def _tokens(src: str) -> list[_Token]:
    out: list[_Token] = []
    for m in _TOKEN.finditer(src):
        kind = m.lastgroup or "punct"
        if kind != "space":
            out.append(_Token(kind, m.group()))
    return out


def _string_value(literal: str) -> str | None:
    """The value of a plain quoted string literal (enough for `steps["a-b"]`)."""
    body = literal.lstrip("rR")
    if body[:1] in {"'", '"'} and len(body) >= 2 and "\\" not in body:
        return body[1:-1]
    return None


def _step_refs(toks: list[_Token]) -> frozenset[str]:
    """`steps.<id>` and `steps["<id>"]` where `steps` is the root variable."""
    found: set[str] = set()
    for i, tok in enumerate(toks[:-2]):
        if tok.kind != "ident" or tok.text != "steps" or (i > 0 and toks[i - 1].text == "."):
            continue
        nxt, after = toks[i + 1], toks[i + 2]
        if nxt.text == "." and after.kind == "ident":
            found.add(after.text)
        elif nxt.text == "[" and after.kind == "string":
            value = _string_value(after.text)
            if value is not None:
                found.add(value)
    return frozenset(found)


def _reads_any_step(toks: list[_Token]) -> bool:
    """Whether the root `steps` appears anywhere but as `steps.<id>` or `steps["<id>"]`
    (a plain string literal, then `]`): then no list of names covers what it reads."""
    for i, tok in enumerate(toks):
        if tok.kind != "ident" or tok.text != "steps" or (i > 0 and toks[i - 1].text == "."):
            continue
        following = [t.text for t in toks[i + 1 : i + 4]] + ["", "", ""]
        if following[0] == "." and i + 2 < len(toks) and toks[i + 2].kind == "ident":
            continue
        if (
            following[0] == "["
            and i + 2 < len(toks)
            and toks[i + 2].kind == "string"
            and _string_value(toks[i + 2].text) is not None
            and following[2] == "]"
        ):
            continue
        return True
    return False


def record_fields(src: str) -> frozenset[str]:
    """The record properties a condition reads off the event it is given: `record.<name>`,
    `record["<name>"]`, `event.changed_fields.<name>` and `event.changed_fields["<name>"]`
    where `record` and `event` are the root variables. What a wait's `when` names here is what
    it listens to (shared/workflows/listening.py). Identity fields of `record` are included;
    the caller drops them."""
    toks = _tokens(src)
    found: set[str] = set()

    def member(i: int) -> str | None:  # `.name` or `["name"]` starting at toks[i]
        if i + 1 >= len(toks):
            return None
        if toks[i].text == "." and toks[i + 1].kind == "ident":
            return toks[i + 1].text
        if toks[i].text == "[" and toks[i + 1].kind == "string":
            return _string_value(toks[i + 1].text)
        return None

    for i, tok in enumerate(toks):
        if tok.kind != "ident" or (i > 0 and toks[i - 1].text == "."):
            continue
        if tok.text == "record":
            name = member(i + 1)
        elif tok.text == "event" and member(i + 1) == "changed_fields":
            name = member(i + 3)
        else:
            continue
        if name is not None:
            found.add(name)
    return frozenset(found)


def _comprehensions(toks: list[_Token]) -> tuple[tuple[Comprehension, ...], frozenset[str]]:
    """The tree of macro calls (`.map(`, `.exists(`…) and the names they bind."""
    bound: set[str] = set()
    # One entry per open bracket: the macro it opened (or None) and the macros found inside.
    stack: list[tuple[str | None, list[Comprehension]]] = [(None, [])]
    for i, tok in enumerate(toks):
        if tok.text in {"(", "[", "{"}:
            macro = None
            if (
                tok.text == "("
                and i >= 2
                and toks[i - 1].text in MACROS
                and toks[i - 2].text == "."
            ):
                macro = toks[i - 1].text
                if i + 1 < len(toks) and toks[i + 1].kind == "ident":
                    bound.add(toks[i + 1].text)
            stack.append((macro, []))
        elif tok.text in {")", "]", "}"} and len(stack) > 1:
            macro, kids = stack.pop()
            found = [Comprehension(macro, tuple(kids))] if macro else kids
            stack[-1][1].extend(found)
    while len(stack) > 1:  # unbalanced input: the parser reports it; keep what was found
        macro, kids = stack.pop()
        stack[-1][1].extend([Comprehension(macro, tuple(kids))] if macro else kids)
    return tuple(stack[0][1]), frozenset(bound)


def _analyse(src: str) -> tuple[frozenset[str], tuple[Comprehension, ...], frozenset[str], int]:
    """Step references, the macro tree, comprehension-bound names, and `+` count."""
    toks = _tokens(src)
    tree, bound = _comprehensions(toks)
    return _step_refs(toks), tree, bound, sum(1 for t in toks if t.text == "+")


def _depth(nodes: tuple[Comprehension, ...]) -> int:
    return max((1 + _depth(n.children) for n in nodes), default=0)


# ---------------------------------------------------------------- compile


@lru_cache(maxsize=4096)
def compile_expression(src: str, roots: frozenset[str] = ROOTS) -> CompiledExpression:
    """Parse and check an expression; raises `ExpressionError` with what is wrong.

    `roots` are the names it may read: the workflow scope's by default; a narrower scope (a
    webhook trigger's idempotency key reads only `headers` and `body`) passes its own."""
    if not isinstance(src, str):
        raise ExpressionError(f"an expression must be a string, found {type(src).__name__}")
    text = src.strip()
    if not text:
        raise ExpressionError("the expression is empty")
    if len(text) > MAX_SOURCE_LENGTH:
        raise ExpressionError(
            f"the expression is {len(text)} characters long; the limit is {MAX_SOURCE_LENGTH}",
            source=text,
        )
    try:
        program = cel.compile(text)
    except Exception as exc:
        raise ExpressionError(f"does not compile: {_first_line(exc)}", source=text) from None
    refs = program.references()
    step_refs, tree, bound, plus = _analyse(text)
    variables = frozenset(refs.get("variables", ()))
    reads_any_step = "steps" in variables and _reads_any_step(_tokens(text))
    unknown = sorted(variables - roots - bound)
    if unknown:
        readable = (
            ", ".join(sorted(roots))
            if roots != ROOTS
            else "event, trigger, record, steps, run and iteration"
        )
        raise ExpressionError(
            f"unknown name {unknown[0]!r}; expressions can read {readable}", source=text
        )
    for fn in refs.get("functions", ()):
        if _OPERATOR.match(fn) or fn in FUNCTIONS:
            continue
        raise ExpressionError(
            f"function {fn!r} is not available; available functions: "
            + ", ".join(sorted(FUNCTIONS)),
            source=text,
        )
    depth = _depth(tree)
    if depth > MAX_COMPREHENSION_DEPTH:
        raise ExpressionError(
            f"comprehensions (all/exists/map/filter) are nested {depth} deep; "
            f"the limit is {MAX_COMPREHENSION_DEPTH}",
            source=text,
        )
    return CompiledExpression(
        source=text,
        program=program,
        variables=variables & roots,
        step_refs=step_refs,
        reads_any_step=reads_any_step,
        comprehensions=tree,
        concatenations=plus,
    )


def references(expr: CompiledExpression | str) -> set[str]:
    """Ids of the steps whose outputs the expression reads (`steps.<id>` / `steps["<id>"]`)."""
    compiled = expr if isinstance(expr, CompiledExpression) else compile_expression(expr)
    return set(compiled.step_refs)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # The parser's message carries "ERROR: <input>:1:4: Syntax error: …" then a caret drawing.
    m = re.search(r"<input>:(\d+):(\d+): (.*)", text)
    if m:
        return f"{m.group(3)} at line {m.group(1)}, column {m.group(2)}"
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------- evaluate


@dataclass(frozen=True)
class ScopeSize:
    """What the cost estimate needs to know about a scope: its largest collection and string."""

    largest_collection: int
    largest_string: int


def measure_scope(scope: Mapping[str, Any]) -> ScopeSize:
    largest_collection = 0
    largest_string = 0
    stack: list[Any] = [scope]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            largest_collection = max(largest_collection, len(value))
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            largest_collection = max(largest_collection, len(value))
            stack.extend(value)
        elif isinstance(value, str | bytes):
            largest_string = max(largest_string, len(value))
    return ScopeSize(largest_collection, largest_string)


class PreparedScope:
    """A scope many expressions will read (admission: one event, a rule per bound workflow),
    measured once and converted to CEL values once per set of variables read, instead of once
    per evaluation: the conversion, not the evaluation, was most of a rule's cost (~11 µs of
    ~14 µs for `record.x == "y"`). Never modify `values` once prepared. Not for use by several
    threads at once (a `cel.Context` isn't thread-safe)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values
        self._contexts: dict[frozenset[str], Any] = {}

    @cached_property
    def size(self) -> ScopeSize:
        return measure_scope(self.values)

    def context(self, names: frozenset[str]) -> Any:
        context = self._contexts.get(names)
        if context is None:
            context = self._contexts[names] = _context(self.values, names)
        return context


def _context(scope: Mapping[str, Any], names: frozenset[str]) -> Any:
    """The CEL variables `names` from `scope` (an absent one is null here; `evaluate` refuses
    it right after)."""
    return cel.Context({name: _to_cel(scope.get(name)) for name in names})


def estimated_cost(expr: CompiledExpression, size: ScopeSize, *, copying: bool = True) -> int:
    """Worst-case work units: each comprehension iterates the largest collection there is
    (in the scope, or a literal list in the source), nested comprehensions multiply.
    `copying=False` counts iterations only (for the allocation estimate)."""
    if not expr.comprehensions:
        return 1  # most rules: no collection is iterated
    n = max(size.largest_collection, expr.source.count(",") + 1)

    def cost(node: Comprehension) -> int:
        per_iteration = 1 + sum(cost(c) for c in node.children)
        copies = (n * n) // 16 if copying and node.name in _COPYING_MACROS else 0
        return n * per_iteration + copies

    return 1 + sum(cost(c) for c in expr.comprehensions)


def evaluate(
    expr: CompiledExpression | str,
    scope: Mapping[str, Any] | PreparedScope,
    *,
    scope_size: ScopeSize | None = None,
) -> Any:
    """Evaluate over `scope`; the result as plain Python (str, int, float, bool, None, list,
    dict, datetime, timedelta). Raises `ExpressionError` when stopped or when it fails."""
    compiled = expr if isinstance(expr, CompiledExpression) else compile_expression(expr)
    prepared = scope if isinstance(scope, PreparedScope) else None
    values = scope.values if isinstance(scope, PreparedScope) else scope
    size = scope_size or (prepared.size if prepared else measure_scope(values))
    cost = estimated_cost(compiled, size)
    if cost > MAX_COST:
        raise ExpressionError(
            f"stopped before evaluation: its worst case is {cost} steps over this input; "
            f"the budget is {MAX_COST} (nested comprehensions over large lists)",
            source=compiled.source,
        )
    # Strings are the only values that can grow large without a comprehension building them
    # element by element: each iteration may concatenate the largest string a few times.
    iterations = estimated_cost(compiled, size, copying=False)
    allocation = iterations * (compiled.concatenations + 1) * max(size.largest_string, 1)
    if allocation > MAX_ALLOCATION_BYTES:
        raise ExpressionError(
            f"stopped before evaluation: it could build about {allocation} bytes over this "
            f"input; the limit is {MAX_ALLOCATION_BYTES}",
            source=compiled.source,
        )
    variables = compiled.variables
    context = prepared.context(variables) if prepared else _context(values, variables)
    for name in variables:
        if name not in values:
            raise ExpressionError(f"{name!r} is not available here", source=compiled.source)
    try:
        result = compiled.program.execute(context)
    except KeyError as exc:
        raise ExpressionError(
            f"no such key {exc.args[0]!r} (use has(x.key) to test for it)",
            source=compiled.source,
        ) from None
    except RecursionError:
        raise ExpressionError("nested too deeply", source=compiled.source) from None
    except Exception as exc:
        raise ExpressionError(_first_line(exc), source=compiled.source) from None
    plain = _from_cel(result)
    _check_result_size(plain, compiled.source)
    return plain


def evaluate_condition(
    expr: CompiledExpression | str,
    scope: Mapping[str, Any] | PreparedScope,
    *,
    scope_size: ScopeSize | None = None,
) -> bool:
    """A rule or branch condition: it must yield a bool (no truthiness guessing)."""
    value = evaluate(expr, scope, scope_size=scope_size)
    if not isinstance(value, bool):
        source = expr.source if isinstance(expr, CompiledExpression) else expr
        raise ExpressionError(
            f"a condition must be true or false, it gave {type(value).__name__} {value!r:.60}",
            source=source,
        )
    return value


def _to_cel(value: Any) -> Any:
    """Plain data only: no host object ever reaches the evaluator."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            return float(value)
        return value
    if isinstance(value, datetime | timedelta):
        return value
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): _to_cel(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_cel(v) for v in value]
    raise ExpressionError(f"cannot pass a {type(value).__name__} to an expression")


def _from_cel(value: Any) -> Any:
    if isinstance(value, cel.OptionalValue):
        return _from_cel(value.value()) if value.has_value() else None
    if isinstance(value, dict):
        return {str(k): _from_cel(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_from_cel(v) for v in value]
    return value


def _check_result_size(value: Any, source: str) -> None:
    if value is None or isinstance(value, bool | int | float):
        return  # a scalar is a few bytes (every rule and condition result is one)
    size = len(json.dumps(to_json(value), separators=(",", ":"), default=str))
    if size > MAX_RESULT_BYTES:
        raise ExpressionError(
            f"the result is {size} bytes; the limit is {MAX_RESULT_BYTES}", source=source
        )


def to_json(value: Any) -> Any:
    """An evaluation result as JSON-compatible data (timestamps as RFC 3339 strings,
    durations as seconds, bytes as base64)."""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


# ---------------------------------------------------------------- templates


def template_expressions(
    value: Any, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every `${{ … }}` expression in a config, with the path of the string holding it."""
    if isinstance(value, str):
        for m in TEMPLATE.finditer(value):
            yield path, m.group(1).strip()
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from template_expressions(v, (*path, str(k)))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from template_expressions(v, (*path, i))


def render(value: Any, scope: Mapping[str, Any]) -> Any:
    """Replace `${{ expr }}` in a config (dicts, lists, strings).

    A string that is exactly one template becomes the expression's typed value (a number
    stays a number); templates embedded in text are stringified (null → "", true → "true",
    lists/maps → JSON). The result is JSON-compatible.
    """
    return _render(value, scope, measure_scope(scope))


def _render(value: Any, scope: Mapping[str, Any], size: ScopeSize) -> Any:
    if isinstance(value, str):
        if "${{" not in value:
            return value
        whole = TEMPLATE.fullmatch(value.strip())
        if whole and len(TEMPLATE.findall(value)) == 1:
            return to_json(evaluate(whole.group(1), scope, scope_size=size))
        return TEMPLATE.sub(
            lambda m: _stringify(evaluate(m.group(1), scope, scope_size=size)), value
        )
    if isinstance(value, Mapping):
        return {k: _render(v, scope, size) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_render(v, scope, size) for v in value]
    return value


def _stringify(value: Any) -> str:
    plain = to_json(value)
    if plain is None:
        return ""
    if isinstance(plain, bool):
        return "true" if plain else "false"
    if isinstance(plain, str):
        return plain
    if isinstance(plain, int | float):
        return str(plain)
    return json.dumps(plain, separators=(",", ":"), sort_keys=True)
