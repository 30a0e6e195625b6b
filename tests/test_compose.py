"""docker-compose.yml, checked without a container engine.

What it breaks: nothing; it checks that the compose file parses, that every service is
configured like a peer, and that each service's exact environment and entrypoint, with
container host names mapped to 127.0.0.x, starts real ``sr3 peer`` processes that form a
working ring. So the compose file cannot drift from the command line the tests run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import in_own_hosts, next_base_port, require_names_apart, stop_processes

from ring.client import Client
from ring.errors import ConfigError
from sr3.certs import init_ca, issue, names_missing
from sr3.local import pick_port

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _entrypoint() -> list[str]:
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            return list(yaml.safe_load(line.removeprefix("ENTRYPOINT").strip()))
    raise AssertionError("Dockerfile has no ENTRYPOINT")


def _dockerfile_instruction(name: str) -> list[str]:
    """The arguments of every ``name`` instruction of the Dockerfile (continuation lines
    joined), each as one string."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        line.removeprefix(name).strip() for line in text.splitlines() if line.startswith(name + " ")
    ]


def _healthcheck() -> list[str]:
    """The image's HEALTHCHECK command (options before CMD; exec or shell form)."""
    (instruction,) = _dockerfile_instruction("HEALTHCHECK")
    _, separator, command = instruction.partition(" CMD ")
    assert separator, f"HEALTHCHECK without CMD: {instruction}"
    if not command.startswith("["):
        return ["/bin/sh", "-c", command]
    parsed = json.loads(command)
    assert isinstance(parsed, list) and all(isinstance(part, str) for part in parsed)
    return parsed


