"""Upstream *simulators* for tests, demos and benchmarks: no model, scripted text, synthetic logprobs.

Each simulator reproduces one inference server's wire format exactly where a client can tell
(field sets, chunking, logprob quirks, errors) so the gateway can be tested end to end offline.

- `gateway.simulator.vllm`: vLLM's /v1/chat/completions and /v1/completions
  (`create_app(vocab, model, ...)`; runnable with `python -m gateway.simulator.vllm`).
"""
