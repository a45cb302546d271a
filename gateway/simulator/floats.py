"""How each server's numbers look on the wire: logprobs computed in float32, printed by different writers.

Real servers compute logprobs in float32 (or lower) and print them in their own way; a client that compares
values exactly, or looks for sentinels, sees the difference:

- Python servers (vLLM, SGLang) call `.tolist()` on a float32 tensor: the exact double of the float32,
  printed in full (`-1.7822265625`);
- TGI (serde) prints the shortest decimal that reads back as the same float32 (`-1.7822266`);
- llama.cpp (nlohmann::json) stores the float32 as a double and prints it in full, like Python.

float32's lowest value, `-3.4028234663852886e+38` as a double, is what SGLang and llama.cpp show where the
probability is zero.
"""

from __future__ import annotations

import math
import struct

FLOAT32_LOWEST = -3.4028234663852886e38  # numpy.finfo(float32).min / std::numeric_limits<float>::lowest()
_F32 = struct.Struct("<f")


def f32(value: float) -> float:
    """The double that a float32 tensor element converts to (what `.tolist()` and nlohmann print)."""
    if not math.isfinite(value):
        return value
    return _F32.unpack(_F32.pack(value))[0]


def f32_shortest(value: float) -> float:
    """The shortest decimal that rounds to the same float32, as serde/ryu print an `f32` (TGI)."""
    if not math.isfinite(value):
        return value
    exact = f32(value)
    for digits in range(1, 10):
        candidate = float(f"{exact:.{digits}g}")
        if f32(candidate) == exact:
            return candidate
    return exact
