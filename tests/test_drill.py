"""``sr3 drill`` end to end on small states, as an operator runs it.

What it breaks: K peers are SIGKILLed at once (locally) or killed through the admin
endpoint (remote ring). What must hold: every topology recovers byte-identical state
when K < R, the report carries the fields operators script against, the ring heals; when
K >= R the drill names the state that became unrecoverable and exits non-zero instead of
pretending; a peer without --enable-admin-kill refuses to be killed remotely.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import next_base_port

from ring.client import Client
from ring.errors import PeerRejected
from sr3.local import LocalCluster

FIELDS = {
    "topology", "recovery_s", "bytes", "throughput_mb_s", "max_fan_in", "verified",
    "bytes_lost", "chosen_by_auto",
}  # fmt: skip


def _drill(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "drill.json"
    completed = subprocess.run(
        [sys.executable, "-m", "sr3", "drill", *args, "--json", str(report)],
        check=False, capture_output=True, text=True, timeout=300,
        env={**os.environ, "SR3_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert report.exists(), completed.stdout + completed.stderr
    return completed.returncode, json.loads(report.read_text())


@pytest.mark.slow
def test_local_drill_recovers_with_every_topology_and_heals(tmp_path: Path) -> None:
    plot = tmp_path / "drill.png"
    code, report = _drill(
        tmp_path, "--peers", "5", "--fail", "2", "--state-size", "8MiB", "--topology", "all",
        "--seed", "3", "--plot", str(plot), "--repeat", "3",
    )  # fmt: skip
    assert code == 0, report
    assert report["seed"] == 3 and len(report["failed_peers"]) == 2
    assert report["heal_s"] is not None and report["chunks_lost_after_heal"] == 0
    results = {entry["topology"]: entry for entry in report["results"]}
    assert set(results) == {"star", "line", "tree"}
    for entry in results.values():
        assert set(entry) >= FIELDS, entry
        assert entry["verified"] and entry["bytes_lost"] == 0 and entry["bytes"] == 8 * 2**20
        assert entry["recovery_s"] > 0 and entry["throughput_mb_s"] > 0
        runs = entry["recovery_s_runs"]
        assert len(runs) == 3 and sorted(runs)[1] == entry["recovery_s"], entry
    assert results["line"]["max_fan_in"] == 1
    assert sum(entry["chosen_by_auto"] for entry in results.values()) == 1
    assert report["auto"]["reason"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_drill_with_k_at_least_r_reports_the_unrecoverable_state(tmp_path: Path) -> None:
    """With 5 peers, R=3, 16 MiB in 4 MiB chunks and seed 1, killing 3 peers takes every
    replica of exactly one chunk (placement is deterministic for this seed)."""
    code, report = _drill(
        tmp_path, "--peers", "5", "--fail", "3", "--state-size", "16MiB", "--topology",
        "star,line", "--seed", "1",
    )  # fmt: skip
    assert code == 2
    assert report["chunks_lost_after_heal"] >= 1
    for entry in report["results"]:
        assert not entry["verified"]
        assert entry["bytes_lost"] == 4 * 2**20
        assert len(entry["missing_chunks"]) == 1
        assert entry["lost_ranges"] and sum(r[1] for r in entry["lost_ranges"]) == 4 * 2**20


@pytest.mark.slow
def test_remote_drill_kills_through_the_admin_endpoint(tmp_path: Path) -> None:
    cluster = LocalCluster.create(
        tmp_path / "ring", 5, cluster_file=tmp_path / "ring.json", base_port=next_base_port(),
        peer_flags=["--enable-admin-kill", "--failure-timeout", "1.5", "--removal-grace", "4",
                    "--repair-interval", "0.5", "--gossip-interval", "0.2"],
    )  # fmt: skip
    cluster.up()
    try:
        secret_file = tmp_path / "secret"
        secret_file.write_text(cluster.secret)
        code, report = _drill(
            tmp_path, "--ring", cluster.ring, "--secret-file", str(secret_file), "--fail", "2",
            "--state-size", "4MiB", "--topology", "tree", "--seed", "5",
        )  # fmt: skip
        assert code == 0, report
        assert [entry["topology"] for entry in report["results"]] == ["tree"]
        for peer_id in report["failed_peers"]:
            assert not cluster.running(peer_id), f"{peer_id} survived the admin kill"
    finally:
        cluster.down(purge=True)


async def test_admin_kill_is_refused_unless_enabled(ring: LocalCluster) -> None:
    async with Client(ring.ring, ring.secret) as client:
        with pytest.raises(PeerRejected) as refused:
            await client.admin_kill("peer-1")
    assert refused.value.status == 403
    assert ring.running("peer-1")
