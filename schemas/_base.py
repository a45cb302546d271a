"""Building blocks shared by the wire models: two base classes and tagged unions.

``ContractModel`` is for shapes we accept from clients or emit to them: strict types and unknown
keys rejected, as OpenAI does. ``PassthroughModel`` is for upstream server output, which vendors
decorate with keys of their own (vLLM's ``stop_reason``, ``prompt_logprobs``): kept, not rejected.

Union members are tagged ``"<field>=<value>"`` (e.g. ``"type=input_text"``) so that
``schemas.errors`` can strip tags from a pydantic error location and get back OpenAI's ``param``
path (``input[0].content``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

#: Separates field and value in a union tag; never appears in a field name.
TAG_SEP = "="

#: One byte of a token's UTF-8 encoding.
Byte = Annotated[int, Field(ge=0, le=255)]


class ContractModel(BaseModel):
    """A shape we accept from clients or emit: strict types, unknown keys rejected."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        # Every field is always serialized, defaults included: say so in the JSON schema.
        json_schema_serialization_defaults_required=True,
    )


class PassthroughModel(BaseModel):
    """A shape produced by upstream servers: vendor keys are kept, coercion is ordinary."""

    model_config = ConfigDict(extra="allow")


def union_tag(field: str, value: str) -> str:
    """The tag of the union member whose ``field`` holds ``value``."""
    return f"{field}{TAG_SEP}{value}"


def tagged_union(field: str, members: Mapping[str, Any], *, default: str | None = None) -> Any:
    """A union of ``members`` chosen by the value of ``field`` (``{value: model}``).

    ``default`` is the value assumed when ``field`` is absent (input messages may omit
    ``"type": "message"``). A missing or unknown value gives one ``union_tag_invalid`` error whose
    tag names the field (``"type="`` when absent), instead of one error per member.
    """
    if len(members) == 1:
        # A union of one is the model itself; its Literal field reports bad values.
        (only,) = members.values()
        return only

    def pick(value: Any) -> str | None:
        if isinstance(value, dict):
            found = value.get(field, default)
        elif isinstance(value, BaseModel):
            found = getattr(value, field, default)
        else:
            return None  # not an object at all: pydantic reports union_tag_not_found
        return union_tag(field, found if isinstance(found, str) else "")

    choices = tuple(Annotated[model, Tag(union_tag(field, value))] for value, model in members.items())
    return Annotated[
        Union[choices],  # noqa: UP007 -- built at runtime, the `|` form needs literal operands
        Discriminator(pick),
    ]
