"""Record real-server replies as replay fixtures (issue 20 item 3).

    python tests/captures/real/record.py vllm http://127.0.0.1:18000 MODEL OUT.json
    python tests/captures/real/record.py llamacpp http://127.0.0.1:18080 MODEL OUT.json

Each case is one request; the file keeps the request, the status, the headers' content type and the raw
body (streams as the list of SSE `data:` payloads, exactly as sent). See README.md beside this file for
how the servers were started.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any

CJK = "写一首关于秋天的诗, 用表情符号 👋🏽"
# SmolLM2's chat template around "Say OK.": the model ends its answer with <|im_end|> (an EOS).
EOS_PROMPT = "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\n"


def vllm_cases(model: str) -> list[tuple[str, str, dict[str, Any]]]:
    chat = {"model": model, "messages": [{"role": "user", "content": CJK}], "temperature": 0, "max_tokens": 24}
    comp = {"model": model, "prompt": CJK, "temperature": 0, "max_tokens": 24}
    return [
        ("chat logprobs, no ids", "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 3}),
        ("chat logprobs, token ids", "/v1/chat/completions",
         {**chat, "logprobs": True, "top_logprobs": 3, "return_tokens_as_token_ids": True}),
        # What the gateway asks for a Responses request with top_logprobs 5 and max_output_tokens 40: the
        # 40th token leaves a character unfinished, which the text holds back.
        ("chat token ids, cap inside a character", "/v1/chat/completions",
         {"model": model, "messages": [{"role": "user", "content": "Tell me about the plan."}], "temperature": 0,
          "max_tokens": 40, "ignore_eos": True, "logprobs": True, "top_logprobs": 6,
          "return_tokens_as_token_ids": True}),
        ("chat top 20 at temperature 1, token ids", "/v1/chat/completions",
         {**chat, "temperature": 1.0, "seed": 0, "max_tokens": 8, "logprobs": True, "top_logprobs": 20,
          "return_tokens_as_token_ids": True}),
        ("chat stream logprobs", "/v1/chat/completions",
         {**chat, "logprobs": True, "top_logprobs": 2, "stream": True,
          "stream_options": {"include_usage": True}}),
        ("completions logprobs", "/v1/completions", {**comp, "logprobs": 3}),
        ("completions logprobs, token ids", "/v1/completions",
         {**comp, "logprobs": 3, "return_tokens_as_token_ids": True}),
        ("completions stream", "/v1/completions",
         {**comp, "logprobs": 2, "stream": True, "stream_options": {"include_usage": True}}),
        ("logit_bias id outside the vocab", "/v1/chat/completions", {**chat, "logit_bias": {"999999": 5}}),
        ("logit_bias id outside the vocab, stream", "/v1/chat/completions",
         {**chat, "logit_bias": {"999999": 5}, "stream": True}),
        ("too many logprobs", "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 21}),
        ("too many logprobs, stream", "/v1/chat/completions",
         {**chat, "logprobs": True, "top_logprobs": 21, "stream": True}),
        ("context length", "/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "好 " * 2000}]}),
        ("context length, completions", "/v1/completions", {**comp, "prompt": "好 " * 2000}),
        ("responses", "/v1/responses",
         {"model": model, "input": CJK, "temperature": 0, "max_output_tokens": 24, "top_logprobs": 3,
          "include": ["message.output_text.logprobs"]}),
    ]


def llamacpp_cases(model: str) -> list[tuple[str, str, dict[str, Any]]]:
    chat = {"model": model, "messages": [{"role": "user", "content": "Say hello with emoji 👋🏽 and 你好"}],
            "temperature": 0, "max_tokens": 24, "logprobs": True, "top_logprobs": 2}
    comp = {"model": model, "prompt": "Emoji: 👋🏽 你好", "temperature": 0, "max_tokens": 16, "logprobs": 2}
    return [
        ("chat", "/v1/chat/completions", chat),
        ("chat stream", "/v1/chat/completions", {**chat, "stream": True}),
        ("chat cut inside a character", "/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "Reply with only 👋🏽👋🏽👋🏽"}], "max_tokens": 2}),
        ("chat cut inside a character, stream", "/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "Reply with only 👋🏽👋🏽👋🏽"}], "max_tokens": 2,
          "stream": True}),
        ("chat cut after a character, stream", "/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "Reply with only 👋🏽👋🏽👋🏽"}], "max_tokens": 3,
          "stream": True}),
        ("chat stop string", "/v1/chat/completions", {**chat, "stop": ["🏽"]}),
        ("chat stop string, stream", "/v1/chat/completions", {**chat, "stop": ["🏽"], "stream": True}),
        ("chat eos", "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": "Say OK."}],
                                              "max_tokens": 40}),
        ("chat eos, stream", "/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 40, "stream": True}),
        ("chat stop string of several tokens", "/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 40, "stop": [" assist"]}),
        ("chat stop string of several tokens, stream", "/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 40, "stop": [" assist"],
          "stream": True}),
        ("chat top_logprobs 25", "/v1/chat/completions",
         {**chat, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 2, "top_logprobs": 25}),
        ("chat n=2", "/v1/chat/completions", {**chat, "n": 2, "temperature": 1.0, "seed": 1}),
        ("completions", "/v1/completions", comp),
        ("completions stream", "/v1/completions", {**comp, "stream": True}),
        ("completions echo", "/v1/completions", {**comp, "echo": True}),
        ("completions eos", "/v1/completions", {**comp, "prompt": EOS_PROMPT, "max_tokens": 40}),
        ("completions eos, stream", "/v1/completions",
         {**comp, "prompt": EOS_PROMPT, "max_tokens": 40, "stream": True}),
        ("completions stop string", "/v1/completions", {**comp, "stop": ["👑"]}),
        ("completions stop string, stream", "/v1/completions", {**comp, "stop": ["👑"], "stream": True}),
        ("completions n=2", "/v1/completions", {**comp, "n": 2, "temperature": 1.0, "seed": 1}),
        ("responses, top_logprobs", "/v1/responses", {"model": model, "input": "Say hi 👋", "max_output_tokens": 16,
                                        "top_logprobs": 2, "include": ["message.output_text.logprobs"]}),
        ("responses", "/v1/responses", {"model": model, "input": "Say hi 👋", "max_output_tokens": 16,
                                        "include": ["message.output_text.logprobs"]}),
        ("responses stream", "/v1/responses", {"model": model, "input": "Say hi 👋", "max_output_tokens": 16,
                                               "stream": True}),
    ]


def record(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            status, ctype, raw = resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        status, ctype, raw = err.code, err.headers.get("Content-Type", ""), err.read()
    text = raw.decode("utf-8", "replace")
    out: dict[str, Any] = {"status": status, "content_type": ctype}
    if "text/event-stream" in ctype:
        out["events"] = [line for line in text.split("\n") if line.strip()]
    else:
        try:
            out["body"] = json.loads(text)
        except ValueError:
            out["text"] = text
    return out


def main() -> None:
    dialect, base, model, target = sys.argv[1:5]
    cases = vllm_cases(model) if dialect == "vllm" else llamacpp_cases(model)
    version = {}
    for probe in ("/version", "/props"):
        try:
            with urllib.request.urlopen(base + probe, timeout=30) as resp:
                version[probe] = json.loads(resp.read())
        except Exception as err:
            version[probe] = repr(err)
    if "/props" in version and isinstance(version["/props"], dict):
        version["/props"] = {k: version["/props"].get(k) for k in ("build_info", "model_path", "n_ctx")}
    recorded = [{"name": name, "path": path, "request": body, "response": record(base, path, body)}
                for name, path, body in cases]
    with open(target, "w", encoding="utf-8") as fh:
        json.dump({"server": dialect, "version": version, "cases": recorded}, fh, ensure_ascii=False, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
