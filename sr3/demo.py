"""The main job on the embedded default: a local ring loses peers and gives state back.

Brings up a local cluster in a temporary home, stores a generated state file, SIGKILLs
``fail`` peers at once (chosen with a seeded generator), reads the file back, verifies it
byte for byte and prints a short report. Exit code 0 only if the state came back intact.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from sr3.client import Client
from sr3.files import file_digest
from sr3.local import LocalCluster
from sr3.statedata import write_state_file

__all__ = ["run_demo"]


def run_demo(state_bytes: int, *, peers: int = 5, fail: int = 2, seed: int = 7) -> int:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="sr3-demo-") as home_name:
        home = Path(home_name)
        cluster = LocalCluster.create(home / "cluster", peers, cluster_file=home / "cluster.json")
        started = time.monotonic()
        cluster.up()
        try:
            return _exercise(cluster, home, state_bytes, fail, rng, seed, started)
        finally:
            cluster.down(purge=True)


def _exercise(
    cluster: LocalCluster, home: Path, state_bytes: int, fail: int, rng: random.Random,
    seed: int, started: float,
) -> int:  # fmt: skip
    import asyncio

    source = home / "state.bin"
    restored = home / "restored.bin"
    write_state_file(source, state_bytes, seed)
    up_s = time.monotonic() - started
    print(
        f"sr3 demo: {len(cluster.cluster.peers)} peers up in {up_s:.1f} s "
        f"(R={cluster.cluster.replication}, W={cluster.cluster.write_quorum})"
    )

    async def store() -> float:
        async with Client(cluster.ring, cluster.secret) as client:
            begin = time.monotonic()
            await client.store_file(source, "demo/state")
            return time.monotonic() - begin

    async def fetch() -> tuple[float, dict[int, int]]:
        async with Client(cluster.ring, cluster.secret) as client:
            begin = time.monotonic()
            ref = await client.lookup_file("demo/state")
            await client.get_file(ref, restored)
            elapsed = time.monotonic() - begin
            view = await client.ring()
            lost: dict[int, int] = {}
            for extent in ref.extents:
                holders = view.ring.preference_list(extent.chunk_id, view.replication)
                gone = sum(1 for member in holders if member.peer_id in victims)
                lost[gone] = lost.get(gone, 0) + 1
            return elapsed, lost

    put_s = asyncio.run(store())
    print(f"stored {state_bytes / 2**20:.0f} MiB of state in {put_s:.2f} s")
    victims = sorted(rng.sample([p.peer_id for p in cluster.cluster.peers], fail))
    for peer_id in victims:
        cluster.kill(peer_id)
    print(f"SIGKILLed {', '.join(victims) or 'no peers'} (seed {seed})")
    get_s, lost = asyncio.run(fetch())
    replication = cluster.cluster.replication
    for gone, count in sorted(lost.items()):
        print(f"  {count:4d} chunks had {gone} of {replication} replicas on killed peers")
    identical = file_digest(source) == file_digest(restored)
    print(
        f"read back {restored.stat().st_size / 2**20:.0f} MiB in {get_s:.2f} s "
        f"with {len(cluster.cluster.peers) - fail} of {len(cluster.cluster.peers)} peers up"
    )
    print("byte-identical: " + ("yes" if identical else "NO"))
    return 0 if identical else 1
