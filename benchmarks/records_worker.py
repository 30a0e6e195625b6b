"""The worker of ``bench_records.py``: one ring and its clients, in a process that
imports that ring's code.

The driver starts it with ``PYTHONPATH`` and the working directory set to one side's
code (this checkout, or a commit extracted with ``git archive``), so that its client and
its peers run that code; it checks that no ``ring`` or ``sr3`` module came from anywhere
else. It starts a local ring, answers the driver's commands (one JSON object a line on
stdin, one answer a line on stdout) until ``quit``, and stops the ring:

    python benchmarks/records_worker.py CODE --home DIR --base-port N --writers N
                                        --settle-s S
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench_records import (
    ATTEMPTS_MAX,
    CATCH_UPS_METRIC,
    OPS_MAX,
    PEERS,
    REPLICATION,
    SEED,
    SETTLE_S_MAX,
    SINGLE_PHASES,
    UNKNOWN_CHOSEN,
    VALUE_BYTES,
    WARMUP_OPS,
    WRITE_QUORUM,
    WRITERS_MAX,
    Phase,
)
from proc_cpu import cpu_delta, cpu_seconds, cpu_sum


def round_stats(client: Any) -> dict[str, Any] | None:
    """The proposer's counters (``RoundStats``), or None on a ring without consensus.

    Looked up by name because the worker runs either version of the client."""
    proposer = getattr(client.records, "proposer", None)
    return None if proposer is None else asdict(proposer.stats)


def total_stats(clients: Sequence[Any]) -> dict[str, Any] | None:
    """The counters of every client's proposer added up."""
    each = [round_stats(client) for client in clients]
    if any(stats is None for stats in each):
        return None
    total: dict[str, Any] = {"rounds_histogram": {}}
    for stats in filter(None, each):
        for name, figure in stats.items():
            if name == "rounds_histogram":
                for rounds, count in figure.items():
                    total[name][rounds] = total[name].get(rounds, 0) + count
            else:
                total[name] = total.get(name, 0) + figure
    return total


def stats_delta(after: dict[str, Any] | None, before: dict[str, Any] | None) -> dict[str, Any]:
    if after is None or before is None:
        return {}
    counters = {name: after[name] - before[name] for name in after if name != "rounds_histogram"}
    histogram = {
        str(rounds): count - before["rounds_histogram"].get(rounds, 0)
        for rounds, count in after["rounds_histogram"].items()
        if count != before["rounds_histogram"].get(rounds, 0)
    }
    return {**counters, "rounds_histogram": histogram}


async def catch_ups(client: Any, addresses: Sequence[str]) -> int | None:
    """``sr3_peer_record_catch_ups`` added up over the peers (None where a peer has no
    such gauge: a ring without consensus)."""
    total = 0
    for address in addresses:
        answer = await client.transport.request(address, "GET", "/metrics")
        lines = answer.body.decode().splitlines()
        found = [line for line in lines if line.startswith(CATCH_UPS_METRIC + " ")]
        if not found:
            return None
        total += int(float(found[0].split()[1]))
    return total


def error_label(exc: Exception, expected: int) -> str:
    """The error's class, and for an unknown outcome how far the chosen version is past
    the one expected (+1: another writer's value took the very version this one wanted,
    so this one's cannot have been chosen)."""
    match = UNKNOWN_CHOSEN.search(str(exc))
    if match is None:
        return type(exc).__name__
    return f"{type(exc).__name__}, chosen = expected + {int(match[1]) - expected}"


