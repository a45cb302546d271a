"""The command line as users run it: serve (with graceful SIGTERM), check-config, demo."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator.vllm import create_app as create_simulator

EXE = str(Path(sys.executable).parent / "responses-gateway")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(tmp_path: Path, upstream: str, **extra) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({  # JSON is YAML
        "upstreams": {"sim": {"urls": [upstream], "health_interval": 0}},
        "models": {"demo-model": {"upstream": "sim", "tokenizer": {"builtin": "demo"}}}, **extra}))
    return path


async def _wait_listening(port: int, process: asyncio.subprocess.Process) -> None:
    for _ in range(200):
        if process.returncode is not None:
            raise AssertionError(f"gateway exited with {process.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise AssertionError("gateway did not start")


async def test_sigterm_lets_the_stream_finish_refuses_new_work_and_exits_0(aiohttp_server, tmp_path):
    sim = await aiohttp_server(create_simulator(build_demo_vocab(), "demo-model", step_delay_ms=40))
    port = _free_port()
    config = _config(tmp_path, str(sim.make_url("")).rstrip("/"), shutdown={"grace_seconds": 20})
    process = await asyncio.create_subprocess_exec(EXE, "serve", "--config", str(config), "--port", str(port),
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        await _wait_listening(port, process)
        base = f"http://127.0.0.1:{port}"
        body = {"model": "demo-model", "input": "hi", "stream": True, "max_output_tokens": 30, "ignore_eos": True}
        async with aiohttp.ClientSession() as session, session.post(f"{base}/v1/responses", json=body) as stream:
            await stream.content.readline()  # streaming has begun
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            async with aiohttp.ClientSession() as other:
                async with other.post(f"{base}/v1/responses", json={**body, "stream": False}) as refused:
                    assert refused.status == 503
                async with other.get(f"{base}/readyz") as ready:
                    assert ready.status == 503
            rest = await stream.text()
        assert '"type":"response.incomplete"' in rest  # the in-flight stream ran to its end
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_bad_config_fails_at_start_naming_the_key(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("upstreams: {u: {urls: [http://x:1], api: nope}}\nmodels: {}\n")
    result = await asyncio.to_thread(subprocess.run, [EXE, "serve", "--config", str(path)], capture_output=True,
                                     text=True, timeout=60)
    assert result.returncode == 2 and "upstreams.u.api" in result.stderr


async def test_check_config_prints_what_works_and_fails_when_an_upstream_is_down(aiohttp_server, tmp_path):
    sim = await aiohttp_server(create_simulator(build_demo_vocab(), "demo-model"))
    good = _config(tmp_path, str(sim.make_url("")).rstrip("/"))
    result = await asyncio.to_thread(subprocess.run, [EXE, "check-config", str(good)], capture_output=True,
                                     text=True, timeout=60)
    assert result.returncode == 0, result.stdout
    assert "tokenizer" in result.stdout and "HTTP 200" in result.stdout
    down = tmp_path / "down"
    down.mkdir()
    bad = _config(down, f"http://127.0.0.1:{_free_port()}")
    result = await asyncio.to_thread(subprocess.run, [EXE, "check-config", str(bad), "--timeout", "2"],
                                     capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "FAIL" in result.stdout


@pytest.mark.skipif(os.environ.get("RG_SKIP_DEMO") == "1", reason="RG_SKIP_DEMO=1")
async def test_the_readme_demo_runs_offline_and_shows_exact_bytes():
    result = await asyncio.to_thread(subprocess.run, [EXE, "demo"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "bytes of the tokens == UTF-8 of the text: True" in result.stdout


@pytest.mark.skipif(os.environ.get("RG_SKIP_DEMO") == "1", reason="RG_SKIP_DEMO=1")
async def test_the_demo_needs_nothing_but_the_plain_install():
    """`pip install -e .` has no OpenAI SDK (a test extra): the demo must not need it. .ci/run runs the
    README's command in a fresh venv; this holds the same here, with `openai` made unimportable."""
    code = "import sys; sys.modules['openai'] = None; from gateway.cli import main; sys.exit(main(['demo']))"
    result = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True,
                                     timeout=120)
    assert result.returncode == 0, result.stderr
    assert "bytes of the tokens == UTF-8 of the text: True" in result.stdout


def _soft_open_files(limit: int):
    def set_limit() -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return set_limit


async def test_serve_lifts_a_low_open_file_limit_to_the_hard_one(aiohttp_server, tmp_path):
    # Two descriptors per request in flight (client and upstream, no pool cap): a shell's soft limit of
    # 1,024 would refuse connections past ~500 requests at once.
    resource = pytest.importorskip("resource")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard open-file limit here is {hard}: nothing to raise to")
    sim = await aiohttp_server(create_simulator(build_demo_vocab(), "demo-model"))
    port = _free_port()
    config = _config(tmp_path, str(sim.make_url("")).rstrip("/"))
    process = await asyncio.create_subprocess_exec(EXE, "serve", "--config", str(config), "--port", str(port),
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                   preexec_fn=_soft_open_files(256))
    try:
        await _wait_listening(port, process)
        limits = Path(f"/proc/{process.pid}/limits").read_text() if Path("/proc").is_dir() else None
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
        [event] = [json.loads(line) for line in stderr.decode().splitlines() if "open_file_limit_raised" in line]
        assert event["from"] == 256 and event["to"] > 256
        if limits is not None:
            [row] = [line for line in limits.splitlines() if line.startswith("Max open files")]
            assert int(row.split()[3]) == event["to"]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
