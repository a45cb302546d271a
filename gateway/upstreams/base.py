"""What every dialect hands the server loop: the upstream request and how to read its answer into a Step
(`gateway.canonical.step`, shared with the translators)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.canonical.step import Step
from gateway.errors import GatewayError
from gateway.logprobs.body_scan import load_json
from gateway.logprobs.parse import ParseOptions
from gateway.logprobs.report import TranslationReport

StepParser = Callable[[Mapping[str, Any], ParseOptions, bool], Step]
BodyLoader = Callable[[bytes, ParseOptions], Any]
ChunkReader = Callable[[bytes], "Step | None"]
ChunkReaderFor = Callable[[ParseOptions, bool], "ChunkReader | None"]
# A stream event of the common shape as its parts: (text, tokens, finish_reason), every token read from its
# id, the tokens a `TokenBatch` where they can be; `step_of_fields` makes the Step its chunk reader would.
ChunkFields = tuple[str, Any, "str | None"]
FieldsReader = Callable[[bytes], "ChunkFields | None"]
FieldsReaderFor = Callable[[ParseOptions], "FieldsReader | None"]


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """A request to send (`path` under the upstream's base URL) and how to read its answer.

    `load(raw, options)` reads one JSON body or stream event's bytes (orjson, unless the dialect has
    a faster reader); `parse(payload, options, streaming)` turns what it gives into a Step.
    `read_chunk(options, batches)`, where a dialect has one, gives a reader (None: none for these options) of
    a stream event's bytes that reads its common shape straight to the Step `parse` would make (None: not
    that shape); with `batches` its tokens may come as a `TokenBatch` (the same Tokens, kept as ids) for a
    translator that takes one. Made once per stream (`stream_reader`): the tokenizer's tables are looked up
    then, not at every event.
    `chunk_fields(options)`, where a dialect's `read_chunk` is a Step made of them (`step_of_fields`), gives a
    reader of the same events' parts (None: none for these options), for a caller that takes the usual chunk
    as they are and makes the Step only for the others.
    `streamed_whole`: the body asks for a stream although the client's answer is whole; the shell reads
    it to its end and `parse` gets the list of its events, each loaded (llama.cpp: see llamacpp.py).
    """

    path: str
    body: dict[str, Any]
    parse: StepParser
    load: BodyLoader = load_json
    read_chunk: ChunkReaderFor | None = None
    streamed_whole: bool = False
    chunk_fields: FieldsReaderFor | None = None

    def read(self, raw: bytes, options: ParseOptions, streaming: bool) -> Step:
        """One body or stream event's bytes -> a Step."""
        if streaming:
            return self.stream_reader(options)(raw)
        return self.parse(self.load(raw, options), options, streaming=False)

    def fields_reader(self, options: ParseOptions) -> FieldsReader | None:
        """`chunk_fields(options)`, where the dialect has one."""
        return self.chunk_fields(options) if self.chunk_fields is not None else None

    def stream_reader(self, options: ParseOptions, batches: bool = False) -> Callable[[bytes], Step]:
        """`read(raw, options, True)` as one function of the event's bytes, for a stream's loop (it runs
        once per token). `batches`: the caller takes a Step whose tokens are a `TokenBatch`."""
        parse, load = self.parse, self.load

        def read_any(raw: bytes) -> Step:
            return parse(load(raw, options), options, streaming=True)

        read_common = self.read_chunk(options, batches) if self.read_chunk is not None else None
        if read_common is None:
            return read_any

        def read(raw: bytes) -> Step:
            step = read_common(raw)
            return step if step is not None else read_any(raw)

        return read


def step_of_fields(fields: ChunkFields) -> Step:
    """The Step of a stream event read as its parts (see ChunkFields)."""
    text, tokens, finish_reason = fields
    step = Step(text, tokens, finish_reason)
    step.report = from_ids_report(len(tokens))  # set, not passed: a keyword argument doubles the cost of the call
    return step


# One report per count, shared by the chunks (nearly all of one token or none) instead of one made per chunk:
# a report is only ever read once parsing has made it (summed into the metrics, or merged into another).
_FROM_IDS_REPORTS: dict[int, TranslationReport] = {}


def from_ids_report(count: int) -> TranslationReport:
    report = _FROM_IDS_REPORTS.get(count)
    if report is None:
        report = TranslationReport(from_ids=count)
        if count < 64:
            _FROM_IDS_REPORTS[count] = report
    return report


def unsupported(message: str, param: str) -> GatewayError:
    """Honest refusal: the route cannot give what was asked; never silently return less."""
    return GatewayError(400, message, param=param, code="unsupported_parameter")
