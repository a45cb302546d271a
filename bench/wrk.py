"""Driving a target with wrk (Debian's `wrk` package) instead of the aiohttp load generator.

On a two-core machine the load generator shares the cores with what it measures: bench/loadgen.py
(Python) took most of a core in the 2-worker rows of bench.workers. wrk is C and costs a fraction of
that. It measures throughput only, and checks each answer as far as a Lua callback cheaply can: the
status is 200 and the body holds the stream's end (the `response.completed` or `response.incomplete`
event of the gateway's Responses stream, `data: [DONE]` of the chat stream that the relay and the
upstream send). Anything else is counted as an error.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.canned import Case
from bench.run import TARGETS, Stack

_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = {body}
local endings = {{{endings}}}
-- Each wrk thread runs its own Lua state: `bad` is a global there, which `done` reads from each.
local threads = {{}}
setup = function(thread) table.insert(threads, thread) end
bad = 0
response = function(status, headers, body)
  local ended = false
  for _, ending in ipairs(endings) do
    if string.find(body, ending, 1, true) then ended = true end
  end
  if status ~= 200 or not ended then bad = bad + 1 end
end
done = function(summary, latency, requests)
  local total = 0
  for _, thread in ipairs(threads) do total = total + thread:get("bad") end
  io.write(string.format("\\nbad answers %d\\n", total))
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None


def drive(url: str, body: str, endings: list[str], connections: int, seconds: float, out: Path) -> dict[str, Any]:
    """`connections` clients posting `body` to `url` for `seconds` (whole seconds, at least 1): {"rps",
    "errors"} (errors: answers that were not a 200 ending in one of `endings`, plus wrk's own socket errors
    and timeouts)."""
    script = out / "wrk.lua"
    script.write_text(_SCRIPT.format(body=json.dumps(body), endings=", ".join(json.dumps(e) for e in endings)))
    # wrk takes whole seconds
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "30s", "-s", str(script),
            url]
    done = subprocess.run(argv, capture_output=True, text=True)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    bad = re.search(r"bad answers (\d+)", done.stdout)
    if done.returncode != 0 or rps is None or bad is None:
        raise RuntimeError(f"wrk printed no figures: {done.stdout}\n{done.stderr}")
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", done.stdout)
    return {"rps": float(rps.group(1)), "errors": int(bad.group(1)) + (sum(map(int, socket.groups())) if socket else 0)}


def wrk_cell(stack: Stack, canned: dict[str, Any], case: Case, connections: int, seconds: float,
             out: Path) -> dict[str, Any]:
    """The cell bench.run.run_cell measures, driven by wrk: each target in turn (a second's warm-up first)."""
    recorded = canned["cases"][case.key]
    cell: dict[str, Any] = {}
    for target in TARGETS:
        if target == "gateway":
            url, body = stack.url(target) + "/v1/responses", recorded["responses_request"]
            endings = ["event: response.completed", "event: response.incomplete"]
        else:
            url, body, endings = stack.url(target) + recorded["path"], recorded["upstream_request"], ["data: [DONE]"]
        drive(url, body, endings, connections, 1.0, out)
        cell[target] = drive(url, body, endings, connections, seconds, out)
    return cell
