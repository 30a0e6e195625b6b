"""docker-compose.yml on a real container engine: the project's image built from this
checkout (on a base image from Debian's archive), five peer containers with TLS, and
clients on the compose network and on the host.

What it breaks: two peers stopped, every container restarted, the whole ring taken down
and brought up again on its volumes (leaving no anonymous volume behind); a Spark
application on the host (executors on ``local-cluster``) that checkpoints to the compose
ring through the published ports; the image run alone with TLS, healthy by its own
HEALTHCHECK; and a name added to the peers' certificate after the first ``up``.
Slow (an image build the first time); ``make test-containers`` runs it, CI too
(``SR3_REQUIRE_CONTAINERS=1``: there a missing engine fails it instead of skipping it).
"""

from __future__ import annotations

import hashlib
import os
import random
import secrets
import socket
import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from containers import (
    ComposeProject,
    base_image_unavailable,
    containers_unavailable,
    ensure_base_image,
    require_containers,
    run,
    start_engine,
    stop_engine,
)
from support import require_spark, spark_credential

from sr3.cluster_app import ClusterJob, application_env, finish_application, write_job_inputs

pytestmark = [pytest.mark.slow, pytest.mark.containers]

PEERS = [f"peer{index}" for index in range(1, 6)]
HOST_RING = "127.0.0.1:7401,127.0.0.1:7402"
NETWORK_RING = "peer1:7401,peer3:7401,peer5:7401"  # peer2 and peer4 get stopped
PUBLISHED_PORTS = range(7401, 7406)
PEER_UID = "7401"  # the image's sr3 user
HEALTHY_S_MAX = 180.0
HOST_FILE_BYTES = 64 * 1024 * 1024
NETWORK_FILE_BYTES = 20 * 1024 * 1024
CLI_TIMEOUT_S = 120.0
SPARK_INPUT_FILES = 6
SPARK_FINISH_S_MAX = 420.0


def _ports_free() -> list[int]:
    busy = []
    for port in PUBLISHED_PORTS:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


# The engine's volumes before the ring's first `up` (an engine may hold others').
volumes_before_up: set[str] = set()


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeProject]:
    """The compose deployment, up and healthy (``docker compose up -d``), taken down with
    its volumes afterwards; the engine is started here only if none was running."""
    require_containers(containers_unavailable())
    busy = _ports_free()
    assert not busy, f"the compose file publishes 127.0.0.1:7401-7405; in use: {busy}"
    work = tmp_path_factory.mktemp("compose")
    engine = start_engine(work / "dockerd.log")
    project = None
    try:
        require_containers(base_image_unavailable(engine))
        base = ensure_base_image(engine)
        name = f"sr3test{os.getpid()}"
        project = ComposeProject.create(
            engine, work / "project", name, secrets.token_urlsafe(32), base
        )
        project.build()
        volumes_before_up.update(project.volumes())
        start = time.monotonic()
        project.compose("up", "-d")
        project.wait_healthy(PEERS, HEALTHY_S_MAX)
        print(f"compose: five healthy peers {time.monotonic() - start:.1f} s after `up -d`")
        yield project
    finally:
        if project is not None:
            project.down()
        stop_engine(engine)


