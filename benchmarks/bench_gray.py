"""Gray failure: put and get latencies of named files with one peer frozen (SIGSTOP).

A frozen peer still accepts connections (the kernel completes the handshake) but never
answers, so a client learns of it only from its own timeouts or from the ring's failure
detector. Each run, on one machine, with real peer processes (a fresh local cluster of
``--peers``, R=3, W=2, the peers' default failure timeout, repair once an hour so that
records created in the run stay on the four acceptors of their fast quorum):

1. healthy: ``--ops`` times, put a ``--size`` file under a new key (``put_bytes``: chunks
   on W..R replicas, then the record naming them) and get it back (``get_bytes``),
   ``--concurrency`` at a time; each operation timed on the monotonic clock;
2. frozen: SIGSTOP one peer, then the same number of puts of new keys, each followed by
   a get of a file stored in step 1, with the same client, whose view still has the
   peer up (until the ring's failure detector says otherwise, 5 s in);
3. SIGCONT the peer (always, in ``finally``).

Run ``r`` of ``--repeat`` freezes ``peer-(r mod peers + 1)`` (``peer-1`` is also the
first seed), so five runs give the frozen peer every role: a replica of some chunks,
an acceptor of every record (in the fast quorum of four fifths of them), the seed the
client asks for the member table, a peer the client's pool holds connections to.

With ``--via fs`` the same files are written and read through ``sr3://`` instead
(``FsClient`` PUT and GET of a peer that coordinates them with its own ring client:
the peer after the frozen one). With ``--frozen coordinator`` as well, the frozen peer
is the one the ``sr3://`` client asks first (its first seed, the other peers after it):
the client must give it up (its liveness probe unanswered) and go on through the next
seed. ``--clients per-op`` gives every operation a client of its own, so that every one
meets the frozen seed first (the bound); ``one`` (the default) keeps one client, which
stays with the seed that answered, as ``sr3 fs`` and an executor's FileSystem do. The
client's hedges, given-up requests and probes are reported, and the writes the peers
refused to commit after a stall of their own (``filesystem.freshness``), from their logs.

Every get is checked byte for byte. Reported for each run, phase and operation: p50,
p99 and max in milliseconds, the ratios frozen to healthy, and the client's hedges
(creates that asked the fifth acceptor, reads that ran a round); over the runs, the
median and range of each. Writes ``benchmarks/results/gray.json`` (``--out``); ``--baseline``
copies the figures of an earlier run (another version of the client, measured the
same way) into it for comparison. Run from the repository root:

    python benchmarks/bench_gray.py [--ops 200] [--size 64KiB] [--concurrency 8] [--repeat 1]
    python benchmarks/bench_gray.py --ops 100 --size 4MiB --concurrency 1 --repeat 5 \
        [--via fs [--frozen coordinator] [--clients per-op]] --out benchmarks/results/gray-4mib.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ring.client import Client
from ring.config import parse_size
from spark_connector.fs_client import FsClient
from sr3.local import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "gray.json"
# One operation that takes longer than this is a failure of the benchmark, not a sample.
OP_S_MAX = 120.0
OPS_MAX = 10_000
CONCURRENCY_MAX = 64
REPEAT_MAX = 50
FAILURE_TIMEOUT_S = 5.0  # the peers' --failure-timeout default
# Issue 42's target: no put or get waits longer than this because one peer is frozen.
SLOWEST_S_TARGET = 2.0
PEER_FLAGS = ["--scrub-rate", "0", "--repair-interval", "3600"]


def quantile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: the smallest sample at or above a ``q`` share of them."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {
        "count": len(samples),
        "p50_ms": round(quantile(samples, 0.50) * 1000, 2),
        "p99_ms": round(quantile(samples, 0.99) * 1000, 2),
        "max_ms": round(max(samples) * 1000, 2),
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """The median and range of one figure over the runs."""
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


async def _timed(
    samples: list[float], starts: list[float], op: Callable[[], Awaitable[object]]
) -> object:
    """Run ``op``; its latency into ``samples``, and when it started into ``starts``."""
    started = time.monotonic()
    async with asyncio.timeout(OP_S_MAX):
        result = await op()
    samples.append(time.monotonic() - started)
    starts.append(started)
    return result


@dataclass(frozen=True, slots=True)
class Store:
    """How a phase puts and gets a file: through the ring client, or through an
    ``sr3://`` coordinator (a peer that stores and reads it with its own ring client)."""

    put: Callable[[str, bytes], Awaitable[object]]
    get: Callable[[str], Awaitable[bytes]]


