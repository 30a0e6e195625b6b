"""Multi-failure recovery drills: write state, kill K peers at once, recover the state
along each requested topology, verify it byte for byte, wait for the ring to heal, and
report.

The drill is independent of how peers are killed: the caller passes ``kill`` (SIGKILL
of local processes, or the authenticated admin endpoint of a remote ring). When K >= R
some chunks may have lost every replica: the drill then reports which state became
unrecoverable (``bytes_lost``, ``missing_chunks``) instead of pretending.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from recovery.auto import measured, verify_rate
from recovery.cost import Choice, Network, Workload, choose
from recovery.executor import RecoveryResult, locate, recover_blob
from recovery.plan import TOPOLOGIES, Topology, parse_topology
from ring import paxos
from ring.blobs import BlobRef
from ring.client import Client
from ring.cluster import Configuration
from ring.errors import ConfigError, DataUnavailable
from ring.files import file_digest
from ring.placement import Member

__all__ = ["DrillOptions", "DrillReport", "TopologyResult", "run_drill", "write_plot"]

MB = 1_000_000
HEAL_TIMEOUT_S = 600.0
# Voters are a function of the member set alone: any cluster id names the same ones.
DRILL_CLUSTER = "0" * 32
HEAL_POLL_S = 0.5
WARM_UP_READS = 8
PAGE_WARM_UP_PIECE_BYTES = 4 * 1024 * 1024
REPEAT_MAX = 20


@dataclass(frozen=True, slots=True)
class DrillOptions:
    fail: int
    topologies: tuple[str, ...]  # star, line, tree, auto
    seed: int
    peer_bytes_s: float | None = None
    requester_bytes_s: float | None = None
    latency_ms: float = 0.0
    fan_in: int = 4
    connections_max: int = 8
    heal_timeout_s: float = HEAL_TIMEOUT_S
    # Recoveries per topology (rounds in rotated order): a result is their median.
    repeat: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.repeat <= REPEAT_MAX:
            raise ValueError(f"repeat must be in 1..{REPEAT_MAX}")


@dataclass(slots=True)
class TopologyResult:
    topology: str
    recovery_s: float | None
    bytes: int
    throughput_mb_s: float | None
    max_fan_in: int | None
    verified: bool
    bytes_lost: int
    chosen_by_auto: bool
    estimated_s: float | None = None
    rerouted_chunks: int = 0
    missing_chunks: list[str] = field(default_factory=list)
    # Byte ranges [offset, length] of the state that no live replica could give back.
    lost_ranges: list[list[int]] = field(default_factory=list)
    error: str | None = None
    # Every recovery's seconds when the drill repeated them (recovery_s is their median).
    recovery_s_runs: list[float] = field(default_factory=list)


@dataclass(slots=True)
class DrillReport:
    seed: int
    peers: int
    replication: int
    fail: int
    state_bytes: int
    failed_peers: list[str]
    heal_s: float | None
    network: dict[str, Any]
    auto: dict[str, Any]
    results: list[TopologyResult]
    chunks_lost_after_heal: int = 0
    # False when the failed peers were a majority of the voters: the ring cannot decide
    # their removal, so it does not heal until they come back (``healable``).
    heal_possible: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _network(options: DrillOptions) -> Network:
    return Network(
        peer_bytes_s=options.peer_bytes_s,
        requester_bytes_s=options.requester_bytes_s,
        rtt_s=0.0005 + 2 * options.latency_ms / 1000.0,
        connections_max=options.connections_max,
        tree_fan_in=options.fan_in,
    )


def _emulated(options: DrillOptions) -> bool:
    return bool(options.peer_bytes_s or options.requester_bytes_s or options.latency_ms)


async def _choose(client: Client, ref: BlobRef, options: DrillOptions, replication: int) -> Choice:
    """The cost model's choice: with an emulated network, from the given figures; else
    from bandwidth and round trips measured on this ring's recent transfers."""
    specs = await locate(client, sorted({e.chunk_id for e in ref.extents}))
    holders = {holder for spec in specs for holder in spec.holders}
    workload = Workload(
        state_bytes=sum(spec.stored_bytes for spec in specs),
        chunks=len(specs),
        holders=max(len(holders), 1),
        failed_peers=options.fail,
        replication=replication,
    )
    network = _network(options)
    if _emulated(options):
        # The links as given; the CPU rate as measured here, like a real recovery's.
        return choose(workload, replace(network, node_bytes_s=verify_rate(client).bytes_s()))
    return choose(workload, measured(client, network))


