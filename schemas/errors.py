"""OpenAI error bodies, and the translation of pydantic validation errors into them.

OpenAI answers a bad request with HTTP 400 and ``{"error": {message, type, param, code}}``:
``param`` is the offending field as a path (``input[0].content``) and ``code`` names the rule
broken (``integer_above_max_value``, ``invalid_type``, ...). ``validation_error_to_openai``
produces the same from a ``pydantic.ValidationError``, with OpenAI's wording.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ._base import TAG_SEP, ContractModel


class ErrorBody(ContractModel):
    message: str
    """For people: what was wrong and what was expected."""
    type: str
    """The error class: ``invalid_request_error``, ``server_error``, ..."""
    param: str | None = None
    """The offending request field as a path (``input[0].content``), if one is to blame."""
    code: str | None = None
    """For programs: the rule broken (``integer_above_max_value``, ``model_not_found``, ...)."""


class ErrorResponse(ContractModel):
    """The body of every non-2xx reply."""

    error: ErrorBody


# pydantic error type -> how OpenAI names the expected JSON type.
_EXPECTED_TYPE = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a decimal",
    "float_parsing": "a decimal",
    "string_type": "a string",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "list_type": "an array",
    "tuple_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}

# Location entries pydantic adds for the members of a smart union ("str", "list[...]").
_UNION_MEMBER_NAMES = frozenset({"str", "int", "float", "bool", "none", "bytes", "dict", "list"})


@dataclass(frozen=True)
class _Problem:
    path: tuple[str | int, ...]
    code: str
    message: str
    expected: str | None = None
    """For a wrong type: the JSON type wanted, so union siblings can be merged into 'one of'."""
    got: Any = None


def validation_error_to_openai(exc: ValidationError) -> ErrorResponse:
    """The OpenAI ``invalid_request_error`` for the first thing wrong with a request.

    "First" is the first field pydantic complains about. A union reports every member's failure:
    of those, the deepest location wins (``input[0].content`` beats ``input``), and wrong-type
    reports at one location merge into "expected one of a string or an array".
    """
    errors = exc.errors(include_url=False)
    if not errors:
        return _response(None, "invalid_value", "Invalid request.")
    first_field = errors[0]["loc"][:1]
    problems = [_problem(err) for err in errors if err["loc"][:1] == first_field]
    chosen = max(problems, key=lambda p: len(p.path))  # max() keeps the earliest of equals
    param = _param(chosen.path)
    if chosen.expected is None:
        return _response(param, chosen.code, chosen.message)
    wanted = list(dict.fromkeys(p.expected for p in problems if p.path == chosen.path and p.expected))
    return _response(param, "invalid_type", _type_message(param, wanted, chosen.got))


def _response(param: str | None, code: str, message: str) -> ErrorResponse:
    return ErrorResponse(error=ErrorBody(message=message, type="invalid_request_error", param=param, code=code))


def _problem(err: ErrorDetails) -> _Problem:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    path = _clean_path(err["loc"])
    param = _param(path)
    quoted = f"'{param}'" if param else "the request body"

    if kind in _EXPECTED_TYPE:
        return _Problem(path, "invalid_type", "", expected=_EXPECTED_TYPE[kind], got=value)
    if kind == "missing":
        return _Problem(path, "missing_required_parameter", f"Missing required parameter: {quoted}.")
    if kind == "extra_forbidden":
        return _Problem(path, "unknown_parameter", f"Unknown parameter: {quoted}.")
    if kind == "literal_error":
        return _invalid_choice(path, value, _quoted_values(ctx.get("expected", "")))
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return _bad_union_member(path, value, ctx)
    if kind in ("less_than_equal", "less_than", "greater_than_equal", "greater_than"):
        return _out_of_range(path, kind, value, ctx)
    if kind == "too_long" and isinstance(value, dict):
        return _Problem(
            path,
            "object_above_max_properties",
            f"Invalid {quoted}: too many properties. Expected an object with at most "
            f"{ctx['max_length']} properties, but got an object with {len(value)} properties instead.",
        )
    if kind in ("too_long", "too_short") and isinstance(value, list):
        above = kind == "too_long"
        limit = ctx["max_length"] if above else ctx["min_length"]
        return _Problem(
            path,
            "array_above_max_length" if above else "array_below_min_length",
            f"Invalid {quoted}: array too {'long' if above else 'short'}. Expected an array with "
            f"{'maximum' if above else 'minimum'} length {limit}, but got an array with length "
            f"{len(value)} instead.",
        )
    if kind in ("string_too_long", "string_too_short"):
        above = kind == "string_too_long"
        if err["loc"][-1:] == ("[key]",):  # a dict key (metadata) rather than a value
            return _Problem(
                path[:-1],
                "property_name_above_max_length",
                f"Invalid '{_param(path[:-1])}': property name too long. Expected a property name "
                f"with maximum length {ctx['max_length']}, but got a property name with length "
                f"{len(value)} instead.",
            )
        limit = ctx["max_length"] if above else ctx["min_length"]
        return _Problem(
            path,
            "string_above_max_length" if above else "string_below_min_length",
            f"Invalid {quoted}: string too {'long' if above else 'short'}. Expected a string with "
            f"{'maximum' if above else 'minimum'} length {limit}, but got a string with length "
            f"{len(value)} instead.",
        )
    if kind == "string_pattern_mismatch":
        return _Problem(
            path,
            "invalid_value",
            f"Invalid {quoted}: string does not match pattern. Expected a string that matches the "
            f"pattern '{ctx['pattern']}'.",
        )
    message = err["msg"].removeprefix("Value error, ")
    return _Problem(path, "invalid_value", f"Invalid {quoted}: {message}.")


def _bad_union_member(path: tuple[str | int, ...], value: Any, ctx: dict[str, Any]) -> _Problem:
    """A tagged union could not pick a member: not an object, tag missing, or unknown tag."""
    if not isinstance(value, dict):
        return _Problem(path, "invalid_type", "", expected="an object", got=value)
    field, _, _ = str(ctx.get("tag", "")).partition(TAG_SEP)
    supported = [tag.partition(TAG_SEP)[2] for tag in _quoted_values(ctx.get("expected_tags", ""))]
    if field not in value:
        missing = (*path, field)
        return _Problem(missing, "missing_required_parameter", f"Missing required parameter: '{_param(missing)}'.")
    found = value[field]
    if not isinstance(found, str):
        return _Problem((*path, field), "invalid_type", "", expected="a string", got=found)
    # OpenAI blames the item itself for an unknown item type or role (param "input[0]").
    return _invalid_choice(path, found, supported)


def _invalid_choice(path: tuple[str | int, ...], value: Any, supported: list[str]) -> _Problem:
    if supported and not isinstance(value, str):
        return _Problem(path, "invalid_type", "", expected="a string", got=value)
    choices = _join(f"'{choice}'" for choice in supported)
    return _Problem(path, "invalid_value", f"Invalid value: {_show(value)}. Supported values are: {choices}.")


def _out_of_range(path: tuple[str | int, ...], kind: str, value: Any, ctx: dict[str, Any]) -> _Problem:
    above = kind.startswith("less_than")
    bound = ctx.get("le", ctx.get("lt", ctx.get("ge", ctx.get("gt"))))
    sign = {"less_than_equal": "<=", "less_than": "<", "greater_than_equal": ">=", "greater_than": ">"}[kind]
    # The bound has the field's type (pydantic makes it 2.0 on a float field): `temperature: 3`
    # is a decimal above maximum, as OpenAI says, although 3 is written as an integer.
    number = "decimal" if isinstance(bound, float) else "integer"
    side = "above maximum" if above else "below minimum"
    return _Problem(
        path,
        f"{number}_{'above_max' if above else 'below_min'}_value",
        f"Invalid '{_param(path)}': {number} {side} value. Expected a value {sign} {_show(bound)}, "
        f"but got {_show(value)} instead.",
    )


def _type_message(param: str | None, wanted: list[str], got: Any) -> str:
    quoted = f"'{param}'" if param else "the request body"
    expected = wanted[0] if len(wanted) == 1 else "one of " + _join(wanted, last="or")
    return f"Invalid type for {quoted}: expected {expected}, but got {_json_type(got)} instead."


def _clean_path(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """The location without union-member names: only field names, dict keys and indexes."""
    return tuple(part for part in loc if isinstance(part, int) or not _is_union_member(part))


def _is_union_member(part: str) -> bool:
    # Our tags are "field=value"; pydantic's own member names are types ("str", "list[...]").
    return TAG_SEP in part or "[" in part or part in _UNION_MEMBER_NAMES


def _param(path: tuple[str | int, ...]) -> str | None:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or None


def _quoted_values(text: str) -> list[str]:
    """``"'a', 'b' or 'c'"`` (how pydantic lists choices) -> ``["a", "b", "c"]``."""
    return re.findall(r"'((?:[^'\\]|\\.)*)'", text)


def _join(items: Any, last: str = "and") -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    if len(items) == 2:
        return f"{items[0]} {last} {items[1]}"
    return f"{', '.join(items[:-1])}, {last} {items[-1]}"


def _show(value: Any) -> str:
    """A value as OpenAI quotes it in messages: strings in single quotes, others as JSON."""
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object"
