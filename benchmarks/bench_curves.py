"""How sr3's costs grow: curves for planning a ring, each a JSON file and a PNG plot.

    python benchmarks/bench_curves.py restore   # restore time and rate vs state size, per topology
    python benchmarks/bench_curves.py peers     # write and read throughput vs number of peers
    python benchmarks/bench_curves.py gossip    # gossip bytes per second per peer vs ring size
    python benchmarks/bench_curves.py repair    # time back to R replicas vs data lost
    python benchmarks/bench_curves.py listing   # record listing latency vs records held
    python benchmarks/bench_curves.py plot      # the PNGs again, from the JSON files

Each measurement runs real peer processes on loopback (the listing curve also runs a
peer's record store in process, up to a million records), through the same code as the
other benchmarks (``sr3 drill``, ``bench_store.py``, ``bench_repair.py``), and writes
``benchmarks/results/curve-<name>.json`` and ``curve-<name>.png``. The gossip curve
extends the real measurement (up to 32 peers) with the membership model: the exact
size of the member table a ring of N peers gossips, times the exchanges per second.
All run on the shared 2-core machine: peers, clients and relays compete for the same
cores, so the shapes carry over to a deployment better than the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ring import api
from ring.codec import compact_json
from ring.gossip import FANOUT_DEFAULT
from ring.gossip_wire import GossipMessage, encode_ages, encode_message, table_digest
from ring.membership import Entry
from ring.paxos import Ballot, Value
from ring.records import RecordStore

RESULTS = Path(__file__).resolve().parent / "results"
PYTHON = sys.executable
SR3 = [PYTHON, "-m", "sr3"]
MIB = 1024 * 1024
RESTORE_SIZES = ["64MiB", "256MiB", "1GiB", "4GiB"]
PEER_COUNTS = [3, 5, 8, 12, 16]
GOSSIP_REAL = [4, 8, 16, 32]
GOSSIP_MODEL = [4, 8, 16, 32, 64, 128, 256, 512, 1000]
REPAIR_SIZES = ["128MiB", "256MiB", "512MiB", "1GiB"]
LISTING_COUNTS = [1_000, 10_000, 100_000, 1_000_000]
LISTED_KEYS = 100
# HTTP and signing headers of one gossip message, each way (measured on a real exchange:
# about this much on top of the body).
GOSSIP_HEADER_BYTES = 520


def run(command: list[str], timeout_s: float) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, timeout=timeout_s)


def save(name: str, data: dict[str, Any]) -> Path:
    path = RESULTS / f"curve-{name}.json"
    data["measured"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / f"curve-{name}.json").read_text())
    return data


# -- restore time vs state size -----------------------------------------------------------


def restore_curve(work: Path) -> None:
    points = []
    for size in RESTORE_SIZES:
        out = work / f"drill-{size}.json"
        run([*SR3, "drill", "--peers", "8", "--fail", "2", "--state-size", size,
             "--topology", "star,line,tree", "--seed", "11", "--json", str(out)],
            timeout_s=3600)  # fmt: skip
        drill = json.loads(out.read_text())
        points.append({"size": size, "drill": drill})
    save("restore", {"peers": 8, "failed": 2, "points": points})


# -- throughput vs number of peers --------------------------------------------------------


def peers_curve(work: Path, size: str) -> None:
    points = []
    for peers in PEER_COUNTS:
        out = work / f"store-{peers}.json"
        run([PYTHON, "benchmarks/bench_store.py", "--size", size, "--peers", str(peers),
             "--settle-s", "3", "--out", str(out)], timeout_s=3600)  # fmt: skip
        points.append({"peers": peers, "store": json.loads(out.read_text())})
    save("peers", {"size": size, "points": points})


# -- gossip bytes vs ring size ------------------------------------------------------------


def _model_entries(peers: int) -> list[Entry]:
    return [
        Entry(f"peer-{n:04d}", f"10.0.{n // 250}.{n % 250 + 1}:7401", "", "up",
              1_764_000_000_000 + n, 100_000 + n, 41)
        for n in range(peers)
    ]  # fmt: skip


def gossip_model(peers: int, fanout: int = FANOUT_DEFAULT, interval_s: float = 1.0) -> float:
    """Bytes per second one peer sends and receives in gossip, in a ring of ``peers``
    whose tables agree (``ring.gossip_wire``): each round it starts ``fanout`` exchanges
    and answers about as many, each carrying the epoch, the table's digest and one byte
    of age per peer both ways."""
    entries = _model_entries(peers)
    message = GossipMessage(41, table_digest(entries), encode_ages([0.5] * peers), None, False)
    body_bytes = len(compact_json(encode_message(message)))
    exchanges = 2 * min(fanout, peers - 1)  # started and answered
    return exchanges * 2 * (body_bytes + GOSSIP_HEADER_BYTES) / interval_s


def gossip_model_whole_tables(
    peers: int, fanout: int = FANOUT_DEFAULT, interval_s: float = 1.0
) -> float:
    """The same with the whole member table in every message (before digests)."""
    table_bytes = len(compact_json(api.member_table_body(_model_entries(peers))))
    exchanges = 2 * min(fanout, peers - 1)
    return exchanges * 2 * (table_bytes + GOSSIP_HEADER_BYTES) / interval_s


async def _gossip_traffic(addresses: list[str], secret: str) -> dict[str, dict[str, int]]:
    from ring.transport import Transport

    transport = Transport(secret)
    try:
        traffic = {}
        for address in addresses:
            answer = await transport.request(address, api.INFO.method, api.INFO.pattern)
            traffic[address] = answer.json()["gossip"]
        return traffic
    finally:
        await transport.close()


def gossip_curve(work: Path, window_s: float) -> None:
    from sr3.local import LocalCluster

    real = []
    for peers in GOSSIP_REAL:
        cluster = LocalCluster.create(
            work / f"gossip-{peers}", peers, cluster_file=work / f"g{peers}.json"
        )
        cluster.up()
        try:
            time.sleep(10)  # joined and settled
            addresses = [peer.address for peer in cluster.cluster.peers]
            before = asyncio.run(_gossip_traffic(addresses, cluster.secret))
            time.sleep(window_s)
            after = asyncio.run(_gossip_traffic(addresses, cluster.secret))
        finally:
            cluster.down(purge=True)
        rates = [
            (after[a]["bytes_sent"] + after[a]["bytes_received"]
             - before[a]["bytes_sent"] - before[a]["bytes_received"]
             + GOSSIP_HEADER_BYTES * (after[a]["messages"] - before[a]["messages"])) / window_s
            for a in addresses
        ]  # fmt: skip
        real.append({"peers": peers, "bytes_s_median": statistics.median(rates),
                     "bytes_s_max": max(rates)})  # fmt: skip
        print(f"{peers} peers: {statistics.median(rates) / 1000:.1f} kB/s per peer", flush=True)
    model = [
        {
            "peers": n,
            "bytes_s": gossip_model(n),
            "bytes_s_whole_tables": gossip_model_whole_tables(n),
        }
        for n in GOSSIP_MODEL
    ]
    save("gossip", {"interval_s": 1.0, "fanout": FANOUT_DEFAULT, "window_s": window_s,
                    "real": real, "model": model})  # fmt: skip


# -- repair time vs data lost -------------------------------------------------------------


def repair_curve(work: Path) -> None:
    points = []
    for size in REPAIR_SIZES:
        out = work / f"repair-{size}.json"
        run([PYTHON, "benchmarks/bench_repair.py", "--size", size, "--out", str(out)],
            timeout_s=3600)  # fmt: skip
        points.append({"size": size, "repair": json.loads(out.read_text())})
    save("repair", {"peers": 8, "killed": 2, "points": points})


# -- record listing vs records held ---------------------------------------------------------


def _filled_store(root: Path, records: int) -> RecordStore:
    """A peer's record store holding ``records`` records under ``k/`` (one slot file each,
    written without fsync: the listing, not the writes, is measured)."""
    from ring.paxos import Slot
    from ring.records import _encode

    directory = root / "records"
    directory.mkdir(parents=True)
    store = RecordStore(root)
    ballot = Ballot(1, "aa")
    for number in range(records):
        key = f"k/{number:08d}"
        slot = Slot(ballot, ballot, Value(1, b"x" * 40, (), False, f"{number:024x}"))
        store._path(key).write_bytes(_encode(key, slot))
    store.open()
    return store


def _timed(step: Callable[[], object], repeat: int = 20) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _listing_point(work: Path, records: int) -> dict[str, Any]:
    store = _filled_store(work / f"records-{records}", records)
    middle = f"k/{records // 2:08d}"[:-2]  # a prefix naming 100 keys
    limit = api.LIST_LIMIT_MAX
    return {
        "records": records,
        "prefix_of_100_s": _timed(lambda: store.list(middle, limit)),
        "scan_of_100_s": _timed(lambda: store.scan(middle, limit, head_bytes=21)),
        "page_of_10000_s": _timed(lambda: store.list("k/", limit), repeat=5),
    }


def listing_curve(work: Path) -> None:
    points = []
    for records in LISTING_COUNTS:
        point = _listing_point(work, records)
        points.append(point)
        print(point, flush=True)
        subprocess.run(["rm", "-rf", str(work / f"records-{records}")], check=True)
    save("listing", {"points": points})


# -- plots ----------------------------------------------------------------------------------


def plot_all() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots: dict[str, Callable[[Any], None]] = {
        "restore": _plot_restore, "peers": _plot_peers, "gossip": _plot_gossip,
        "repair": _plot_repair, "listing": _plot_listing,
    }  # fmt: skip
    for name, draw in plots.items():
        if not (RESULTS / f"curve-{name}.json").exists():
            continue
        figure = plt.figure(figsize=(7, 4.2))
        draw(figure)
        figure.tight_layout()
        figure.savefig(RESULTS / f"curve-{name}.png", dpi=90)
        plt.close(figure)
        print(f"wrote {RESULTS / f'curve-{name}.png'}")


def _plot_restore(figure: Any) -> None:
    data = load("restore")
    axes = figure.add_subplot(1, 1, 1)
    for topology in ("star", "line", "tree"):
        xs, ys = [], []
        for point in data["points"]:
            for row in point["drill"]["results"]:
                if row["topology"] == topology and row["verified"]:
                    xs.append(point["drill"]["state_bytes"] / MIB)
                    ys.append(row["recovery_s"])
        axes.plot(xs, ys, marker="o", label=topology)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("state (MiB, raw)")
    axes.set_ylabel("recovery time (s)")
    axes.set_title("Recovery after 2 of 8 peers fail, by topology")
    axes.legend()


def _plot_peers(figure: Any) -> None:
    data = load("peers")
    axes = figure.add_subplot(1, 1, 1)
    for operation in ("write", "read"):
        xs = [p["peers"] for p in data["points"]]
        ys = [p["store"]["sr3_mb_s"][operation] for p in data["points"]]
        axes.plot(xs, ys, marker="o", label=f"sr3 {operation}")
    baseline = [p["store"]["baseline_mb_s"]["write"] for p in data["points"]]
    axes.axhline(statistics.median(baseline), linestyle=":", color="grey",
                 label="bare aiohttp PUT (no replication), median")  # fmt: skip
    axes.set_xlabel("peers (R=3)")
    axes.set_ylabel("MB/s")
    axes.set_ylim(bottom=0)
    axes.set_title(f"Throughput of {data['size']} vs ring size (one 2-core machine)")
    axes.legend()


def _plot_gossip(figure: Any) -> None:
    data = load("gossip")
    axes = figure.add_subplot(1, 1, 1)
    axes.plot([p["peers"] for p in data["model"]], [p["bytes_s"] / 1000 for p in data["model"]],
              label="model (digest + ages x exchanges)")  # fmt: skip
    whole = [p.get("bytes_s_whole_tables") for p in data["model"]]
    if all(whole):
        axes.plot([p["peers"] for p in data["model"]], [w / 1000 for w in whole], "--",
                  label="model, whole tables (before)")  # fmt: skip
    real = data["real"]
    axes.plot([p["peers"] for p in real], [p["bytes_s_median"] / 1000 for p in real], "o",
              label="measured, real peers (median)")  # fmt: skip
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("peers in the ring")
    axes.set_ylabel("gossip kB/s per peer (sent + received)")
    axes.set_title("Membership traffic per peer, 1 s interval, fanout 3")
    axes.legend()


def _plot_repair(figure: Any) -> None:
    data = load("repair")
    axes = figure.add_subplot(1, 1, 1)
    lost = [p["repair"]["repair_bytes"] / 1e6 for p in data["points"]]
    axes.plot(lost, [p["repair"]["full_replication_after_kill_s"] for p in data["points"]],
              marker="o", label="back to 3 replicas (incl. 5 s detection and grace)")  # fmt: skip
    axes.plot(lost, [p["repair"]["repair_s"] for p in data["points"]], marker="o",
              label="of which copying")  # fmt: skip
    axes.set_xlabel("data re-replicated (MB)")
    axes.set_ylabel("seconds")
    axes.set_ylim(bottom=0)
    axes.set_title("Repair after 2 of 8 peers are SIGKILLed")
    axes.legend()


def _plot_listing(figure: Any) -> None:
    data = load("listing")
    axes = figure.add_subplot(1, 1, 1)
    xs = [p["records"] for p in data["points"]]
    for key, label in (("prefix_of_100_s", "list a prefix of 100 keys"),
                       ("scan_of_100_s", "scan a prefix of 100 keys"),
                       ("page_of_10000_s", "list a page of 10 000 keys")):  # fmt: skip
        axes.plot(xs, [p[key] * 1000 for p in data["points"]], marker="o", label=label)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("records the peer holds")
    axes.set_ylabel("ms per call (the peer's part)")
    axes.set_title("Record listing on one peer vs records held")
    axes.legend()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "curve", choices=["restore", "peers", "gossip", "repair", "listing", "plot"]
    )
    parser.add_argument("--size", default="256MiB", help="peers curve: bytes written and read")
    parser.add_argument("--window-s", type=float, default=20.0, help="gossip: seconds measured")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sr3-curves-") as temporary:
        work = Path(temporary)
        steps: dict[str, Callable[[], None]] = {
            "restore": lambda: restore_curve(work),
            "peers": lambda: peers_curve(work, args.size),
            "gossip": lambda: gossip_curve(work, args.window_s),
            "repair": lambda: repair_curve(work),
            "listing": lambda: listing_curve(work),
            "plot": lambda: None,
        }
        steps[args.curve]()
    plot_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
