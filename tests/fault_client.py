"""The client side of the fault lab's scenarios (``tests/faultlab.py``), run as a process
inside one host of the lab (``ip netns exec``): a client reaches peers only as that host
does, so it is on one side of a partition.

Two commands, the secret in ``SR3_SECRET``:

``ready``: wait until every peer of ``--ring`` answers ready and places ``--members``
members; exit 0, or 1 after ``--wait-s``.

``workload``: ``--clients`` clients (each its own ``Client``, so its own proposer) do
compare-and-set creates, updates and reads (no deletes) on ``--keys``
(``histories.client_loop``) until the file ``--stop-file`` exists; then each client
reads every key, retried until a read returns or ``--final-wait-s`` has passed.
With ``--fs``, each client also works the ``sr3://`` namespace (``fs_loop``): it races
every other client of both sides to create the same paths (create-if-absent: the names
change every ``CREATE_SLOT_S`` of the shared monotonic clock), and creates files of its
own and renames them. After the stop each side reads back every path it touched
(``fs_final``). Meanwhile it asks each peer of ``--watch`` for its ring (``GET /v1/ring``) and
configuration (``GET /v1/cluster``), signed, every ``PROBE_INTERVAL_S``. Everything goes
to ``--out`` as JSON lines, times on the machine's monotonic clock (one for every namespace)::

    {"type": "call", "side": "a", "phase": "workload" | "final", ...histories.call_to_json}
    {"type": "probe", "side": "a", "peer": ADDRESS, "at_s": T, "members": [IDS],
     "epoch": N, "config": [IDS], "cluster": ID}      (members: its ring; config: its epoch's)
    {"type": "probe", "side": "a", "peer": ADDRESS, "at_s": T, "error": "..."}
    {"type": "anomaly", "side": "a", "text": "..."}   (an answer no register gives)
    {"type": "fs", "side": "a", "client": N, "op": "create" | "rename", "path": P,
     "target": P2 | null, "data": TEXT, "invoke_s": T, "end_s": T2,
     "outcome": "ok" | "refused" | "unknown", "code": CODE, "error": NAME, "message": TEXT}
    {"type": "fs-final", "side": "a", "path": P, "data": TEXT | null (absent),
     "read": true | false (not readable within --final-wait-s)}

No pickle: what crosses to the test is plain JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import urllib.request
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from histories import MESSAGE_CHARS_MAX, Call, Workload, call_to_json, client_loop, timed_read
from support import HttpProbe

from ring import api
from ring.client import Client, ClientOptions
from ring.cluster import parse_cluster_answer
from ring.errors import NotFound, SR3Error
from ring.transport import Timeouts
from spark_connector.fs_client import FsClient, FsRefused

PROBE_INTERVAL_S = 0.25
PROBE_TIMEOUT_S = 1.0
STOP_POLL_S = 0.05
FINAL_RETRY_S = 0.25
# Rounds of final reads of the namespace, and the pause between two.
FINAL_ROUNDS_MAX = 4
FINAL_SETTLE_S = 2.0
FINAL_READ_S = 5.0
CALLS_MAX = 100_000
HEALTH_TIMEOUT_S = 1.0
# Limits for a LAN where a partition drops packets silently: a connection opens within
# 1.5 s (one lost SYN retried) or the peer is taken as unreachable, and a peer believed
# down gets 0.5 s when it must be asked anyway. With the defaults (3 s, 2 s) a call on a
# cut-off side takes about 9 s to fail, so that side makes one call per client per cut.
CLIENT_OPTIONS = ClientOptions(
    timeouts=Timeouts(connect_s=1.5, read_s=10.0),
    down_probe_s=0.5,
    read_attempt_s=1.0,
    write_attempt_s=2.0,
)


def ready(addresses: list[str], members: int, wait_s: float) -> int:
    """Poll every peer's health (unsigned) until each is ready with ``members`` members."""
    deadline = time.monotonic() + wait_s
    waiting = list(addresses)
    while waiting and time.monotonic() < deadline:
        for address in list(waiting):
            url = f"http://{address}{api.HEALTH.pattern}"
            try:
                with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as answer:
                    health = json.loads(answer.read())
            except (OSError, ValueError):
                continue
            if health.get("ready") and health.get("members") == members:
                waiting.remove(address)
        time.sleep(0.2)
    print(f"not ready after {wait_s} s: {waiting}" if waiting else "ready")
    return 1 if waiting else 0


async def probe_once(probe: HttpProbe, address: str) -> dict[str, Any]:
    """One peer's placement members and configuration epoch, or why not."""
    at_s = time.monotonic()
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            ring = await probe.signed(address, "GET", api.RING.pattern)
            cluster = await probe.signed(address, "GET", api.CLUSTER.pattern)
        if ring.status != 200 or cluster.status != 200:
            return {"peer": address, "at_s": at_s, "error": f"HTTP {ring.status}/{cluster.status}"}
        description = api.RingDescription.from_json(ring.json())
        configuration = parse_cluster_answer(cluster.json()).current
    except (TimeoutError, OSError, SR3Error, ValueError) as exc:
        return {"peer": address, "at_s": at_s, "error": type(exc).__name__}
    return {
        "peer": address,
        "at_s": at_s,
        "members": sorted(member.peer_id for member in description.members),
        "epoch": configuration.epoch,
        "config": sorted(member.peer_id for member in configuration.members),
        "cluster": configuration.cluster,
    }


