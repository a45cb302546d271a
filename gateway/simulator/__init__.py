"""Upstream *simulators* for tests, demos and benchmarks: no model, scripted text, synthetic logprobs.

Each simulator reproduces one inference server's wire format exactly where a client can tell
(field sets, chunking, logprob quirks, errors) so the gateway can be tested end to end offline.
All of them take a real tokenizer (`create_app(vocab, model, ...)`), share the fault hooks and
/sim/* routes (`base.py`, `faults.py`), and run with `python -m gateway.simulator.<name>`:

- `vllm`: vLLM's /v1/chat/completions and /v1/completions;
- `tgi`: Text Generation Inference's /generate, /generate_stream and its OpenAI routes;
- `sglang`: SGLang's /v1/chat/completions, /v1/completions and native /generate;
- `llamacpp`: llama.cpp's llama-server /v1/chat/completions, /v1/completions and /completion;
- `openai`: a server in OpenAI's own conventions (`\\xNN` token strings with exact bytes, `bytes:`
  completions tokens, true top-k lists).
"""
