"""``sr3 demo``: the end-to-end demonstration on a local cluster."""

from __future__ import annotations

import sys

import click

from ring.config import parse_size
from sr3.cli._shared import fail_cleanly


@click.command()
@click.option("--batches", default=12, show_default=True, type=click.IntRange(3, 600),
              help="Input files, one micro-batch each.")  # fmt: skip
@click.option("--kill-at", default=5, show_default=True, type=click.IntRange(0, 597),
              help="SIGKILL the driver once the ring holds this batch.")  # fmt: skip
@click.option("--peers", default=5, show_default=True, type=click.IntRange(3, 50))
@click.option("--fail", "fail_count", default=2, show_default=True, type=click.IntRange(0, 49))
@click.option("--seed", default=7, show_default=True, type=int)
@click.option("--storage-only", is_flag=True,
              help="No Spark: store a state file, kill --fail peers, read it back.")  # fmt: skip
@click.option("--cluster", "on_cluster", is_flag=True,
              help="Spark on local-cluster (executor JVMs) checkpointing to sr3:///.")  # fmt: skip
@click.option("--state-size", default="64MiB", show_default=True,
              help="Size of the state file (--storage-only).")  # fmt: skip
@fail_cleanly
def demo(
    batches: int, kill_at: int, peers: int, fail_count: int, seed: int, storage_only: bool,
    on_cluster: bool, state_size: str,
) -> None:  # fmt: skip
    """The main job: a Spark query loses its driver, its checkpoint and --fail peers,
    restores its state from the ring and produces exactly the output of a run without
    failures (needs sr3[spark] and Java 17). With --cluster: executors in their own JVMs
    checkpoint straight to sr3:///, the whole application and --fail peers die, and a new
    application carries on from the same path."""
    from sr3.demo import SparkDemoOptions, run_demo, run_spark_demo

    if storage_only:
        sys.exit(run_demo(parse_size(state_size), peers=peers, fail=fail_count, seed=seed))
    if on_cluster:
        from sr3.cluster_demo import ClusterDemoOptions, run_cluster_demo

        cluster_options = ClusterDemoOptions(
            batches=batches, kill_after=kill_at, peers=peers, fail=fail_count, seed=seed
        )
        sys.exit(run_cluster_demo(cluster_options))
    options = SparkDemoOptions(
        batches=batches, kill_at=kill_at, peers=peers, fail=fail_count, seed=seed
    )
    sys.exit(run_spark_demo(options))
