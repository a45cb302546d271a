"""The real npm clients (Codex CLI, the OpenAI Node SDK, the Vercel AI SDK), run in subprocesses.

`.ci/install-clients` installs the versions pinned in `.ci/clients/package.json` under the shared
cache root, in a folder named by a hash of that file; this finds the same folder the same way
(`RESPONSES_GATEWAY_CLIENTS_DIR` overrides it). Tests skip, naming the installer, when it is absent;
under `.ci/run`, which installs them, they fail instead (`RESPONSES_GATEWAY_REQUIRE_CLIENTS`).

The clients run with `asyncio` subprocesses, so the test's loop keeps serving the gateway and the
simulator (aiohttp test servers on loopback) while a client talks to them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / ".ci" / "clients" / "package.json"
INSTALLER = ".ci/install-clients"


def cache_root() -> Path:
    root = os.environ.get("RESPONSES_GATEWAY_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "responses-gateway"


def clients_dir() -> Path:
    """The installed clients' folder (it holds `node_modules`); skips the test when not installed."""
    override = os.environ.get("RESPONSES_GATEWAY_CLIENTS_DIR")
    folder = Path(override) if override else cache_root() / "clients" / hashlib.sha256(
        MANIFEST.read_bytes()).hexdigest()[:16]
    missing = None
    if not (folder / "node_modules").is_dir():
        missing = f"the npm clients are not installed at {folder}: run `bash {INSTALLER}`"
    elif shutil.which("node") is None:
        missing = f"node is not on PATH (needed by the clients {INSTALLER} installs)"
    if missing and os.environ.get("RESPONSES_GATEWAY_REQUIRE_CLIENTS"):
        pytest.fail(f"{missing} (.ci/run installed them; RESPONSES_GATEWAY_REQUIRE_CLIENTS is set)")
    if missing:
        pytest.skip(missing)
    return folder


def codex_bin() -> Path:
    return clients_dir() / "node_modules" / ".bin" / "codex"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> Ran:
        assert self.returncode == 0, f"exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return self


async def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120,
              stdin: bytes | None = None) -> Ran:
    """Run a client to its end (killed after `timeout` seconds: a hung client fails, never hangs the run)."""
    process = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, env={**os.environ, **(env or {})}, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin), timeout)
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
        return Ran(-9, out.decode(errors="replace"), err.decode(errors="replace") + f"\n[killed after {timeout}s]")
    return Ran(process.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


async def run_node(script: str, *, env: dict[str, str] | None = None, timeout: float = 120) -> Ran:
    """An ES module script, with `openai`, `ai` and `@ai-sdk/openai` importable (cwd: the clients' folder)."""
    return await run(["node", "--input-type=module", "-e", script], cwd=clients_dir(), env=env, timeout=timeout)