@dataclass(slots=True)
class Timings:
    """One phase's latencies of each kind, and when each operation started."""

    puts: list[float] = field(default_factory=list)
    gets: list[float] = field(default_factory=list)
    put_starts: list[float] = field(default_factory=list)
    get_starts: list[float] = field(default_factory=list)


async def _phase(
    store: Store, blobs: dict[str, bytes], put_keys: list[str], get_keys: list[str], width: int
) -> Timings:
    """Put ``put_keys`` and get ``get_keys`` (pairwise, one after the other), ``width``
    pairs at a time; the put and get latencies."""
    timings = Timings()
    slots = asyncio.Semaphore(width)

    async def pair(put_key: str, get_key: str) -> None:
        async with slots:
            await _timed(
                timings.puts, timings.put_starts, lambda: store.put(put_key, blobs[put_key])
            )
            data = await _timed(timings.gets, timings.get_starts, lambda: store.get(get_key))
            if data != blobs[get_key]:
                raise SystemExit(f"get of {get_key} returned other bytes")

    async with asyncio.TaskGroup() as group:
        for put_key, get_key in zip(put_keys, get_keys, strict=True):
            group.create_task(pair(put_key, get_key))
    return timings


def _slowest_at(samples: list[float], starts: list[float], origin: float) -> float:
    """When the slowest operation started, in seconds after ``origin``."""
    slowest = max(range(len(samples)), key=samples.__getitem__)
    return round(starts[slowest] - origin, 2)


def _refusals(cluster: LocalCluster) -> dict[str, int]:
    """What the peers' logs say so far: stalls of their event loops, writes not committed."""
    counts = {"stalls_logged": 0, "commits_refused": 0}
    for peer in cluster.cluster.peers:
        if peer.log_file is None or not Path(peer.log_file).exists():
            continue
        text = Path(peer.log_file).read_bytes()
        counts["stalls_logged"] += text.count(b"event loop stalled")
        counts["commits_refused"] += text.count(b"a write is not committed")
    return counts


COUNTERS = ("hedges", "abandoned", "probes")


class FsStore:
    """``sr3://`` puts and gets through one client, or a client per operation; the
    clients' counters (``FsClient.stats``; none in a client without them) summed."""

    def __init__(self, seeds: list[str], secret: str, per_op: bool) -> None:
        self._seeds, self._secret, self._per_op = seeds, secret, per_op
        self._shared = FsClient(seeds, secret)
        self._totals = dict.fromkeys(COUNTERS, 0)

    async def _run(self, op: Callable[[FsClient], Awaitable[Any]]) -> Any:
        if not self._per_op:
            return await op(self._shared)
        async with FsClient(self._seeds, self._secret) as fs:
            try:
                return await op(fs)
            finally:
                for key, value in _counters(fs).items():
                    self._totals[key] += value

    def counters(self) -> dict[str, int]:
        return dict(self._totals) if self._per_op else _counters(self._shared)

    def store(self) -> Store:
        async def put(key: str, data: bytes) -> object:
            return await self._run(lambda fs: fs.write(f"/{key}", data))

        async def get(key: str) -> bytes:
            data: bytes = await self._run(lambda fs: fs.read(f"/{key}"))
            return data

        return Store(put, get)

    async def close(self) -> None:
        await self._shared.close()


def _counters(fs: FsClient) -> dict[str, int]:
    stats = getattr(fs, "stats", None)  # a client from before the probes has none
    return {key: int(getattr(stats, key, 0)) for key in COUNTERS}


def _hedges(client: Client) -> dict[str, int]:
    """The client's counters of what it did around silent peers, so far."""
    stats = client.records.proposer.stats
    return {
        "fast_creates": stats.fast_creates,
        "fast_hedges": getattr(stats, "fast_hedges", 0),  # 0: a client without them
        "rounds_for_reads": client.records.rounds_for_reads,
    }


