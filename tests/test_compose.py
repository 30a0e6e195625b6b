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
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

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


def test_compose_file_describes_a_ring_of_at_least_five_peers() -> None:
    services = _compose()["services"]
    assert len(services) >= 5
    volumes = set()
    founders = 0
    for name, service in services.items():
        environment = service["environment"]
        assert {"SR3_PEER_ID", "SR3_LISTEN", "SR3_DATA", "SR3_SEEDS"} <= set(environment), name
        assert service["restart"] == "unless-stopped", name
        assert "healthcheck" in service, name
        assert service["env_file"] == ".env", name
        volumes.update(volume.split(":")[0] for volume in service["volumes"])
        seeds = [seed for seed in environment["SR3_SEEDS"].split(",") if seed]
        assert all(seed.split(":")[0] in services for seed in seeds), "seeds are services"
        founders += not seeds
        # Clients on the host reach the peer at its published port: it advertises that.
        host_port = ":".join(_interpolate(service["ports"][0]).split(":")[:2])
        networks = _interpolate(environment["SR3_ADVERTISE_NETWORKS"])
        assert networks == f"external={host_port}", name
        assert host_port.startswith("127.0.0.1:"), "published on loopback by default"
    assert founders == 1, "exactly one peer founds the ring (no seeds)"
    assert len(volumes) == len(services), "every peer needs a data volume of its own"
    assert _entrypoint() == ["sr3", "peer"]


def test_every_service_command_line_runs_a_real_peer(tmp_path: Path) -> None:
    services = _compose()["services"]
    hosts = {name: f"127.0.0.{index}" for index, name in enumerate(sorted(services), start=1)}
    port = pick_port(list(hosts.values()), 7600)
    secret = "compose-test-secret-0123456789"

    # Each service's published port, as the host reaches it (its 'external' address).
    published = {
        name: ":".join(_interpolate(service["ports"][0]).split(":")[:2])
        for name, service in services.items()
    }

    def local(text: str) -> str:
        text = _interpolate(text)
        for name, host in hosts.items():
            text = text.replace(f"{name}:7401", f"{host}:{port}")
            text = text.replace(published[name], f"{host}:{port}")
        return text

    processes = []
    sr3 = [sys.executable, "-m", "sr3"]
    try:
        for name, service in sorted(services.items()):
            env = {key: local(str(value)) for key, value in service["environment"].items()}
            env["SR3_LISTEN"] = f"{hosts[name]}:{port}"
            env["SR3_DATA"] = str(tmp_path / name)
            env["SR3_SECRET"] = secret
            command = sr3 + _entrypoint()[1:]
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115
            processes.append(
                subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=log)
            )
            log.close()
        for host in hosts.values():
            _wait_healthy(f"{host}:{port}")
        ring = ",".join(f"{host}:{port}" for host in hosts.values())

        async def round_trip() -> bytes:
            async with Client(ring, secret) as client:
                ref = await client.chunks.put_blob(b"compose" * 1000)
                return await client.chunks.get_blob(ref)

        import asyncio

        assert asyncio.run(round_trip()) == b"compose" * 1000
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            assert process.wait(timeout=15) == 0, "a peer did not stop cleanly on SIGTERM"
        shutil.rmtree(tmp_path, ignore_errors=True)


def _interpolate(text: str) -> str:
    """Compose's ``${NAME:-default}``, with the defaults (no .env in the test)."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", lambda match: match.group(1), text)


def _wait_healthy(address: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{address}/v1/health", timeout=0.5) as answer:
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
