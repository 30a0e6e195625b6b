"""``sr3 spark list`` shows each query's lease and standbys; ``sr3 spark standby``
refuses bad settings in one line and, with Spark, drives a query to a given batch; the
lease's Prometheus gauges follow a take and a release.

The listing tests write lease and standby status records by hand (what a holder and a
standby write), so they need no Spark.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from support import require_spark

from ring.lease import first_lease
from ring.sync_client import SyncClient
from spark_connector.lease import QueryLease, lease_key, read_lease
from spark_connector.manifest import manifest_key
from spark_connector.standby import STATUS_REFRESH_S, StandbyStatus, standbys_prefix
from sr3.local import LocalCluster
from sr3.standby_app import read_events

COMMAND_TIMEOUT_S = 120


def _env(cluster: LocalCluster | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SR3_")}
    if cluster is not None:
        env["SR3_CLUSTER_FILE"] = str(cluster.cluster_file)
    return env


def _sr3(cluster: LocalCluster | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sr3", *args], env=_env(cluster), capture_output=True,
        text=True, timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip


def _ok(cluster: LocalCluster | None, *args: str) -> str:
    done = _sr3(cluster, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _block(stdout: str, query: str) -> list[str]:
    """The lines ``sr3 spark list`` prints for ``query``: its own, then the indented."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{query}  "))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def _write_records(client: SyncClient, driven: str, leased: str, now: float) -> None:
    """``driven``: two batches, a lease (fence 2, a 120 s timeout: fresh however slow
    the listing) renewed just now noting batch 7, one standby a batch behind (its status
    written before that batch, saying it was not).
    ``leased``: a lease only, not renewed for 100 s, and a standby silent as long."""
    for batch_id in (6, 7):
        client.put_record(manifest_key(driven, batch_id), b"{}", expected_version=0)
    lease = (
        first_lease("host-a:101", 120.0, now - 120)
        .taken_by("host-a:101", 120.0, now - 60)
        .renewed(now - 0.5, {"batch": 7})
    )
    client.put_record(lease_key(driven), lease.encode(), expected_version=0)
    # It reported no lag when it wrote this; the listing counts it against batch 7.
    status = StandbyStatus("host-b:202", "sync", 6, 0, 123456, 4096, now - 1)
    client.put_record(standbys_prefix(driven) + "host-b:202", status.encode(), expected_version=0)

    stale = first_lease("host-c:303", 3.0, now - 300).renewed(now - 100, {"batch": 41})
    client.put_record(lease_key(leased), stale.encode(), expected_version=0)
    silent = StandbyStatus("host-d:404", "fs", 40, 1, 0, 0, now - 3 * STATUS_REFRESH_S - 10)
    client.put_record(standbys_prefix(leased) + "host-d:404", silent.encode(), expected_version=0)


