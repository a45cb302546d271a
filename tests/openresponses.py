"""The Open Responses OpenAPI spec as a JSON Schema validator, read in place from /work/shared.

The whole document is one resource, so every `#/components/schemas/...` reference resolves
anywhere in it (Draft 2020-12). `jsonschema` is a test dependency only.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_PATH = Path(__file__).resolve().parents[2] / "shared" / "reference" / "openresponses-openapi.json"
SPEC_URI = "urn:openresponses-openapi"

# Known conflicts (README "Contracts"): the SDK's reasoning text events are the spec's
# `response.reasoning.*` under another name; the spec types a json_schema format's `schema` as null.
SPEC_EVENT_NAME = {"response.reasoning_text.delta": "response.reasoning.delta",
                   "response.reasoning_text.done": "response.reasoning.done"}


class OpenResponsesSpec:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.schemas: dict[str, Any] = document["components"]["schemas"]
        self._registry = Registry().with_resource(SPEC_URI, Resource(contents=document, specification=DRAFT202012))
        # The same document with the one spec error fixed: a json_schema format's `schema` is an object.
        patched = copy.deepcopy(document)
        patched["components"]["schemas"]["JsonSchemaResponseFormat"]["properties"]["schema"] = {"type": "object"}
        self._patched = Registry().with_resource(SPEC_URI, Resource(contents=patched, specification=DRAFT202012))

    def validate(self, schema_name: str, instance: Any, *, json_schema_format: bool = False) -> None:
        registry = self._patched if json_schema_format else self._registry
        schema = {"$ref": f"{SPEC_URI}#/components/schemas/{schema_name}"}
        jsonschema.Draft202012Validator(schema, registry=registry).validate(instance)

    def event_schema_name(self, event_type: str) -> str:
        """The stream event schema whose `type` enum is exactly `event_type` (and has a sequence number)."""
        names = [name for name, schema in self.schemas.items()
                 if isinstance(schema, dict)
                 and schema.get("properties", {}).get("type", {}).get("enum") == [event_type]
                 and "sequence_number" in schema.get("properties", {})]
        assert len(names) == 1, f"expected one spec schema for {event_type!r}, found {names}"
        return names[0]

    def validate_event(self, event: dict[str, Any], *, json_schema_format: bool = False) -> None:
        spec_type = SPEC_EVENT_NAME.get(event["type"], event["type"])
        self.validate(self.event_schema_name(spec_type), {**event, "type": spec_type},
                      json_schema_format=json_schema_format)

    @property
    def response_required(self) -> set[str]:
        return set(self.schemas["ResponseResource"]["required"])


@cache
def load_spec() -> OpenResponsesSpec | None:
    """The spec, or None when /work/shared is absent (spec checks are then skipped)."""
    if not SPEC_PATH.is_file():
        return None
    return OpenResponsesSpec(json.loads(SPEC_PATH.read_text(encoding="utf-8")))
