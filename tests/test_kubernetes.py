"""deploy/kubernetes/, checked without a Kubernetes cluster.

Every manifest validates strictly against the Kubernetes API schemas (offline,
``kubernetes-validate``). Then the StatefulSet's pods are run as real processes, one per
pod, each in a mount namespace of its own whose ``/etc/hosts`` resolves the headless
Service's pod names (``sr3-peer-N.sr3-peers.<namespace>.svc.cluster.local``) as cluster
DNS would, with the container's exact command and environment (the manifest's paths
and port mapped into the test's folder, as a volume mount would): they form a ring over
TLS with client certificates required, the readiness probe's own command passes for
every pod, and the smoke-test Job's command (``sr3 status``) and a put and get through
the client Service's name succeed from a namespace that resolves the same names.
Needs root for the mount namespaces: skips without it, fails under
``SR3_REQUIRE_NETLAB=1`` (CI).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import yaml
from support import in_own_hosts, next_base_port, require_names_apart, stop_processes

from sr3.certs import init_ca, issue
from sr3.cli.peer import peer as peer_command

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.37.0"
NAMESPACE = "sr3test"
WAIT_S = 60.0


def _documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((FOLDER / name).read_text()) if doc]


def _kind(name: str, kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in _documents(name) if doc["kind"] == kind]
    return found


def test_every_manifest_validates_strictly_against_the_kubernetes_schemas() -> None:
    manifests = sorted(FOLDER.glob("*.yaml"))
    assert {path.name for path in manifests} >= {"sr3-peers.yaml", "spark-example.yaml"}
    for path in manifests:
        for document in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_statefulset_keeps_a_quorum_and_sets_only_flags_sr3_peer_reads() -> None:
    stateful = _kind("sr3-peers.yaml", "StatefulSet")
    spec = stateful["spec"]
    container = spec["template"]["spec"]["containers"][0]
    known = {str(param.envvar) for param in peer_command.params if isinstance(param, click.Option)}
    names = {item["name"] for item in container["env"]}
    assert {name for name in names if name.startswith("SR3_")} - known - {"SR3_SECRET"} == set()
    assert {"SR3_TLS_CERT", "SR3_TLS_KEY", "SR3_TLS_CA", "SR3_TLS_CLIENT_CERTS"} <= names
    assert spec["serviceName"] == "sr3-peers" and spec["replicas"] >= 5
    assert container["readinessProbe"] and container["livenessProbe"]
    assert spec["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    budget = _kind("sr3-peers.yaml", "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    headless = [d for d in _documents("sr3-peers.yaml") if d["metadata"]["name"] == "sr3-peers"]
    assert headless[0]["spec"]["clusterIP"] == "None"
    assert headless[0]["spec"]["publishNotReadyAddresses"] is True


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(NAME)`` references to earlier variables."""
    for name, known in env.items():
        value = value.replace(f"$({name})", known)
    return value


