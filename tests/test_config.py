"""config.yaml: what loads, and that a bad config names the key that is wrong."""

import pytest

from gateway.config import ConfigError, load_config, parse_config
from gateway.logprobs.parse import _ID_TABLES
from gateway.routing import build_routes

GOOD = """
listen: {host: 0.0.0.0, port: 9000}
upstreams:
  qwen-vllm:
    urls: ["http://127.0.0.1:8000/"]
    dialect: vllm
    api: completions
models:
  Qwen/Qwen2-0.5B:
    upstream: qwen-vllm
    tokenizer: {builtin: demo}
    chat_template: template.jinja
"""


def test_good_config_loads_and_resolves_relative_paths(tmp_path):
    (tmp_path / "config.yaml").write_text(GOOD)
    (tmp_path / "template.jinja").write_text("{{ messages[0].content }}")
    config = load_config(tmp_path / "config.yaml")
    assert config.listen.port == 9000
    assert config.upstreams["qwen-vllm"].urls == ["http://127.0.0.1:8000"]
    route = build_routes(config)["Qwen/Qwen2-0.5B"]
    assert route.upstream_model == "Qwen/Qwen2-0.5B" and route.vocab is not None
    # Its id table is built at start (before workers fork), not on the first request.
    assert route.vocab in _ID_TABLES
    assert route.chat_template.render([{"role": "user", "content": "hi"}]) == "hi"


@pytest.mark.parametrize(
    ("mutation", "key"),
    [
        (("qwen-vllm:", "qwen-vllm:\n    colour: blue"), "upstreams.qwen-vllm.colour"),
        (("api: completions", "api: generate"), "upstreams.qwen-vllm.api"),
        (('urls: ["http://127.0.0.1:8000/"]', "urls: [ftp://x]"), "upstreams.qwen-vllm.urls"),
        (("upstream: qwen-vllm", "upstream: nowhere"), "models.Qwen/Qwen2-0.5B.upstream"),
        (("port: 9000", "port: 99999"), "listen.port"),
    ],
)
def test_bad_config_names_the_key(tmp_path, mutation, key):
    (tmp_path / "config.yaml").write_text(GOOD.replace(*mutation))
    with pytest.raises(ConfigError, match=key.replace("/", "/").replace(".", r"\.")):
        load_config(tmp_path / "config.yaml")


def test_bad_tokenizer_and_template_fail_at_start_naming_the_model(tmp_path):
    config = parse_config({"upstreams": {"u": {"urls": ["http://127.0.0.1:1"]}},
                           "models": {"m": {"upstream": "u", "tokenizer": {"file": "missing.json"}}}}, tmp_path)
    with pytest.raises(ConfigError, match=r"models\.m\.tokenizer"):
        build_routes(config)
    config = parse_config({"upstreams": {"u": {"urls": ["http://127.0.0.1:1"]}},
                           "models": {"m": {"upstream": "u", "chat_template": "missing.jinja"}}}, tmp_path)
    with pytest.raises(ConfigError, match=r"models\.m\.chat_template"):
        build_routes(config)


def test_invalid_yaml_and_missing_file_are_config_errors(tmp_path):
    (tmp_path / "config.yaml").write_text("upstreams: [")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(tmp_path / "config.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_the_example_config_is_valid():
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parents[1] / "config.example.yaml")
    assert "Qwen/Qwen2-0.5B" in config.models


@pytest.mark.parametrize(
    ("dialect", "api", "message"),
    [("tgi", "completions", "never returns logprobs"), ("vllm", "generate", "native API"),
     ("llamacpp", "generate", "native API")],
)
def test_routes_that_cannot_give_logprobs_are_refused_at_load(dialect, api, message):
    with pytest.raises(ConfigError, match=rf"upstreams\.u\.api: .*{message}"):
        parse_config({"upstreams": {"u": {"urls": ["http://127.0.0.1:1"], "dialect": dialect, "api": api}},
                      "models": {}}, base_dir=__import__("pathlib").Path("."))


def test_each_dialect_has_its_servers_default_cap():
    config = parse_config({"upstreams": {"t": {"urls": ["http://x:1"], "dialect": "tgi"},
                                         "v": {"urls": ["http://x:1"]},
                                         "o": {"urls": ["http://x:1"], "dialect": "tgi", "max_top_logprobs": 10}},
                           "models": {}}, base_dir=__import__("pathlib").Path("."))
    assert [config.upstreams[n].top_logprobs_cap for n in "tvo"] == [5, 20, 10]