def _host_sr3(project: ComposeProject, *args: str) -> str:
    """``sr3 ARGS`` on the host, as a user there runs it: the published ports as seeds,
    the secret from .env, the cluster's CA from ./tls."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SR3_")},
        "SR3_RING": HOST_RING,
        "SR3_SECRET": project.secret,
        "SR3_TLS_CA": str(project.directory / "tls" / "ca.pem"),
    }
    done = run([sys.executable, "-m", "sr3", *args], env=env, timeout_s=CLI_TIMEOUT_S)
    return done.stdout


def _network_sr3(project: ComposeProject, script: str, exchange: Path) -> str:
    """``sh -c SCRIPT`` in a container on the compose network (the peers' image and
    configuration: the secret from .env, the CA at /tls/ca.pem), ``exchange`` at /x."""
    done = project.run_in_network(
        "peer1", ["sh", "-c", script], volumes={exchange: "/x"}, env={"SR3_RING": NETWORK_RING}
    )
    return done.stdout


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_back_everywhere(project: ComposeProject, exchange: Path, files: dict[str, Path]) -> None:
    """Every key in ``files`` read on the host and on the compose network, byte-identical."""
    for key, original in files.items():
        back = exchange / f"{original.name}.host"
        back.unlink(missing_ok=True)
        _host_sr3(project, "get", key, "-o", str(back))
        assert _digest(back) == _digest(original), f"{key} read on the host"
        inside = f"{original.name}.network"
        (exchange / inside).unlink(missing_ok=True)
        _network_sr3(project, f"sr3 get {key} -o /x/{inside}", exchange)
        assert _digest(exchange / inside) == _digest(original), f"{key} read on the network"


def test_the_compose_ring_serves_the_host_and_its_network_through_stops_and_restarts(
    ring: ComposeProject, tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: two of five peers stopped; then every container restarted; then the ring
    taken down and up again (volumes kept). Must hold: from the host (published ports,
    TLS with the cluster's CA) and from a container on the compose network, `sr3 status`
    sees the ring and every file put from either side reads back byte-identical each
    time; peers run as the image's non-root user."""
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)  # containers run as the sr3 user
    from_host = exchange / "from-host.bin"
    from_host.write_bytes(rng.randbytes(HOST_FILE_BYTES))

    status = _host_sr3(ring, "status")
    for port in PUBLISHED_PORTS:
        assert f"127.0.0.1:{port}" in status, status  # the addresses of the host's network
    assert status.count("│ up ") == len(PEERS), status
    _host_sr3(ring, "put", str(from_host), "--key", "blob/from-host")
    _network_sr3(
        ring,
        f"head -c {NETWORK_FILE_BYTES} /dev/urandom > /x/from-network.bin"
        " && sr3 put /x/from-network.bin --key blob/from-network && sr3 status",
        exchange,
    )
    files = {"blob/from-host": from_host, "blob/from-network": exchange / "from-network.bin"}
    _read_back_everywhere(ring, exchange, files)
    for service, container in ring.containers().items():
        if service in PEERS:
            uid = run([ring.engine.docker, "exec", container, "id", "-u"]).stdout.strip()
            assert uid == PEER_UID, f"{service} runs as uid {uid}"

    ring.compose("stop", "peer2", "peer4")
    _read_back_everywhere(ring, exchange, files)

    ring.compose("start", "peer2", "peer4")
    ring.compose("restart", timeout_s=300)
    ring.wait_healthy(PEERS, HEALTHY_S_MAX)
    _read_back_everywhere(ring, exchange, files)

    ring.compose("down", timeout_s=300)  # containers and network gone; volumes kept
    # Nothing but the peers' named volumes: no anonymous one (the tls service's /data).
    named = {f"{ring.name}_{peer}-data" for peer in PEERS}
    assert ring.volumes() - volumes_before_up == named
    ring.compose("up", "-d")
    ring.wait_healthy(PEERS, HEALTHY_S_MAX)
    _read_back_everywhere(ring, exchange, files)


