"""Spark on ``local-cluster`` with ``checkpointLocation = "sr3:///..."``: executors in
their own JVMs write state straight to the ring (``sr3.cluster_app``).

For each query kind: an application processes about half the input, the whole
application (driver and executors) is SIGKILLed, R - 1 peers are SIGKILLed, and a new
application on the same ``sr3://`` path finishes the input. Its output and the
``statestore`` reader's rows must equal those of the same query run without failures
(on a local checkpoint, in the same new application); the executors never saw the
cluster secret (a credential scoped to ``/spark`` only).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from support import MakeCluster, require_spark, spark_credential

from sr3.cluster_app import (
    ClusterJob,
    application_env,
    finish_application,
    kill_application,
    read_outputs,
    rescale_application,
    start_application,
    wait_for_batches,
    write_job_inputs,
)

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

# The peers' default failure timeout and removal grace (5 s, 60 s): with records on
# 2R - 1 acceptors the ring takes every write right after two of five peers die, with no
# membership change to wait for. Only repair runs more often than by default.
PEER_FLAGS = ["--repair-interval", "2"]
INPUT_FILES = 8
# The first application is killed once it committed this many batches' output.
KILL_AFTER_BATCHES = 4
APP_START_S_MAX = 180.0
FINISH_S_MAX = 420.0


def _job(
    tmp_path: Path,
    query: str,
    rng: random.Random,
    input_seed: int = 0,
    *,
    files: int = INPUT_FILES,
    partitions: int = 0,
    secret_file: str = "",
) -> ClusterJob:
    """The job of ``query`` under ``tmp_path``, its first ``files`` input files written."""
    write_job_inputs(query, tmp_path / "input", files, input_seed or rng.randrange(10**6))
    return ClusterJob(
        query=query,
        input_dir=str(tmp_path / "input"),
        checkpoint=f"sr3:///spark/tests/{query}-{rng.randrange(10**9)}",
        output_dir=str(tmp_path / "output"),
        reference_checkpoint=str(tmp_path / "reference-checkpoint"),
        reference_output_dir=str(tmp_path / "reference-output"),
        result_path=str(tmp_path / "result.json"),
        partitions=partitions,
        secret_file=secret_file,
    )


@pytest.mark.parametrize("query", ["window", "dedup", "join", "pandas"])
def test_a_killed_application_and_two_dead_peers_lose_no_state(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path, query: str
) -> None:
    """Breaks: the application SIGKILLed (driver and executors) after about half the
    input, then 2 of 5 peers (R = 3). Must hold: a new application on the same sr3://
    checkpoint finishes with the output and state store rows of an uninterrupted run,
    and neither executors' environment nor the conf holds the cluster secret."""
    require_spark("pandas", "pyarrow")
    cluster = make_cluster(5, peer_flags=PEER_FLAGS)
    job = _job(tmp_path, query, rng)
    env = application_env(cluster.ring, spark_credential(cluster.secret))
    log = tmp_path / "driver.log"
    app = start_application("run", job, env, log)
    try:
        wait_for_batches(app, Path(job.output_dir), KILL_AFTER_BATCHES, log, APP_START_S_MAX)
    finally:
        kill_application(app)
    # What the killed JVMs leave (Spark's folders, extracted native libraries) is in the
    # folder beside the application's log, not in the system's temp folder.
    scratch = tmp_path / "driver.jvm"
    assert any((scratch / "local").glob("blockmgr-*")), sorted(tmp_path.iterdir())
    assert any((scratch / "tmp").iterdir()), sorted(scratch.rglob("*"))
    killed_after = len(read_outputs(Path(job.output_dir)))
    victims = rng.sample([peer.peer_id for peer in cluster.cluster.peers], 2)
    for victim in victims:
        cluster.kill(victim)
    result = finish_application(job, env, log, FINISH_S_MAX)
    context = f"query {query}, peers killed {victims}, rows before the kill {killed_after}"
    assert result.reference_output, context
    assert result.output == result.reference_output, context
    assert result.state == result.reference_state, context
    assert not result.executor_env_has_secret, context
    assert not result.conf_has_secret, context


