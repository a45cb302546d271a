"""The body of ``POST /v1/responses/compact`` (the Open Responses ``CompactResponseMethodPublicBody``).

``input`` items are checked as ``CreateResponse`` input once their ``compaction`` items are expanded,
so here it is only a string or a list. Other top-level fields OpenAI's SDK may send (``service_tier``,
``prompt_cache_retention``, ...) are accepted and have no effect.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

from ._base import ContractModel


class CompactRequest(ContractModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[Any] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    prompt_cache_key: Annotated[str, Field(max_length=64)] | None = None
