"""`serve` hands freed heap back to the OS when idle again (glibc), and the environment can turn it off.

Nothing here measures memory (bench/RESULTS.md does): the tests pin when a trim happens, that the
setting reaches the running server, that it is skipped where there is no glibc, and that the work left
for after an answer holds none of the request's translator.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import sys
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway import cli, memory

ENV = memory.IDLE_TRIM_ENV


def _glibc() -> bool:
    return memory.glibc() is not None


# ----------------------------------------------------------------------------- the setting


@pytest.mark.parametrize(("value", "seconds"), [(None, 1.0), ("", 1.0), (" 2.5 ", 2.5), ("0", 0.0), ("0.25", 0.25)])
def test_idle_trim_seconds_defaults_to_one_and_zero_turns_it_off(value, seconds):
    environ = {} if value is None else {ENV: value}
    assert memory.idle_trim_seconds(environ) == seconds


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_idle_trim_seconds_refuses_what_is_not_a_duration(value):
    with pytest.raises(ValueError, match=ENV):
        memory.idle_trim_seconds({ENV: value})


@pytest.mark.parametrize(("value", "size"), [(None, 65536), ("", 65536), ("8192", 8192), (" 16384 ", 16384)])
def test_upstream_read_bufsize_defaults_to_aiohttps(value, size):
    environ = {} if value is None else {memory.READ_BUFSIZE_ENV: value}
    assert memory.upstream_read_bufsize(environ) == size


@pytest.mark.parametrize("value", ["8k", "0", "-8192", "1023", "16777217", "8192.0"])
def test_upstream_read_bufsize_refuses_what_is_not_a_sane_size(value):
    with pytest.raises(ValueError, match=memory.READ_BUFSIZE_ENV):
        memory.upstream_read_bufsize({memory.READ_BUFSIZE_ENV: value})


@pytest.mark.parametrize(("value", "size"), [(None, 32768), ("", 32768), ("0", 0), (" 4096 ", 4096),
                                             ("1048576", 1048576)])
def test_a_long_streams_receive_buffer_defaults_to_32_kb(value, size):
    environ = {} if value is None else {memory.RECEIVE_BUFFER_ENV: value}
    assert memory.long_stream_receive_buffer(environ) == size


@pytest.mark.parametrize("value", ["32k", "-1", "4095", "16777217", "1.5"])
def test_a_long_streams_receive_buffer_refuses_what_is_not_a_sane_size(value):
    with pytest.raises(ValueError, match=memory.RECEIVE_BUFFER_ENV):
        memory.long_stream_receive_buffer({memory.RECEIVE_BUFFER_ENV: value})


@pytest.mark.parametrize(("value", "limits"), [(None, (65536, 131072)), ("8192", (8192, 16384))])
async def test_upstream_responses_are_read_with_the_configured_buffer(monkeypatch, aiohttp_server, tmp_path,
                                                                      value, limits):
    from gateway.app import STATE, create_app
    from gateway.config import load_config

    if value is None:
        monkeypatch.delenv(memory.READ_BUFSIZE_ENV, raising=False)
    else:
        monkeypatch.setenv(memory.READ_BUFSIZE_ENV, value)
    gateway = await aiohttp_server(create_app(load_config(_config(tmp_path))))
    session = gateway.app[STATE].session
    async with session.get(gateway.make_url("/healthz")) as reply:  # any answer: the reader is the session's
        assert reply.content.get_read_buffer_limits() == limits


# ----------------------------------------------------------------------------- when it trims


class _Heap:
    """A fake RSS that grows with requests and shrinks when trimmed."""

    def __init__(self) -> None:
        self.rss = 100 << 20
        self.trims = 0

    def trim(self) -> None:
        self.trims += 1
        self.rss -= 20 << 20


def test_trims_only_when_idle_and_grown_by_the_slack():
    heap = _Heap()
    busy = [False]
    trimmer = memory.IdleTrimmer(lambda: busy[0], heap.trim, lambda: heap.rss, slack=8 << 20)
    assert not trimmer.tick()  # nothing grew since start

    heap.rss += 7 << 20
    assert not trimmer.tick()  # grew, but less than the slack

    heap.rss += 40 << 20
    busy[0] = True
    assert not trimmer.tick()  # a request is in flight: never under load
    busy[0] = False
    assert trimmer.tick() and heap.trims == 1
    assert trimmer.floor == heap.rss  # measured after the trim
    assert not trimmer.tick()  # idle and trimmed: no trim in a loop
    assert heap.trims == trimmer.trims == 1


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")
async def test_the_running_app_trims_when_idle_and_stops_with_it(aiohttp_server):
    app = web.Application()
    busy = [True]
    trimmer = memory.install_idle_trim(app, lambda: busy[0], 0.01)
    assert trimmer is not None
    heap = _Heap()
    trimmer.trim, trimmer.rss = heap.trim, lambda: heap.rss
    server = await aiohttp_server(app)
    heap.rss += 50 << 20
    await asyncio.sleep(0.1)
    assert heap.trims == 0  # busy all along
    busy[0] = False
    for _ in range(100):
        if heap.trims:
            break
        await asyncio.sleep(0.01)
    assert heap.trims == 1
    await server.close()
    heap.rss += 50 << 20
    await asyncio.sleep(0.05)
    assert heap.trims == 1  # the task ended with the app


def test_nothing_is_installed_when_turned_off_or_without_glibc(monkeypatch):
    app = web.Application()
    assert memory.install_idle_trim(app, lambda: False, 0) is None
    monkeypatch.setattr(sys, "platform", "darwin")
    assert memory.install_idle_trim(app, lambda: False, 1.0) is None
    assert memory.release_free_memory() is False
    assert len(app.cleanup_ctx) == 0


# ----------------------------------------------------------------------------- serve wires it


def _config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({  # JSON is YAML
        "upstreams": {"sim": {"urls": ["http://127.0.0.1:9"], "health_interval": 0}},
        "models": {"demo-model": {"upstream": "sim", "tokenizer": {"builtin": "demo"}}},
        "store": {"backend": "memory"},
    }))
    return path


@pytest.mark.parametrize(("value", "interval"), [(None, 1.0), ("0", 0.0), ("3", 3.0)])
def test_serve_installs_the_idle_trim_the_environment_asks_for(monkeypatch, tmp_path, value, interval):
    import gc

    import gateway.server
    from gateway.app import STATE

    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    seen = {}

    def fake_install(app, busy, seconds):
        state = app[STATE]
        seen["interval"] = seconds
        seen["busy"] = [busy()]
        state.in_flight += 1
        seen["busy"].append(busy())
        state.in_flight -= 1

    async def fake_serve(app, host, port, grace):
        seen["served"] = True

    monkeypatch.setattr(cli, "install_idle_trim", fake_install)
    monkeypatch.setattr(gateway.server, "serve", fake_serve)
    monkeypatch.setattr(gateway.server, "configure_logging", lambda level: None)
    try:
        assert cli.main(["serve", "--config", str(_config(tmp_path))]) == 0
    finally:
        gc.unfreeze()
    assert seen == {"interval": interval, "busy": [False, True], "served": True}


@pytest.mark.parametrize(("name", "value"), [(ENV, "often"), (memory.READ_BUFSIZE_ENV, "big"),
                                             (memory.RECEIVE_BUFFER_ENV, "small")])
def test_serve_refuses_a_bad_setting_before_loading_anything(monkeypatch, tmp_path, capsys, name, value):
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "load_config", lambda path: pytest.fail("loaded the config"))
    assert cli.main(["serve", "--config", str(_config(tmp_path))]) == 2
    assert name in capsys.readouterr().err


@pytest.mark.parametrize(("name", "value"), [(memory.READ_BUFSIZE_ENV, "big"), (memory.RECEIVE_BUFFER_ENV, "small")])
def test_demo_refuses_a_bad_buffer_size_as_serve_does(monkeypatch, capsys, name, value):
    monkeypatch.setenv(name, value)
    assert cli.main(["demo"]) == 2
    assert name in capsys.readouterr().err


# ----------------------------------------------------------------------------- long streams read less ahead


@pytest.mark.parametrize(("max_tokens", "configured", "long"), [
    (None, None, True), (257, None, True), (256, None, False), (16, None, False), (None, 8192, False),
    (4096, 65536, False)])
def test_a_stream_that_may_run_long_is_a_long_stream_unless_one_read_size_is_configured(max_tokens, configured, long):
    assert memory.is_long_stream(max_tokens, configured) is long


def _tcp_rmem_default() -> int:
    with open("/proc/sys/net/ipv4/tcp_rmem") as rmem:
        return int(rmem.read().split()[1])


_DEFAULT_WINDOW = memory.LONG_STREAM_RECEIVE_BUFFER


@pytest.mark.parametrize(("stream", "max_tokens", "configured", "receive", "limits", "window"), [
    (True, None, None, None, (16384, 32768), _DEFAULT_WINDOW),
    (True, 1000, None, None, (16384, 32768), _DEFAULT_WINDOW),
    (True, 8, None, None, (65536, 131072), None), (False, 1000, None, None, (65536, 131072), None),
    (True, 1000, "8192", None, (8192, 16384), None),
    (True, 1000, None, "24576", (16384, 32768), 24576), (True, 1000, None, "0", (16384, 32768), None)])
async def test_the_upstream_response_of_a_long_stream_is_read_16_kb_at_a_time_through_a_small_window(
        monkeypatch, aiohttp_server, demo_vocab, stream, max_tokens, configured, receive, limits, window):
    """What the gateway's upstream responses really buffer, per request: aiohttp's reader limits, and
    the kernel receive buffer of the socket the response came on (`window`: what it asked for, which
    Linux reports doubled; None: the kernel's own)."""
    from gateway.app import STATE
    from tests.e2e import start_stack

    for name, value in ((memory.READ_BUFSIZE_ENV, configured), (memory.RECEIVE_BUFFER_ENV, receive)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    # No health checks: the request opens the only upstream connection, through the pool it was given.
    stack = await start_stack(aiohttp_server, demo_vocab, upstream_options={"health_interval": 0})
    state = stack.gateway.app[STATE]
    read_limits_seen: list[tuple[int, int]] = []
    sockets_opened: list[socket.socket] = []

    def recording(session: aiohttp.ClientSession) -> None:
        post = session.post
        connector = session.connector
        make_socket = connector._socket_factory  # None: aiohappyeyeballs makes a plain socket

        async def recording_post(*args, **kwargs):
            response = await post(*args, **kwargs)
            read_limits_seen.append(response.content.get_read_buffer_limits())
            return response

        def recording_socket_factory(addr_info):
            family, type_, proto, _, _ = addr_info
            sock = make_socket(addr_info) if make_socket else socket.socket(family, type_, proto)
            sockets_opened.append(sock)
            return sock

        monkeypatch.setattr(session, "post", recording_post)
        monkeypatch.setattr(connector, "_socket_factory", recording_socket_factory)

    recording(state.session)
    recording(state.long_stream_session)
    request = {"model": stack.model, "input": "hi", "stream": stream, "max_output_tokens": max_tokens}
    async with aiohttp.ClientSession() as client, client.post(stack.url("/v1/responses"), json=request,
                                                          headers={"Authorization": "Bearer test-key"}) as reply:
        assert reply.status == 200, await reply.text()
        await reply.read()
    [read_limits] = read_limits_seen
    [sock] = sockets_opened
    assert read_limits == limits
    receive_buffer = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    if not sys.platform.startswith("linux"):
        return
    if window is not None:
        assert receive_buffer == 2 * window
    else:  # the kernel's own, autotuned upward from tcp_rmem's default
        assert receive_buffer >= _tcp_rmem_default() > 2 * memory.LONG_STREAM_RECEIVE_BUFFER


# ----------------------------------------------------------------------------- what a finished request holds


def _live_translators() -> int:
    from gateway.translate.stream import ResponsesStream

    gc.collect()
    return sum(isinstance(thing, ResponsesStream) for thing in gc.get_objects())


@pytest.mark.parametrize("stream", [True, False])
async def test_nothing_after_the_answer_keeps_the_translator(aiohttp_server, demo_vocab, caplog, stream):
    """The access line and the metrics run after the answer is written (middleware.after_answer), from
    callbacks of the request's task. Under load that can be a second later (256 long streams ending
    together keep the loop busy), so what they hold must not include the translator (its tokens, its final
    logprob lists): when they held the request's bookkeeping, bench.memory peaked 60 MB higher. Checked
    from an outermost middleware: the handler has returned, the callbacks have not run."""
    from tests.e2e import start_stack

    caplog.set_level(logging.INFO, logger="responses_gateway.access")
    seen: list[tuple[int, int]] = []  # (translators alive, access lines written) as the handler returns

    @web.middleware
    async def outermost(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        seen.append((_live_translators(), len(_access_lines(caplog))))
        return response

    stack = await start_stack(aiohttp_server, demo_vocab, outermost=outermost)
    request = {"model": stack.model, "input": "hi", "stream": stream, "max_output_tokens": 40, "top_logprobs": 5,
               "include": ["message.output_text.logprobs"]}
    async with aiohttp.ClientSession() as client, client.post(stack.url("/v1/responses"), json=request) as reply:
        assert reply.status == 200
        body = await reply.read()
    await asyncio.sleep(0)  # the request's task has ended: its callbacks ran
    assert b"top_logprobs" in body  # a translator with logprobs was at work
    assert seen == [(0, 0)]  # nothing holds it, and the access line waits for the answer
    [line] = _access_lines(caplog)
    assert line["status"] == 200 and line["output_tokens"] > 0


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(record.getMessage()) for record in caplog.records if record.name == "responses_gateway.access"]