def test_a_second_application_on_one_checkpoint_fails_and_the_first_keeps_its_state(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Breaks: a second application started on the sr3:// checkpoint a running one
    uses, then new input for both. Must hold: one of them fails as on HDFS (the offset
    log's next file exists: create-if-absent refused), and the checkpoint then finishes
    with the state and output of an uninterrupted run."""
    require_spark()
    cluster = make_cluster(3, peer_flags=PEER_FLAGS)
    seed = rng.randrange(1, 10**6)
    job = _job(tmp_path, "window", rng, seed)
    env = application_env(cluster.ring, spark_credential(cluster.secret))
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = start_application("run", job, env, first_log)
    second_dir = tmp_path / "second"
    second_job = ClusterJob(**{**json.loads(job.to_json()), "output_dir": str(second_dir)})
    second = None
    try:
        wait_for_batches(first, Path(job.output_dir), INPUT_FILES, first_log, APP_START_S_MAX)
        second = start_application("run", second_job, env, second_log)
        deadline = time.monotonic() + APP_START_S_MAX
        while "running" not in second_log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        # New input: both see it, both try to log the next batch; one must lose.
        write_job_inputs("window", Path(job.input_dir), INPUT_FILES + 4, seed)
        deadline = time.monotonic() + APP_START_S_MAX
        while first.poll() is None and second.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        failed = [
            (name, log.read_text()[-20000:])
            for name, app, log in (("first", first, first_log), ("second", second, second_log))
            if app.poll() is not None
        ]
    finally:
        kill_application(first)
        if second is not None:
            kill_application(second)
    assert failed, "both applications ran on one checkpoint"
    # Spark's words when a log's next file exists: found by its check before writing, or
    # by create-if-absent refusing the write (FileAlreadyExistsException), as on HDFS.
    spark_says = ("Multiple streaming jobs detected", "Multiple streaming queries are concurrently")
    assert any(words in text for _name, text in failed for words in spark_says), failed[0][0]
    result = finish_application(job, env, tmp_path / "finish.log", FINISH_S_MAX)
    assert result.state == result.reference_state
    # Each batch's output is in the directory of the application that ran it.
    batches = {p.name: p for p in sorted(second_dir.glob("batch-*.json"))}
    batches |= {p.name: p for p in sorted(Path(job.output_dir).glob("batch-*.json"))}
    rows = sorted(
        (row for p in batches.values() for row in json.loads(p.read_text())), key=json.dumps
    )
    assert rows == result.reference_output


# The rescale's own bound: three applications, each starting a local-cluster.
RESCALE_TEST_S_MAX = 900


@pytest.mark.timeout(RESCALE_TEST_S_MAX)
@pytest.mark.parametrize("query", ["window", "dedup"])
def test_a_checkpoint_on_the_ring_rescaled_in_place_by_executors_runs_on_at_the_new_count(
    make_cluster: MakeCluster, rng: random.Random, tmp_path: Path, query: str
) -> None:
    """Breaks: an application on an sr3:// checkpoint (2 state partitions) SIGKILLed
    after half its input; a second application on local-cluster rescales the checkpoint
    in place to 4 (its executors read and write the partitions on the ring: sr3's runner
    for the HDFS-backed provider of ``window``, Spark's for RocksDB with changelog
    checkpointing of ``dedup``); then the rest of the input arrives. Must hold: a third
    application runs on at 4 partitions, and its output and state store rows, partition
    ids included, equal those of the query run at 4 from its first batch."""
    require_spark()
    cluster = make_cluster(3, peer_flags=PEER_FLAGS)
    seed = rng.randrange(1, 10**6)
    secret_file = tmp_path / "secret"
    secret_file.write_text(cluster.secret)
    secret_file.chmod(0o600)
    job = _job(
        tmp_path, query, rng, seed,
        files=INPUT_FILES // 2, partitions=4, secret_file=str(secret_file),
    )  # fmt: skip
    env = application_env(cluster.ring, spark_credential(cluster.secret))
    app = start_application("run", job, env, tmp_path / "driver.log")
    try:
        wait_for_batches(
            app, Path(job.output_dir), INPUT_FILES // 2, tmp_path / "driver.log", APP_START_S_MAX
        )
    finally:
        kill_application(app)
    said = rescale_application(job, env, tmp_path / "rescale.log", FINISH_S_MAX)
    assert "RESCALED 2 -> 4" in said, said
    write_job_inputs(query, tmp_path / "input", INPUT_FILES, seed)
    result = finish_application(job, env, tmp_path / "finish.log", FINISH_S_MAX)
    assert result.partitions == 4
    assert result.reference_output
    assert result.output == result.reference_output
    assert result.state == result.reference_state
    assert {json.loads(row[1])["partition_id"] for row in result.state} <= set(range(4))
