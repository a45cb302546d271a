"""Build a tiny random-weight Qwen2 model for the real-vLLM tests, from the real Qwen2 tokenizer files.

    python tiny_qwen2.py TOKENIZER_DIR OUT_DIR

TOKENIZER_DIR holds Qwen2's `vocab.json` and `merges.txt` (read in place). The model is one decoder layer,
hidden size 64, two heads of head_dim 32 (vLLM's CPU attention refuses head_dim 16 at the first request),
float32, seeded: the same files on every run.

Its weights are shaped, not trained, so that the text it writes exercises what the gateway must get
right with byte-level BPE: characters split across tokens, tokens that hold a whole character and the
start of the next, and now and then a character that is never completed (invalid UTF-8 mid-text) or a
stop inside one. The residual stream carries a few clean "feature" dimensions from the embedding of the
last token straight to the LM head (attention and MLP never write to them), so the next-token logits are
a bigram over the UTF-8 state of the last token plus context-dependent noise:

* after a token that ends a character, lead fragments (tokens ending inside a character) and whole CJK
  characters are favoured, and tokens starting with continuation bytes are suppressed;
* after a token that needs k more continuation bytes, tokens that start with exactly k continuation
  bytes are favoured (mostly, not always: some characters stay unfinished);
* the end tokens get a small probability everywhere, also inside a character.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

SEED = 20
HIDDEN = 64
HEAD_DIM = 32
# feature dimensions of the residual stream: 0 constant, 1 + k "the last token needs k more bytes"
CONST, NEED = 0, 1
FEATURES = 5
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, the format Qwen2's instruct models use.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# desired logit contributions (natural-log units) before the noise
LEAD_AFTER_COMPLETE = 8.6  # the ~1,200 lead fragments together get about half the mass after a whole char
CJK_AFTER_COMPLETE = 6.0
CONT_SUPPRESS = -12.0  # continuation-first tokens right after a whole character
CONT_MATCH = 8.9  # the k-continuation tokens after a token needing k: ~85%, so some characters stay unfinished
# <|im_end|> / <|endoftext|>: rare (tests force a stop with logit_bias or a cap); slightly likelier inside a character
END_AFTER_COMPLETE = 8.0  # below the best single token: greedy decoding must not stop at once
END_INSIDE = 6.5
NOISE_LOGIT = 0.85  # std of the context-dependent part of every logit


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (printable stand-ins for the 256 bytes), inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    order = list(keep)
    for b in range(256):
        if b not in keep:
            order.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(order, chars, strict=True)}


def utf8_state(raw: bytes) -> tuple[int, int]:
    """(continuation bytes the token starts with, continuation bytes still needed at its end)."""
    lead = 0
    while lead < len(raw) and 0x80 <= raw[lead] < 0xC0:
        lead += 1
    i, tail = len(raw) - 1, 0
    while i >= lead and 0x80 <= raw[i] < 0xC0:
        i, tail = i - 1, tail + 1
    need = 0
    if i >= lead:
        b = raw[i]
        size = 2 if 0xC2 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 4 if 0xF0 <= b < 0xF5 else 1
        need = max(0, size - 1 - tail)
    return lead, need


def is_cjk(raw: bytes) -> bool:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(text) and all("\u4e00" <= ch <= "\u9fff" for ch in text)


def build(tokenizer_dir: Path, out_dir: Path) -> None:
    torch.manual_seed(SEED)
    vocab = json.loads((tokenizer_dir / "vocab.json").read_text(encoding="utf-8"))
    merges = [
        tuple(line.split(" "))
        for line in (tokenizer_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#version")
    ]
    tokenizer = Qwen2Tokenizer(
        vocab=dict(vocab),
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    # Qwen2's own ids: <|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645 (the order added)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHAT_TEMPLATE
    size = len(tokenizer)
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIALS}
    if list(ids.values()) != [151643, 151644, 151645]:
        raise SystemExit(f"unexpected special token ids {ids}")

    config = Qwen2Config(
        vocab_size=size,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=HIDDEN // HEAD_DIM,
        num_key_value_heads=HIDDEN // HEAD_DIM,
        head_dim=HEAD_DIM,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config).eval()

    decode = byte_decoder()
    lead = torch.zeros(size, dtype=torch.long)
    need = torch.zeros(size, dtype=torch.long)
    cjk = torch.zeros(size, dtype=torch.bool)
    for token, index in vocab.items():
        raw = bytes(decode[ch] for ch in token)
        lead[index], need[index] = utf8_state(raw)
        cjk[index] = is_cjk(raw)
    need = need.clamp(max=FEATURES - 2)

    with torch.no_grad():
        noise_dims = HIDDEN - FEATURES
        embed = torch.randn(size, HIDDEN)
        embed[:, :FEATURES] = 0.0
        embed[:, CONST] = 4.0
        embed[torch.arange(size), NEED + need] = 4.0
        model.model.embed_tokens.weight.copy_(embed)
        # after the final RMSNorm the feature dims are about 4 / rms(embed) ~= 3.4 and each noise dim ~0.85
        scale = 4.0 / ((32.0 + noise_dims) / HIDDEN) ** 0.5
        head = torch.randn(size, HIDDEN) * (NOISE_LOGIT / (0.85 * noise_dims**0.5))
        head[:, :FEATURES] = 0.0
        starts_cont = lead > 0
        ends_inside = need > 0
        head[ends_inside, NEED + 0] += LEAD_AFTER_COMPLETE / scale
        head[cjk, NEED + 0] += CJK_AFTER_COMPLETE / scale
        head[starts_cont, NEED + 0] += CONT_SUPPRESS / scale
        for k in range(1, FEATURES - 1):
            head[lead == k, NEED + k] += CONT_MATCH / scale
        for name in ("<|im_end|>", "<|endoftext|>"):
            head[ids[name], :] = 0.0
            head[ids[name], CONST] = END_INSIDE / scale
            head[ids[name], NEED + 0] = (END_AFTER_COMPLETE - END_INSIDE) / scale
        head[ids["<|im_start|>"], :] = 0.0
        head[ids["<|im_start|>"], CONST] = -30.0 / scale
        model.lm_head.weight.copy_(head)
        # attention and MLP add context-dependent noise, never to the feature dimensions
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.mul_(4.0)
        layer.self_attn.o_proj.weight[:FEATURES, :] = 0.0
        layer.mlp.down_proj.weight.mul_(4.0)
        layer.mlp.down_proj.weight[:FEATURES, :] = 0.0
        for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm):
            norm.weight.fill_(1.0)

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build(Path(sys.argv[1]), Path(sys.argv[2]))