def test_spark_list_shows_each_querys_lease_and_standbys(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: nothing; records written as a holder and a standby write them. Must hold:
    the text and JSON listings show the holder, fence, newest batch and each standby's
    batch and lag; a query with a lease and no manifests is listed; a lease not renewed
    for longer than its timeout reads "lapsed?", a standby quiet for three refresh
    periods "silent", and fresh ones neither."""
    driven, leased = f"driven{rng.randrange(10**9)}", f"leased{rng.randrange(10**9)}"
    with SyncClient(ring.ring, ring.secret) as client:
        _write_records(client, driven, leased, time.time())

    listed = _ok(ring, "spark", "list")
    head, lease_line, standby_line = _block(listed, driven)
    assert head == f"{driven}  latest 7  batches 6, 7"
    assert re.match(r"  lease    host-a:101  fence 2  held for \d+\.\d s  renewed ", lease_line)
    assert "newest batch 7" in lease_line and "lapsed?" not in lease_line, lease_line
    assert standby_line.startswith("  standby  host-b:202 (sync)  batch 6  behind 1 batches, "
                                   "120.6 KiB  updated "), standby_line  # fmt: skip
    assert "silent" not in standby_line, standby_line

    head, lease_line, standby_line = _block(listed, leased)
    assert head == f"{leased}  no batches on the ring"
    assert "host-c:303  fence 1" in lease_line and "lapsed? (timeout 3 s)" in lease_line
    assert "newest batch 41" in lease_line, lease_line
    assert "host-d:404 (fs)  batch 40" in standby_line and standby_line.endswith("  silent")

    entries = {e["query"]: e for e in json.loads(_ok(ring, "spark", "list", "--json"))["queries"]}
    entry = entries[driven]
    assert (entry["batches"], entry["latest"]) == ([6, 7], 7)
    lease = entry["lease"]
    assert (lease["holder"], lease["fence"], lease["batch"]) == ("host-a:101", 2, 7)
    assert (lease["released"], lease["lapsed"]) == (False, False)
    assert 59 < lease["held_for_s"] < 59 + COMMAND_TIMEOUT_S, lease
    [standby] = entry["standbys"]
    assert (standby["holder"], standby["mode"], standby["batch"]) == ("host-b:202", "sync", 6)
    assert (standby["behind_batches"], standby["behind_bytes"], standby["silent"]) == (
        1, 123456, False,
    )  # fmt: skip
    entry = entries[leased]
    assert (entry["batches"], entry["latest"], entry["lease"]["lapsed"]) == ([], None, True)
    assert [s["silent"] for s in entry["standbys"]] == [True]

    only = json.loads(_ok(ring, "spark", "list", "--query", leased, "--json"))["queries"]
    assert [e["query"] for e in only] == [leased] and only[0]["lease"]["holder"] == "host-c:303"


def test_spark_list_shows_a_released_lease(ring: LocalCluster, rng: random.Random) -> None:
    """Must hold: a lease its holder released reads "released", never "lapsed?"."""
    query = f"released{rng.randrange(10**9)}"
    with SyncClient(ring.ring, ring.secret) as client:
        lease = QueryLease(client, query, "host-e:505", timeout_s=1.0, renew_every_s=0.2)
        assert lease.try_acquire() is None
        lease.release()
    time.sleep(1.2)  # longer than the timeout: a lease still held would read lapsed
    _head, lease_line = _block(_ok(ring, "spark", "list", "--query", query), query)
    assert "host-e:505  fence 1" in lease_line and "released " in lease_line, lease_line
    assert "lapsed?" not in lease_line, lease_line


def _assert_one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sr3: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines


def test_spark_standby_help_and_bad_settings(tmp_path: Path) -> None:
    """Must hold: --help works without a ring and names the trigger, the forms of --app
    and exit code 130; a bad --sink, bad lease timing, a bad holder, a demo query without
    --input and an --app that names no file or function are refused before any Spark
    starts, in words, without a traceback."""
    shown = " ".join(_ok(None, "spark", "standby", "--help").split())
    for needle in ("--lease-timeout", "--trigger", "path/to/file.py:function", "130 interrupted"):
        assert needle in shown, shown
    base = ["spark", "standby", "--query", "q1", "--checkpoint", str(tmp_path / "ckpt")]
    demo = [*base, "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")]

    done = _sr3(None, *demo, "--sink", "kafka")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "Invalid value for '--sink': 'kafka' is not one of 'foreach', 'files'" in done.stderr

    _assert_one_line_error(_sr3(None, *demo, "--renew-every", "5"), "renew at most every")
    _assert_one_line_error(_sr3(None, *demo, "--holder", "no spaces"), "lease holder")
    _assert_one_line_error(_sr3(None, *base), "--input and --output")
    _assert_one_line_error(_sr3(None, *base, "--app", "nowhere.py:build"), "not a file")
    _assert_one_line_error(_sr3(None, *base, "--app", "jobs"), "module:function")
    assert not (tmp_path / "ckpt").exists()


def test_lease_gauges_follow_a_take_and_a_release(ring: LocalCluster, rng: random.Random) -> None:
    """Must hold: sr3_lease_held is 1 while this process holds a query's lease, with its
    fence in sr3_lease_fence, and 0 once it released it."""
    query = f"gauges{rng.randrange(10**9)}"
    labels = {"query": query}
    with SyncClient(ring.ring, ring.secret) as client:
        lease = QueryLease(client, query, "host-f:606")
        assert lease.try_acquire() is None
        assert REGISTRY.get_sample_value("sr3_lease_held", labels) == 1
        assert REGISTRY.get_sample_value("sr3_lease_fence", labels) == 1
        lease.release()
        assert REGISTRY.get_sample_value("sr3_lease_held", labels) == 0
        assert read_lease(client, query)[0] is not None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text: str = answer.read().decode()
            return text
    except OSError:
        return ""


@pytest.mark.slow
def test_spark_standby_drives_the_demo_query_to_a_batch(
    ring: LocalCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: nothing; one application, no one holding the query. Must hold: ``sr3
    spark standby`` takes the lease (fence 1), runs the demo query to --until-batch,
    serves sr3_lease_held on --metrics-port meanwhile, writes its events where it said,
    exits 0 and releases the lease, which ``sr3 spark list`` then shows."""
    require_spark()
    from sr3.spark_demo import write_inputs

    query = f"cli{rng.randrange(10**9)}"
    write_inputs(tmp_path / "in", 3, rng.randrange(10**6))
    port = _free_port()
    events = tmp_path / "events.jsonl"
    command = [
        sys.executable, "-m", "sr3", "spark", "standby", "--query", query,
        "--checkpoint", str(tmp_path / "ckpt"), "--input", str(tmp_path / "in"),
        "--output", str(tmp_path / "out"), "--until-batch", "1", "--run-max", "5m",
        "--holder", "cli-test:1", "--events", str(events), "--metrics-port", str(port),
    ]  # fmt: skip
    # Output to files, not pipes: a pipe nobody reads until the end fills up (64 KiB of
    # Spark's log) and stalls the application's JVM in the middle of a write.
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out_path.open("w") as out_file, err_path.open("w") as err_file:
        process = subprocess.Popen(
            command, env=_env(ring), stdout=out_file, stderr=err_file, text=True
        )
    held_seen = False
    try:
        deadline = time.monotonic() + 240
        while process.poll() is None and time.monotonic() < deadline:
            held_seen = held_seen or f'sr3_lease_held{{query="{query}"}} 1.0' in _scrape(port)
            time.sleep(0.2)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    assert process.returncode == 0, (stdout, stderr[-4000:])
    assert f"events in {events}" in stdout, stdout
    assert held_seen, "sr3_lease_held was never 1 on the metrics port"
    kinds = [event["event"] for event in read_events(events)]
    assert kinds[:2] == ["ready", "took_over"] and kinds[-1] == "done", kinds
    listed: dict[str, Any] = json.loads(_ok(ring, "spark", "list", "--query", query, "--json"))
    [entry] = listed["queries"]
    assert entry["lease"]["holder"] == "cli-test:1" and entry["lease"]["fence"] == 1
    assert entry["lease"]["released"] is True, entry
    assert entry["batches"], entry  # StateSync pushed the local checkpoint's batches