class Worker:
    """Runs the driver's commands on one ring: one client for single-writer phases,
    ``writers`` more for contention."""

    def __init__(self, clients: list[Any], peers: Sequence[tuple[int, str]]) -> None:
        self.clients = clients
        self.peer_pids = [pid for pid, _address in peers]
        self.addresses = [address for _pid, address in peers]
        self.rng = random.Random(SEED)

    def value(self) -> bytes:
        return self.rng.randbytes(VALUE_BYTES)

    async def measure(self, calls: Callable[[], Any]) -> Phase:
        """Run ``calls()`` (a coroutine returning latencies and counters), timed."""
        stats_before = total_stats(self.clients)
        catch_ups_before = await catch_ups(self.clients[0], self.addresses)
        client_before, peers_before = cpu_seconds(os.getpid()), cpu_sum(self.peer_pids)
        started = time.perf_counter()
        latencies_ms, extra = await calls()
        wall_s = time.perf_counter() - started
        catch_ups_after = await catch_ups(self.clients[0], self.addresses)
        return Phase(
            latencies_ms=latencies_ms,
            wall_s=wall_s,
            client_cpu_s=cpu_delta(cpu_seconds(os.getpid()), client_before),
            peers_cpu_s=cpu_delta(cpu_sum(self.peer_pids), peers_before),
            round_stats=stats_delta(total_stats(self.clients), stats_before) or None,
            catch_ups=None
            if catch_ups_after is None or catch_ups_before is None
            else catch_ups_after - catch_ups_before,
            **extra,
        )

    async def creates(self, prefix: str, ops: int) -> tuple[list[float], dict[str, Any]]:
        client, latencies = self.clients[0], []
        for index in range(ops):
            value = self.value()
            started = time.perf_counter()
            await client.put_record(f"{prefix}/{index}", value, expected_version=0)
            latencies.append(1000 * (time.perf_counter() - started))
        return latencies, {}

    async def updates(self, key: str, ops: int) -> tuple[list[float], dict[str, Any]]:
        client, latencies = self.clients[0], []
        version = await client.put_record(key, self.value(), expected_version=0)
        for _ in range(ops):
            value = self.value()
            started = time.perf_counter()
            version = await client.put_record(key, value, expected_version=version)
            latencies.append(1000 * (time.perf_counter() - started))
        return latencies, {}

    async def reads(self, key: str, ops: int) -> tuple[list[float], dict[str, Any]]:
        client, latencies = self.clients[0], []
        for _ in range(ops):
            started = time.perf_counter()
            found = await client.get_record(key)
            latencies.append(1000 * (time.perf_counter() - started))
            assert found is not None and found.version > 0, f"{key} read back empty"
        return latencies, {}

    async def contend(
        self, key: str, writers: int, attempts: int
    ) -> tuple[list[float], dict[str, Any]]:
        from ring.errors import RecordConflict, SR3Error

        await self.clients[0].put_record(key, self.value(), expected_version=0)
        latencies: list[float] = []
        outcome = {"wins": 0, "conflicts": 0}
        won: list[int] = []
        errors: dict[str, int] = {}
        histogram: dict[str, int] = {}

        async def writer(client: Any) -> None:
            for _ in range(attempts):
                current = await client.get_record(key)
                expected = 0 if current is None else current.version
                before = round_stats(client)
                started = time.perf_counter()
                try:
                    won.append(
                        await client.put_record(key, self.value(), expected_version=expected)
                    )
                    outcome["wins"] += 1
                except RecordConflict:
                    outcome["conflicts"] += 1
                except SR3Error as exc:  # contention, unknown outcome, quorum: counted
                    name = error_label(exc, expected)
                    errors[name] = errors.get(name, 0) + 1
                latencies.append(1000 * (time.perf_counter() - started))
                after = round_stats(client)
                if after is not None and before is not None:
                    rounds = str(after["rounds"] - before["rounds"])
                    histogram[rounds] = histogram.get(rounds, 0) + 1

        async with asyncio.TaskGroup() as group:
            for client in self.clients[1 : writers + 1]:
                group.create_task(writer(client))
        double_wins = len(won) - len(set(won))
        return latencies, {
            **outcome,
            "double_wins": double_wins,
            "errors": errors,
            "rounds_histogram": histogram,
        }

    async def run(self, command: dict[str, Any]) -> Phase:
        phase, tag, ops = command["phase"], command["tag"], int(command["ops"])
        assert 1 <= ops <= OPS_MAX
        if phase == "create":
            return await self.measure(lambda: self.creates(f"bench/c/{tag}", ops))
        if phase == "update":
            return await self.measure(lambda: self.updates(f"bench/u/{tag}", ops))
        if phase == "read":
            return await self.measure(lambda: self.reads(f"bench/u/{tag}", ops))
        if phase == "contend":
            writers, attempts = int(command["writers"]), int(command["attempts"])
            assert 1 <= writers < len(self.clients) and 1 <= attempts <= ATTEMPTS_MAX
            return await self.measure(lambda: self.contend(f"bench/x/{tag}", writers, attempts))
        raise ValueError(f"unknown phase {phase!r}")


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


async def serve(
    ring: str, secret: str, writers: int, peers: Sequence[tuple[int, str]], settled_at: float
) -> None:
    """Answer the driver's commands (one JSON object a line on stdin) until ``quit``;
    the first waits until ``settled_at`` (monotonic)."""
    from ring.client import Client

    clients = [Client(ring, secret) for _ in range(writers + 1)]
    try:
        for client in clients:
            await client.ring()
        worker = Worker(clients, peers)
        for phase in SINGLE_PHASES:  # warm-up: connections, member tables, page cache
            await worker.run({"phase": phase, "tag": "warmup", "ops": WARMUP_OPS})
        _answer({"ready": True})
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            if command.get("quit"):
                break
            await asyncio.sleep(max(0.0, settled_at - time.monotonic()))
            _answer({"phase": asdict(await worker.run(command))})
    finally:
        for client in clients:
            await client.close()


def _stop_on_sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(143)


def run_worker(code: Path, home: Path, base_port: int, writers: int, settle_s: float) -> None:
    """Start a ring of this process's code (``PYTHONPATH``), serve, and stop it."""
    import ring
    from sr3.local import LocalCluster

    loaded = Path(ring.__file__).resolve()
    assert loaded.is_relative_to(code.resolve()), f"ring loaded from {loaded}, not {code}"
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    cluster = LocalCluster.create(
        home,
        PEERS,
        replication=REPLICATION,
        write_quorum=WRITE_QUORUM,
        base_port=base_port,
        cluster_file=home / "cluster.json",
    )
    try:
        cluster.up()
        settled_at = time.monotonic() + settle_s
        peers = [(peer.pid or 0, peer.address) for peer in cluster.cluster.peers]
        asyncio.run(serve(cluster.ring, cluster.secret, writers, peers, settled_at))
    finally:
        cluster.down(purge=True)
    foreign = [
        name
        for name, module in sys.modules.items()
        if name.split(".")[0] in {"ring", "sr3"}
        and getattr(module, "__file__", None)
        and not Path(module.__file__ or "").resolve().is_relative_to(code.resolve())
    ]
    assert not foreign, f"modules loaded from outside {code}: {foreign}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("code", type=Path, help="the code this worker's ring runs")
    parser.add_argument("--home", type=Path, required=True, help="the ring's folder")
    parser.add_argument("--base-port", type=int, required=True, help="first peer's port")
    parser.add_argument("--writers", type=int, required=True, help="contending writers")
    parser.add_argument("--settle-s", type=float, required=True, help="wait before measuring")
    args = parser.parse_args(argv)
    if not (1 <= args.writers <= WRITERS_MAX and 0 <= args.settle_s <= SETTLE_S_MAX):
        parser.error(f"--writers 1..{WRITERS_MAX}, --settle-s 0..{SETTLE_S_MAX:.0f}")
    run_worker(args.code, args.home, args.base_port, args.writers, args.settle_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
