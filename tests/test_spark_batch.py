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

And a task attempt killed mid-commit: every executor JVM SIGKILLed while one of their
task commits (a directory rename) is under way on the ring; Spark runs the lost tasks
again on new executors, and the table still reads back exactly as on file://, nothing
of a killed attempt added to it.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import require_spark, spark_credential

from filesystem.moves import INTENT_KEY_PREFIX, Intent
from ring.client import Client
from sr3.batch_app import MODES, BatchJob, BatchResult
from sr3.cluster_app import application_env
from sr3.local import LocalCluster
from sr3.process_group import group_pids
from sr3.spark_demo import with_scratch

pytestmark = pytest.mark.slow

ROWS = 200_000
JOB_TIMEOUT_S = 900.0
# The killed job: enough tasks that their commits spread over seconds.
KILLED_JOB_ROWS = 60_000
KILLED_JOB_TASKS = 8
EXECUTOR_MAIN = "CoarseGrainedExecutorBackend"
WATCH_PAUSE_S = 0.01


def test_partitioned_overwrites_commit_on_sr3_as_on_file(
    ring: LocalCluster, rng: random.Random, tmp_path: Path
) -> None:
    require_spark()
    credential = spark_credential(ring.secret)
    job = BatchJob(
        sr3_path=f"sr3:///spark/batch-{rng.randrange(10**9)}",
        local_path=f"file://{tmp_path}/tables",
        modes=tuple(MODES),
        rows=ROWS,
        seed=rng.randrange(10**6),
    )
    done = subprocess.run(
        [sys.executable, "-m", "sr3.batch_app", job.to_json()],
        env=with_scratch(application_env(ring.ring, credential), tmp_path / "jvm"),
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


@pytest.mark.cluster
def test_executors_killed_mid_task_commit_leave_no_partial_output(
    ring: LocalCluster, rng: random.Random, tmp_path: Path
) -> None:
    require_spark()
    credential = spark_credential(ring.secret)
    table = f"/spark/killed-{rng.randrange(10**9)}"
    job = BatchJob(
        sr3_path=f"sr3://{table}",
        local_path=f"file://{tmp_path}/tables",
        rows=KILLED_JOB_ROWS,
        seed=rng.randrange(10**6),
        tasks=KILLED_JOB_TASKS,
        first_write=False,
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "sr3.batch_app", job.to_json()],
        env=with_scratch(application_env(ring.ring, credential), tmp_path / "jvm"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    stop = threading.Event()
    killed: list[str] = []
    watcher = threading.Thread(
        target=lambda: killed.extend(
            asyncio.run(_kill_executors_at_a_task_commit(ring, table, process.pid, stop))
        )
    )
    watcher.start()
    try:
        out, err = process.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        stop.set()
        watcher.join()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    lines = out.splitlines()
    assert process.returncode == 0 and lines, out[-3000:] + err[-6000:]
    assert killed, "no task commit was seen under way: nothing was killed"
    outcome = BatchResult.from_json(lines[-1].removeprefix("RESULT ")).modes["v1"]
    assert outcome.rows["sr3"] == outcome.rows["file"] == KILLED_JOB_ROWS
    assert outcome.digests["sr3"] == outcome.digests["file"]
    assert outcome.partitions["sr3"] == outcome.partitions["file"]


async def _kill_executors_at_a_task_commit(
    ring: LocalCluster, table: str, job_group: int, stop: threading.Event
) -> list[str]:
    """SIGKILL the job's executors the first time a task commit of ``table`` (a rename
    of a task attempt's directory) is seen copying; the rename's source, or nothing."""
    async with Client(ring.ring, ring.secret) as client:
        while not stop.is_set():
            for key in await client.list_records(INTENT_KEY_PREFIX):
                record = await client.get_record(key)
                if record is None:
                    continue
                intent = Intent.decode(record.value)
                attempt = intent.source.startswith(table) and "/_temporary/attempt_" in (
                    intent.source
                )
                if not attempt or intent.state != "copying":
                    continue
                executors = [pid for pid in group_pids(job_group) if _is_executor(pid)]
                for pid in executors:
                    os.kill(pid, signal.SIGKILL)
                if executors:
                    return [intent.source]
            await asyncio.sleep(WATCH_PAUSE_S)
    return []


def _is_executor(pid: int) -> bool:
    try:
        return EXECUTOR_MAIN.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
