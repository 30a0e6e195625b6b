"""``sr3 drill --spark-rescale`` end to end, small, as an operator runs it.

What it breaks: a stateful query's state is rescaled through the ring mid-stream, from 2
to 4 state partitions: offline (the query stopped, ``sr3 spark rescale``, a new
application restoring from the ring) with R-1 peers SIGKILLed as the rescale starts, and
by a standby started at 4 partitions taking a planned handover. What must hold: each
run's output (every row once) and final state equal an uninterrupted run's at 2
partitions, the report says which batch the rescale wrote, and the exit code is 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import require_spark

from ring.errors import ConfigError
from sr3.rescale_drill import RescaleDrillOptions

DRILL_TIMEOUT_S = 1500


@pytest.mark.slow
@pytest.mark.standby
@pytest.mark.timeout(DRILL_TIMEOUT_S + 60)
def test_a_query_rescaled_offline_and_by_handover_matches_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    require_spark()
    report_path = tmp_path / "drill.json"
    completed = subprocess.run(
        [sys.executable, "-m", "sr3", "drill", "--spark-rescale", "2:4", "--files", "6",
         "--kill-peers", "--json", str(report_path)],
        check=False, capture_output=True, text=True, timeout=DRILL_TIMEOUT_S,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    assert report_path.exists(), output
    report = json.loads(report_path.read_text())
    assert completed.returncode == 0 and report["ok"], output
    runs = {run["mode"]: run for run in report["runs"]}
    assert set(runs) == {"offline", "handover"}
    for run in runs.values():
        assert run["output_matched"] and run["state_matched"], run
        assert run["rows_reference"] > 0 and run["rows_after"] == run["rows_reference"]
        assert len(run["killed_peers"]) == 2 and run["rescaled_batch"] is not None
        assert run["pause_s"] is not None and run["pause_s"] > 0
    assert runs["offline"]["rescale_s"] > 0


def test_the_rescale_drill_refuses_bad_counts() -> None:
    with pytest.raises(ConfigError, match="two different counts"):
        RescaleDrillOptions(from_partitions=4, to_partitions=4)
    with pytest.raises(ConfigError, match="partitions 1 to"):
        RescaleDrillOptions(from_partitions=0)
    with pytest.raises(ConfigError, match="majority"):
        RescaleDrillOptions(kill_peers=True, peers=4)
    completed = subprocess.run(
        [sys.executable, "-m", "sr3", "drill", "--spark-rescale", "4-16"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert completed.returncode == 1 and "FROM:TO" in completed.stderr, completed.stderr
