"""The canonical step of generation: what every front door and every dialect share, and nothing else.

`Generation` is what a front door parses a request into and what every dialect builds its upstream
request from; `Step` (with `ToolCallDelta`) is what every dialect parses an upstream answer into and
what every translator consumes. Both `gateway.upstreams` and `gateway.translate` import from here and
never from each other, as h11's connection and its reader/writer share `_events.py`; this package
imports only `gateway.logprobs` (and `gateway.errors`) below it.
"""
