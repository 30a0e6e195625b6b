"""Spark batch writes on ``sr3://``: ``df.write.partitionBy(...).mode("overwrite")
.parquet("sr3:///...")`` from executors on ``local-cluster`` (``sr3.batch_app``), committed
by Hadoop's ``FileOutputCommitter`` (algorithms 1 and 2) and Spark's commit protocol with
a dynamic partition overwrite, all of which rename directories.

What it breaks: nothing but the committers' expectations of a file system: task
attempt directories renamed into place, task directories merged into the table,
staged partitions moved over old ones, partition values that need escaping in a path.
Must hold: each table reads back with exactly the rows and partition directories of the
same job on file://, nothing of the first write left behind a static overwrite, and no
committer directory (``_temporary``, staging) left in the table.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import require_spark

from ring.auth import scoped_credential
from sr3.batch_app import MODES, BatchJob, BatchResult
from sr3.cluster_app import application_env
from sr3.local import LocalCluster

pytestmark = pytest.mark.slow

ROWS = 200_000
JOB_TIMEOUT_S = 900.0


def test_partitioned_overwrites_commit_on_sr3_as_on_file(
    ring: LocalCluster, rng: random.Random, tmp_path: Path
) -> None:
    require_spark()
    now = int(time.time())
    credential = scoped_credential(ring.secret, "/spark", expires_at=now + 3600, issued_at=now)
    job = BatchJob(
        sr3_path=f"sr3:///spark/batch-{rng.randrange(10**9)}",
        local_path=f"file://{tmp_path}/tables",
        modes=tuple(MODES),
        rows=ROWS,
        seed=rng.randrange(10**6),
    )
    done = subprocess.run(
        [sys.executable, "-m", "sr3.batch_app", job.to_json()],
        env=application_env(ring.ring, credential),
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    result = BatchResult.from_json(lines[-1].removeprefix("RESULT "))
    for mode, outcome in result.modes.items():
        assert outcome.rows["sr3"] == outcome.rows["file"] > 0, mode
        assert outcome.digests["sr3"] == outcome.digests["file"], mode
        assert outcome.partitions["sr3"] == outcome.partitions["file"], mode
        # Spark's escapes of "a/b", "100%" and "k:v" are names like any other.
        assert {"city=a%2Fb", "city=100%25", "city=k%3Av"} <= set(outcome.partitions["sr3"])
    static, dynamic = result.modes["v1"], result.modes["v1-dynamic"]
    assert static.rows["sr3"] == ROWS  # the first write's rows all went
    assert dynamic.rows["sr3"] > ROWS  # its untouched partitions stayed
