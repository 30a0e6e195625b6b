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
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import in_own_hosts, require_names_apart, stop_processes

from ring.client import Client
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
        assert "healthcheck" in service, name
        assert service["env_file"] == ".env", name
        volumes.update(volume.split(":")[0] for volume in service["volumes"] if "-data" in volume)
        assert "./tls:/tls:ro" in service["volumes"], name
        assert {"SR3_TLS_CERT", "SR3_TLS_KEY", "SR3_TLS_CA"} <= set(environment), name
        assert service["depends_on"]["tls"]["condition"] == "service_completed_successfully"
        assert "https://" in " ".join(service["healthcheck"]["test"]), name
        seeds = [seed for seed in environment["SR3_SEEDS"].split(",") if seed]
        assert all(seed.split(":")[0] in services for seed in seeds), "seeds are services"
        founders += not seeds
        # Clients on the host reach the peer at its published port: it advertises that.
        host_port = ":".join(_interpolate(service["ports"][0]).split(":")[:2])
        networks = _interpolate(environment["SR3_ADVERTISE_NETWORKS"])
        assert networks == f"external={host_port}", name
        assert host_port.startswith("127.0.0.1:"), "published on loopback by default"
        # The certificate names the service and the published address.
        assert f"--san {name}" in services["tls"]["command"][0], name
    assert founders == 1, "exactly one peer founds the ring (no seeds)"
    assert len(volumes) == len(peers), "every peer needs a data volume of its own"
    assert _entrypoint() == ["sr3", "peer"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".env", "tls"} <= set(ignored), "the secret and the CA stay out of images"


def _make_tls(folder: Path) -> None:
    """The tls service's own script, with ./tls at ``folder`` (and its chown only as
    root: the test's peers run as this user)."""
    script = _interpolate(_compose()["services"]["tls"]["command"][0]).replace("/tls", str(folder))
    if os.geteuid() != 0:
        script = script.replace("chown ", "true ")
    bin_dir = str(Path(sys.executable).parent)
    done = subprocess.run(
        ["sh", "-c", script], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
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
            check = [local(part) for part in service["healthcheck"]["test"][1:]]
            check = [part.replace("127.0.0.1:", f"{ips[name]}:") for part in check]
            check[0] = sys.executable
            deadline = time.monotonic() + 60
            while subprocess.run(check, capture_output=True, timeout=30, check=False).returncode:
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


def _interpolate(text: str) -> str:
    """Compose's ``${NAME:-default}``, with the defaults (no .env in the test)."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", lambda match: match.group(1), text)


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