async def watch(addresses: list[str], secret: str, stop: asyncio.Event) -> list[dict[str, Any]]:
    """Probe every watched peer each interval until ``stop``; every answer and failure."""
    seen: list[dict[str, Any]] = []
    async with HttpProbe(secret) as probe:
        while not stop.is_set():
            seen += await asyncio.gather(*(probe_once(probe, a) for a in addresses))
            await asyncio.sleep(PROBE_INTERVAL_S)
    return seen


async def wait_for_file(path: Path, stop: asyncio.Event, max_s: float) -> None:
    """Set ``stop`` once ``path`` exists, or after ``max_s`` (a bound if the test died)."""
    deadline = time.monotonic() + max_s
    # Another process's signal, through the file system: polled (a stat is quick).
    while not path.exists() and time.monotonic() < deadline:  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(STOP_POLL_S)
    stop.set()


async def final_reads(
    client: Client, number: int, keys: tuple[str, ...], work: Workload, wait_s: float
) -> None:
    """Read every key once it answers, each retried until ``wait_s`` has passed."""
    deadline = time.monotonic() + wait_s
    for key in keys:
        while await timed_read(client, number, key, work) is None:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(FINAL_RETRY_S)


# The namespace workload: contested creates under /fault/create, renames of a client's
# own files under /fault/rename/c<N>.
FS_ROOT = "/fault"
CREATE_SLOT_S = 0.5
CREATE_PATHS_PER_SLOT = 2
FS_PAUSE_S = (0.1, 0.3)
FS_CALLS_MAX = 20_000


async def fs_call(
    number: int,
    op: str,
    paths: tuple[str, str | None],
    data: str,
    timeout_s: float,
    call: Awaitable[object],
) -> dict[str, Any]:
    """One namespace call (``paths``: the path, and a rename's target), as the judge
    reads it: ok, refused (the code says why) or unknown (an error or no answer within
    ``timeout_s``: it may have taken effect)."""
    path, target = paths
    invoke_s = time.monotonic()
    outcome, code, error, message = "ok", "", "", ""
    try:
        async with asyncio.timeout(timeout_s):
            await call
    except FsRefused as exc:
        outcome, code, message = "refused", exc.code, str(exc)[:MESSAGE_CHARS_MAX]
    except NotFound as exc:
        outcome, code, message = "refused", "not_found", str(exc)[:MESSAGE_CHARS_MAX]
    except (SR3Error, TimeoutError) as exc:
        outcome, error, message = "unknown", type(exc).__name__, str(exc)[:MESSAGE_CHARS_MAX]
    return {
        "type": "fs", "client": number, "op": op, "path": path, "target": target,
        "data": data, "invoke_s": invoke_s, "end_s": time.monotonic(), "outcome": outcome,
        "code": code, "error": error, "message": message,
    }  # fmt: skip


async def fs_loop(
    fs: FsClient,
    number: int,
    rng: random.Random,
    stop: asyncio.Event,
    timeout_s: float,
    out: list[dict[str, Any]],
) -> None:
    """Contested creates and renames of own files, until ``stop``."""
    renamed = 0
    while not stop.is_set() and len(out) < FS_CALLS_MAX:
        slot = int(time.monotonic() / CREATE_SLOT_S)
        path = f"{FS_ROOT}/create/{slot}-{rng.randrange(CREATE_PATHS_PER_SLOT)}"
        data = f"c{number}.{slot}.{rng.randrange(10**9)}"
        write = fs.write(path, data.encode())
        out.append(await fs_call(number, "create", (path, None), data, timeout_s, write))
        source = f"{FS_ROOT}/rename/c{number}/{renamed}.tmp"
        target = f"{FS_ROOT}/rename/c{number}/{renamed}"
        data = f"c{number}.r{renamed}.{rng.randrange(10**9)}"
        write = fs.write(source, data.encode())
        created = await fs_call(number, "create", (source, None), data, timeout_s, write)
        out.append(created)
        if created["outcome"] == "ok":
            rename = fs.rename(source, target)
            out.append(await fs_call(number, "rename", (source, target), data, timeout_s, rename))
        renamed += 1
        await asyncio.sleep(rng.uniform(*FS_PAUSE_S))


async def fs_final(
    fs: FsClient, calls: list[dict[str, Any]], wait_s: float
) -> list[dict[str, Any]]:
    """Read back every path ``calls`` touched (a rename's both ends), each retried until
    it answers (its bytes, or absent) or ``wait_s`` has passed; round after round (at
    most ``FINAL_ROUNDS_MAX``, ``FINAL_SETTLE_S`` apart) until two agree: a call cut at
    the client may still be running on its coordinator, and a rename that commits
    between the reads of its two ends would read absent at both."""
    paths = sorted({c["path"] for c in calls} | {c["target"] for c in calls if c["target"]})
    deadline = time.monotonic() + wait_s
    previous: list[dict[str, Any]] | None = None
    found: list[dict[str, Any]] = []
    for _round in range(FINAL_ROUNDS_MAX):
        found = [await _read_back(fs, path, deadline) for path in paths]
        if found == previous or time.monotonic() >= deadline:
            break
        previous = found
        await asyncio.sleep(FINAL_SETTLE_S)
    return found


