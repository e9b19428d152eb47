"""The files of deploy/ are valid for the tools that read them and agree with the worker.

Each file is parsed (PyYAML for compose, Kubernetes and Prometheus files) and checked
against what the worker really does: the stop timeouts exceed the worker's ``--grace``,
the scrape settings name its ``--metrics-port``, every alert names metrics
:class:`~distsched.metrics.PrometheusMetrics` exports. Where a tool is on this machine
it validates the file too: ``systemd-analyze verify``, ``promtool check``, ``kubectl
kustomize``. A missing tool skips its test with the reason; under ``CI=true`` that is a
failure for the tools .ci/run installs (systemd-analyze, promtool), not for kubectl,
which Debian does not package in a usable version. No container engine runs here, so
compose files and manifests are checked for structure only (``kubectl apply
--dry-run=client`` needs an API server to map kinds, so it is not run).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from distsched import Scheduler, State, TaskSpec
from distsched.exporter import serve_depth
from distsched.text import parse_duration
from tests.cluster_fixtures import require_redis_cli, wait_until
from tests.conftest import (
    IN_CI,
    REPO_ROOT,
    RedisServer,
    require_extra,
    require_redis_server,
    subprocess_env,
)

yaml = require_extra("yaml")

DEPLOY = REPO_ROOT / "deploy"
COMPOSE_FILES = [DEPLOY / "compose" / "compose.yaml", DEPLOY / "compose" / "compose.cluster.yaml"]
K8S_BASE = DEPLOY / "k8s" / "base"
UNIT = DEPLOY / "systemd" / "distsched-worker@.service"
ALERTS = DEPLOY / "prometheus" / "distsched-alerts.yml"
# Seconds a stop timeout must exceed --grace by: reporting, closing connections.
MARGIN_S = 10.0


def require_tool(name: str, ci_installs: bool) -> str:
    path = shutil.which(name)
    if path is None:
        if IN_CI and ci_installs:
            pytest.fail(f"{name} is not on PATH, and CI=true requires it (.ci/run installs it)")
        pytest.skip(f"{name} is not on PATH")
    return path


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name=value`` or ``--name value`` in a command line."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def seconds(text: str) -> float:
    return parse_duration(text, "duration")


def grace_of(args: list[str]) -> float:
    grace = option(args, "--grace")
    assert grace is not None, f"no --grace in {args}"
    return seconds(grace)


def env_file(path: Path) -> dict[str, str]:
    """The ``NAME=value`` lines of an environment file (compose ``env_file``, systemd
    ``EnvironmentFile``, kustomize ``envs``)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines())
    return {p[0].strip(): p[1].strip() for p in pairs if len(p) == 2 and not p[0].startswith("#")}


def compose_env(path: Path, service: dict[str, Any]) -> dict[str, str]:
    """A compose service's environment: its ``env_file``, then ``environment`` over it."""
    files = service.get("env_file", [])
    env: dict[str, str] = {}
    for name in [files] if isinstance(files, str) else files:
        env.update(env_file(path.parent / name))
    env.update(service.get("environment") or {})
    return env


# A Redis URL that carries a secret: a password in its user information or its query.
CREDENTIALED_URL = re.compile(r"rediss?(\+cluster)?://[^\s/@]*:[^\s/@]*@|[?&]password=", re.I)


def exported_metric_names() -> set[str]:
    """Every sample name a worker's registry exposes (``_total``, ``_bucket``, ...)."""
    prometheus_client = require_extra("prometheus_client")
    from distsched.metrics import PrometheusMetrics

    registry = prometheus_client.CollectorRegistry()
    PrometheusMetrics(registry)
    return {s.name for family in registry.collect() for s in family.samples}


