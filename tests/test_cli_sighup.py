"""SIGHUP on `responses-gateway serve`: the config is read again; new requests take the new routes while a
stream already running finishes on its old one; a bad new config is refused and the old one kept."""

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.simulator.vllm import create_app as create_simulator

EXE = str(Path(sys.executable).parent / "responses-gateway")


def _write(path: Path, models: dict, upstreams: dict, **extra) -> None:
    path.write_text(json.dumps({"upstreams": upstreams, "models": models, "store": {"backend": "memory"}, **extra}))


async def _line_with(stream: asyncio.StreamReader, needle: str, seen: list[str]) -> str:
    while True:
        line = (await asyncio.wait_for(stream.readline(), 60)).decode()
        if not line:
            raise AssertionError(f"{needle!r} never printed; got {seen}")
        seen.append(line)
        if needle in line:
            return line


async def test_sighup_reloads_routes_for_new_requests_while_in_flight_ones_finish(aiohttp_server, tmp_path):
    vocab = build_demo_vocab()
    old = await aiohttp_server(create_simulator(vocab, "demo-model", step_delay_ms=40, default_reply="old upstream"))
    new = await aiohttp_server(create_simulator(vocab, "demo-model", default_reply="new upstream"))

    def upstream(server) -> dict:
        return {"urls": [str(server.make_url("")).rstrip("/")], "health_interval": 0}

    config = tmp_path / "config.yaml"
    _write(config, {"demo-model": {"upstream": "old", "tokenizer": {"builtin": "demo"}}}, {"old": upstream(old)})
    process = await asyncio.create_subprocess_exec(EXE, "serve", "--config", str(config), "--port", "0",
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: list[str] = []
    err: list[str] = []
    try:
        listening = await _line_with(process.stdout, "responses-gateway on http://", out)
        base = listening.split()[2]
        body = {"model": "demo-model", "input": "hi", "max_output_tokens": 100, "ignore_eos": True}
        short = {**body, "max_output_tokens": 8}
        short_added = {**short, "model": "added-model"}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/v1/responses", json={**body, "stream": True}) as stream:
                await stream.content.readline()  # the stream has begun, on the old upstream
                _write(config, {"demo-model": {"upstream": "new", "tokenizer": {"builtin": "demo"}},
                                "added-model": {"upstream": "new", "upstream_model": "demo-model"}},
                       {"new": upstream(new)}, auth={"api_keys_env": "SOME_KEYS"})
                process.send_signal(signal.SIGHUP)
                reloaded = json.loads(await _line_with(process.stderr, '"event": "reloaded"', err))
                assert reloaded["models"] == 2 and reloaded["kept_until_restart"] == ["auth"]
                assert reloaded["in_flight_on_the_old"] == 1  # the stream was still running at the swap
                await _line_with(process.stdout, "tokenizer of demo-model: demo", out)  # loaded again
                async with session.post(f"{base}/v1/responses", json=short) as fresh:
                    assert fresh.status == 200  # auth is kept as it was (off) until a restart
                    assert (await fresh.json())["output"][0]["content"][0]["text"].startswith("new upstr")
                async with session.post(f"{base}/v1/responses", json=short_added) as added:
                    assert added.status == 200
                rest = await stream.text()
            assert '"type":"response.completed"' in rest or '"type":"response.incomplete"' in rest
            assert "old upstream" in rest and "new upstream" not in rest  # it finished where it began

            # A config that does not load is refused; the running one keeps serving.
            config.write_text("upstreams: {new: {urls: [http://127.0.0.1:9], colour: red}}\nmodels: {}\n")
            process.send_signal(signal.SIGHUP)
            failed = json.loads(await _line_with(process.stderr, '"event": "reload_failed"', err))
            assert "upstreams.new.colour: unknown key" in failed["error"]
            async with session.post(f"{base}/v1/responses", json=short_added) as still:
                assert still.status == 200
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