def _health_command(env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The HEALTHCHECK as this checkout runs it, with ``env`` the container's: the
    image's copy of deploy/healthcheck.py is /opt/sr3/healthcheck.py, and its ``python``
    is this interpreter."""
    script = str(ROOT / "deploy" / "healthcheck.py")
    command = [part.replace("/opt/sr3/healthcheck.py", script) for part in _healthcheck()]
    bin_dir = str(Path(sys.executable).parent)
    return command, {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _peers() -> dict[str, Any]:
    """The peer services (the others make what they need, like the TLS files)."""
    services = _compose()["services"]
    return {name: s for name, s in services.items() if "SR3_PEER_ID" in s.get("environment", {})}


def test_compose_file_describes_a_ring_of_at_least_five_peers_over_tls() -> None:
    services = _compose()["services"]
    peers = _peers()
    assert len(peers) >= 5
    volumes = set()
    founders = 0
    for name, service in peers.items():
        environment = service["environment"]
        assert {"SR3_PEER_ID", "SR3_LISTEN", "SR3_DATA", "SR3_SEEDS"} <= set(environment), name
        assert service["restart"] == "unless-stopped", name
        # Health: the image's HEALTHCHECK, which reads the peer's TLS settings.
        assert "healthcheck" not in service, f"{name} overrides the image's health check"
        assert service["env_file"] == ".env", name
        volumes.update(volume.split(":")[0] for volume in service["volumes"] if "-data" in volume)
        assert "./tls:/tls:ro" in service["volumes"], name
        assert {"SR3_TLS_CERT", "SR3_TLS_KEY", "SR3_TLS_CA"} <= set(environment), name
        assert service["depends_on"]["tls"]["condition"] == "service_completed_successfully"
        seeds = [seed for seed in environment["SR3_SEEDS"].split(",") if seed]
        assert all(seed.split(":")[0] in services for seed in seeds), "seeds are services"
        founders += not seeds
        # Clients on the host reach the peer at its published port: it advertises that.
        host_port = ":".join(_interpolate(service["ports"][0]).split(":")[:2])
        networks = _interpolate(environment["SR3_ADVERTISE_NETWORKS"])
        assert networks == f"external={host_port}", name
        assert host_port.startswith("127.0.0.1:"), "published on loopback by default"
        # The certificate names the service and the published address.
        assert name in _tls_names(), name
    assert founders == 1, "exactly one peer founds the ring (no seeds)"
    assert len(volumes) == len(peers), "every peer needs a data volume of its own"
    assert _entrypoint() == ["sr3", "peer"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".env", "tls"} <= set(ignored), "the secret and the CA stay out of images"


def _tls_names(env: dict[str, str] | None = None) -> list[str]:
    """The names the tls service's certificate is to carry, as its script lists them."""
    script = _interpolate(_compose()["services"]["tls"]["command"][0], env)
    (line,) = [line for line in script.splitlines() if line.startswith('names="')]
    return line.removeprefix('names="').removesuffix('"').replace(",", " ").split()


def _run_tls(folder: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The tls service's own script, with ./tls at ``folder`` and ``.env`` holding ``env``
    (and its chown only as root: the test's peers run as this user)."""
    script = _interpolate(_compose()["services"]["tls"]["command"][0], env)
    script = script.replace("/tls", str(folder))
    if os.geteuid() != 0:
        script = script.replace("chown ", "true ")
    bin_dir = str(Path(sys.executable).parent)
    return subprocess.run(
        ["sh", "-c", script], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _make_tls(folder: Path) -> None:
    done = _run_tls(folder)
    assert done.returncode == 0, done.stdout + done.stderr
    folder.mkdir(exist_ok=True)


def test_every_service_command_line_runs_a_real_peer(tmp_path: Path) -> None:
    """Every peer service's environment and entrypoint, run as a real process in a mount
    namespace whose /etc/hosts resolves the service names (as the compose network's DNS
    does), with the TLS files the tls service's own script makes: they form a ring over
    HTTPS, each passes the service's health check command, and ``sr3 put`` and ``get``
    from a namespace with the same names round-trip a file."""
    require_names_apart()
    services = _peers()
    ips = {name: f"127.0.0.{index}" for index, name in enumerate(sorted(services), start=1)}
    port = pick_port(list(ips.values()), 7600)
    secret = "compose-test-secret-0123456789"
    tls = tmp_path / "tls"
    tls.mkdir()
    _make_tls(tls)
    hosts_file = tmp_path / "hosts"
    names = [f"{ip} {name}" for name, ip in ips.items()]
    hosts_file.write_text(Path("/etc/hosts").read_text() + "\n".join(names) + "\n")

    def local(text: str) -> str:
        """Paths as the volume mounts put them, the one port every service listens on."""
        return _interpolate(text).replace("/tls/", f"{tls}/").replace(":7401", f":{port}")

    processes = []
    bin_dir = str(Path(sys.executable).parent)
    path = f"{bin_dir}:{os.environ['PATH']}"
    try:
        for name, service in sorted(services.items()):
            env = {key: local(str(value)) for key, value in service["environment"].items()}
            env["SR3_LISTEN"] = f"{ips[name]}:{port}"
            env["SR3_DATA"] = str(tmp_path / name)
            env["SR3_SECRET"] = secret
            command = in_own_hosts(hosts_file, [sys.executable, "-m", "sr3", *_entrypoint()[1:]])
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115
            processes.append(
                subprocess.Popen(
                    command, env={**os.environ, **env, "PATH": path}, stdout=log, stderr=log
                )
            )
            log.close()
        for name, service in services.items():
            env = {key: local(str(value)) for key, value in service["environment"].items()}
            env["SR3_LISTEN"] = f"{ips[name]}:{port}"
            check, check_env = _health_command(env)
            deadline = time.monotonic() + 60
            while subprocess.run(
                check, env=check_env, capture_output=True, timeout=30, check=False
            ).returncode:
                log_text = (tmp_path / f"{name}.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"{name} never healthy:\n{log_text}"
                time.sleep(0.3)
        client_env = {
            **os.environ, "PATH": path, "SR3_SECRET": secret, "SR3_RING": f"peer1:{port}",
            "SR3_TLS_CA": str(tls / "ca.pem"),
        }  # fmt: skip
        payload = tmp_path / "payload.bin"
        payload.write_bytes(b"compose" * 100_000)

        def sr3(*args: str) -> subprocess.CompletedProcess[str]:
            command = in_own_hosts(hosts_file, [sys.executable, "-m", "sr3", *args])
            return subprocess.run(
                command, env=client_env, capture_output=True, text=True, timeout=120, check=False
            )

        put = sr3("put", str(payload), "--key", "compose/payload")
        assert put.returncode == 0, put.stdout + put.stderr
        back = tmp_path / "back.bin"
        get = sr3("get", "compose/payload", "-o", str(back))
        assert get.returncode == 0, get.stdout + get.stderr
        assert back.read_bytes() == payload.read_bytes()
    finally:
        codes = stop_processes(processes)
        shutil.rmtree(tmp_path, ignore_errors=True)
        assert codes == [0] * len(processes), "a peer did not stop cleanly on SIGTERM"


def _interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${NAME:-default}`` (from ``env``, the test's .env, else the default)
    and its ``$$`` (a ``$`` for the shell)."""
    known = env or {}

    def value(match: re.Match[str]) -> str:
        return known.get(match.group(1)) or match.group(2)

    parts = text.split("$$")
    return "$".join(re.sub(r"\$\{([A-Z0-9_]+):-([^}]*)\}", value, part) for part in parts)


def _wait_healthy(address: str, context: ssl.SSLContext | None = None) -> None:
    deadline = time.monotonic() + 30
    scheme = "https" if context is not None else "http"
    while time.monotonic() < deadline:
        try:
            url = f"{scheme}://{address}/v1/health"
            with urllib.request.urlopen(url, timeout=0.5, context=context) as answer:
                if json.loads(answer.read())["ready"]:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail(f"peer at {address} never became ready")


def test_a_peer_bound_to_every_address_runs_its_overlay_at_the_advertised_one(
    tmp_path: Path,
) -> None:
    """Compose peers listen on 0.0.0.0 and advertise their service name; overlay
    datagrams sign the advertised address, so the overlay must start with it."""
    port = pick_port(["127.0.0.1"], 7900)
    env = {
        "SR3_PEER_ID": "peer-any",
        "SR3_LISTEN": f"0.0.0.0:{port}",
        "SR3_ADVERTISE": f"127.0.0.1:{port}",
        "SR3_DATA": str(tmp_path / "data"),
        "SR3_SECRET": "compose-test-secret-0123456789",
    }
    log = open(tmp_path / "peer.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "sr3", *_entrypoint()[1:]],
        env={**os.environ, **env},
        stdout=log,
        stderr=log,
    )
    log.close()
    try:
        _wait_healthy(f"127.0.0.1:{port}")

        async def info() -> dict[str, Any]:
            async with Client(f"127.0.0.1:{port}", env["SR3_SECRET"]) as client:
                await client.ring()
                entry = (await client.members())[0]
                assert entry["address"] == f"127.0.0.1:{port}"
                status = await client.status()
                assert status.peers[0].state == "up"
                return entry

        import asyncio

        asyncio.run(info())
        assert process.poll() is None, (tmp_path / "peer.log").read_text()
        assert "Traceback" not in (tmp_path / "peer.log").read_text()
    finally:
        process.terminate()
        assert process.wait(timeout=15) == 0, (tmp_path / "peer.log").read_text()


PORT_TRIES_MAX = 200


def _port_free_everywhere() -> int:
    """A port that no process holds on any address, for TCP (the API) and UDP (the
    overlay): a peer listening on 0.0.0.0 binds both on every address. From this run's
    own stretch of ports (other suites share the machine)."""
    base = next_base_port()
    for port in range(base, base + PORT_TRIES_MAX):
        try:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                with socket.socket(socket.AF_INET, kind) as probe:
                    probe.bind(("0.0.0.0", port))
        except OSError:
            continue
        return port
    raise AssertionError(f"no port free everywhere in {base}..{base + PORT_TRIES_MAX}")


def _start_peer(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``sr3 peer`` as the image's ENTRYPOINT runs it, with ``env`` (the container's)."""
    log = open(tmp_path / "peer.log", "ab")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "sr3", *_entrypoint()[1:]],
        env={**os.environ, **env},
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    log.close()
    return process


@pytest.mark.parametrize("tls", ["client-certs", "tls", "plain"])
def test_the_image_health_check_follows_the_peer_it_runs_with_or_without_tls(
    tmp_path: Path, tls: str
) -> None:
    """The image run outside the compose file (``docker run -e SR3_...``): its
    HEALTHCHECK command, with the container's environment, fails while no peer answers
    and passes once the peer is ready, whether the peer serves plain HTTP, HTTPS, or
    HTTPS requiring client certificates (as on Kubernetes)."""
    port = _port_free_everywhere()
    env = {
        "SR3_PEER_ID": "peer-alone",
        "SR3_LISTEN": f"0.0.0.0:{port}",
        "SR3_ADVERTISE": f"127.0.0.1:{port}",
        "SR3_DATA": str(tmp_path / "data"),
        "SR3_SECRET": "compose-test-secret-0123456789",
    }
    if tls != "plain":
        init_ca(tmp_path / "ca")
        issue(tmp_path / "ca", tmp_path / "tls", "peer", ["peer-alone", "127.0.0.1"])
        env |= {
            "SR3_TLS_CERT": str(tmp_path / "tls" / "peer.pem"),
            "SR3_TLS_KEY": str(tmp_path / "tls" / "peer.key"),
            "SR3_TLS_CA": str(tmp_path / "ca" / "ca.pem"),
            "SR3_TLS_CLIENT_CERTS": "true" if tls == "client-certs" else "false",
        }
    check, check_env = _health_command(env)
    before = subprocess.run(check, env=check_env, capture_output=True, timeout=30, check=False)
    assert before.returncode != 0, "healthy with no peer running"
    process = _start_peer(tmp_path, env)
    try:
        deadline = time.monotonic() + 60
        while (
            done := subprocess.run(
                check, env=check_env, capture_output=True, text=True, timeout=30, check=False
            )
        ).returncode:
            log_text = (tmp_path / "peer.log").read_text()[-3000:]
            assert process.poll() is None, log_text
            assert time.monotonic() < deadline, f"never healthy: {done.stdout}\n{log_text}"
            time.sleep(0.3)
    finally:
        codes = stop_processes([process])
    assert codes == [0], (tmp_path / "peer.log").read_text()[-3000:]


def _handshake(port: int, name: str, ca: Path) -> str | None:
    """None when a client reaching 127.0.0.1:``port`` as ``name`` accepts the peer's
    certificate (host name checked against ``ca``), else why not."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=name),
        ):
            return None
    except (OSError, ssl.SSLError) as exc:
        return str(exc)


def test_the_tls_service_adds_names_to_the_certificate_on_a_later_up(tmp_path: Path) -> None:
    """Breaks: a name added to the certificate's list after the first ``up``
    (SR3_TLS_EXTRA_NAMES in .env); then the CA's key moved off the host, as the docs
    advise. Must hold: an ``up`` with the same names leaves the certificate as it is; one
    with a new name re-issues it from the same CA, and a running peer serves it to
    clients that reach it by the new name, without a restart; without the CA's key, a
    new name fails the tls service with a message that says what to do and leaves the
    certificate alone, while an ``up`` that adds nothing still passes."""
    tls = tmp_path / "tls"
    tls.mkdir()
    _make_tls(tls)
    cert, ca_pem = tls / "peers.pem", tls / "ca.pem"
    assert names_missing(cert, _tls_names()) == []
    first = cert.read_bytes()
    _make_tls(tls)
    assert cert.read_bytes() == first, "re-issued with nothing to add"

    port = _port_free_everywhere()
    peer1 = _compose()["services"]["peer1"]["environment"]
    env = {k: _interpolate(str(v)).replace("/tls/", f"{tls}/") for k, v in peer1.items()}
    env |= {
        "SR3_LISTEN": f"127.0.0.1:{port}", "SR3_ADVERTISE": f"127.0.0.1:{port}",
        "SR3_DATA": str(tmp_path / "data"), "SR3_SECRET": "compose-test-secret-0123456789",
        "SR3_TLS_CHECK_INTERVAL": "0.5",
    }  # fmt: skip
    process = _start_peer(tmp_path, env)
    try:
        _wait_healthy(f"127.0.0.1:{port}", ssl.create_default_context(cafile=str(ca_pem)))
        assert "sr3.example.net" in str(_handshake(port, "sr3.example.net", ca_pem))
        added = {"SR3_TLS_EXTRA_NAMES": "sr3.example.net,198.51.100.7"}
        done = _run_tls(tls, added)
        assert done.returncode == 0, done.stdout + done.stderr
        assert names_missing(cert, [*_tls_names(), "sr3.example.net", "198.51.100.7"]) == []
        assert ca_pem.read_bytes() == (tls / "ca" / "ca.pem").read_bytes(), "the same CA"
        deadline = time.monotonic() + 30
        while (refused := _handshake(port, "sr3.example.net", ca_pem)) is not None:
            assert time.monotonic() < deadline, f"the peer never served the new names: {refused}"
            time.sleep(0.2)
    finally:
        codes = stop_processes([process])
    assert codes == [0], (tmp_path / "peer.log").read_text()[-3000:]

    (tls / "ca" / "ca.key").rename(tmp_path / "ca.key")
    reissued = cert.read_bytes()
    done = _run_tls(tls, {**added, "SR3_EXTERNAL_HOST": "sr3-other.example.net"})
    assert done.returncode != 0
    assert "does not name: sr3-other.example.net" in done.stderr, done.stderr
    assert "tls/ca/ca.key" in done.stderr, done.stderr
    assert cert.read_bytes() == reissued
    done = _run_tls(tls, added)
    assert done.returncode == 0, done.stdout + done.stderr


def test_names_missing_compares_addresses_as_addresses_and_names_without_case(
    tmp_path: Path,
) -> None:
    init_ca(tmp_path)
    names = ["Peer1", "::1", "*.sr3-peers.ns.svc.cluster.local", "10.0.0.7"]
    issued = issue(tmp_path, tmp_path, "peers", names)
    assert names_missing(issued.cert, ["peer1", "0:0::1", "10.0.0.7"]) == []
    assert names_missing(
        issued.cert, ["sr3-peer-3.sr3-peers.ns.svc.cluster.local", "sr3-peers.ns.svc.cluster.local"]
    ) == ["sr3-peers.ns.svc.cluster.local"]
    assert names_missing(issued.cert, ["a.b.sr3-peers.ns.svc.cluster.local", "10.0.0.8"]) == [
        "a.b.sr3-peers.ns.svc.cluster.local",
        "10.0.0.8",
    ]
    with pytest.raises(ConfigError, match="cannot read the certificate"):
        names_missing(tmp_path / "ca.key", ["peer1"])


def test_no_service_gives_the_image_volume_an_anonymous_volume() -> None:
    """Every service of the project's image mounts something at each of the image's
    VOLUME paths (a named volume or a tmpfs): otherwise the engine makes an anonymous
    volume for it at every ``up`` and ``docker-compose down`` leaves it behind."""
    instructions = _dockerfile_instruction("VOLUME")
    paths = [path for instruction in instructions for path in json.loads(instruction)]
    assert paths == ["/data"]
    for name, service in _compose()["services"].items():
        if service.get("image") != "sr3-peer:latest":
            continue
        targets = {volume.split(":")[1] for volume in service.get("volumes", [])}
        targets |= set(service.get("tmpfs", []))
        assert set(paths) <= targets, f"{name}: nothing mounted at {set(paths) - targets}"


DOC_FILES = ("docs/operations.md", "docker-compose.yml", "deploy/base-image.sh", "README.md")


def test_the_docs_give_commands_as_debians_docker_compose_runs_them() -> None:
    """Debian's engine has ``docker-compose`` (no ``docker compose`` plugin): every
    command line in the deployment docs is spelled that way."""
    for name in DOC_FILES:
        for number, line in enumerate((ROOT / name).read_text().splitlines(), start=1):
            command = line.lstrip("# ").strip()
            assert not re.search(r"(^|&& |; )docker compose ", command), f"{name}:{number}: {line}"