def _container_env(container: dict[str, Any], pod: str, secret: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = _expand(str(item["value"]), env)
        elif item["name"] == "POD_NAME":
            env["POD_NAME"] = pod
        elif item["name"] == "POD_NAMESPACE":
            env["POD_NAMESPACE"] = NAMESPACE
        elif item["valueFrom"].get("secretKeyRef", {}).get("name") == "sr3":
            env[item["name"]] = secret
    return env


@dataclass(frozen=True)
class Pods:
    """The StatefulSet's pods as processes, and how to run commands beside them."""

    hosts_file: Path
    tls: Path
    port: int
    ips: dict[str, str]
    secret: str
    bin_dir: str

    def mapped(self, text: str, pod_ip: str) -> str:
        """A manifest's path or address as the test lays them out (volumes mounted at
        the test's TLS folder, every pod on its own loopback address and one port)."""
        text = text.replace("/etc/sr3-tls/", f"{self.tls}/").replace(
            "/etc/sr3-client/", f"{self.tls}/"
        )
        text = text.replace("0.0.0.0:7401", f"{pod_ip}:{self.port}")
        if pod_ip:
            text = text.replace("127.0.0.1:7401", f"{pod_ip}:{self.port}")
        return text.replace(":7401", f":{self.port}")

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.bin_dir}:{os.environ['PATH']}", **extra}

    def sr3(self, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        """``sr3 ARGS`` where cluster DNS names resolve (a pod of the Job)."""
        command = in_own_hosts(self.hosts_file, [sys.executable, "-m", "sr3", *args])
        return subprocess.run(
            command, env=self.env(env), capture_output=True, text=True, timeout=120, check=False
        )


def _lay_out(tmp_path: Path, replicas: int) -> Pods:
    domain = f"sr3-peers.{NAMESPACE}.svc.cluster.local"
    ips = {f"sr3-peer-{index}": f"127.0.0.{index + 1}" for index in range(replicas)}
    names = {f"{pod}.{domain}": ip for pod, ip in ips.items()}
    names[f"sr3.{NAMESPACE}.svc.cluster.local"] = "127.0.0.1"  # the client Service
    hosts_file = tmp_path / "hosts"
    lines = [f"{ip} {name}" for name, ip in names.items()]
    hosts_file.write_text(Path("/etc/hosts").read_text() + "\n".join(lines) + "\n")
    # The Secrets, as README.md makes them: one certificate for every pod (a wildcard
    # over the headless Service) and the Service, and a client certificate.
    tls = tmp_path / "tls"
    init_ca(tls)
    issue(tls, tls, "peers", [f"*.{domain}", f"sr3.{NAMESPACE}.svc.cluster.local", "127.0.0.1"])
    issue(tls, tls, "client", ["sr3-client"])
    secret = "kubernetes-test-secret-0123456789"
    return Pods(hosts_file, tls, next_base_port(), ips, secret, str(Path(sys.executable).parent))


def _start(pods: Pods, container: dict[str, Any], tmp_path: Path) -> list[subprocess.Popen[bytes]]:
    processes = []
    for pod, ip in pods.ips.items():
        env = {
            k: pods.mapped(v, ip) for k, v in _container_env(container, pod, pods.secret).items()
        }
        env["SR3_DATA"] = str(tmp_path / pod)
        command = [pods.mapped(part, ip) for part in container["command"]]
        with open(tmp_path / f"{pod}.log", "wb") as log:
            processes.append(
                subprocess.Popen(
                    in_own_hosts(pods.hosts_file, command),
                    env=pods.env(env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return processes


def _wait_ready(pods: Pods, container: dict[str, Any], tmp_path: Path) -> None:
    """Run the readiness probe's own command for every pod until it passes."""
    for pod, ip in pods.ips.items():
        check = [pods.mapped(part, ip) for part in container["readinessProbe"]["exec"]["command"]]
        check[0] = sys.executable
        deadline = time.monotonic() + WAIT_S
        while subprocess.run(check, capture_output=True, timeout=30, check=False).returncode:
            logs = (tmp_path / f"{pod}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{pod} never ready:\n{logs}"
            time.sleep(0.5)


def test_the_statefulset_runs_a_tls_ring_that_the_job_and_clients_reach_by_dns(
    tmp_path: Path,
) -> None:
    require_names_apart()
    stateful = _kind("sr3-peers.yaml", "StatefulSet")
    container = stateful["spec"]["template"]["spec"]["containers"][0]
    # Three of the StatefulSet's pods (R = 3): what each runs is the same, and the suite
    # has a time budget.
    replicas = min(3, int(stateful["spec"]["replicas"]))
    pods = _lay_out(tmp_path, replicas)
    processes = _start(pods, container, tmp_path)
    try:
        _wait_ready(pods, container, tmp_path)
        job = _kind("spark-example.yaml", "Job")["spec"]["template"]["spec"]["containers"][0]
        job_env = {
            k: pods.mapped(v, "") for k, v in _container_env(job, "sr3-status", pods.secret).items()
        }
        assert job["command"] == ["sr3", "status"]
        deadline = time.monotonic() + WAIT_S
        while (status := pods.sr3(job_env, "status")).returncode != 0 or "healthy" not in (
            status.stdout
        ):
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(1.0)
        data = tmp_path / "payload.bin"
        data.write_bytes(os.urandom(3 * 1024 * 1024))
        put = pods.sr3(job_env, "put", str(data), "--key", "k8s/payload")
        assert put.returncode == 0, put.stdout + put.stderr
        back = tmp_path / "back.bin"
        get = pods.sr3(job_env, "get", "k8s/payload", "-o", str(back))
        assert get.returncode == 0, get.stdout + get.stderr
        assert back.read_bytes() == data.read_bytes()
    finally:
        stop_processes(processes, wait_s=20.0)
