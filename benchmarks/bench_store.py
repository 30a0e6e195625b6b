"""Store and restore throughput of an sr3 ring against a bare HTTP object store.

One run measures, on the same machine and data:

- **baseline**: a bare aiohttp server in its own process on 127.0.0.1 that writes each
  ``PUT /obj/{n}`` body to a file (no fsync, no verification, no compression) and answers
  ``GET /obj/{n}`` with the file. The client sends the file in sr3's chunk size with sr3's
  number of concurrent transfers over one ``aiohttp.ClientSession`` and reads it back into
  a file in order. No replication.
- **sr3**: a local cluster of ``--peers`` peer processes (R=3, W=2 by default) and
  ``ring.client.Client``: ``put_file`` (chunked, compressed, replicated, fsynced, verified
  on the peer before it is written) and ``get_file`` (verified end to end, fsynced).

Both outputs are compared with the input by SHA-256 (not timed). Throughput is MB/s of
raw data (10^6 bytes/s); the ratios sr3/baseline are checked against the targets (read
>= 0.9x, write >= 0.6x). Each repeat starts a fresh cluster and a fresh baseline server;
the medians are reported. Every timed phase starts after ``sync`` and ``--settle-s`` idle
seconds (see ``timed``). Context recorded with the figures: the compression ratio (bytes
stored on all peers / (raw size x R)), and the CPU seconds of the client and of the
server processes in each phase, as "cores busy": a figure near the core count means the
phase is CPU-bound on this machine, where client and servers share the cores.

Differences kept on purpose: the baseline sends every byte once and raw, sr3 sends
compressed bytes R times; sr3's read fsyncs its output (``get_file`` is atomic and
durable), the baseline's does not. Run from the repository root:

    python benchmarks/bench_store.py [--size 1GiB] [--peers 5] [--repeat 1]
                                     [--out benchmarks/results/store.json]

The baseline server is ``baseline_server.py``, in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from baseline_server import start_baseline_server, stop_process
from proc_cpu import cpu_delta, cpu_seconds, cpu_sum

from ring.client import Client, ClientOptions
from ring.config import parse_size
from ring.heap import keep_buffers
from sr3.local import LocalCluster
from sr3.statedata import write_state_file

T = TypeVar("T")
RESULTS_PATH_DEFAULT = Path(__file__).resolve().parent / "results" / "store.json"
SEED = 20_240_601
MB = 1_000_000
TARGET_WRITE_RATIO = 0.6
TARGET_READ_RATIO = 0.9
# TLS on every hop against the same without (issue 27): write and read.
TARGET_TLS_RATIO = 0.8
HASH_BLOCK_BYTES = 8 * 1024 * 1024
REPLICATION = 3
SETTLE_S_DEFAULT = 10.0
WRITE_QUORUM = 2
OPERATIONS = ("write", "read")


@dataclass(frozen=True, slots=True)
class Setup:
    """What every measurement of a run shares."""

    work: Path
    path: Path
    source_sha256: str
    peers: int
    options: ClientOptions
    settle_s: float


@dataclass(frozen=True, slots=True)
class Phase:
    """One timed phase: wall seconds, and CPU seconds (user + system) of the client
    process and of the server processes together (None where /proc is unavailable)."""

    seconds: float
    client_cpu_s: float | None
    servers_cpu_s: float | None

    @property
    def cores_busy(self) -> float | None:
        if self.client_cpu_s is None or self.servers_cpu_s is None:
            return None
        return (self.client_cpu_s + self.servers_cpu_s) / self.seconds


@dataclass(frozen=True, slots=True)
class Trial:
    """One repeat of one system: writing the whole file, then reading it back."""

    write: Phase
    read: Phase
    # sr3 only: what the peers hold afterwards (all replicas, stored form).
    stored_bytes: int | None = None
    chunk_count: int | None = None


async def timed(
    action: Awaitable[T], server_pids: Sequence[int], settle_s: float
) -> tuple[T, Phase]:
    """Await ``action`` and measure it, after a settling period that is not timed.

    Dirty pages of earlier phases are flushed first, so that one phase's writeback does
    not land in the next one's time. Then the machine idles for ``settle_s``: on virtual
    machines that hand freed memory back to the host (virtio-balloon free page
    reporting), writing into memory freed moments ago is several times cheaper than into
    memory freed long ago, so without a pause a phase that follows a large delete (of
    the previous phase's files) would be measured on cheaper memory than the others.
    """
    await asyncio.to_thread(os.sync)
    await asyncio.sleep(settle_s)
    client_before, servers_before = cpu_seconds(os.getpid()), cpu_sum(server_pids)
    started = time.perf_counter()
    result = await action
    seconds = time.perf_counter() - started
    client_cpu_s = cpu_delta(cpu_seconds(os.getpid()), client_before)
    return result, Phase(seconds, client_cpu_s, cpu_delta(cpu_sum(server_pids), servers_before))


# -- baseline client ---------------------------------------------------------------------


async def baseline_write(
    session: aiohttp.ClientSession, base_url: str, path: Path, chunk_bytes: int, transfers: int
) -> int:
    """PUT the file in ``chunk_bytes`` pieces, ``transfers`` at a time; the piece count."""
    slots = asyncio.Semaphore(transfers)

    async def send(index: int, body: bytes) -> None:
        try:
            async with session.put(f"{base_url}/obj/{index}", data=body) as answer:
                await answer.read()
                if answer.status != 201:
                    raise RuntimeError(f"baseline PUT {index} answered {answer.status}")
        finally:
            slots.release()

    count = 0
    handle = await asyncio.to_thread(open, path, "rb")
    with handle:
        async with asyncio.TaskGroup() as group:
            while True:
                await slots.acquire()
                body = await asyncio.to_thread(handle.read, chunk_bytes)
                if not body:
                    slots.release()
                    break
                group.create_task(send(count, body))
                count += 1
    return count


async def baseline_read(
    session: aiohttp.ClientSession, base_url: str, out_path: Path, count: int, transfers: int
) -> None:
    """GET pieces ``0..count-1``, ``transfers`` ahead, and write them to a file in order."""

    async def fetch(index: int) -> bytes:
        async with session.get(f"{base_url}/obj/{index}") as answer:
            body = await answer.read()
            if answer.status != 200:
                raise RuntimeError(f"baseline GET {index} answered {answer.status}")
            return body

    pending: deque[asyncio.Task[bytes]] = deque()
    handle = await asyncio.to_thread(open, out_path, "wb")
    with handle:
        async with asyncio.TaskGroup() as group:
            for index in range(count):
                if len(pending) >= transfers:
                    handle.write(await pending.popleft())
                pending.append(group.create_task(fetch(index)))
            while pending:
                handle.write(await pending.popleft())


async def baseline_round(setup: Setup, base_url: str, server_pid: int, out_path: Path) -> Trial:
    transfers, chunk_bytes = setup.options.transfers_max, setup.options.chunk_bytes
    connector = aiohttp.TCPConnector(limit=transfers)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        count, write = await timed(
            baseline_write(session, base_url, setup.path, chunk_bytes, transfers),
            [server_pid],
            setup.settle_s,
        )
        _, read = await timed(
            baseline_read(session, base_url, out_path, count, transfers),
            [server_pid],
            setup.settle_s,
        )
    return Trial(write, read)


def measure_baseline(setup: Setup, repeat: int) -> Trial:
    directory = setup.work / f"baseline-{repeat}"
    out_path = setup.work / "baseline.out"
    process, base_url = start_baseline_server(directory, setup.work / "baseline-server.log")
    try:
        trial = asyncio.run(baseline_round(setup, base_url, process.pid, out_path))
    finally:
        stop_process(process)
    check_identical(setup, out_path, "baseline")
    out_path.unlink()
    remove_tree(directory)
    return trial


# -- sr3 ---------------------------------------------------------------------------------


async def sr3_round(setup: Setup, cluster: LocalCluster, out_path: Path) -> Trial:
    peer_pids = [peer.pid for peer in cluster.cluster.peers if peer.pid is not None]
    options = replace(setup.options, tls=cluster.client_tls)
    async with Client(cluster.ring, cluster.secret, options=options) as client:
        await client.ring()
        # The chunk layer alone (no naming record), as the baseline stores bare files.
        ref, write = await timed(client.chunks.put_file(setup.path), peer_pids, setup.settle_s)
        _, read = await timed(client.chunks.get_file(ref, out_path), peer_pids, setup.settle_s)
        status = await client.status()
    down = [peer.peer_id for peer in status.peers if peer.stored_bytes is None]
    if down:
        raise RuntimeError(f"peers did not answer the status probe: {down}")
    if (status.replication, status.write_quorum) != (REPLICATION, WRITE_QUORUM):
        raise RuntimeError(f"the ring runs R={status.replication} W={status.write_quorum}")
    return Trial(
        write,
        read,
        stored_bytes=sum(peer.stored_bytes or 0 for peer in status.peers),
        chunk_count=sum(peer.chunk_count or 0 for peer in status.peers),
    )


def measure_sr3(setup: Setup, repeat: int, *, tls: bool = False) -> Trial:
    """One sr3 round on a fresh cluster; with ``tls``, HTTPS on every hop and client
    certificates required (``sr3 cluster up --tls``)."""
    home = setup.work / f"cluster-{repeat}{'-tls' if tls else ''}"
    out_path = setup.work / "sr3.out"
    cluster = LocalCluster.create(
        home,
        setup.peers,
        replication=REPLICATION,
        write_quorum=WRITE_QUORUM,
        cluster_file=home / "cluster.json",
        tls=tls,
    )
    try:
        cluster.up()
        trial = asyncio.run(sr3_round(setup, cluster, out_path))
    finally:
        cluster.down(purge=True)
    check_identical(setup, out_path, "sr3")
    out_path.unlink()
    remove_tree(home)
    return trial


# -- helpers and report ------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(HASH_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def check_identical(setup: Setup, copy: Path, label: str) -> None:
    if sha256_file(copy) != setup.source_sha256:
        raise RuntimeError(f"{label}: the file read back differs from the original")


def remove_tree(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def mb_s(size_bytes: int, seconds: float) -> float:
    return size_bytes / MB / seconds


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def summary(size_bytes: int, trials: Sequence[Trial]) -> dict[str, dict[str, Any]]:
    """Per operation: median MB/s, each run's MB/s and the median CPU figures."""
    result: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        phases: list[Phase] = [getattr(trial, op) for trial in trials]
        runs = [mb_s(size_bytes, phase.seconds) for phase in phases]
        result[op] = {
            "mb_s": statistics.median(runs),
            "mb_s_runs": runs,
            "client_cpu_s": median_or_none([phase.client_cpu_s for phase in phases]),
            "servers_cpu_s": median_or_none([phase.servers_cpu_s for phase in phases]),
            "cores_busy": median_or_none([phase.cores_busy for phase in phases]),
        }
    return result


def build_report(
    size_bytes: int, setup: Setup, base: list[Trial], ours: list[Trial]
) -> dict[str, Any]:
    baseline, sr3 = summary(size_bytes, base), summary(size_bytes, ours)
    ratios = {op: sr3[op]["mb_s"] / baseline[op]["mb_s"] for op in OPERATIONS}
    targets = {"write": TARGET_WRITE_RATIO, "read": TARGET_READ_RATIO}
    stored_bytes = statistics.median(trial.stored_bytes or 0 for trial in ours)
    return {
        "benchmark": "store",
        "size_bytes": size_bytes,
        "peers": setup.peers,
        "replication": REPLICATION,
        "write_quorum": WRITE_QUORUM,
        "chunk_bytes": setup.options.chunk_bytes,
        "transfers_max": setup.options.transfers_max,
        "repeat": len(ours),
        "settle_s": setup.settle_s,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "baseline_mb_s": {op: baseline[op]["mb_s"] for op in OPERATIONS},
        "sr3_mb_s": {op: sr3[op]["mb_s"] for op in OPERATIONS},
        "ratio": ratios,
        "target_ratio": targets,
        "target_met": {op: ratios[op] >= targets[op] for op in OPERATIONS},
        "compression_ratio": stored_bytes / (size_bytes * REPLICATION),
        "stored_bytes": stored_bytes,
        "chunk_count": statistics.median(trial.chunk_count or 0 for trial in ours),
        "baseline": baseline,
        "sr3": sr3,
        "notes": [
            "MB/s = raw bytes / 10^6 / wall seconds of the phase, median over repeats",
            "baseline: one raw copy per byte, no fsync, no verification, no compression",
            "sr3: zstd-compressed chunks on R peers, fsynced and verified on each peer; "
            "the read is verified end to end and fsyncs its output",
            "cores_busy = (client + server CPU seconds) / wall seconds of the phase",
        ],
        "runs": {
            "baseline": [asdict(trial) for trial in base],
            "sr3": [asdict(trial) for trial in ours],
        },
    }


def _cores(figure: float | None) -> str:
    return "  n/a" if figure is None else f"{figure:5.2f}"


def print_report(report: dict[str, Any]) -> None:
    header = (
        f"{'':>6} | {'baseline MB/s':>13} | {'sr3 MB/s':>9} | {'ratio':>6} | {'target':>13} | "
        f"cores busy (baseline, sr3)"
    )
    print(header)
    print("-" * len(header))
    for op in OPERATIONS:
        met = "ok" if report["target_met"][op] else "MISSED"
        print(
            f"{op:>6} | {report['baseline_mb_s'][op]:>13.1f} | {report['sr3_mb_s'][op]:>9.1f} | "
            f"{report['ratio'][op]:>5.2f}x | >={report['target_ratio'][op]:.2f}x {met:>6} | "
            f"{_cores(report['baseline'][op]['cores_busy'])} "
            f"{_cores(report['sr3'][op]['cores_busy'])}"
        )
    print(
        f"\nsize {report['size_bytes'] / 2**20:.0f} MiB, peers {report['peers']}, "
        f"R={report['replication']} W={report['write_quorum']}, "
        f"chunk {report['chunk_bytes'] / 2**20:.0f} MiB x {report['transfers_max']} in flight, "
        f"cores {report['cores']}, repeat {report['repeat']} (median)\n"
        f"compression ratio (stored on peers / (raw x R)): {report['compression_ratio']:.3f}"
    )


def describe(size_bytes: int, trial: Trial) -> str:
    return ", ".join(
        f"{op} {mb_s(size_bytes, phase.seconds):.0f} MB/s, {_cores(phase.cores_busy).strip()} cores"
        for op, phase in (("write", trial.write), ("read", trial.read))
    )


def tls_report(size_bytes: int, plain: list[Trial], secured: list[Trial]) -> dict[str, Any]:
    """sr3 with TLS on every hop against sr3 without, each repeat on fresh clusters
    measured back to back: per-repeat ratios (TLS / plain MB/s), median and range."""
    ratios: dict[str, dict[str, float]] = {}
    for op in OPERATIONS:
        each = [
            (size_bytes / getattr(tls_trial, op).seconds)
            / (size_bytes / getattr(plain_trial, op).seconds)
            for plain_trial, tls_trial in zip(plain, secured, strict=True)
        ]
        ratios[op] = {
            "median": statistics.median(each), "min": min(each), "max": max(each),
        }  # fmt: skip
    return {
        "sr3_tls": summary(size_bytes, secured),
        "ratio_tls_plain": ratios,
        "target_ratio": TARGET_TLS_RATIO,
        "runs": [asdict(trial) for trial in secured],
    }


def write_report(report: dict[str, Any], out: Path) -> None:
    """Write atomically so a reader never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_suffix(out.suffix + ".tmp")
    temporary.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(temporary, out)


def run(
    size_bytes: int,
    peers: int,
    repeat: int,
    settle_s: float,
    out: Path,
    log: Callable[[str], None],
    *,
    compare_tls: bool = False,
    keep_client_buffers: bool = False,
) -> None:
    # This process runs both clients and, like a user's process that uses sr3's library,
    # keeps glibc's default thresholds (sr3's own processes keep their chunk buffers,
    # ``ring.heap``; ``--keep-buffers`` sets the same here, for both clients).
    heap_kept = keep_buffers() if keep_client_buffers else False
    options = ClientOptions()
    base: list[Trial] = []
    ours: list[Trial] = []
    secured: list[Trial] = []
    load_average = os.getloadavg()[0]
    if load_average > 1.0:
        log(f"warning: load average {load_average:.2f} before the run; figures will be noisy")
    with tempfile.TemporaryDirectory(prefix="sr3-bench-store-") as temporary:
        work = Path(temporary)
        log(f"generating {size_bytes} bytes of state-like data")
        write_state_file(work / "state.bin", size_bytes, SEED)
        source_sha256 = sha256_file(work / "state.bin")
        setup = Setup(work, work / "state.bin", source_sha256, peers, options, settle_s)
        for index in range(repeat):
            base.append(measure_baseline(setup, index))
            log(f"baseline {index + 1}/{repeat}: {describe(size_bytes, base[-1])}")
            ours.append(measure_sr3(setup, index))
            log(f"sr3      {index + 1}/{repeat}: {describe(size_bytes, ours[-1])}")
            if compare_tls:
                secured.append(measure_sr3(setup, index, tls=True))
                log(f"sr3 tls  {index + 1}/{repeat}: {describe(size_bytes, secured[-1])}")
    report = build_report(size_bytes, setup, base, ours)
    report["load_average_1m_before"] = load_average
    report["client_heap_kept"] = heap_kept
    if compare_tls:
        report["tls"] = tls_report(size_bytes, ours, secured)
    print_report(report)
    write_report(report, out)
    print(f"\nwrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", default="1GiB", help="raw bytes to store (e.g. 256MiB)")
    parser.add_argument("--peers", type=int, default=5, help="peers in the local cluster")
    parser.add_argument("--repeat", type=int, default=1, help="repeats; medians are reported")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH_DEFAULT, help="JSON results")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=SETTLE_S_DEFAULT,
        help="idle seconds before each timed phase (see timed())",
    )
    parser.add_argument(
        "--compare-tls",
        action="store_true",
        help="also measure sr3 with TLS on every hop (client certificates required) after "
        "each plain round, and report TLS / plain",
    )
    parser.add_argument(
        "--keep-buffers",
        action="store_true",
        help="keep chunk buffers in this process, which runs both clients (ring.heap)",
    )
    args = parser.parse_args(argv)
    size_bytes = parse_size(args.size)
    if size_bytes <= 0 or args.peers < REPLICATION or args.repeat < 1 or args.settle_s < 0:
        parser.error("--size must be positive, --peers at least 3 (R=3), --repeat at least 1")
    run(
        size_bytes,
        args.peers,
        args.repeat,
        args.settle_s,
        args.out,
        lambda line: print(line, flush=True),
        compare_tls=args.compare_tls,
        keep_client_buffers=args.keep_buffers,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
