"""The template syntax of user suites: `{{ name | filter | filter(arg) }}`, safe by construction.

No code runs: an expression is a parameter name (with `.key` / `[index]` steps into the
values a generator returned), or a JSON string/number literal, followed by filters from a
fixed table. There is no attribute access on Python objects, no calls, no loops, so
expanding a template can neither touch the host nor run away. (To "render" is
`agent.render`'s word: protocol messages for the model.)

    expr    := head ("|" filter)*
    head    := NAME ("." NAME | "[" INT "]")*  |  JSON string  |  number
    filter  := NAME | NAME "(" JSON literal ("," JSON literal)* ")"

`expand_text` puts each expression's value into the string (numbers as digits, booleans as
`true`/`false`; a list or mapping must be turned into text with `join`, `lines` or
`json`). `expand_value` returns the native value when the whole string is one expression
(a reference argument `timeout: "{{ t }}"` stays an integer). Pure functions.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPEN, _CLOSE = "{{", "}}"


class ExpressionError(ValueError):
    """A template is malformed, names an unknown value, or a filter got the wrong type."""


@dataclass(frozen=True)
class _Filter:
    name: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Expr:
    """One parsed `{{ … }}` expression."""

    source: str
    """The text between the braces, for messages."""
    name: str | None
    """The parameter the expression starts from; None for a literal."""
    literal: Any
    """The literal value when `name` is None."""
    path: tuple[str | int, ...]
    """`.key` / `[index]` steps into the parameter's value."""
    filters: tuple[_Filter, ...]
    """Filters applied left to right."""


Piece = str | Expr


def parse(text: str) -> list[Piece]:
    """Split `text` into literal strings and expressions.

    Raises:
        ExpressionError: an unclosed `{{`, an empty or malformed expression, an unknown filter,
            or a filter with the wrong number of arguments.
    """
    pieces: list[Piece] = []
    pos = 0
    while True:
        start = text.find(_OPEN, pos)
        if start < 0:
            if pos < len(text):
                pieces.append(text[pos:])
            return pieces
        end = _find_close(text, start)
        if start > pos:
            pieces.append(text[pos:start])
        pieces.append(_parse_expr(text[start + 2 : end].strip()))
        pos = end + 2


def _find_close(text: str, start: int) -> int:
    """Index of the `}}` closing the `{{` at `start` (braces inside string literals skipped)."""
    i = start + 2
    quoted = False
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif text.startswith(_CLOSE, i):
            return i
        elif text.startswith(_OPEN, i):
            break
        i += 1
    raise ExpressionError(f"unclosed {_OPEN!r} at character {start + 1}")


def names_in(text: str) -> set[str]:
    """The parameter names `text` refers to.

    Raises:
        ExpressionError: as `parse`.
    """
    return {p.name for p in parse(text) if isinstance(p, Expr) and p.name is not None}


def expand_text(text: str, values: Mapping[str, Any]) -> str:
    """`text` with every expression replaced by its value as text.

    Raises:
        ExpressionError: as `parse`, or an unknown name, a bad filter input, a value that has no
            text form (a list or mapping without `join`/`lines`/`json`).
    """
    out: list[str] = []
    for piece in parse(text):
        out.append(piece if isinstance(piece, str) else _as_text(evaluate(piece, values), piece))
    return "".join(out)


def expand_value(text: str, values: Mapping[str, Any]) -> Any:
    """The native value when `text` is exactly one expression, else `expand_text(text, values)`.

    Raises:
        ExpressionError: as `expand_text`.
    """
    pieces = parse(text)
    if len(pieces) == 1 and isinstance(pieces[0], Expr):
        return evaluate(pieces[0], values)
    return expand_text(text, values)


