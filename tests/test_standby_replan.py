"""A standby resumes the batch its killed predecessor was running, with that batch's
input: two Spark applications in their own processes, local checkpoints kept by
StateSync, the active one SIGKILLed inside a batch.

What it breaks: the active application's sink is stuck inside a batch (its rows are
recorded), a new input file arrives, and the application's whole process group is
SIGKILLed. Its query reads every file present when a batch is planned, so a standby that
planned that batch again would read the new file with it. What must hold: every batch id
has one set of rows across both applications (the standby runs the stuck batch with
exactly the killed one's rows, and the new file in a later batch), every input row is in
some batch, and the standby says it resumed the batch as it was planned.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import require_spark

from sr3.local import LocalCluster
from sr3.process_group import kill_group, log_tail
from sr3.standby_app import StandbyJob, read_events, start

APP = Path(__file__).parent / "fixtures" / "replan_app.py"
WAIT_S = 240.0
LEASE_S = 2.0


def write_rows(directory: Path, index: int, count: int) -> list[str]:
    rows = [f"k{index}-{n}" for n in range(count)]
    temporary = directory / f".in-{index}.tmp"
    temporary.write_text(
        "".join(
            json.dumps({"key": key, "ts": f"2024-01-01T00:{index:02d}:{n:02d}"}) + "\n"
            for n, key in enumerate(rows)
        )
    )
    temporary.rename(directory / f"in-{index:03d}.json")
    return rows


def sink(out: Path, holder: str) -> dict[int, list[list[list[str]]]]:
    """Each batch id's row sets as ``holder``'s sink recorded them (a batch id may run
    more than once, e.g. a replay)."""
    path = out / f"sink-{holder}.jsonl"
    batches: dict[int, list[list[list[str]]]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            batches.setdefault(int(entry["batch"]), []).append(entry["rows"])
    return batches


def wait_for(condition: Callable[[], bool], what: str, apps: list[Any]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        for process, log in apps:
            if process.poll() is not None:
                raise AssertionError(f"{log.name} exited before {what}:\n{log_tail(log, 40)}")
        if time.monotonic() > deadline:
            tails = "\n".join(log_tail(log, 40) for _process, log in apps)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.1)


@contextlib.contextmanager
def launched(job: StandbyJob, env: dict[str, str], home: Path) -> Iterator[Any]:
    log = home / f"{job.holder}.log"
    process = start(job, env, log)
    try:
        yield process, log
    finally:
        kill_group(process)


@pytest.mark.slow
@pytest.mark.standby
@pytest.mark.timeout(900)
def test_a_standby_runs_the_killed_driver_s_batch_with_its_input(
    ring: LocalCluster, tmp_path: Path
) -> None:
    require_spark()
    query = f"replan-{time.monotonic_ns() % 10**9}"
    input_dir, out = tmp_path / "in", tmp_path / "out"
    input_dir.mkdir()
    out.mkdir()
    (out / "block-app-a").write_text("2")  # A's sink sticks in the batch holding file 2
    env = {
        **os.environ, "SR3_RING": ring.ring, "SR3_SECRET": ring.secret,
        "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1",
    }  # fmt: skip

    def job(holder: str, **more: Any) -> StandbyJob:
        return StandbyJob(
            query=query, checkpoint=str(tmp_path / f"ckpt-{holder}"), input_dir=str(input_dir),
            output_dir=str(out), events_path=str(tmp_path / f"events-{holder}.jsonl"),
            holder=holder, lease_timeout_s=LEASE_S, renew_every_s=0.5, trigger_s=0.2,
            app=f"{APP}:build", run_s_max=600.0, **more,
        )  # fmt: skip

    written = write_rows(input_dir, 0, 3)
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(launched(job("app-a"), env, tmp_path))
        wait_for(lambda: _holds(out, "app-a", "k0-"), "A's batch of file 0", [a])
        b = stack.enter_context(launched(job("app-b", stop_idle_s=4.0), env, tmp_path))
        wait_for(lambda: _event(tmp_path, "app-b", "ready") is not None, "B ready", [a, b])
        written += write_rows(input_dir, 1, 4)
        wait_for(lambda: _holds(out, "app-a", "k1-"), "A's batch of file 1", [a, b])
        written += write_rows(input_dir, 2, 5)
        wait_for((out / "inside-app-a").exists, "A stuck inside file 2's batch", [a, b])
        stuck = int((out / "inside-app-a").read_text())
        written += write_rows(input_dir, 3, 6)  # arrives after the batch was planned
        os.killpg(a[0].pid, signal.SIGKILL)
        kill_group(a[0])
        wait_for(lambda: _holds(out, "app-b", "k3-"), "B's batch of file 3", [b])
        try:
            b[0].wait(WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"B did not stop once idle\n{log_tail(b[1], 40)}")
    took = next(
        e for e in read_events(tmp_path / "events-app-b.jsonl") if e["event"] == "took_over"
    )
    assert took["fence"] == 2 and took["previous"] == "app-a", took
    assert took["resumed_after"] is not None and took["resumed_after"] < stuck
    runs_a, runs_b = sink(out, "app-a"), sink(out, "app-b")
    assert stuck in runs_b, "B did not run the batch A was stuck in"
    every: dict[int, list[list[list[str]]]] = {}
    for runs in (runs_a, runs_b):
        for batch, row_sets in runs.items():
            every.setdefault(batch, []).extend(row_sets)
    for batch, row_sets in sorted(every.items()):
        assert all(rows == row_sets[0] for rows in row_sets), (
            f"batch {batch} ran with different rows: {row_sets}"
        )
    assert {key for key, _ts in every[stuck][0]} == {f"k2-{n}" for n in range(5)}
    seen = {key for row_sets in every.values() for rows in row_sets for key, _ts in rows}
    assert seen == set(written)
    assert took["planned"] == stuck, took


def _event(home: Path, holder: str, name: str) -> dict[str, Any] | None:
    events = read_events(home / f"events-{holder}.jsonl")
    return next((event for event in events if event["event"] == name), None)


def _holds(out: Path, holder: str, prefix: str) -> bool:
    return any(
        key.startswith(prefix)
        for row_sets in sink(out, holder).values()
        for rows in row_sets
        for key, _ts in rows
    )