def test_spark_on_the_host_checkpoints_to_the_compose_ring(
    ring: ComposeProject, tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: nothing; a Spark application on the host (driver and two executor JVMs,
    local-cluster) with checkpointLocation on sr3:// reaches the peers only through the
    published ports, over TLS, with a scoped credential. Must hold: its output and state
    store rows equal those of the same query on a local checkpoint."""
    require_spark()
    write_job_inputs("window", tmp_path / "input", SPARK_INPUT_FILES, rng.randrange(10**6))
    job = ClusterJob(
        query="window",
        input_dir=str(tmp_path / "input"),
        checkpoint=f"sr3:///spark/compose/window-{rng.randrange(10**9)}",
        output_dir=str(tmp_path / "output"),
        reference_checkpoint=str(tmp_path / "reference-checkpoint"),
        reference_output_dir=str(tmp_path / "reference-output"),
        result_path=str(tmp_path / "result.json"),
    )
    credential = spark_credential(ring.secret)
    env = application_env(HOST_RING, credential)
    env["SR3_TLS_CA"] = str(ring.directory / "tls" / "ca.pem")
    result = finish_application(job, env, tmp_path / "driver.log", SPARK_FINISH_S_MAX)
    assert result.reference_output
    assert result.output == result.reference_output
    assert result.state == result.reference_state
    assert not result.executor_env_has_secret


def _container_state(project: ComposeProject, container: str) -> tuple[str, str]:
    """A container's state ('running', 'exited', ...) and its health."""
    fmt = "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}"
    state, _, health = (
        run([project.engine.docker, "inspect", "--format", fmt, container])
        .stdout.strip()
        .partition(" ")
    )
    return state, health


def test_the_image_run_alone_with_tls_and_client_certificates_turns_healthy(
    ring: ComposeProject,
) -> None:
    """Breaks: nothing; the project's image run without the compose file (``docker
    run``), as one peer serving HTTPS that requires client certificates, on a port of
    its own. Must hold: the image's own HEALTHCHECK reports it healthy."""
    name = f"{ring.name}-alone"
    tls = ring.directory / "tls"
    run(
        [
            ring.engine.docker, "run", "-d", "--name", name, "--network", "none",
            "--tmpfs", "/data:uid=7401", "-v", f"{tls}:/tls:ro",
            "-e", "SR3_PEER_ID=alone", "-e", "SR3_LISTEN=0.0.0.0:7499",
            "-e", "SR3_ADVERTISE=127.0.0.1:7499", "-e", "SR3_DATA=/data",
            "-e", f"SR3_SECRET={ring.secret}", "-e", "SR3_TLS_CERT=/tls/peers.pem",
            "-e", "SR3_TLS_KEY=/tls/peers.key", "-e", "SR3_TLS_CA=/tls/ca.pem",
            "-e", "SR3_TLS_CLIENT_CERTS=true", "sr3-peer:latest",
        ]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + HEALTHY_S_MAX
        while (state := _container_state(ring, name)) != ("running", "healthy"):
            if time.monotonic() > deadline or state[0] != "running":
                logs = run([ring.engine.docker, "logs", "--tail", "30", name], check=False)
                health = run(
                    [ring.engine.docker, "inspect", "--format", "{{json .State.Health}}", name]
                )
                raise AssertionError(f"{state}: {health.stdout}\n{logs.stdout}{logs.stderr}")
            time.sleep(1.0)
    finally:
        run([ring.engine.docker, "rm", "-f", "-v", name], check=False)


def test_a_name_added_after_the_first_up_reaches_the_peers_certificate(
    ring: ComposeProject,
) -> None:
    """Breaks: a name added to ``.env`` (SR3_TLS_EXTRA_NAMES) after the ring's first
    ``up``. Must hold: ``docker-compose up -d`` re-issues the peers' certificate from the
    same CA with the name, the peers turn healthy, and a client on the host that reaches
    a published port by that name accepts the certificate (host name checked)."""
    tls = ring.directory / "tls"
    ca_before = (tls / "ca.pem").read_bytes()
    ring.set_env(SR3_TLS_EXTRA_NAMES="sr3-added.example.net")
    ring.compose("up", "-d", timeout_s=300)
    ring.wait_healthy(PEERS, HEALTHY_S_MAX)
    assert (tls / "ca.pem").read_bytes() == ca_before
    context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    deadline = time.monotonic() + HEALTHY_S_MAX
    for port in PUBLISHED_PORTS:
        while True:
            try:
                with (
                    socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                    context.wrap_socket(raw, server_hostname="sr3-added.example.net"),
                ):
                    break
            except OSError as exc:
                assert time.monotonic() < deadline, f"127.0.0.1:{port}: {exc}"
                time.sleep(1.0)