async def measure(
    cluster: LocalCluster, victim: str, coordinator: str | None, settings: Settings, seed: int
) -> dict[str, Any]:
    """One healthy and one frozen phase; through ``coordinator``'s ``sr3://`` namespace
    when given (the victim itself with ``--frozen coordinator``: the client's first
    seed), else through the ring client."""
    rng = random.Random(seed)
    healthy_keys = [f"bench/gray/healthy-{index}" for index in range(settings.ops)]
    frozen_keys = [f"bench/gray/frozen-{index}" for index in range(settings.ops)]
    blobs = {key: rng.randbytes(settings.size) for key in [*healthy_keys, *frozen_keys]}
    first = cluster.peer(coordinator or victim).address
    seeds = [first] + [a for a in cluster.cluster.addresses if a != first]
    if settings.frozen == "replica":
        seeds = [first]  # as before: the coordinator alone
    fs = FsStore(seeds, cluster.secret, settings.clients == "per-op")
    async with Client(cluster.ring, cluster.secret) as client:
        store = Store(lambda key, data: client.put_bytes(data, key), client.get_bytes)
        if coordinator is not None:
            store = fs.store()
        try:
            healthy = await _phase(store, blobs, healthy_keys, healthy_keys, settings.concurrency)
            before, fs_before, logs_before = _hedges(client), fs.counters(), _refusals(cluster)
            cluster.signal(victim, signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                frozen = await _phase(store, blobs, frozen_keys, healthy_keys, settings.concurrency)
            finally:
                cluster.signal(victim, signal.SIGCONT)
            frozen_s = time.monotonic() - frozen_at
            after, fs_after = _hedges(client), fs.counters()
        finally:
            await fs.close()
        aclose = getattr(client.view, "aclose", None)  # write lanes still in the background
        if aclose is not None:
            await aclose()
    logs_after = _refusals(cluster)
    figures: dict[str, Any] = {"frozen_peer": victim, "frozen_phase_s": round(frozen_s, 2)}
    if coordinator is not None:
        figures["coordinator"] = coordinator
        figures["seeds"] = [cluster.cluster.peers[cluster.cluster.addresses.index(a)].peer_id
                            for a in seeds]  # fmt: skip
    for name, timings in (("healthy", healthy), ("frozen", frozen)):
        figures[name] = {"put": summary(timings.puts), "get": summary(timings.gets)}
    # When the slowest frozen operations started, after the SIGSTOP (the ring removes a
    # silent peer after its 60 s removal grace: an epoch change).
    figures["frozen"]["put"]["max_at_s"] = _slowest_at(frozen.puts, frozen.put_starts, frozen_at)
    figures["frozen"]["get"]["max_at_s"] = _slowest_at(frozen.gets, frozen.get_starts, frozen_at)
    if coordinator is None:  # the coordinator's own client hedged, not this one
        figures["frozen"]["client"] = {key: after[key] - before[key] for key in after}
    else:
        figures["healthy"]["fs_client"] = fs_before
        figures["frozen"]["fs_client"] = {key: fs_after[key] - fs_before[key] for key in fs_after}
        figures["healthy"]["peers"] = logs_before
        figures["frozen"]["peers"] = {key: logs_after[key] - logs_before[key] for key in logs_after}
    return {**figures, **_ratios(figures)}


def _ratios(figures: dict[str, Any]) -> dict[str, Any]:
    """The frozen phase's figures against the healthy one's, and against the bounds."""
    ratios: dict[str, Any] = {}
    for op in ("put", "get"):
        for figure in ("p50", "p99", "max"):
            ratio = figures["frozen"][op][f"{figure}_ms"] / max(
                figures["healthy"][op][f"{figure}_ms"], 1e-9
            )
            ratios[f"{op}_{figure}_ratio_frozen_to_healthy"] = round(ratio, 2)
        slowest_ms = figures["frozen"][op]["max_ms"]
        ratios[f"{op}_max_within_failure_timeout"] = slowest_ms <= FAILURE_TIMEOUT_S * 1000
        ratios[f"{op}_max_within_2s"] = slowest_ms <= SLOWEST_S_TARGET * 1000
    return ratios


@dataclass(frozen=True, slots=True)
class Settings:
    ops: int
    size: int
    peers: int
    concurrency: int
    seed: int
    via: str
    frozen: str = "replica"
    clients: str = "one"


def one_run(settings: Settings, run: int) -> dict[str, Any]:
    """A fresh cluster, one healthy and one frozen phase, the cluster gone after. Run
    ``r`` freezes ``peer-(r mod peers + 1)``; through ``sr3://`` the next peer
    coordinates, or with ``--frozen coordinator`` the frozen one is asked first."""
    seed = settings.seed + run
    victim = f"peer-{run % settings.peers + 1}"
    coordinator = f"peer-{(run + 1) % settings.peers + 1}" if settings.via == "fs" else None
    if settings.frozen == "coordinator":
        coordinator = victim
    with tempfile.TemporaryDirectory(prefix="sr3-bench-gray-") as work_name:
        work = Path(work_name)
        cluster = LocalCluster.create(
            work / "cluster", settings.peers, cluster_file=work / "cluster.json",
            base_port=7950, peer_flags=[*PEER_FLAGS, "--seed", str(seed)],
        )  # fmt: skip
        cluster.up()
        try:
            figures = asyncio.run(measure(cluster, victim, coordinator, settings, seed))
        finally:
            cluster.down(purge=True)
    print(json.dumps({"run": run, **figures}), flush=True)
    return {"run": run, "seed": seed, **figures}


def over_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median and range over the runs of each phase's p50 and max, and of the ratios."""
    spreads: dict[str, Any] = {}
    for phase in ("healthy", "frozen"):
        for op in ("put", "get"):
            for figure in ("p50_ms", "max_ms"):
                values = [run[phase][op][figure] for run in runs]
                spreads[f"{phase}_{op}_{figure}"] = spread(values)
    for op in ("put", "get"):
        for figure in ("p50", "max"):
            key = f"{op}_{figure}_ratio_frozen_to_healthy"
            spreads[key] = spread([run[key] for run in runs])
    return spreads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--size", default="64KiB")
    parser.add_argument("--peers", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="runs, each on a fresh cluster")
    parser.add_argument(
        "--via", choices=("client", "fs"), default="client",
        help="the ring client (put_bytes/get_bytes), or sr3:// writes and reads of a peer",
    )  # fmt: skip
    parser.add_argument(
        "--frozen", choices=("replica", "coordinator"), default="replica",
        help="with --via fs: freeze a peer beside the coordinator, or the one asked first",
    )  # fmt: skip
    parser.add_argument(
        "--clients", choices=("one", "per-op"), default="one",
        help="with --via fs: one sr3:// client, or one per operation",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--label", default="", help="what code was measured (e.g. before)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--baseline", type=Path, help="an earlier run's JSON to include")
    args = parser.parse_args()
    if not 1 <= args.ops <= OPS_MAX or not 1 <= args.concurrency <= CONCURRENCY_MAX:
        raise SystemExit(f"--ops must be in 1..{OPS_MAX}, --concurrency in 1..{CONCURRENCY_MAX}")
    if not 1 <= args.repeat <= REPEAT_MAX:
        raise SystemExit(f"--repeat must be in 1..{REPEAT_MAX}")
    size = parse_size(args.size)
    if args.via != "fs" and (args.frozen != "replica" or args.clients != "one"):
        raise SystemExit("--frozen and --clients are for --via fs")
    settings = Settings(
        args.ops, size, args.peers, args.concurrency, args.seed, args.via, args.frozen, args.clients
    )
    runs = [one_run(settings, run) for run in range(args.repeat)]
    result = {
        "benchmark": "gray",
        "label": args.label,
        "via": args.via,
        "frozen": args.frozen,
        "clients": args.clients,
        "ops": args.ops,
        "size_bytes": size,
        "peers": args.peers,
        "replication": 3,
        "write_quorum": 2,
        "concurrency": args.concurrency,
        "failure_timeout_s": FAILURE_TIMEOUT_S,
        "seed": args.seed,
        "peer_flags": PEER_FLAGS,
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m_after": round(os.getloadavg()[0], 2),
        },
        # The figures of the first run at the top level, as before runs were repeated.
        **{key: value for key, value in runs[0].items() if key not in ("run", "seed")},
        "runs": runs,
        "over_runs": over_runs(runs),
    }
    if args.baseline is not None:
        earlier = json.loads(args.baseline.read_text())
        result["baseline"] = {
            key: earlier[key]
            for key in ("label", "frozen_peer", "frozen_phase_s", "healthy", "frozen", "over_runs")
            if key in earlier
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["over_runs"], indent=2))


if __name__ == "__main__":
    main()