async def _warm_up(client: Client, state: BlobRef, work: Path, options: DrillOptions) -> None:
    """One small recovery per topology before the failures: opens connections and code
    paths, so the first measured topology does not pay for them; a few chunk reads of
    the state, whose timings the cost model uses when the network is not emulated; and
    a scratch file of the state's size written and deleted, so that the first recovery
    does not pay alone for the fresh pages its output takes (each recovery's output is
    deleted before the next, whose pages are then at hand; a VM that backs guest memory
    on first touch measured 0.8 s per 300 MiB for fresh pages and 0.06 s for reused
    ones)."""
    await asyncio.to_thread(_touch_pages, work / "warm-up-pages.bin", state.size)
    for chunk_id in list(dict.fromkeys(e.chunk_id for e in state.extents))[:WARM_UP_READS]:
        await client.fetch_chunk(chunk_id)
    # Scratch data read back at once and never named: collected after the grace.
    ref = await client.chunks.put_blob(b"sr3 drill warm-up " * 4096)
    for topology in TOPOLOGIES:
        await recover_blob(
            client, ref, work / "warm-up.bin", topology, fan_in=options.fan_in,
            connections_max=options.connections_max,
        )  # fmt: skip
    await asyncio.to_thread((work / "warm-up.bin").unlink, True)


def _touch_pages(path: Path, size: int) -> None:
    piece = memoryview(bytes(min(size, PAGE_WARM_UP_PIECE_BYTES)))  # sliced without copies
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for offset in range(0, size, len(piece) or 1):
            os.pwrite(fd, piece[: size - offset], offset)
    finally:
        os.close(fd)
        path.unlink()


def _lost_ranges(ref: BlobRef, missing: Sequence[str]) -> list[list[int]]:
    gone = set(missing)
    ranges: list[list[int]] = []
    offset = 0
    for extent in ref.extents:
        if extent.chunk_id in gone:
            if ranges and ranges[-1][0] + ranges[-1][1] == offset:
                ranges[-1][1] += extent.length
            else:
                ranges.append([offset, extent.length])
        offset += extent.length
    return ranges


async def _recover_one(
    client: Client, ref: BlobRef, topology: Topology, out: Path, digest: str,
    options: DrillOptions,
) -> tuple[RecoveryResult | None, TopologyResult]:  # fmt: skip
    try:
        result = await recover_blob(
            client, ref, out, topology, fan_in=options.fan_in,
            connections_max=options.connections_max, ingress_bytes_s=options.requester_bytes_s,
        )  # fmt: skip
    except DataUnavailable as exc:
        missing = sorted(set(exc.missing))
        ranges = _lost_ranges(ref, missing)
        return None, TopologyResult(
            topology, None, ref.size, None, None, False, sum(r[1] for r in ranges), False,
            missing_chunks=missing, lost_ranges=ranges, error=str(exc)[:300],
        )  # fmt: skip
    verified = await asyncio.to_thread(file_digest, out) == digest
    await asyncio.to_thread(out.unlink, True)
    return result, TopologyResult(
        topology, round(result.seconds, 3), ref.size,
        round(ref.size / MB / max(result.seconds, 1e-9), 1), result.max_fan_in, verified, 0,
        False, rerouted_chunks=len(result.rerouted),
    )  # fmt: skip


