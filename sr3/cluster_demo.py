"""The main job on a Spark cluster (``sr3 demo --cluster``): executors write state
straight to the ring through ``sr3://``; the whole application and two storage peers
die; a new application carries on from the same path.

``run_cluster_demo``, in a temporary home that is always cleaned up:

1. a local ring of ``peers`` peers comes up, and a credential scoped to ``/spark`` is
   minted (the application never sees the cluster secret);
2. a windowed count (``sr3.cluster_app``, ``local-cluster[2,1,1024]``: two executor
   JVMs) checkpoints to ``sr3:///spark/demo/...``, one input file per trigger;
3. after ``kill_after`` batches the application (driver and executors) is SIGKILLed,
   then ``fail`` peers;
4. a new application on the same ``sr3://`` path finishes the input, then runs the same
   query without failures on a local checkpoint;
5. outputs and the ``statestore`` reader's rows of both are compared. Exit code 0 only
   on a match.
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ring.auth import scoped_credential
from ring.errors import SR3Error
from sr3.cluster_app import (
    ClusterJob,
    application_env,
    finish_application,
    kill_application,
    read_outputs,
    start_application,
    wait_for_batches,
    write_job_inputs,
)
from sr3.local import BASE_PORT_DEFAULT, LocalCluster

__all__ = ["ClusterDemoOptions", "run_cluster_demo"]

# The peers' default flags (failure timeout 5 s, removal grace 60 s): records live on
# 2R - 1 acceptors and chunks fall back along their preference lists, so the ring takes
# every write right after two peers die, with no membership change to wait for.
PEER_FLAGS: tuple[str, ...] = ()
APP_START_S_MAX = 180.0
FINISH_S_MAX = 420.0
CREDENTIAL_S = 3600


@dataclass(frozen=True, slots=True)
class ClusterDemoOptions:
    query: str = "window"
    batches: int = 10
    kill_after: int = 4
    peers: int = 5
    fail: int = 2
    seed: int = 7
    base_port: int = BASE_PORT_DEFAULT


def run_cluster_demo(options: ClusterDemoOptions, console: Console | None = None) -> int:
    console = console or Console()
    if options.fail >= options.peers or options.kill_after >= options.batches:
        raise SR3Error("--fail must be below --peers and the kill before the last batch")
    rng = random.Random(options.seed)
    with tempfile.TemporaryDirectory(prefix="sr3-cluster-demo-") as home_text:
        home = Path(home_text)
        cluster = LocalCluster.create(
            home / "ring", options.peers, base_port=options.base_port,
            cluster_file=home / "cluster.json", peer_flags=list(PEER_FLAGS),
        )  # fmt: skip
        try:
            cluster.up()
            return _run(options, cluster, home, rng, console)
        finally:
            cluster.down(purge=True)


def _run(
    options: ClusterDemoOptions,
    cluster: LocalCluster,
    home: Path,
    rng: random.Random,
    console: Console,
) -> int:
    now = int(time.time())
    credential = scoped_credential(
        cluster.secret, "/spark", expires_at=now + CREDENTIAL_S, issued_at=now
    )
    write_job_inputs(options.query, home / "input", options.batches, options.seed)
    job = ClusterJob(
        query=options.query,
        input_dir=str(home / "input"),
        checkpoint=f"sr3:///spark/demo/{options.query}",
        output_dir=str(home / "output"),
        reference_checkpoint=str(home / "reference-checkpoint"),
        reference_output_dir=str(home / "reference-output"),
        result_path=str(home / "result.json"),
    )
    env = application_env(cluster.ring, credential)
    console.print(
        f"ring of {options.peers} peers up; application on local-cluster[2,1,1024] "
        f"checkpoints to {job.checkpoint} with a credential scoped to /spark"
    )
    log = home / "application.log"
    started = time.monotonic()
    app = start_application("run", job, env, log)
    try:
        wait_for_batches(app, Path(job.output_dir), options.kill_after, log, APP_START_S_MAX)
    finally:
        kill_application(app)
    rows_before = len(read_outputs(Path(job.output_dir)))
    console.print(
        f"SIGKILLed the application (driver and executors) after {options.kill_after} "
        f"batches ({rows_before} rows out) at {time.monotonic() - started:.0f} s"
    )
    victims = sorted(rng.sample([peer.peer_id for peer in cluster.cluster.peers], options.fail))
    for victim in victims:
        cluster.kill(victim)
    console.print(f"SIGKILLed peers {', '.join(victims)}")
    result = finish_application(job, env, home / "finish.log", FINISH_S_MAX)
    console.print(
        f"a new application finished the input on the same path in {result.finish_s:.1f} s"
    )
    checks = {
        "output equals an uninterrupted run's": result.output == result.reference_output,
        "state store rows equal an uninterrupted run's": result.state == result.reference_state,
        "no executor saw the cluster secret": not result.executor_env_has_secret
        and not result.conf_has_secret,
    }
    for name, ok in checks.items():
        console.print(f"{'MATCH' if ok else 'MISMATCH'}  {name}")
    console.print(
        f"{len(result.output)} output rows, {len(result.state)} state rows; "
        f"total {time.monotonic() - started:.0f} s"
    )
    return 0 if all(checks.values()) and result.reference_output else 1
