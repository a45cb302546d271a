"""The command line as a new user meets it: help, version, and one-line errors that say what to do.

Every test runs the installed `responses-gateway` command in a subprocess, as a user would."""

import base64
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import gateway

EXE = str(Path(sys.executable).parent / "responses-gateway")


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error a failed command printed: one line on stderr, no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def write_config(tmp_path: Path, models: dict, **extra) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({  # JSON is YAML
        "upstreams": {"u": {"urls": ["http://127.0.0.1:9"], "health_interval": 0}}, "models": models, **extra}))
    return path


def test_version_is_the_installed_one():
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"responses-gateway {gateway.__version__}"


def test_every_subcommand_and_option_has_help_text():
    top = run("--help")
    assert top.returncode == 0
    assert "Responses API" in top.stdout  # a description, not just usage
    from gateway.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert set(subparsers.choices) == {"serve", "demo", "check-config", "inspect"}
    for name, sub in subparsers.choices.items():
        assert name in top.stdout
        assert sub.description, f"{name} has no description"
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help text"
        shown = run(name, "--help")
        assert shown.returncode == 0 and sub.description.split()[0] in shown.stdout
        for action in sub._actions:
            if action.help != "show this help message and exit":
                assert action.help.split()[0].rstrip(",:") in shown.stdout, (name, action.dest)


def test_demo_port_puts_the_gateway_on_that_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run("demo", "--port", str(port), timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"gateway on http://127.0.0.1:{port}/v1/responses" in result.stdout
    assert "bytes of the tokens == UTF-8 of the text: True" in result.stdout


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_busy_port_is_one_line_naming_it(tmp_path, busy_port):
    # With a tokenizer, so that start-up has nothing to warn about (a route without one logs that its
    # bytes are per character) and stderr holds only the error.
    config = write_config(tmp_path, {"m": {"upstream": "u", "tokenizer": {"builtin": "demo"}}})
    line = one_line_error(run("serve", "--config", str(config), "--port", str(busy_port)))
    assert f"127.0.0.1:{busy_port}" in line and "in use" in line and "--port" in line
    line = one_line_error(run("demo", "--port", str(busy_port), timeout=120))
    assert f"127.0.0.1:{busy_port}" in line and "in use" in line


def test_a_missing_config_file_is_one_line(tmp_path):
    missing = tmp_path / "nope.yaml"
    line = one_line_error(run("serve", "--config", str(missing)))
    assert str(missing) in line and "No such file" in line
    checked = run("check-config", str(missing))  # check-config reports it as its one failed check
    assert checked.returncode == 1 and "Traceback" not in checked.stderr
    assert checked.stdout.startswith("FAIL") and checked.stdout.count("\n") == 1 and "No such file" in checked.stdout


def test_an_unreadable_tokenizer_is_one_line_naming_the_model_and_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("this is not a tokenizer")
    config = write_config(tmp_path, {"m": {"upstream": "u", "tokenizer": {"file": "tokenizer.json"}}})
    line = one_line_error(run("serve", "--config", str(config)))
    assert line.startswith("config error: models.m.tokenizer:") and "tokenizer.json" in line


def test_a_bare_string_tokenizer_gets_the_mapping_forms_as_a_hint(tmp_path):
    config = write_config(tmp_path, {"m": {"upstream": "u", "tokenizer": "Qwen/Qwen2-0.5B"}})
    line = one_line_error(run("serve", "--config", str(config)))
    assert "models.m.tokenizer" in line and "'Qwen/Qwen2-0.5B'" in line
    for form in ("{hf: ", "{directory: ", "{file: "):
        assert form in line


@pytest.mark.parametrize(("section", "typo", "meant"), [
    ({"upstreams": {"u": {"urls": ["http://127.0.0.1:9"], "max_top_logprob": 5}}}, "upstreams.u.max_top_logprob",
     "max_top_logprobs"),
    ({"shutdown": {"grace_second": 5}}, "shutdown.grace_second", "grace_seconds"),
    ({"model": {}}, "model", "models"),
])
def test_an_unknown_config_key_gets_did_you_mean(tmp_path, section, typo, meant):
    data = {"upstreams": {"u": {"urls": ["http://127.0.0.1:9"]}}, "models": {}, **section}
    (tmp_path / "config.yaml").write_text(json.dumps(data))
    line = one_line_error(run("serve", "--config", str(tmp_path / "config.yaml")))
    assert f"{typo}: unknown key; did you mean '{meant}'?" in line


def _tiny_tiktoken(path: Path) -> None:
    """A rank file of the 256 single bytes: enough for tiktoken to build an encoding."""
    path.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))


def test_special_tokens_are_accepted_where_the_error_message_says(tmp_path):
    _tiny_tiktoken(tmp_path / "tiny.tiktoken")
    spec = {"tiktoken": "tiny.tiktoken", "pattern": r"\S+|\s+", "special_tokens": {"<|end|>": 256}}
    config = write_config(tmp_path, {"m": {"upstream": "u", "tokenizer": spec}})
    result = run("check-config", str(config), "--timeout", "1")
    assert "tokenizer" in result.stdout and "257 tokens" in result.stdout, result.stdout + result.stderr
    # A wrong value is refused by the tokenizer loader with what it must be, not by a type check on strings.
    spec["special_tokens"] = ["<|end|>"]
    config = write_config(tmp_path, {"m": {"upstream": "u", "tokenizer": spec}})
    line = one_line_error(run("serve", "--config", str(config)))
    assert "special_tokens" in line and "integer id" in line and "valid string" not in line


def test_serve_prints_a_line_per_tokenizer_with_its_load_time(tmp_path, busy_port):
    _tiny_tiktoken(tmp_path / "tiny.tiktoken")
    models = {"a": {"upstream": "u", "tokenizer": {"builtin": "demo"}},
              "b": {"upstream": "u", "tokenizer": {"tiktoken": "tiny.tiktoken", "pattern": r"\S+|\s+"}},
              "c": {"upstream": "u"}}
    config = write_config(tmp_path, models)
    # The busy port stops it right after loading: the progress lines are out by then.
    result = run("serve", "--config", str(config), "--port", str(busy_port))
    lines = [line for line in result.stdout.splitlines() if line.startswith("tokenizer of ")]
    assert [line.split(":")[0] for line in lines] == ["tokenizer of a", "tokenizer of b"]
    assert "demo (1,233 tokens) loaded in " in lines[0] and "tiny (256 tokens) loaded in " in lines[1]
    assert all(line.endswith(" s") for line in lines)
