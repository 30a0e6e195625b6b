"""``sr3 drill --spark-standby`` end to end, small, as an operator runs it.

What it breaks: the active application's whole process group (Python and JVM) and R-1 =
2 of 5 peers are SIGKILLed at the same moment, once it committed a third of the input.
What must hold: the standby takes the query over with fence 2 from the killed
application, resumes after a batch the killed one committed, runs to the last batch, and
the output (the killed application's and the standby's, replays counted once) and the
state equal an uninterrupted run's; the report says so and the exit code is 0. Twice:
local checkpoints kept by StateSync with foreachBatch output, and one sr3:// checkpoint
shared by both applications (fenced commits) with Spark's parquet file sink.

The pieces the drill judges by (the file sink's committed files, merged outputs) are
checked without Spark.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import require_spark

from ring.errors import ConfigError
from sr3.standby_drill import StandbyDrillOptions, committed_parquet_files, merge_outputs

REPORT_FIELDS = {
    "took_over", "fence", "previous", "resumed_after", "catch_up_bytes", "takeover_s",
    "first_commit_s", "lease_timeout_s", "output_matched", "state_matched", "killed_peers",
}  # fmt: skip
# A drill starts three Spark applications on a ring; a busy two-core machine needs time.
DRILL_TIMEOUT_S = 900


def _drill(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    report = tmp_path / "drill.json"
    completed = subprocess.run(
        [sys.executable, "-m", "sr3", "drill", "--spark-standby", *args, "--json", str(report)],
        check=False, capture_output=True, text=True, timeout=DRILL_TIMEOUT_S,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    assert report.exists(), output
    return completed.returncode, json.loads(report.read_text()), output


@pytest.mark.slow
@pytest.mark.standby
@pytest.mark.timeout(DRILL_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    ("mode", "sink", "master"),
    [("sync", "foreach", "local[2]"), ("fs", "files", "local-cluster[2,1,1024]")],
)
def test_standby_takes_over_after_the_active_app_and_two_peers_die(
    tmp_path: Path, mode: str, sink: str, master: str
) -> None:
    """sr3:// with executors in JVMs of their own (local-cluster): they write the state
    straight to the ring, the drivers fence their commits."""
    require_spark()
    code, report, output = _drill(
        tmp_path, "--checkpoint-mode", mode, "--sink", sink, "--files", "12", "--seed", "3",
        "--master", master,
    )  # fmt: skip
    assert code == 0, output
    assert set(report) >= REPORT_FIELDS, report
    assert report["ok"] and report["took_over"] and report["finished"], output
    assert report["active_fence"] == 1 and report["fence"] == 2
    assert report["previous"] == "drill-a"
    assert len(report["killed_peers"]) == 2
    assert report["output_matched"] and report["state_matched"], output
    assert report["rows_reference"] > 0 and report["rows_after"] == report["rows_reference"]
    # The standby resumes after a batch the killed app committed, never beyond it.
    assert report["resumed_after"] is not None
    assert 0 <= report["resumed_after"] <= report["killed_after_batch"]
    assert report["first_batch"] == report["resumed_after"] + 1
    # It takes the lease only once it saw it unchanged for the lease's timeout.
    assert report["waited_s"] >= report["lease_timeout_s"]
    assert 0 < report["takeover_s"] <= report["first_commit_s"]
    assert "MATCH" in output and "MISMATCH" not in output


def test_the_drill_refuses_options_of_the_other_mode(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "sr3", "drill", "--spark-standby", "--ring", "127.0.0.1:1"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert completed.returncode == 1
    assert "--ring: not for --spark-standby" in completed.stderr
    completed = subprocess.run(
        [sys.executable, "-m", "sr3", "drill", "--sink", "files"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert completed.returncode == 1 and "--sink: not for the recovery drill" in completed.stderr


def test_options_keep_a_majority_of_peers_and_a_valid_lease() -> None:
    with pytest.raises(ConfigError, match="majority"):
        StandbyDrillOptions(peers=4, replication=3)
    with pytest.raises(ConfigError, match="checkpoint mode"):
        StandbyDrillOptions(checkpoint_mode="hdfs")
    options = StandbyDrillOptions(files=12, lease_timeout_s=0.6)
    assert options.renew_every_s < 0.6 / 2
    assert options.kill_after_batch == 3 and options.until_batch == 12


def test_the_standby_s_batches_replace_the_killed_app_s() -> None:
    row = ("2024-01-01T00:00:00", "k0", 1)
    other = ("2024-01-01T00:01:00", "k1", 2)
    active = {0: [], 1: [row], 2: [other]}  # batch 2 ran again on the standby
    standby = {2: [other], 3: [], 4: [row]}
    assert merge_outputs(active, standby, 3) == {0: [], 1: [row], 2: [other], 3: []}


def test_only_files_the_sink_log_lists_are_committed(tmp_path: Path) -> None:
    log = tmp_path / "_spark_metadata"
    log.mkdir()
    paths = [tmp_path / f"part-{index}.parquet" for index in range(4)]
    for path in paths:
        path.write_bytes(b"")

    def entry(path: Path, action: str = "add") -> str:
        return json.dumps({"path": path.as_uri(), "size": 0, "action": action})

    (log / "0").write_text(f"v1\n{entry(paths[0])}\n")
    (log / "1.compact").write_text(f"v1\n{entry(paths[0])}\n{entry(paths[1])}\n")
    (log / "2").write_text(f"v1\n{entry(paths[2])}\n")
    (log / ".3.tmp").write_text(f"v1\n{entry(paths[3])}\n")  # never renamed into place
    assert committed_parquet_files(tmp_path) == [p.resolve() for p in paths[:3]]