# ------------------------------------------------------------------------ compose


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_a_compose_file_gives_workers_longer_to_stop_than_their_grace(path: Path) -> None:
    compose = load(path)
    services = compose["services"]
    worker = services["worker"]
    command = worker["command"]
    assert command[:2] == ["worker", "example_app:FUNCTIONS"]
    assert worker["stop_signal"] == "SIGTERM"
    assert seconds(worker["stop_grace_period"]) >= grace_of(command) + MARGIN_S
    # The metrics endpoint listens beyond the container, on a fixed port.
    assert option(command, "--metrics-addr") == "0.0.0.0"
    assert option(command, "--metrics-port") is not None
    for name in ("worker", "dashboard"):
        env = compose_env(path, services[name])
        assert env["DISTSCHED_REDIS_URL"] and env["DISTSCHED_NAMESPACE"]
        # The image is built from this repository with deploy/Dockerfile.
        build = services[name]["build"]
        assert (path.parent / build["context"] / build["dockerfile"]).resolve().is_file()
    # Read-only unless an operator adds --allow-actions and a token.
    assert "--allow-actions" not in services["dashboard"]["command"]
    for service in services.values():
        for needed in service.get("depends_on", {}):
            assert needed in services
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (path.parent / source).resolve().exists(), volume


def test_the_cluster_compose_file_joins_three_masters_that_workers_reach_by_address() -> None:
    services = load(COMPOSE_FILES[1])["services"]
    nodes = {name: s for name, s in services.items() if name.startswith("redis-")}
    assert len(nodes) == 3
    addresses = set()
    for node in nodes.values():
        assert option(node["command"], "--cluster-enabled") == "yes"
        addresses.add(node["networks"]["distsched"]["ipv4_address"])
    create = services["cluster-init"]["command"][0]
    assert all(f"{address}:6379" in create for address in addresses)
    url = compose_env(COMPOSE_FILES[1], services["worker"])["DISTSCHED_REDIS_URL"]
    assert url.startswith("redis+cluster://") and url.split("//")[1].split(":")[0] in addresses


def test_the_example_app_maps_names_to_the_functions_workers_run() -> None:
    spec = importlib.util.spec_from_file_location("example_app", DEPLOY / "example_app.py")
    assert spec is not None and spec.loader is not None
    example_app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example_app)
    assert example_app.FUNCTIONS["add"](2, 3) == 5
    assert set(example_app.FUNCTIONS) == {"add", "sleep"}


# --------------------------------------------------------------------- kubernetes


def k8s_objects(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    docs = [doc for file in sorted(path.glob("*.yaml")) for doc in load_all(file)]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs if "metadata" in d}


