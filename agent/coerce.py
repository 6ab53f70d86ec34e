"""Coercion of raw arg text (protocol v1) and native JSON args to a tool's JSON schema.

Protocol v1 args are raw text; the tool schema says what they mean. Strings are kept
byte-exact. Other types ignore surrounding whitespace and must match one strict grammar
each (see docs/protocol.md). Native JSON args (OpenAI `tool_calls`) must already carry the
schema's JSON types. Every failure is a `ProtocolError` naming the tool, the arg and what
was expected.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from agent.errors import ProtocolError
from sandbox.tool_specs import ToolSpec

__all__ = ["coerce_args", "coerce_native_args", "describe_type"]

_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_MAX_SHOWN = 60


def _shown(value: str) -> str:
    """A short, quoted excerpt of a bad value for an error message."""
    if len(value) > _MAX_SHOWN:
        return repr(value[:_MAX_SHOWN]) + "…"
    return repr(value)


def describe_type(schema: Mapping[str, Any]) -> str:
    """The schema's type in words, for system prompts and error messages."""
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        return f"array of {describe_type(schema['items'])} (JSON)"
    if kind in ("array", "object"):
        return f"{kind} (JSON)"
    return str(kind)


def _expected(kind: str) -> str:
    return {
        "integer": "an integer such as 30",
        "number": "a number such as 1.5",
        "boolean": "true or false",
        "array": "a JSON array such as [1, 2]",
        "object": 'a JSON object such as {"k": "v"}',
        "null": "null",
        "string": "a string",
    }.get(kind, kind)


def _check_json_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    return True


def _coerce_one(raw: str, kind: str) -> tuple[bool, Any]:
    """(ok, value) for one raw text against one JSON-schema type name."""
    if kind == "string":
        return True, raw
    text = raw.strip()
    try:
        if kind == "integer":
            # int() refuses more than sys.get_int_max_str_digits() digits with ValueError.
            return (True, int(text)) if _INTEGER.fullmatch(text) else (False, None)
        if kind == "number":
            if _NUMBER.fullmatch(text):
                number = float(text)
                if math.isfinite(number):
                    return True, int(text) if _INTEGER.fullmatch(text) else number
            return False, None
    except ValueError:
        return False, None
    if kind == "boolean":
        if text in ("true", "false"):
            return True, text == "true"
        return False, None
    if kind == "null":
        return (True, None) if text == "null" else (False, None)
    if kind in ("array", "object"):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return False, None
        return (True, value) if _check_json_type(value, kind) else (False, None)
    return True, raw


def _check_items(tool: str, arg: str, schema: Mapping[str, Any], value: Any) -> None:
    items = schema.get("items")
    if schema.get("type") != "array" or not isinstance(items, Mapping) or "type" not in items:
        return
    kind = items["type"]
    kinds = kind if isinstance(kind, list) else [kind]
    for i, item in enumerate(value):
        if not any(_check_json_type(item, k) for k in kinds):
            raise ProtocolError(
                f"tool {tool!r}, arg {arg!r}: item {i} must be {' or '.join(kinds)}, got {json.dumps(item)[:_MAX_SHOWN]}",
                code="bad_value",
                tool=tool,
                arg=arg,
            )


def _check_enum(tool: str, arg: str, schema: Mapping[str, Any], value: Any) -> None:
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        raise ProtocolError(
            f"tool {tool!r}, arg {arg!r}: must be one of {json.dumps(enum)}, got {_shown(str(value))}",
            code="bad_value",
            tool=tool,
            arg=arg,
        )


def _coerce_value(tool: str, arg: str, schema: Mapping[str, Any], raw: str) -> Any:
    kind = schema.get("type", "string")
    kinds: list[str] = list(kind) if isinstance(kind, list) else [str(kind)]
    for k in kinds:
        ok, value = _coerce_one(raw, k)
        if ok:
            _check_items(tool, arg, schema, value)
            _check_enum(tool, arg, schema, value)
            return value
    expected = " or ".join(_expected(k) for k in kinds)
    raise ProtocolError(
        f"tool {tool!r}, arg {arg!r}: expected {expected}, got {_shown(raw)}",
        code="bad_value",
        tool=tool,
        arg=arg,
    )


def _properties(spec: ToolSpec) -> Mapping[str, Any]:
    props = spec.parameters.get("properties", {})
    return props if isinstance(props, Mapping) else {}


def _check_names(spec: ToolSpec, names: list[str], call_id: str | None) -> None:
    props = _properties(spec)
    closed = spec.parameters.get("additionalProperties", True) is False or bool(props)
    for name in names:
        if closed and name not in props:
            known = ", ".join(props) or "(none)"
            raise ProtocolError(
                f"tool {spec.name!r} has no arg {name!r}; its args are: {known}",
                code="unknown_arg",
                tool=spec.name,
                arg=name,
                call_id=call_id,
            )
    for required in spec.parameters.get("required", []):
        if required not in names:
            kind = describe_type(props.get(required, {}))
            raise ProtocolError(
                f"tool {spec.name!r} is missing required arg {required!r} ({kind})",
                code="missing_arg",
                tool=spec.name,
                arg=required,
                call_id=call_id,
            )


def coerce_args(
    spec: ToolSpec, raw_args: Mapping[str, str], *, call_id: str | None = None
) -> dict[str, Any]:
    """Protocol v1 raw arg texts → typed values, validated against `spec`.

    Raises:
        ProtocolError: unknown or missing arg, or a value that does not coerce.
    """
    _check_names(spec, list(raw_args), call_id)
    props = _properties(spec)
    out: dict[str, Any] = {}
    for name, raw in raw_args.items():
        try:
            out[name] = _coerce_value(spec.name, name, props.get(name, {}), raw)
        except ProtocolError as e:
            e.call_id = call_id
            raise
    return out


def coerce_native_args(
    spec: ToolSpec, args: Mapping[str, Any], *, call_id: str | None = None
) -> dict[str, Any]:
    """Native (JSON) args → validated values. JSON types must already match the schema.

    Raises:
        ProtocolError: unknown or missing arg, or a value of the wrong JSON type.
    """
    _check_names(spec, list(args), call_id)
    props = _properties(spec)
    out: dict[str, Any] = {}
    for name, value in args.items():
        schema = props.get(name, {})
        kind = schema.get("type", "string")
        kinds: list[str] = list(kind) if isinstance(kind, list) else [str(kind)]
        if not any(_check_json_type(value, k) for k in kinds):
            raise ProtocolError(
                f"tool {spec.name!r}, arg {name!r}: expected {' or '.join(_expected(k) for k in kinds)}, "
                f"got {_shown(json.dumps(value))}",
                code="bad_value",
                tool=spec.name,
                arg=name,
                call_id=call_id,
            )
        _check_items(spec.name, name, schema, value)
        _check_enum(spec.name, name, schema, value)
        out[name] = value
    return out