def _median_entry(entries: Sequence[TopologyResult]) -> TopologyResult:
    """The first entry that failed, else the one at the median time, with every time."""
    failed = [entry for entry in entries if entry.recovery_s is None or not entry.verified]
    if failed:
        return failed[0]
    ordered = sorted(entries, key=lambda entry: entry.recovery_s or 0.0)
    median = ordered[(len(ordered) - 1) // 2]
    median.recovery_s_runs = [entry.recovery_s or 0.0 for entry in entries]
    return median


def healable(members: Sequence[Member], victims: Sequence[str]) -> bool:
    """Whether the ring can heal after losing ``victims``: removing a dead peer is a
    decision of a majority of the voters (``ring.cluster``), so with a majority of them
    dead placement stays as it is and nothing is re-replicated until they come back."""
    voters = Configuration(DRILL_CLUSTER, 1, tuple(members)).voters()
    dead = sum(1 for voter in voters if voter.peer_id in victims)
    return len(voters) - dead >= paxos.majority(len(voters))


async def _lost_without_healing(client: Client, timeout_s: float) -> int:
    """Chunks no live peer holds, once every live peer finished two more repair rounds
    (each audits what the records it coordinates reference) or ``timeout_s`` passed."""
    started = time.monotonic()
    first: dict[str, int] | None = None
    while time.monotonic() - started < timeout_s:
        status = await client.status()
        rounds = {p.peer_id: p.repair_rounds or 0 for p in status.peers if p.state == "up"}
        if first is None:
            first = rounds
        elif rounds and all(rounds[p] >= first.get(p, 0) + 2 for p in rounds):
            return status.chunks_lost
        await asyncio.sleep(HEAL_POLL_S)
    return (await client.status()).chunks_lost


async def _wait_heal(client: Client, timeout_s: float) -> tuple[float | None, int]:
    """Seconds until no chunk is under-replicated (None on timeout), and lost chunks."""
    started = time.monotonic()
    settled_rounds: dict[str, int] | None = None
    while time.monotonic() - started < timeout_s:
        status = await client.status()
        live = [peer for peer in status.peers if peer.state == "up"]
        removed = all(p.ring_state in ("up", "removed", "left") for p in status.peers)
        if removed and status.chunks_under_replicated == 0 and live:
            rounds = {p.peer_id: p.repair_rounds or 0 for p in live}
            if settled_rounds is None:
                settled_rounds = rounds
            elif all(rounds[p] > settled_rounds.get(p, 0) for p in rounds):
                return time.monotonic() - started, status.chunks_lost
        else:
            settled_rounds = None
        await asyncio.sleep(HEAL_POLL_S)
    return None, (await client.status()).chunks_lost


def write_plot(report: DrillReport, path: Path) -> None:
    """A PNG comparing the topologies' recovery time and throughput."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'sr3[plot]'") from exc

    matplotlib.use("Agg")
    from matplotlib import pyplot

    done = [r for r in report.results if r.recovery_s is not None]
    names = [r.topology + (" (auto)" if r.chosen_by_auto else "") for r in done]
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(10, 4))
    left.bar(names, [r.recovery_s or 0.0 for r in done], color="#4477aa", label="measured")
    left.scatter(names, [r.estimated_s or 0.0 for r in done], color="#cc6677", zorder=3,
                 label="cost model")  # fmt: skip
    left.set_ylabel("recovery time (s)")
    left.legend()
    right.bar(names, [r.throughput_mb_s or 0.0 for r in done], color="#228833")
    right.set_ylabel("throughput (MB/s)")
    network = report.network
    figure.suptitle(
        f"sr3 drill: {report.peers} peers, R={report.replication}, {report.fail} killed, "
        f"{report.state_bytes / 2**20:.0f} MiB; peer {_rate(network['peer_bytes_s'])}, "
        f"requester {_rate(network['requester_bytes_s'])}, +{network['latency_ms']:g} ms"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _rate(value: float | None) -> str:
    return "unlimited" if value is None else f"{value / MB:g} MB/s"


async def run_drill(
    client: Client,
    state_path: Path,
    work: Path,
    options: DrillOptions,
    kill: Callable[[list[str]], Awaitable[None]],
) -> DrillReport:
    """Store ``state_path``, kill ``options.fail`` peers, recover with each topology."""
    view = await client.ring(refresh=True)
    peers = [member.peer_id for member in view.ring.members]
    if options.fail >= len(peers):
        raise ValueError(f"cannot kill {options.fail} of {len(peers)} peers and still recover")
    ref = await client.store_file(state_path, "drill/state")
    digest = await asyncio.to_thread(file_digest, state_path)
    await _warm_up(client, ref, work, options)
    victims = sorted(random.Random(options.seed).sample(peers, options.fail))
    await kill(victims)
    choice = await _choose(client, ref, options, view.replication)
    wanted = [t for t in TOPOLOGIES if t in options.topologies or "all" in options.topologies]
    if "auto" in options.topologies and choice.topology not in wanted:
        wanted.append(parse_topology(choice.topology))
    # A seeded order, so that no topology always runs first on cold caches.
    random.Random(options.seed ^ 0x0D81).shuffle(wanted)
    estimates = {estimate.topology: estimate for estimate in choice.estimates}
    runs: dict[str, list[TopologyResult]] = {topology: [] for topology in wanted}
    for round_number in range(options.repeat):
        # Rotated each round: no topology always runs first, or right after another.
        turn = round_number % len(wanted)
        for topology in wanted[turn:] + wanted[:turn]:
            _, entry = await _recover_one(
                client, ref, topology, work / f"recovered-{topology}.bin", digest, options
            )
            runs[topology].append(entry)
    results = []
    for topology in wanted:
        entry = _median_entry(runs[topology])
        entry.chosen_by_auto = topology == choice.topology
        entry.estimated_s = round(estimates[topology].seconds, 3)
        results.append(entry)
    heal_possible = healable(view.ring.members, victims)
    if heal_possible:
        heal_s, lost = await _wait_heal(client, options.heal_timeout_s)
    else:
        heal_s, lost = None, await _lost_without_healing(client, options.heal_timeout_s)
    return DrillReport(
        seed=options.seed, peers=len(peers), replication=view.replication, fail=options.fail,
        state_bytes=ref.size, failed_peers=victims,
        heal_s=round(heal_s, 2) if heal_s is not None else None,
        network={
            "peer_bytes_s": options.peer_bytes_s,
            "requester_bytes_s": options.requester_bytes_s,
            "latency_ms": options.latency_ms,
        },
        auto={
            "topology": choice.topology,
            "reason": choice.reason,
            "estimates": [asdict(estimate) for estimate in choice.estimates],
        },
        results=results, chunks_lost_after_heal=lost, heal_possible=heal_possible,
    )  # fmt: skip
