"""Cold start of the compose deployment on Docker's engine, against the same ring as local
processes (``sr3 cluster up --tls``), same smoke test, same machine.

Each repetition, in turn (compose, local, then local, compose in the next: ABBA):

- **cold start**: from nothing (no containers or volumes; no data directories) to five
  peers healthy and ready: ``docker compose up -d`` (images already built) against
  ``LocalCluster.create(tls=True).up()``;
- **smoke**: from the host with the ``sr3`` command, as a user: ``status``, ``put`` of
  64 MiB, ``get``, two peers stopped, ``get`` again (byte-identical).

Reported per repetition and as the median with its range: cold start, smoke and their
sum, and the compose / local ratio of the sum. The image builds are timed once, before:
the base image from Debian's archive (only when missing) and the project's image. Writes
``benchmarks/results/compose.json``. Needs root and Docker's engine (it starts dockerd
when none runs), as ``make test-containers`` does.

    python benchmarks/bench_compose.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the container helpers the compose test uses

from containers import (  # noqa: E402
    BASE_IMAGE,
    ComposeProject,
    containers_unavailable,
    ensure_base_image,
    run,
    start_engine,
    stop_engine,
)

from sr3.local import LocalCluster  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "compose.json"
PEERS = [f"peer{index}" for index in range(1, 6)]
HOST_RING = "127.0.0.1:7401,127.0.0.1:7402"
FILE_BYTES = 64 * 1024 * 1024
HEALTHY_S_MAX = 180.0
CLI_TIMEOUT_S = 120.0
TARGET_S = 180.0


def sr3(env: dict[str, str], *args: str) -> str:
    done = run([sys.executable, "-m", "sr3", *args], env=env, timeout_s=CLI_TIMEOUT_S)
    return str(done.stdout)


def smoke(env: dict[str, str], work: Path, stop_two: Callable[[], object]) -> float:
    """Seconds for status, put, get, two peers stopped, get; AssertionError on a wrong
    byte."""
    original = work / "smoke.bin"
    if not original.exists():
        original.write_bytes(os.urandom(FILE_BYTES))
    back = work / "smoke.back"
    started = time.monotonic()
    sr3(env, "status")
    key = f"bench/smoke-{secrets.token_hex(4)}"
    sr3(env, "put", str(original), "--key", key)
    for stop in (stop_two, None):
        back.unlink(missing_ok=True)
        sr3(env, "get", key, "-o", str(back))
        assert back.read_bytes() == original.read_bytes(), key
        if stop is not None:
            stop()
    return time.monotonic() - started


def host_env(extra: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SR3_")}, **extra}


def compose_run(project: ComposeProject, work: Path) -> dict[str, float]:
    started = time.monotonic()
    project.compose("up", "-d")
    project.wait_healthy(PEERS, HEALTHY_S_MAX)
    cold = time.monotonic() - started
    env = host_env(
        {
            "SR3_RING": HOST_RING,
            "SR3_SECRET": project.secret,
            "SR3_TLS_CA": str(project.directory / "tls" / "ca.pem"),
        }
    )
    try:
        smoke_s = smoke(env, work, lambda: project.compose("stop", "peer2", "peer4"))
    finally:
        project.down()
    return {"cold_start_s": cold, "smoke_s": smoke_s, "total_s": cold + smoke_s}


def local_run(work: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sr3-bench-compose-") as home:
        started = time.monotonic()
        cluster = LocalCluster.create(
            Path(home), len(PEERS), tls=True, cluster_file=Path(home) / "cluster.json"
        )
        cluster.up()
        cold = time.monotonic() - started
        env = host_env({"SR3_CLUSTER_FILE": str(cluster.cluster_file)})
        try:

            def stop_two() -> None:
                for peer_id in ("peer-2", "peer-4"):
                    cluster.stop(peer_id)

            smoke_s = smoke(env, work, stop_two)
        finally:
            for peer in cluster.cluster.peers:
                if cluster.running(peer.peer_id):
                    cluster.stop(peer.peer_id)
    return {"cold_start_s": cold, "smoke_s": smoke_s, "total_s": cold + smoke_s}


def summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "median": statistics.median(run[name] for run in runs),
            "min": min(run[name] for run in runs),
            "max": max(run[name] for run in runs),
        }
        for name in ("cold_start_s", "smoke_s", "total_s")
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, choices=range(1, 11))
    args = parser.parse_args()
    reason = containers_unavailable()
    if reason is not None:
        print(f"bench_compose: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sr3-bench-compose-"))
    engine = start_engine(work / "dockerd.log")
    try:
        had_base = run([engine.docker, "image", "inspect", BASE_IMAGE], check=False)
        started = time.monotonic()
        ensure_base_image(engine)
        base_s = None if had_base.returncode == 0 else time.monotonic() - started
        project = ComposeProject.create(
            engine, work / "project", "sr3bench", secrets.token_urlsafe(32), BASE_IMAGE
        )
        started = time.monotonic()
        project.build()
        build_s = time.monotonic() - started
        compose: list[dict[str, float]] = []
        local: list[dict[str, float]] = []
        for index in range(args.repeat):
            order = ("compose", "local") if index % 2 == 0 else ("local", "compose")
            for kind in order:
                if kind == "compose":
                    compose.append(compose_run(project, work))
                else:
                    local.append(local_run(work))
                latest = (compose if kind == "compose" else local)[-1]
                print(kind, {name: round(value, 1) for name, value in latest.items()})
    except subprocess.TimeoutExpired as exc:
        print(f"bench_compose: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_engine(engine)
    ratios = [c["total_s"] / loc["total_s"] for c, loc in zip(compose, local, strict=True)]
    report: dict[str, Any] = {
        "benchmark": "bench_compose",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "repeat": args.repeat,
        "file_bytes": FILE_BYTES,
        "base_image_build_s": base_s,
        "image_build_s": build_s,
        "compose": {"runs": compose, **summary(compose)},
        "local": {"runs": local, **summary(local)},
        "ratio_total": {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        },
        "target_total_s": TARGET_S,
        "target_met": statistics.mean(run["total_s"] for run in compose) < TARGET_S,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("ratio_total", "target_met")}))
    print(f"compose total: {report['compose']['total_s']}; local: {report['local']['total_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