def evaluate(expr: Expr, values: Mapping[str, Any]) -> Any:
    """The value of one expression.

    Raises:
        ExpressionError: an unknown name, a missing key or index, a filter given the wrong type.
    """
    if expr.name is None:
        value = expr.literal
    elif expr.name in values:
        value = values[expr.name]
    else:
        known = ", ".join(sorted(values)) or "none"
        raise ExpressionError(f"unknown parameter {expr.name!r} (known: {known})")
    for step in expr.path:
        value = _step_into(value, step, expr)
    for f in expr.filters:
        func = FILTERS[f.name][0]
        try:
            value = func(value, *f.args)
        except ExpressionError as e:
            raise ExpressionError(f"`{f.name}` in {{{{ {expr.source} }}}}: {e}") from None
    return value


def _parse_expr(source: str) -> Expr:
    if not source:
        raise ExpressionError("empty expression {{ }}")
    parts = _split_top(source, "|")
    head = parts[0].strip()
    name, literal, path = _parse_head(head, source)
    filters = tuple(_parse_filter(part.strip(), source) for part in parts[1:])
    return Expr(source=source, name=name, literal=literal, path=path, filters=filters)


def _parse_head(head: str, source: str) -> tuple[str | None, Any, tuple[str | int, ...]]:
    if head[:1] in {'"', "-"} or head[:1].isdigit():
        try:
            literal = json.loads(head)
        except json.JSONDecodeError:
            raise ExpressionError(f"bad literal {head!r} in {{{{ {source} }}}}") from None
        if not isinstance(literal, str | int | float):
            raise ExpressionError(f"bad literal {head!r} in {{{{ {source} }}}}")
        return None, literal, ()
    match = _NAME.match(head)
    if match is None:
        raise ExpressionError(
            f"{{{{ {source} }}}}: expected a parameter name or a quoted string, got {head!r}"
        )
    path: list[str | int] = []
    rest = head[match.end() :]
    while rest:
        step = re.match(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(-?\d+)\]", rest)
        if step is None:
            raise ExpressionError(f"{{{{ {source} }}}}: unexpected {rest!r} after the name")
        path.append(step.group(1) if step.group(1) is not None else int(step.group(2)))
        rest = rest[step.end() :]
    return match.group(0), None, tuple(path)


def _parse_filter(text: str, source: str) -> _Filter:
    match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?", text, re.S)
    if match is None:
        raise ExpressionError(f"{{{{ {source} }}}}: malformed filter {text!r}")
    name, raw_args = match.group(1), match.group(2)
    if name not in FILTERS:
        raise ExpressionError(
            f"{{{{ {source} }}}}: unknown filter {name!r} (known: {', '.join(sorted(FILTERS))})"
        )
    args: tuple[Any, ...] = ()
    if raw_args is not None and raw_args.strip():
        try:
            parsed = json.loads(f"[{raw_args}]")
        except json.JSONDecodeError:
            raise ExpressionError(
                f"{{{{ {source} }}}}: arguments of `{name}` must be JSON literals "
                f'(e.g. join(", ")), got ({raw_args})'
            ) from None
        args = tuple(parsed)
    _, low, high = FILTERS[name]
    if not low <= len(args) <= high:
        want = str(low) if low == high else f"{low} to {high}"
        raise ExpressionError(
            f"{{{{ {source} }}}}: `{name}` takes {want} argument(s), got {len(args)}"
        )
    return _Filter(name=name, args=args)


def _split_top(text: str, sep: str) -> list[str]:
    """Split at `sep` outside string literals and parentheses."""
    parts: list[str] = []
    depth = 0
    quoted = False
    escaped = False
    current: list[str] = []
    for ch in text:
        if quoted:
            escaped = ch == "\\" and not escaped
            if ch == '"' and not escaped:
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def _step_into(value: Any, step: str | int, expr: Expr) -> Any:
    if isinstance(step, str):
        if isinstance(value, dict) and step in value:
            return value[step]
        raise ExpressionError(f"{{{{ {expr.source} }}}}: no key {step!r} in {_kind(value)}")
    if isinstance(value, list) and -len(value) <= step < len(value):
        return value[step]
    raise ExpressionError(f"{{{{ {expr.source} }}}}: no index [{step}] in {_kind(value)}")


