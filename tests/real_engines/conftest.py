"""Session fixtures for the real servers: `real_vllm` and `real_llama_server`.

Each server starts once per session on a free loopback port and stops at the session's end (also on
Ctrl-C: pytest tears the session down; a killed pytest takes them along through PR_SET_PDEATHSIG).
The real-engine tests run last and each server starts when a test first needs it (vLLM, on one CPU
thread, takes about 2 minutes; starting it in the background beside the rest of the suite was tried
and made timing-sensitive tests flaky on a 2-core machine). The terminal summary prints each server's
start-up time and the real-engine tests' wall time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.real_engines import engines
from tests.real_engines.truth import TokenTable

HERE = Path(__file__).resolve().parent
VLLM_START_TIMEOUT = 900.0  # seconds; ~3 min on an idle 2-core machine, more when it is busy
LLAMA_START_TIMEOUT = 120.0


@dataclass(frozen=True)
class RealEngine:
    """A running real server, what a test needs to put the gateway in front of it."""

    name: str
    base_url: str  # without /v1, as the gateway's `upstreams.*.urls` take it
    model: str  # the served model name
    dialect: str  # the gateway's dialect for it
    tokenizer: dict[str, str]  # the gateway's `models.*.tokenizer` for the served model ({} if none)
    model_dir: Path | None  # vLLM: the model folder (its tokenizer files); llama-server: None
    max_logprobs: int | None  # the server's cap on k (None: no cap)
    startup_seconds: float


class _State:
    log_dir: Path | None = None
    processes: dict[str, engines.EngineProcess] = {}  # noqa: RUF012  (one per session)
    first_start: float | None = None
    last_end: float | None = None
    waited = 0.0  # seconds the real-engine tests spent waiting for a server to come up
    tests = 0


def _log_dir() -> Path:
    if _State.log_dir is None:
        _State.log_dir = Path(tempfile.mkdtemp(prefix="real-engines-"))
    return _State.log_dir


# While developing: a server already running (started by hand as tests/real_engines/engines.py does)
# is used instead of starting one, e.g. RESPONSES_GATEWAY_VLLM_URL=http://127.0.0.1:18000.
URL_ENV = {"vllm": "RESPONSES_GATEWAY_VLLM_URL", "llama": "RESPONSES_GATEWAY_LLAMA_SERVER_URL"}


def _process(name: str) -> engines.EngineProcess | None:
    """The session's process for `name` (started), or None when its parts are not installed."""
    if os.environ.get(URL_ENV[name]):
        return None
    if name in _State.processes:
        return _State.processes[name]
    found = engines.parts()
    if (found.missing_vllm() if name == "vllm" else found.missing_llama_server()) is not None:
        return None
    make = engines.vllm_process if name == "vllm" else engines.llama_server_process
    process = make(found, _log_dir())
    process.start()
    _State.processes[name] = process
    return process


def _is_real_engine_test(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    real = [item for item in items if _is_real_engine_test(item)]
    if not real or config.option.collectonly:
        return
    # Last, so that a server's start never runs beside the rest of the suite: started in the background
    # at collection, vLLM's ~2 minutes of start-up on a 2-core machine made timing-sensitive tests fail
    # (tests/test_cli.py's 10 s wait for a gateway subprocess to listen). It starts when first needed.
    items[:] = [item for item in items if not _is_real_engine_test(item)] + real


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if nodeid.startswith("tests/real_engines/") and _State.first_start is None:
        _State.first_start = time.monotonic()


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    if nodeid.startswith("tests/real_engines/"):
        _State.last_end = time.monotonic()
        _State.tests += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = []
    for process in _State.processes.values():
        if process.startup_seconds is not None:
            lines.append(f"{process.name}: healthy {process.startup_seconds:.1f} s after its start")
        else:
            lines.append(f"{process.name}: never became healthy: see {process.log_path}")
    if _State.first_start is not None and _State.last_end is not None:
        wall = _State.last_end - _State.first_start
        lines.append(f"real-engine tests: {_State.tests} in {wall - _State.waited:.1f} s wall "
                     f"(+ {_State.waited:.1f} s waiting for the servers to come up)")
    if lines:
        terminalreporter.write_sep("-", "real engines")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _stop_all()


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_all()  # (again: a crash between collection and the session's end)


def _stop_all() -> None:
    failed = False
    for process in _State.processes.values():
        failed |= process.startup_seconds is None
        process.stop()
    if _State.log_dir is not None and not failed:
        shutil.rmtree(_State.log_dir, ignore_errors=True)


def _ready(name: str, timeout: float) -> engines.EngineProcess | str:
    """The session's healthy server for `name`, or the URL of one given in the environment."""
    if url := os.environ.get(URL_ENV[name]):
        return url.rstrip("/")
    found = engines.parts()
    missing = found.missing_vllm() if name == "vllm" else found.missing_llama_server()
    if missing:
        engines.skip_or_fail(missing)
    process = _process(name)
    assert process is not None
    started = time.monotonic()
    try:
        process.wait_ready(timeout)
    except RuntimeError as failure:
        pytest.fail(str(failure), pytrace=False)
    finally:
        _State.waited += time.monotonic() - started
    return process


def _url(process: engines.EngineProcess | str) -> str:
    return process if isinstance(process, str) else process.base_url


def _startup(process: engines.EngineProcess | str) -> float:
    return 0.0 if isinstance(process, str) else process.startup_seconds or 0.0


@pytest.fixture(scope="session")
def real_vllm() -> Iterator[RealEngine]:
    """Real vLLM 0.32.0 (CPU) serving the tiny Qwen2 model as `qwen2-tiny`, `--max-logprobs 20`."""
    process = _ready("vllm", VLLM_START_TIMEOUT)
    model_dir = engines.parts().qwen2_dir.resolve()
    yield RealEngine("vLLM", _url(process), engines.VLLM_MODEL, "vllm", {"directory": str(model_dir)},
                     model_dir, engines.VLLM_MAX_LOGPROBS, _startup(process))


@pytest.fixture(scope="session")
def vllm_tokens(real_vllm: RealEngine) -> TokenTable:
    """The served model's token id -> bytes (tokenizers' reading of its tokenizer.json)."""
    assert real_vllm.model_dir is not None
    return TokenTable(real_vllm.model_dir / "tokenizer.json")


@pytest.fixture(scope="session")
def real_llama_server() -> Iterator[RealEngine]:
    """Real llama-server serving SmolLM2-135M-Instruct Q4_1 as `smollm2` (2 slots, 1 thread)."""
    process = _ready("llama", LLAMA_START_TIMEOUT)
    yield RealEngine("llama-server", _url(process), engines.LLAMA_MODEL, "llamacpp", {}, None, None,
                     _startup(process))