def test_kubernetes_workers_get_longer_to_terminate_than_their_grace_and_are_scraped() -> None:
    objects = k8s_objects(K8S_BASE)
    worker = objects[("Deployment", "distsched-worker")]["spec"]["template"]
    (container,) = worker["spec"]["containers"]
    args = container["args"]
    assert worker["spec"]["terminationGracePeriodSeconds"] >= grace_of(args) + MARGIN_S
    port = option(args, "--metrics-port")
    annotations = worker["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == port
    assert annotations["prometheus.io/path"] == "/metrics"
    assert [p["containerPort"] for p in container["ports"]] == [int(str(port))]
    assert option(args, "--metrics-addr") == "0.0.0.0"
    assert container["envFrom"] == [{"configMapRef": {"name": "distsched"}}]
    assert "DISTSCHED_NAMESPACE" in env_file(K8S_BASE / "config.env")


def test_every_kubernetes_container_requests_resources_and_runs_without_privileges() -> None:
    objects = k8s_objects(K8S_BASE)
    deployments = [o for (kind, _), o in objects.items() if kind == "Deployment"]
    assert len(deployments) == 2
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            assert container["resources"]["requests"]["cpu"]
            assert container["resources"]["requests"]["memory"]
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_kubernetes_dashboard_is_read_only_and_probed_behind_its_service() -> None:
    objects = k8s_objects(K8S_BASE)
    pod = objects[("Deployment", "distsched-dashboard")]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert "--allow-actions" not in container["args"]
    # No token in the base: the Redis URL is its only variable besides the ConfigMap.
    assert [e["name"] for e in container["env"]] == ["DISTSCHED_REDIS_URL"]
    port_names = {p["name"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["port"] in port_names
    assert container["livenessProbe"]["tcpSocket"]["port"] in port_names
    service = objects[("Service", "distsched-dashboard")]["spec"]
    assert service["selector"] == pod["metadata"]["labels"]
    assert {p["targetPort"] for p in service["ports"]} <= port_names


def rendered(kustomization: Path) -> list[dict[str, Any]]:
    kubectl = require_tool("kubectl", ci_installs=False)
    done = subprocess.run(
        [kubectl, "kustomize", str(kustomization)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def dashboard_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [
        d for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "distsched-dashboard"
    ]  # fmt: skip
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_kubectl_kustomize_builds_the_base_with_its_config_map_and_labels() -> None:
    docs = rendered(K8S_BASE)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Service"]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert "DISTSCHED_REDIS_URL" not in config["data"]
    assert not re.search(r"rediss?(\+cluster)?://", str(config["data"]))
    # The generated name (with its hash) is what the Deployments refer to.
    for d in docs:
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "distsched"
        if d["kind"] == "Deployment":
            (container,) = d["spec"]["template"]["spec"]["containers"]
            assert container["envFrom"][0]["configMapRef"]["name"] == config["metadata"]["name"]
            assert container["image"] == "distsched:0.1.0"
    assert "--allow-actions" not in dashboard_container(docs)["args"]


def test_the_dashboard_actions_overlay_takes_its_token_from_a_secret() -> None:
    container = dashboard_container(rendered(DEPLOY / "k8s" / "dashboard-actions"))
    assert "--allow-actions" in container["args"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    # The token comes on top of the Redis URL, which stays.
    assert env == {
        "DISTSCHED_REDIS_URL": {"name": "distsched-redis", "key": "url"},
        "DISTSCHED_DASHBOARD_TOKEN": {"name": "distsched-dashboard", "key": "token"},
    }


K8S_AUTOSCALE = DEPLOY / "k8s" / "autoscale"


def scaled_object_trigger() -> dict[str, Any]:
    (trigger,) = k8s_objects(K8S_AUTOSCALE)[("ScaledObject", "distsched-worker")]["spec"][
        "triggers"
    ]
    metadata: dict[str, Any] = trigger["metadata"]
    return metadata


def test_keda_scales_the_workers_from_zero_on_what_the_exporter_serves() -> None:
    objects = {**k8s_objects(K8S_BASE), **k8s_objects(K8S_AUTOSCALE)}
    scaled = objects[("ScaledObject", "distsched-worker")]["spec"]
    worker = objects[("Deployment", scaled["scaleTargetRef"]["name"])]
    assert scaled["minReplicaCount"] == 0
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "metrics-api"
    # The URL reaches the exporter's Service, whose port leads to the exporter's port.
    url = urllib.parse.urlsplit(trigger["metadata"]["url"])
    service = objects[("Service", url.hostname)]["spec"]
    (port,) = service["ports"]
    assert url.port == port["port"] and url.path == "/depth"
    exporter = objects[("Deployment", "distsched-exporter")]["spec"]["template"]
    assert service["selector"] == exporter["metadata"]["labels"]
    (container,) = exporter["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert int(str(option(container["args"], "--port"))) == ports[port["targetPort"]]
    assert container["args"][0] == "exporter" and option(container["args"], "--bind") == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"]["path"] == "/depth"
    # The namespace the workers serve, the busy count, one worker per --concurrency tasks.
    namespace = env_file(K8S_BASE / "config.env")["DISTSCHED_NAMESPACE"]
    assert trigger["metadata"]["valueLocation"] == f"namespaces.{namespace}.busy"
    (worker_container,) = worker["spec"]["template"]["spec"]["containers"]
    concurrency = option(worker_container["args"], "--concurrency")
    assert trigger["metadata"]["targetValue"] == concurrency
    # The exporter is held to what every container of the base is.
    assert exporter["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["resources"]["requests"]["cpu"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    url_env = {e["name"]: e for e in container["env"]}["DISTSCHED_REDIS_URL"]
    assert url_env["valueFrom"]["secretKeyRef"] == {"name": "distsched-redis", "key": "url"}


def test_the_value_keda_reads_is_a_number_the_exporter_serves(own_redis: RedisServer) -> None:
    """valueLocation, read as KEDA reads it (a dotted path into the JSON), on a real
    exporter of the namespace the workers serve."""
    namespace = env_file(K8S_BASE / "config.env")["DISTSCHED_NAMESPACE"]
    with Scheduler.from_url(own_redis.url, namespace=namespace) as s:
        s.schedule_many([TaskSpec(f"t{i}", "f") for i in range(3)])
        server = serve_depth([s], 0)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/depth") as response:
                value: Any = json.load(response)
        finally:
            server.close()
    for part in scaled_object_trigger()["valueLocation"].split("."):
        value = value[part]
    assert value == 3


def test_kubectl_kustomize_builds_the_autoscale_overlay_on_the_base() -> None:
    docs = rendered(K8S_AUTOSCALE)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ConfigMap", "Deployment", "Deployment", "Deployment", "ScaledObject", "Service",
        "Service",
    ]  # fmt: skip
    for d in docs:
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "distsched"


# ------------------------------------------------------------------------ secrets


def test_every_kubernetes_container_reads_the_redis_url_from_a_secret_not_a_config_map() -> None:
    objects = k8s_objects(K8S_BASE)
    config = env_file(K8S_BASE / "config.env")
    assert "DISTSCHED_REDIS_URL" not in config
    assert not any(re.search(r"rediss?(\+cluster)?://", v) for v in config.values())
    assert not [o for (kind, _), o in objects.items() if kind == "ConfigMap"]
    for name in ("distsched-worker", "distsched-dashboard"):
        pod = objects[("Deployment", name)]["spec"]["template"]["spec"]
        for container in pod["containers"]:
            env = {e["name"]: e for e in container["env"]}
            url = env["DISTSCHED_REDIS_URL"]
            assert "value" not in url
            assert url["valueFrom"]["secretKeyRef"] == {"name": "distsched-redis", "key": "url"}
            assert container["envFrom"] == [{"configMapRef": {"name": "distsched"}}]
    assert (
        "kubectl create secret generic distsched-redis"
        in (K8S_BASE / "kustomization.yaml").read_text()
    )


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_services_read_the_redis_url_from_an_env_file(path: Path) -> None:
    services = load(path)["services"]
    for name in ("worker", "dashboard"):
        service = services[name]
        assert "DISTSCHED_REDIS_URL" not in (service.get("environment") or {})
        (file,) = (
            [service["env_file"]] if isinstance(service["env_file"], str) else service["env_file"]
        )
        assert env_file(path.parent / file)["DISTSCHED_REDIS_URL"]
        assert "chmod 600" in (path.parent / file).read_text()


def test_the_systemd_environment_file_is_installed_readable_by_root_alone() -> None:
    assert "install -m 0600 -o root -g root distsched.env" in UNIT.read_text()
    assert "mode 0600" in (DEPLOY / "systemd" / "distsched.env").read_text()
    assert "0640" not in (DEPLOY / "README.md").read_text()


def test_no_file_of_deploy_holds_a_redis_url_with_credentials() -> None:
    for path in DEPLOY.rglob("*"):
        if not path.is_file() or path.suffix in (".md",) or "__pycache__" in path.parts:
            continue
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue  # a comment shows the form with placeholders
            assert not CREDENTIALED_URL.search(line), (path, line)


# ------------------------------------------------------------------------ systemd


def unit_entries(text: str) -> dict[str, list[str]]:
    """Key -> values of a unit file, continuation lines joined."""
    entries: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            entries.setdefault(key.strip(), []).append(value.strip())
    return entries


def test_the_systemd_unit_stops_with_sigterm_after_the_grace_and_restarts() -> None:
    entries = unit_entries(UNIT.read_text())
    (exec_start,) = entries["ExecStart"]
    args = exec_start.split()
    assert args[1:3] == ["worker", "${DISTSCHED_APP}"]
    assert entries["KillSignal"] == ["SIGTERM"]
    (timeout,) = entries["TimeoutStopSec"]
    assert seconds(timeout) >= grace_of(args) + MARGIN_S
    assert entries["Restart"] == ["always"]
    # Each instance serves metrics on the port it is named after.
    assert option(args, "--metrics-port") == "%i"
    for hardening in ("NoNewPrivileges", "ProtectSystem", "PrivateTmp", "CapabilityBoundingSet"):
        assert hardening in entries
    # The environment file defines every variable the command line uses.
    env = unit_entries((DEPLOY / "systemd" / "distsched.env").read_text())
    used = set(re.findall(r"\$\{(\w+)\}", exec_start))
    assert used <= set(env), used - set(env)
    assert {"DISTSCHED_REDIS_URL", "DISTSCHED_NAMESPACE"} <= set(env)


def test_systemd_analyze_verifies_the_unit_without_a_warning(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze", ci_installs=True)
    # An instance of the template, its program this checkout's distsched (verify checks
    # that the program exists).
    program = shutil.which("distsched", path=str(Path(sys.executable).parent))
    assert program is not None
    text = UNIT.read_text().replace("/opt/distsched/venv/bin/distsched", program)
    instance = tmp_path / "distsched-worker@9101.service"
    instance.write_text(text)
    done = subprocess.run(
        [tool, "verify", str(instance)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    )


# --------------------------------------------------------------------- prometheus


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load(ALERTS)["groups"] for rule in group["rules"]]


def test_every_alert_names_only_metrics_the_worker_exports() -> None:
    exported = exported_metric_names()
    named = set()
    for rule in alert_rules():
        metrics = set(re.findall(r"\bdistsched_\w+", rule["expr"]))
        assert metrics, rule["alert"]
        assert metrics <= exported, (rule["alert"], metrics - exported)
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        named |= metrics
    # The waits, lease expiries, failure rate and unserved functions are all watched.
    assert {
        "distsched_oldest_due_wait_seconds",
        "distsched_leases_expired_total",
        "distsched_tasks_failed_total",
        "distsched_tasks_unserved_total",
    } <= named


def test_the_kubernetes_scrape_job_reads_the_annotations_the_workers_carry() -> None:
    (job,) = load(DEPLOY / "prometheus" / "scrape-kubernetes.yml")["scrape_configs"]
    sources = {s for r in job["relabel_configs"] for s in r["source_labels"]}
    for annotation in ("scrape", "port", "path"):
        assert f"__meta_kubernetes_pod_annotation_prometheus_io_{annotation}" in sources


def promtool(*args: str) -> str:
    tool = require_tool("promtool", ci_installs=True)
    done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_checks_the_alert_rules_and_the_scrape_configuration() -> None:
    assert f"SUCCESS: {len(alert_rules())} rules found" in promtool("check", "rules", str(ALERTS))
    promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))


def test_promtool_fires_each_alert_on_the_series_that_should_raise_it() -> None:
    tests = DEPLOY / "prometheus" / "distsched-alerts.test.yml"
    spec = load(tests)
    tested = {a["alertname"] for t in spec["tests"] for a in t["alert_rule_test"]}
    assert tested == {rule["alert"] for rule in alert_rules()}
    promtool("test", "rules", str(tests))


# ------------------------------------------------------------------------ README


def test_the_deploy_readme_names_every_file_of_deploy() -> None:
    readme = (DEPLOY / "README.md").read_text()
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    missing = [str(p.relative_to(DEPLOY)) for p in files if p.name != "README.md"]
    missing = [name for name in missing if name not in readme]
    assert not missing


# ---------------------------------------------------------------------- the fleet


@pytest.fixture
def fleet() -> Iterator[Any]:
    from distsched.tools.fleet import FleetConfig, LocalFleet

    server = require_redis_server()
    cli = require_redis_cli()
    env = subprocess_env()
    env["PYTHONPATH"] = f"{DEPLOY}:{env['PYTHONPATH']}"
    config = FleetConfig(
        app="example_app:FUNCTIONS", masters=3, workers=2, namespace="fleet", grace_s=5.0,
        worker_args=["--concurrency", "2"], env=env, redis_server=server, redis_cli=cli,
    )  # fmt: skip
    with LocalFleet(config) as running:
        yield running


@pytest.mark.slow
def test_a_local_fleet_runs_submitted_tasks_on_a_cluster_and_stops_cleanly(fleet: Any) -> None:
    with Scheduler.from_url(fleet.url, namespace="fleet") as s:
        # Both workers register once started (a Python start takes a while on a busy host).
        wait_until(
            lambda: sorted(w.worker_id for w in s.workers() if w.alive) == ["fleet-0", "fleet-1"],
            60, "both workers to register",
        )  # fmt: skip
        for i in range(20):
            s.schedule(f"add-{i}", fn="add", args=[i, 1])
        for i in range(20):
            info = s.wait(f"add-{i}", timeout=60)
            assert info.state is State.SUCCEEDED
            assert s.result(f"add-{i}") == i + 1
        workers = s.workers()
        assert sorted(w.worker_id for w in workers) == ["fleet-0", "fleet-1"]
    directory = fleet.directory
    fleet.stop()
    # SIGTERM is a clean shutdown: every worker exits 0, and the nodes are gone too.
    assert fleet.worker_exit_codes() == [0, 0]
    assert all(node.poll() is not None for node in fleet.nodes)
    assert not directory.exists()
