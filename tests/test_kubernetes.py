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

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml
from support import (
    in_own_hosts,
    next_base_port,
    require_names_apart,
    require_spark,
    spark_credential,
    stop_processes,
)

from spark_connector.jar import fs_jar
from sr3.certs import init_ca, issue
from sr3.cli.peer import peer as peer_command
from sr3.cluster_app import spark_home

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
FOLDER = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.37.0"
NAMESPACE = "sr3test"
WAIT_S = 60.0
SPARK_RUN_S_MAX = 240.0


def _documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((FOLDER / name).read_text()) if doc]


def _kind(name: str, kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in _documents(name) if doc["kind"] == kind]
    return found


def _manifests() -> list[Path]:
    """Every Kubernetes manifest: each YAML file under deploy/ but the compose file."""
    found = sorted({*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")})
    return [path for path in found if path.name != "docker-compose.yml"]


def test_every_manifest_validates_strictly_against_the_kubernetes_schemas() -> None:
    manifests = _manifests()
    assert {path.name for path in manifests} >= {"sr3-peers.yaml", "spark-example.yaml"}
    for path in manifests:
        documents = [document for document in yaml.safe_load_all(path.read_text()) if document]
        assert documents, f"{path} holds no manifest"
        for document in documents:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def _pod_specs() -> list[tuple[str, dict[str, Any]]]:
    """(where, pod spec) of every pod template in every manifest under deploy/."""
    specs = []
    for path in _manifests():
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            where = f"{path.name}: {document['kind']} {document['metadata']['name']}"
            spec = document.get("spec", {})
            template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get(
                "template"
            )
            if document["kind"] == "Pod":
                specs.append((where, spec))
            elif template:
                specs.append((where, template["spec"]))
    return specs


def _can_read(mode: int, uid: int, groups: set[int], owner_gid: int) -> bool:
    """Whether a process of ``uid`` in ``groups`` reads a file of ``mode`` owned by
    root and group ``owner_gid``."""
    if uid == 0:
        return True
    if owner_gid in groups:
        return bool(mode & 0o040)
    return bool(mode & 0o004)


def test_every_pod_reads_the_secrets_it_mounts() -> None:
    """As the kubelet lays a Secret volume out: files owned by root, group the pod's
    fsGroup when it has one (else root), mode the item's or the volume's defaultMode
    (0644 by default). Every container that mounts a Secret reads it as the user and
    groups it runs as (pod securityContext, then the container's)."""
    for where, spec in _pod_specs():
        pod_security = spec.get("securityContext", {})
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for container in spec.get("initContainers", []) + spec["containers"]:
            security = {**pod_security, **container.get("securityContext", {})}
            uid = int(security.get("runAsUser", 0))
            groups = {int(security.get("runAsGroup", 0)), *security.get("supplementalGroups", [])}
            if "fsGroup" in pod_security:
                groups.add(int(pod_security["fsGroup"]))
            for mount in container.get("volumeMounts", []):
                # (a volume claim template is no Secret)
                secret = volumes.get(mount["name"], {}).get("secret")
                if secret is None:
                    continue
                owner_gid = int(pod_security.get("fsGroup", 0))
                modes = [int(secret.get("defaultMode", 0o644))]
                modes += [int(item["mode"]) for item in secret.get("items", []) if "mode" in item]
                for mode in modes:
                    assert _can_read(mode, uid, groups, owner_gid), (
                        f"{where}: container {container['name']} (uid {uid}, groups "
                        f"{sorted(groups)}) cannot read Secret {secret['secretName']} "
                        f"(mode {mode:o}, group {owner_gid})"
                    )


def test_the_peers_spread_over_nodes_and_zones_and_know_their_zone() -> None:
    """No two peers on one node while another node has none to spare (strictly, or a
    node's loss could take more than R - 1 peers); over zones as far as the scheduler
    can; and each peer's zone is the zone of its node (the pod's topology label, as
    Kubernetes copies it from the node), with zone-aware placement on."""
    stateful = _kind("sr3-peers.yaml", "StatefulSet")
    template = stateful["spec"]["template"]
    selector = stateful["spec"]["selector"]["matchLabels"]
    constraints = {c["topologyKey"]: c for c in template["spec"]["topologySpreadConstraints"]}
    by_node = constraints["kubernetes.io/hostname"]
    assert by_node["maxSkew"] == 1 and by_node["whenUnsatisfiable"] == "DoNotSchedule"
    by_zone = constraints["topology.kubernetes.io/zone"]
    assert by_zone["whenUnsatisfiable"] == "ScheduleAnyway", "zoneless clusters schedule"
    for constraint in constraints.values():
        assert constraint["labelSelector"]["matchLabels"] == selector
        assert selector.items() <= template["metadata"]["labels"].items()
        assert constraint.get("nodeTaintsPolicy") == "Honor", "a drained node is no domain"
    container = template["spec"]["containers"][0]
    (zone,) = [item for item in container["env"] if item["name"] == "SR3_ZONE"]
    path = zone["valueFrom"]["fieldRef"]["fieldPath"]
    assert path == "metadata.labels['topology.kubernetes.io/zone']"
    assert "sr3 peer --zone-aware" in container["command"][-1]


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


def _container_env(
    container: dict[str, Any],
    pod: str,
    secrets: dict[str, str],
    labels: dict[str, str] | None = None,
    pod_ip: str = "127.0.0.1",
) -> dict[str, str]:
    """The container's environment as the kubelet makes it for ``pod`` at ``pod_ip``
    with the pod's ``labels`` (those Kubernetes copies from the node: its zone);
    ``secrets``: the value of each Secret by name (each used here has one key)."""
    fields = {"metadata.name": pod, "metadata.namespace": NAMESPACE, "status.podIP": pod_ip}
    for key, value in (labels or {}).items():
        fields[f"metadata.labels['{key}']"] = value
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = _expand(str(item["value"]), env)
        elif "fieldRef" in item["valueFrom"]:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            # A label the pod does not have reads as empty.
            assert path in fields or path.startswith("metadata.labels["), path
            env[item["name"]] = fields.get(path, "")
        else:
            env[item["name"]] = secrets[item["valueFrom"]["secretKeyRef"]["name"]]
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
    port = _port_free_on(list(ips.values()))
    return Pods(hosts_file, tls, port, ips, secret, str(Path(sys.executable).parent))


PORT_TRIES_MAX = 200


def _port_free_on(addresses: list[str]) -> int:
    """A port free on every pod's address for TCP (the API) and UDP (the overlay), from
    this run's own stretch of ports (other suites may run peers on this machine)."""
    base = next_base_port()
    for port in range(base, base + PORT_TRIES_MAX):
        try:
            for address in addresses:
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    with socket.socket(socket.AF_INET, kind) as probe:
                        probe.bind((address, port))
        except OSError:
            continue
        return port
    raise AssertionError(f"no port free on {addresses} in {base}..{base + PORT_TRIES_MAX}")


def _zone(pod: str) -> str:
    """The zone of the node a pod lands on, in the test: two zones, alternating."""
    return f"zone-{'ab'[int(pod.rsplit('-', 1)[1]) % 2]}"


def _pod_env(pods: Pods, container: dict[str, Any], pod: str, ip: str) -> dict[str, str]:
    """The StatefulSet container's environment for ``pod``, mapped to the test's layout,
    on a node of zone ``_zone(pod)``."""
    labels = {"topology.kubernetes.io/zone": _zone(pod)}
    env = _container_env(container, pod, {"sr3": pods.secret}, labels, ip)
    return {key: pods.mapped(value, ip) for key, value in env.items()}


def _start(pods: Pods, container: dict[str, Any], tmp_path: Path) -> list[subprocess.Popen[bytes]]:
    processes = []
    for pod, ip in pods.ips.items():
        env = _pod_env(pods, container, pod, ip)
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
    """Run the readiness probe's own command for every pod, in the container's
    environment (as the kubelet runs an exec probe), until it passes. The image's
    /opt/sr3/healthcheck.py is deploy/healthcheck.py."""
    script = str(DEPLOY / "healthcheck.py")
    for pod, ip in pods.ips.items():
        check = [
            pods.mapped(part, ip).replace("/opt/sr3/healthcheck.py", script)
            for part in container["readinessProbe"]["exec"]["command"]
        ]
        assert check[0] == "python", check
        check[0] = sys.executable
        env = pods.env(_pod_env(pods, container, pod, ip))
        deadline = time.monotonic() + WAIT_S
        while subprocess.run(
            check, env=env, capture_output=True, timeout=30, check=False
        ).returncode:
            logs = (tmp_path / f"{pod}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{pod} never ready:\n{logs}"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def statefulset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pods]:
    """Three of the StatefulSet's pods (R = 3: what each runs is the same, and the suite
    has a time budget) as processes, each ready by its readiness probe."""
    require_names_apart()
    stateful = _kind("sr3-peers.yaml", "StatefulSet")
    container = stateful["spec"]["template"]["spec"]["containers"][0]
    replicas = min(3, int(stateful["spec"]["replicas"]))
    tmp_path = tmp_path_factory.mktemp("statefulset")
    pods = _lay_out(tmp_path, replicas)
    processes = _start(pods, container, tmp_path)
    try:
        _wait_ready(pods, container, tmp_path)
        yield pods
    finally:
        stop_processes(processes, wait_s=20.0)


def _status_job_env(pods: Pods) -> dict[str, str]:
    """The status Job's environment (it reaches the ring at the client Service)."""
    job = _kind("status-job.yaml", "Job")["spec"]["template"]["spec"]["containers"][0]
    assert job["command"] == ["sr3", "status"]
    env = _container_env(job, "sr3-status", {"sr3": pods.secret})
    return {key: pods.mapped(value, "") for key, value in env.items()}


def test_the_statefulset_runs_a_tls_ring_that_the_job_and_clients_reach_by_dns(
    statefulset: Pods, tmp_path: Path
) -> None:
    pods = statefulset
    job_env = _status_job_env(pods)
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
    # Each peer reports its node's zone.
    listed = pods.sr3(job_env, "status", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    zones = {peer["id"]: peer["zone"] for peer in json.loads(listed.stdout)["peers"]}
    assert zones == {pod: _zone(pod) for pod in pods.ips}


def _config_map(name: str) -> dict[str, str]:
    (found,) = [
        doc
        for doc in _documents("spark-example.yaml")
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == name
    ]
    data = found["data"]
    assert isinstance(data, dict)
    return data


def test_the_spark_drivers_service_account_may_start_its_executors() -> None:
    """The driver Job submits to the cluster's own API in client mode, as a service
    account whose Role (bound in the namespace) lets it create, watch and delete pods."""
    job = _kind("spark-example.yaml", "Job")
    spec = job["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    assert args[args.index("--master") + 1].startswith("k8s://https://kubernetes.default.svc")
    assert args[args.index("--deploy-mode") + 1] == "client"
    assert "spark.kubernetes.driver.pod.name=$(POD_NAME)" in args
    account = spec["serviceAccountName"]
    assert _kind("spark-example.yaml", "ServiceAccount")["metadata"]["name"] == account
    binding = _kind("spark-example.yaml", "RoleBinding")
    assert {"kind": "ServiceAccount", "name": account} in binding["subjects"]
    role = _kind("spark-example.yaml", "Role")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]
    }  # fmt: skip
    allowed = {
        (resource, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = {"create", "get", "list", "watch", "delete", "deletecollection"}
    assert {("pods", verb) for verb in needed} <= allowed
    assert {("configmaps", "create"), ("services", "create")} <= allowed
    dockerfile = (FOLDER / "spark.Dockerfile").read_text()
    image = spec["containers"][0]["image"]
    assert f"-t {image} " in dockerfile, "spark.Dockerfile builds the image the Job runs"
    assert args[args.index("--conf") :].count(f"spark.kubernetes.container.image={image}") == 1


def _spark_command(
    pods: Pods, container: dict[str, Any], env: dict[str, str], layout: dict[str, Path]
) -> list[str]:
    """The driver container's command and args as the kubelet expands them (``$(VAR)``
    from its environment ``env``), run here: Spark's own spark-submit (the image's is
    /opt/spark/bin/spark-submit) with the sr3 jar (the image has it in /opt/spark/jars),
    ``local[2]`` for the cluster's API server (no cluster: the executors are threads of
    the driver's JVM), loopback and free ports for the pod's network, and the volumes'
    mount paths laid out in ``layout``."""
    command = [_expand(part, env) for part in container["command"] + container["args"]]
    assert command[0] == "/opt/spark/bin/spark-submit"
    command[0] = str(Path(spark_home()) / "bin" / "spark-submit")
    command[1:1] = ["--conf", f"spark.jars={fs_jar()}"]
    replaced = {
        command[command.index("--master") + 1]: "local[2]",
        "spark.driver.bindAddress=0.0.0.0": "spark.driver.bindAddress=127.0.0.1",
        "spark.driver.port=7078": "spark.driver.port=0",
        "spark.driver.blockManager.port=7079": "spark.driver.blockManager.port=0",
    }
    command = [replaced.get(part, part) for part in command]
    for mount_path, directory in layout.items():
        command = [part.replace(mount_path, str(directory)) for part in command]
    return [pods.mapped(part, "") for part in command]


@pytest.mark.slow
def test_the_spark_example_driver_checkpoints_its_query_to_the_statefulsets_ring(
    statefulset: Pods, tmp_path: Path
) -> None:
    """The driver Job's container as it runs in its pod: its command and environment,
    the ConfigMaps' spark-defaults.conf and application at their mount paths, the client
    Secret's files at theirs, and the credential from its Secret (scoped to spark/).
    Must hold: the query runs three micro-batches against the StatefulSet's ring by its
    client Service's name, over TLS with client certificates required, and the ring
    holds their commits."""
    require_spark()
    pods = statefulset
    job = _kind("spark-example.yaml", "Job")["spec"]["template"]["spec"]
    container = job["containers"][0]
    volumes = {volume["name"]: volume for volume in job["volumes"]}
    layout: dict[str, Path] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            directory = tmp_path / mount["name"]
            directory.mkdir()
            for key, text in _config_map(volume["configMap"]["name"]).items():
                (directory / key).write_text(pods.mapped(text, ""))
            layout[mount["mountPath"]] = directory
        else:
            assert volume["secret"]["secretName"] == "sr3-client", volume
            layout[mount["mountPath"]] = pods.tls
    env = _container_env(
        container, "sr3-spark-example-x", {"sr3-spark": spark_credential(pods.secret)}
    )
    command = [*_spark_command(pods, container, env, layout), "3"]
    for mount_path, directory in layout.items():
        env = {key: value.replace(mount_path, str(directory)) for key, value in env.items()}
    env |= {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    checkpoint = container["args"][-1]
    done = subprocess.run(
        in_own_hosts(pods.hosts_file, command),
        cwd=tmp_path,
        env=pods.env(env),
        capture_output=True,
        text=True,
        timeout=SPARK_RUN_S_MAX,
        check=False,
    )
    # Spark's INFO lines and Java stack frames left out of a failure's message: the
    # reason is in the rest.
    output = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if " INFO " not in line and not line.lstrip().startswith("at ")
    ]
    assert done.returncode == 0, "\n".join(output)[-6000:]
    assert "Batch: 2" in done.stdout, done.stdout[-3000:]
    # `sr3 fs` signs each request for the peer it dials, as the FileSystem does: a seed
    # that is a peer's own name.
    peer0 = f"sr3-peer-0.sr3-peers.{NAMESPACE}.svc.cluster.local:{pods.port}"
    fs_env = {**_status_job_env(pods), "SR3_RING": peer0}
    listed = pods.sr3(fs_env, "fs", "ls", f"{checkpoint}/commits")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert {"0", "1", "2"} <= {Path(word).name for word in listed.stdout.split()}, listed.stdout
