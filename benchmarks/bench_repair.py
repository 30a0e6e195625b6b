"""Healing figures of an sr3 ring: re-replication after failures, join churn, and the
cost of repair to foreground reads.

One run, on one machine, with real peer processes (fresh local cluster of ``--peers``,
R=3, short failure timeout and grace so that repair starts quickly):

1. store ``--size`` of state-like data (several files) and wait for a quiet ring;
2. foreground baseline: read a ``--read-size`` file back with no repair running;
3. SIGKILL 2 peers (seeded choice) and time: until the ring marks them removed, and
   until ``chunks_under_replicated`` is 0 again; repair MB/s = bytes the survivors
   pushed / time from removal to full replication;
4. while that repair runs, read the same file again and again: the median foreground
   throughput of the reads that finished during repair, as a ratio to the median of
   5 reads before the kill;
5. add a new peer and measure the stored bytes moved to reach full placement, as a
   fraction of all stored bytes, against the ideal 1/N.

Writes ``benchmarks/results/repair.json``. Run from the repository root:

    python benchmarks/bench_repair.py [--size 1GiB] [--peers 8] [--seed 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ring import api
from ring.client import Client, RingStatus
from ring.config import parse_size
from sr3.local import LocalCluster
from sr3.statedata import write_state_file

RESULTS = Path(__file__).resolve().parent / "results" / "repair.json"
MB = 1_000_000
FILES = 8
READS = 5
SETTLE_S = 3.0
POLL_S = 0.25
WAIT_S_MAX = 900.0
PEER_FLAGS = [
    "--failure-timeout", "2", "--removal-grace", "5", "--repair-interval", "1",
    "--gossip-interval", "0.5",
]  # fmt: skip


async def _totals(client: Client) -> tuple[RingStatus, int, int]:
    """Status, total stored bytes and total repair bytes pushed (every reachable peer)."""
    status = await client.status()
    stored = sum(peer.stored_bytes or 0 for peer in status.peers if peer.state == "up")
    pushed = 0
    for peer in status.peers:
        if peer.state != "up":
            continue
        route = api.INFO
        info = (await client.transport.request(peer.address, route.method, route.pattern)).json()
        pushed += int(info["repair"]["bytes_pushed_total"])
    return status, stored, pushed


async def _wait(client: Client, done: Any, what: str) -> RingStatus:
    deadline = time.monotonic() + WAIT_S_MAX
    while True:
        status = await client.status()
        if done(status):
            return status
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}: {status}")
        await asyncio.sleep(POLL_S)


def _settled(status: RingStatus, expected_rounds: int = 0) -> bool:
    up = [peer for peer in status.peers if peer.state == "up"]
    return status.chunks_under_replicated == 0 and all(
        (peer.repair_rounds or 0) > expected_rounds and (peer.hints_pending or 0) == 0
        for peer in up
    )


async def _read_mb_s(client: Client, key: str, out: Path) -> float:
    ref = await client.lookup_file(key)
    started = time.monotonic()
    await client.get_file(ref, out)
    return ref.size / MB / (time.monotonic() - started)


async def _read_samples(client: Client, key: str, out: Path, count: int) -> list[float]:
    return [await _read_mb_s(client, key, out) for _ in range(count)]


async def _reads_while_repairing(
    client: Client, key: str, out: Path, done: Any
) -> tuple[list[float], RingStatus]:
    """Read ``key`` again and again until ``done(status)``; throughput of each read that
    finished while repair was still running."""
    samples: list[float] = []
    deadline = time.monotonic() + WAIT_S_MAX
    while time.monotonic() < deadline:
        mb_s = await _read_mb_s(client, key, out)
        status = await client.status()
        if done(status):
            return samples, status
        samples.append(mb_s)
    raise SystemExit("gave up waiting for full replication after the kill")


async def measure(cluster: LocalCluster, work: Path, size: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    async with Client(cluster.ring, cluster.secret) as client:
        for index in range(FILES):
            path = work / f"state-{index}.bin"
            write_state_file(path, size // FILES, seed + index)
            await client.store_file(path, f"bench/state-{index}")
            path.unlink()
        status = await _wait(client, _settled, "a quiet ring after writing")
        _, stored_before, _ = await _totals(client)
        # Let the writes reach the disks before measuring, so that writeback does not
        # slow the baseline reads.
        await asyncio.to_thread(os.sync)
        await asyncio.sleep(SETTLE_S)
        baseline = await _read_samples(client, "bench/state-0", work / "read.bin", READS)

        victims = sorted(rng.sample([p.peer_id for p in cluster.cluster.peers], 2))
        rounds = {p.peer_id: p.repair_rounds or 0 for p in status.peers}
        _, _, pushed_before = await _totals(client)
        killed_at = time.monotonic()
        for peer_id in victims:
            cluster.kill(peer_id)
        await _wait(
            client,
            lambda s: all(p.ring_state == "removed" for p in s.peers if p.peer_id in victims),
            "the killed peers to be removed",
        )
        removed_at = time.monotonic()
        during, _ = await _reads_while_repairing(
            client, "bench/state-0", work / "read.bin",
            lambda s: _settled(s, max(rounds.values()) + 1),
        )  # fmt: skip
        healed_at = time.monotonic()
        _, stored_after, pushed_after = await _totals(client)
        repaired = pushed_after - pushed_before

        joined = cluster.add_peer()
        _, _, pushed_join_before = await _totals(client)
        join_started = time.monotonic()
        await _wait(
            client,
            lambda s: (
                _settled(s)
                and all(p.ring_state == "up" for p in s.peers if p.peer_id == joined.peer_id)
            ),
            "full placement after the join",
        )
        await asyncio.sleep(3)
        status, stored_joined, pushed_join_after = await _totals(client)
        joined_bytes = next(
            p.stored_bytes or 0 for p in status.peers if p.peer_id == joined.peer_id
        )
        members = sum(1 for p in status.peers if p.state == "up")
        return {
            "stored_bytes_before_kill": stored_before,
            "killed": victims,
            "detect_and_grace_s": round(removed_at - killed_at, 2),
            "full_replication_after_kill_s": round(healed_at - killed_at, 2),
            "repair_s": round(healed_at - removed_at, 2),
            "repair_bytes": repaired,
            "repair_mb_s": round(repaired / MB / max(healed_at - removed_at, 1e-9), 1),
            "foreground_reads_during_repair": len(during),
            "foreground_read_mb_s_no_repair": round(statistics.median(baseline), 1),
            "foreground_read_mb_s_during_repair": round(statistics.median(during), 1)
            if during
            else None,
            "foreground_read_ratio": round(
                statistics.median(during) / statistics.median(baseline), 3
            )
            if during
            else None,
            "stored_bytes_after_heal": stored_after,
            "join_peer": joined.peer_id,
            "join_members_after": members,
            "join_s": round(time.monotonic() - join_started, 2),
            "join_bytes_pushed": pushed_join_after - pushed_join_before,
            "join_bytes_on_new_peer": joined_bytes,
            "join_fraction_moved": round(joined_bytes / max(stored_joined, 1), 4),
            "join_fraction_ideal": round(1 / members, 4),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    size = parse_size(args.size)
    with tempfile.TemporaryDirectory(prefix="sr3-bench-repair-") as work_name:
        work = Path(work_name)
        cluster = LocalCluster.create(
            work / "cluster", args.peers, cluster_file=work / "cluster.json",
            base_port=7900, peer_flags=[*PEER_FLAGS, "--seed", str(args.seed)],
        )  # fmt: skip
        cluster.up()
        try:
            figures = asyncio.run(measure(cluster, work, size, args.seed))
        finally:
            cluster.down(purge=True)
    result = {
        "benchmark": "repair",
        "size_bytes": size,
        "peers": args.peers,
        "replication": 3,
        "seed": args.seed,
        "peer_flags": PEER_FLAGS,
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        **figures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        print(f"{key:40} {value}")


if __name__ == "__main__":
    main()