async def _read_back(fs: FsClient, path: str, deadline: float) -> dict[str, Any]:
    data: str | None = None
    read = False
    while not read and time.monotonic() < deadline:
        try:
            async with asyncio.timeout(FINAL_READ_S):
                data = (await fs.read(path)).decode()
            read = True
        except NotFound:
            data, read = None, True
        except (SR3Error, TimeoutError):
            await asyncio.sleep(FINAL_RETRY_S)
    return {"type": "fs-final", "path": path, "data": data, "read": read}


def lines(side: str, phase: str, calls: list[Call]) -> list[dict[str, Any]]:
    return [{"type": "call", "side": side, "phase": phase, **call_to_json(c)} for c in calls]


async def workload(options: argparse.Namespace, secret: str) -> list[dict[str, Any]]:
    keys = tuple(options.keys.split(","))
    rng = random.Random(options.seed)
    # Origin 0: times are the machine's monotonic clock, as the test's are.
    work = Workload(
        keys, CALLS_MAX, call_timeout_s=options.call_timeout_s, origin_s=0.0, delete_share=0.0
    )
    clients = [Client(options.ring, secret, options=CLIENT_OPTIONS) for _ in range(options.clients)]
    fs_clients = [
        FsClient(options.ring, secret) for _ in range(options.clients if options.fs else 0)
    ]
    fs_calls: list[dict[str, Any]] = []
    fs_found: list[dict[str, Any]] = []
    watch_stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as group:
            watcher = group.create_task(watch(options.watch, secret, watch_stop))
            group.create_task(wait_for_file(Path(options.stop_file), work.stop, options.max_s))
            async with asyncio.TaskGroup() as loops:
                for number, client in enumerate(clients, start=options.first_client):
                    client_rng = random.Random(rng.randrange(2**32))
                    loops.create_task(client_loop(client, number, client_rng, work))
                for number, fs in enumerate(fs_clients, start=options.first_client):
                    fs_rng = random.Random(rng.randrange(2**32))
                    loops.create_task(
                        fs_loop(fs, number, fs_rng, work.stop, options.call_timeout_s, fs_calls)
                    )
            during = list(work.calls)
            final = Workload(keys, CALLS_MAX, call_timeout_s=options.call_timeout_s, origin_s=0.0)
            async with asyncio.TaskGroup() as reads:
                for number, client in enumerate(clients, start=options.first_client):
                    reads.create_task(
                        final_reads(client, number, keys, final, options.final_wait_s)
                    )
                if fs_clients:
                    fs_read = reads.create_task(
                        fs_final(fs_clients[0], fs_calls, options.final_wait_s)
                    )
            if fs_clients:
                fs_found = fs_read.result()
            watch_stop.set()
    finally:
        for client in clients:
            await client.close()
        for fs in fs_clients:
            await fs.close()
    side = options.side
    probes = [{"type": "probe", "side": side, **probe} for probe in watcher.result()]
    anomalies = [
        {"type": "anomaly", "side": side, "text": text}
        for text in [*work.anomalies, *final.anomalies]
    ]
    return [
        *lines(side, "workload", during),
        *lines(side, "final", final.calls),
        *probes,
        *anomalies,
        *({"side": side, **call} for call in fs_calls),
        *({"side": side, **found} for found in fs_found),
    ]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    wait = commands.add_parser("ready")
    wait.add_argument("--ring", required=True, type=lambda text: text.split(","))
    wait.add_argument("--members", required=True, type=int)
    wait.add_argument("--wait-s", type=float, default=60.0)
    run = commands.add_parser("workload")
    run.add_argument("--ring", required=True)
    run.add_argument("--side", required=True)
    run.add_argument("--keys", required=True)
    run.add_argument("--clients", type=int, default=2)
    run.add_argument("--first-client", type=int, default=0)
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--stop-file", required=True)
    run.add_argument("--out", required=True)
    run.add_argument("--watch", type=lambda text: [a for a in text.split(",") if a], default=[])
    run.add_argument("--call-timeout-s", type=float, default=10.0)
    run.add_argument("--final-wait-s", type=float, default=30.0)
    run.add_argument("--max-s", type=float, default=600.0)
    run.add_argument("--fs", action="store_true", help="work the sr3:// namespace too")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    options = parse(argv)
    if options.command == "ready":
        return ready(options.ring, options.members, options.wait_s)
    secret = os.environ["SR3_SECRET"]
    records = asyncio.run(workload(options, secret))
    out = Path(options.out)
    partial = out.with_name(out.name + ".partial")
    partial.write_text("".join(json.dumps(record) + "\n" for record in records))
    partial.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