def _as_text(value: Any, expr: Expr) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise ExpressionError(
        f"{{{{ {expr.source} }}}} is {_kind(value)}; turn it into text with "
        "`join`, `lines` or `json`"
    )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


# ---- filters: each takes the value and its JSON-literal arguments --------------------------


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ExpressionError(f"needs a list, got {_kind(value)}")
    return value


def _numbers(value: Any) -> list[float]:
    items = _list(value)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
        raise ExpressionError("needs a list of numbers")
    return items


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ExpressionError(f"needs a number, got {_kind(value)}")
    return value


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise ExpressionError(f"needs text or numbers, got {_kind(value)} inside")


def _sort(value: Any) -> list[Any]:
    items = _list(value)
    try:
        return sorted(items)
    except TypeError:
        raise ExpressionError("cannot sort a list that mixes numbers and strings") from None


def _unique(value: Any) -> list[Any]:
    out: list[Any] = []
    for item in _list(value):
        if item not in out:
            out.append(item)
    return out


def _join(value: Any, sep: Any = "") -> str:
    return str(sep).join(_text_of(v) for v in _list(value))


def _lines(value: Any) -> str:
    return "".join(_text_of(v) + "\n" for v in _list(value))


def _minmax(func: Callable[[Sequence[float]], float]) -> Callable[[Any], float]:
    def apply(value: Any) -> float:
        items = _numbers(value)
        if not items:
            raise ExpressionError("needs a non-empty list")
        return func(items)

    return apply


def _len(value: Any) -> int:
    if isinstance(value, str | list | dict):
        return len(value)
    raise ExpressionError(f"needs a list, string or mapping, got {_kind(value)}")


def _str_method(method: Callable[[str], str]) -> Callable[[Any], str]:
    def apply(value: Any) -> str:
        if not isinstance(value, str):
            raise ExpressionError(f"needs a string, got {_kind(value)}")
        return method(value)

    return apply


def _fixed(value: Any, digits: Any) -> str:
    if isinstance(digits, bool) or not isinstance(digits, int) or not 0 <= digits <= 12:
        raise ExpressionError(f"digits must be an integer 0..12, got {digits!r}")
    return f"{_number(value):.{digits}f}"


def _arith(op: Callable[[float, float], float]) -> Callable[[Any, Any], float]:
    def apply(value: Any, other: Any) -> float:
        return op(_number(value), _number(other))

    return apply


def _pick(index: int) -> Callable[[Any], Any]:
    def apply(value: Any) -> Any:
        items = _list(value)
        if not items:
            raise ExpressionError("needs a non-empty list")
        return items[index]

    return apply


FILTERS: dict[str, tuple[Callable[..., Any], int, int]] = {
    # name: (function, fewest args, most args)
    "add": (_arith(lambda a, b: a + b), 1, 1),
    "first": (_pick(0), 0, 0),
    "fixed": (_fixed, 1, 1),
    "join": (_join, 0, 1),
    "json": (lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True), 0, 0),
    "last": (_pick(-1), 0, 0),
    "len": (_len, 0, 0),
    "lines": (_lines, 0, 0),
    "lower": (_str_method(str.lower), 0, 0),
    "max": (_minmax(max), 0, 0),
    "min": (_minmax(min), 0, 0),
    "mul": (_arith(lambda a, b: a * b), 1, 1),
    "reverse": (lambda v: list(reversed(_list(v))), 0, 0),
    "shell": (lambda v: shlex.quote(_text_of(v)), 0, 0),
    "sort": (_sort, 0, 0),
    "sum": (lambda v: sum(_numbers(v)), 0, 0),
    "unique": (_unique, 0, 0),
    "upper": (_str_method(str.upper), 0, 0),
}
"""The only operations a template can apply, by name."""
