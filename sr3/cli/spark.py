"""``sr3 spark``: Spark queries' state on the ring (list, restore, forget), the conf
a session needs to checkpoint to ``sr3://`` (conf), and an application that drives a
query or stands by to take it over (standby)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ring.config import Settings, resolve_tls
from ring.errors import ConfigError, ProtocolError, SR3Error
from ring.lease import (
    DRIFT_DEFAULT,
    RENEW_EVERY_S_DEFAULT,
    TIMEOUT_S_DEFAULT,
    check_holder,
    check_timing,
)
from ring.sync_client import SyncClient
from sr3.cli._shared import (
    client_options,
    describe_error,
    fail,
    fail_cleanly,
    human_size,
    ring_options,
    ring_settings,
)
from sr3.standby_app import SINKS

if TYPE_CHECKING:
    from ring.lease import Lease
    from spark_connector.fs_checkpoints import FsCheckpoint
    from spark_connector.restore import RestoreReport
    from spark_connector.standby import StandbyStatus

# A standby whose status is older than this many refresh periods is shown "silent".
SILENT_REFRESHES = 3


@click.group()
def spark() -> None:
    """Spark queries' state on the ring: list, restore, forget; conf; standby."""


@spark.command("list")
@click.option("--query", help="Only this query.")
@click.option("--fs-root", default="/spark", show_default=True,
              help="Where to look for sr3:// checkpoints.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@ring_options
@fail_cleanly
def spark_list(
    query: str | None, fs_root: str, as_json: bool, ring: str | None, secret_file: Path | None
) -> None:
    """Queries with state on the ring (pushed by StateSync) or a lease (sr3 spark
    standby): the batches kept for each, which application drives it and which stand
    by; then the checkpoints Spark wrote to sr3:// under --fs-root.

    Ages ("held for", "renewed ... ago", "updated ... ago") subtract wall-clock times
    written on other machines from this machine's clock: they are as good as the clocks'
    agreement. "lapsed?" (not renewed for longer than the lease's timeout) is advisory:
    standbys judge a lapse on their own monotonic clocks. A standby is "silent" when its
    status was not updated for three refresh periods."""
    from spark_connector.fs_checkpoints import find_checkpoints
    from spark_connector.fs_client import FsClient
    from spark_connector.sync import ring_queries

    settings = ring_settings(ring, secret_file)
    with SyncClient(settings.ring, settings.secret, options=client_options(settings)) as client:
        queries = ring_queries(client, query)
        entries = _query_entries(client, query, queries, time.time())

    async def checkpoints() -> list[FsCheckpoint]:
        async with FsClient(
            settings.ring, settings.secret, tls=resolve_tls(settings.cluster)
        ) as fs:
            return await find_checkpoints(fs, fs_root)

    found = [] if query else asyncio.run(checkpoints())
    if as_json:
        paths = [
            {"checkpoint": f"sr3://{c.path}", "latest_committed": c.latest_committed} for c in found
        ]
        click.echo(json.dumps({"queries": entries, "checkpoints": paths}, indent=2))
        return
    if not entries and not found:
        click.echo(f"no query has state on the ring, and no sr3:// checkpoint is under {fs_root}")
        return
    for entry in entries:
        for line in _query_lines(entry):
            click.echo(line)
    for checkpoint in found:
        latest = checkpoint.latest_committed
        click.echo(
            f"sr3://{checkpoint.path}  latest committed "
            + ("none" if latest is None else str(latest))
        )


def _query_entries(
    client: SyncClient, query: str | None, queries: dict[str, list[int]], now: float
) -> list[dict[str, Any]]:
    """Each query with manifests or a lease record: its batches, lease and standbys
    (``now``: this machine's wall clock, for the ages)."""
    from spark_connector.lease import read_lease
    from spark_connector.manifest import check_query_name

    keys = client.list_records(f"spark/{check_query_name(query)}/" if query else "spark/")
    leased: set[str] = set()
    standbys: dict[str, list[str]] = {}
    for key in keys:
        parts = key.split("/")
        if len(parts) == 3 and parts[2] == "lease":
            leased.add(parts[1])
        elif len(parts) == 4 and parts[2] == "standbys":
            standbys.setdefault(parts[1], []).append(key)
    entries = []
    for name in sorted(set(queries) | leased):
        batches = queries.get(name, [])
        lease: dict[str, Any] | None = None
        if name in leased:
            try:
                found, _version = read_lease(client, name)
                lease = None if found is None else _describe_lease(found, now)
            except (ProtocolError, ConfigError) as exc:  # not a lease, or not a query name
                lease = {"error": str(exc)}
        described = _read_standbys(client, sorted(standbys.get(name, [])), now)
        _behind_now(described, batches, lease)
        entries.append({
            "query": name, "batches": batches, "latest": batches[-1] if batches else None,
            "lease": lease, "standbys": described,
        })  # fmt: skip
    return entries


def _behind_now(
    standbys: list[dict[str, Any]], batches: list[int], lease: dict[str, Any] | None
) -> None:
    """Each standby's lag in batches as of this listing: the newest batch the ring
    knows (its newest manifest, or the one the holder noted in the lease) less the
    standby's, not the lag it reported when it last wrote its status."""
    known = [*batches[-1:], *([lease["batch"]] if lease and lease.get("batch") is not None else [])]
    if not known:
        return
    newest = max(known)
    for standby in standbys:
        if standby.get("batch") is not None:
            standby["behind_batches"] = max(0, newest - standby["batch"])


def _read_standbys(client: SyncClient, keys: list[str], now: float) -> list[dict[str, Any]]:
    """The status records at ``keys`` (one that is not a status says why)."""
    from spark_connector.standby import StandbyStatus

    described = []
    for key in keys:
        record = client.get_record(key)
        if record is None:  # dropped since the listing: that standby stopped
            continue
        try:
            described.append(_describe_standby(StandbyStatus.decode(record.value), now))
        except (ValueError, KeyError, TypeError) as exc:
            described.append({"holder": key.rsplit("/", 1)[-1], "error": f"unreadable: {exc}"})
    return described


def _describe_lease(lease: Lease, now: float) -> dict[str, Any]:
    """A lease as ``sr3 spark list`` shows it. ``lapsed`` is advisory (wall clocks)."""
    note = lease.note or {}
    batch = note.get("batch")
    renewed_ago_s = now - lease.renewed_at
    return {
        "holder": lease.holder,
        "fence": lease.fence,
        "timeout_s": lease.timeout_s,
        "acquired_at": lease.acquired_at,
        "renewed_at": lease.renewed_at,
        "held_for_s": round(now - lease.acquired_at, 3),
        "renewed_ago_s": round(renewed_ago_s, 3),
        "released": lease.released,
        "lapsed": not lease.released and renewed_ago_s > lease.timeout_s,
        "batch": batch if isinstance(batch, int) and not isinstance(batch, bool) else None,
    }


def _describe_standby(status: StandbyStatus, now: float) -> dict[str, Any]:
    from spark_connector.standby import STATUS_REFRESH_S

    updated_ago_s = now - status.updated_at
    return {
        "holder": status.holder,
        "mode": status.mode,
        "batch": status.batch,
        "behind_batches": status.behind_batches,
        "behind_bytes": status.behind_bytes,
        "pulled_bytes_last": status.pulled_bytes_last,
        "updated_at": status.updated_at,
        "updated_ago_s": round(updated_ago_s, 3),
        "silent": updated_ago_s > SILENT_REFRESHES * STATUS_REFRESH_S,
    }


def _query_lines(entry: dict[str, Any]) -> list[str]:
    batches = entry["batches"]
    shown = ", ".join(str(batch) for batch in batches)
    lines = [
        f"{entry['query']}  latest {batches[-1]}  batches {shown}"
        if batches
        else f"{entry['query']}  no batches on the ring"
    ]
    if entry["lease"] is not None:
        lines.append(f"  lease    {_lease_text(entry['lease'])}")
    lines.extend(f"  standby  {_standby_text(standby)}" for standby in entry["standbys"])
    return lines


def _lease_text(lease: dict[str, Any]) -> str:
    if "error" in lease:
        return f"unreadable: {lease['error']}"
    state = (
        f"released {lease['renewed_ago_s']:.1f} s ago"
        if lease["released"]
        else f"renewed {lease['renewed_ago_s']:.1f} s ago"
        + (f"  lapsed? (timeout {lease['timeout_s']:g} s)" if lease["lapsed"] else "")
    )
    batch = lease["batch"]
    return (
        f"{lease['holder']}  fence {lease['fence']}  held for {lease['held_for_s']:.1f} s  "
        + state
        + ("" if batch is None else f"  newest batch {batch}")
    )


def _standby_text(standby: dict[str, Any]) -> str:
    if "error" in standby:
        return f"{standby['holder']}  {standby['error']}"
    batch = standby["batch"]
    return (
        f"{standby['holder']} ({standby['mode']})  batch {'-' if batch is None else batch}  "
        f"behind {standby['behind_batches']} batches, {human_size(standby['behind_bytes'])}  "
        f"updated {standby['updated_ago_s']:.1f} s ago" + ("  silent" if standby["silent"] else "")
    )


@spark.command("restore")
@click.option("--query", help="Name the query was registered under (StateSync).")
@click.option("--from", "source", help="An sr3:// checkpoint to copy instead.")
@click.option("--to", "target", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Checkpoint directory to create (empty or absent).")  # fmt: skip
@click.option("--batch", "batch_id", type=click.IntRange(0), help="Batch (default: newest).")
@click.option("--topology", default="auto", show_default=True,
              help="star, line, tree[:FANOUT] or auto.")  # fmt: skip
@click.option("--overwrite", is_flag=True, help="Replace a non-empty --to directory.")
@ring_options
@fail_cleanly
def spark_restore(
    query: str | None, source: str | None, target: Path, batch_id: int | None, topology: str,
    overwrite: bool, ring: str | None, secret_file: Path | None,
) -> None:  # fmt: skip
    """Restore a query's checkpoint directory from the ring (--query), or copy an sr3://
    checkpoint into a local directory (--from); start the query on it."""
    from spark_connector.sync import StateSync

    settings = ring_settings(ring, secret_file)
    if (query is None) == (source is None):
        fail("name exactly one of --query (pushed by StateSync) and --from (an sr3:// path)")
    if source is not None:
        if batch_id is not None or overwrite:
            fail("--batch and --overwrite go with --query; --from copies the whole checkpoint")
        files, size = asyncio.run(_copy_checkpoint(settings.ring, settings.secret, source, target))
        click.echo(f"copied {source} into {target}: {files} files, {size} bytes")
        return
    assert query is not None
    sync = StateSync(settings.ring, query, target, settings.secret)
    try:
        restored = sync.restore(topology, batch_id=batch_id, overwrite=overwrite)
        report = sync.last_restore
    finally:
        sync.close()
    if restored is None or report is None:
        click.echo(f"the ring has no state of query {query!r}", err=True)
        sys.exit(3)
    click.echo(_restore_line(query, sync.checkpoint_dir, restored, report))


def _restore_line(query: str, target: Path, restored: int, report: RestoreReport) -> str:
    """What ``sr3 spark restore`` did, in one line: kept the local checkpoint, or
    restored a batch (and where the ring's batch came from)."""
    origin = f", pushed {report.origin}" if report.origin else ""
    if report.action == "kept-local":
        return (
            f"kept {target}: it holds batch {restored} of {query}; the ring's newest is "
            f"{report.ring_batch_id}{origin}; nothing to restore"
        )
    recovery = report.recovery
    return (
        f"restored batch {restored} of {query} into {target}: {report.files} files, "
        f"{report.bytes_total} bytes, {recovery.topology} in {recovery.seconds:.2f} s"
        + (f" ({recovery.reason})" if recovery.reason else "")
        + origin
    )


@spark.command("rescale")
@click.option("--query", required=True,
              help="The query's name (StateSync's, or the standby's for an sr3:// checkpoint: "
                   "its lease).")  # fmt: skip
@click.option("--checkpoint",
              help="An sr3:// checkpoint to rescale in place (default: the state StateSync "
                   "pushed).")  # fmt: skip
@click.option("--partitions", required=True, type=click.IntRange(1, 100_000),
              help="The number of state partitions the query runs at from now on.")  # fmt: skip
@click.option("--dry-run", is_flag=True,
              help="Repartition the ring's newest batch in a scratch folder and report the "
                   "time and how the state spreads; touch nothing.")  # fmt: skip
@click.option("--scratch", type=click.Path(file_okay=False, path_type=Path),
              help="Where the scratch checkpoint goes (default: the temp folder).")  # fmt: skip
@click.option("--topology", default="auto", show_default=True,
              help="star, line, tree[:FANOUT] or auto, for the restore.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@ring_options
@fail_cleanly
def spark_rescale(
    query: str, checkpoint: str | None, partitions: int, dry_run: bool, scratch: Path | None,
    topology: str, as_json: bool, ring: str | None, secret_file: Path | None,
) -> None:  # fmt: skip
    """Rescale a stopped query's state on the ring to --partitions state partitions: the
    newest batch is restored into a scratch folder, repartitioned by Spark's own runner
    (RocksDB's state store provider), and pushed back as the next batch under the
    query's lease. The next start of the query anywhere runs at the new count. Refused,
    in one line, while an application holds the query's lease, while a batch is planned
    and not committed, or for what Spark's runner does not support."""
    import importlib.util

    from spark_connector.manifest import check_query_name
    from spark_connector.rescale import dry_run_fs, rescale, rescale_fs

    check_query_name(query)
    if checkpoint is not None and not checkpoint.startswith("sr3:"):
        fail("--checkpoint: an sr3:// path (a local checkpoint's state is on the ring: omit it)")
    if importlib.util.find_spec("pyspark") is None:
        fail("pyspark is not installed here: sr3 spark rescale runs Spark's repartition")
    settings = ring_settings(ring, secret_file)
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    spark = _rescale_session(None if checkpoint is None else settings)
    try:
        with SyncClient(settings.ring, settings.secret, options=client_options(settings)) as client:
            if checkpoint is None:
                report = rescale(
                    client, query, partitions, spark, scratch_dir=scratch, topology=topology,
                    dry_run=dry_run,
                )  # fmt: skip
            elif dry_run:
                report = dry_run_fs(
                    settings.ring, settings.secret, query, checkpoint, partitions, spark,
                    scratch_dir=scratch,
                )  # fmt: skip
            else:
                report = rescale_fs(client, query, checkpoint, partitions, spark)
    finally:
        spark.stop()
    if as_json:
        click.echo(json.dumps(_rescale_json(report), indent=2))
        return
    for line in _rescale_lines(report):
        click.echo(line)


def _rescale_session(fs_settings: Settings | None) -> Any:
    """A local SparkSession for Spark's runner (it reads the checkpoint's own conf), with
    the sr3:// conf when ``fs_settings`` are given."""
    from pyspark.sql import SparkSession

    from spark_connector.conf import spark_conf
    from spark_connector.jar import fs_jar
    from sr3.spark_demo import SPARK_CONF, scratch_conf

    # sr3's jar either way: it rescales the HDFS-backed provider's state.
    fs_conf = (
        {"spark.jars": str(fs_jar())}
        if fs_settings is None
        else spark_conf(fs_settings.ring, fs_settings.secret)
    )
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master("local[2]").appName("sr3-rescale")
    for key, value in {**SPARK_CONF, **scratch_conf(), **fs_conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _rescale_json(report: Any) -> dict[str, Any]:
    from dataclasses import asdict

    data: dict[str, Any] = asdict(report)
    data["seconds"] = round(report.seconds, 3)
    for spread, figures in zip(report.spread, data["spread"], strict=True):
        figures["skew"] = spread.skew
    return data


def _rescale_lines(report: Any) -> list[str]:
    if report.dry_run:
        head = (
            f"{report.query}: batch {report.base_batch} would go from {report.from_partitions} "
            f"to {report.to_partitions} partitions: restore {report.restore_s:.2f} s, "
            f"repartition {report.repartition_s:.2f} s (dry run: nothing pushed)"
        )
    else:
        head = (
            f"{report.query}: batch {report.base_batch} at {report.from_partitions} partitions "
            f"is batch {report.batch_id} at {report.to_partitions} on the ring (fence "
            f"{report.fence}): restore {report.restore_s:.2f} s, repartition "
            f"{report.repartition_s:.2f} s, push {report.push_s:.2f} s "
            f"({human_size(report.pushed_bytes)})"
        )
    lines = [head]
    for spread in report.spread:
        rows = "?" if not spread.rows else f"{min(spread.rows)}-{max(spread.rows)}"
        skew = "-" if spread.skew is None else f"{spread.skew:.2f}"
        lines.append(
            f"  operator {spread.operator}: rows per partition {rows}, bytes "
            f"{human_size(min(spread.bytes))}-{human_size(max(spread.bytes))}, skew {skew}"
        )
    return lines


@spark.command("forget")
@click.option("--query", help="Name the query was registered under (StateSync).")
@click.option("--keep", type=click.IntRange(0),
              help="Newest batches to keep (0: forget the query); with --query.")  # fmt: skip
@click.option("--checkpoint", help="An sr3:// checkpoint to delete whole instead.")
@ring_options
@fail_cleanly
def spark_forget(
    query: str | None, keep: int | None, checkpoint: str | None, ring: str | None,
    secret_file: Path | None,
) -> None:  # fmt: skip
    """Delete a query's older batches from the ring (peers collect their chunks once no
    kept batch references them, after --gc-grace), or an sr3:// checkpoint whole (Spark
    keeps its own history there). Deletes what it can and says what is left; exit code 1
    when something is left or the ring has no such query."""
    from spark_connector.catalog import delete_manifest, query_batches
    from spark_connector.manifest import check_query_name

    settings = ring_settings(ring, secret_file)
    if checkpoint is not None:
        if query is not None or keep is not None:
            fail("--checkpoint deletes a whole sr3:// checkpoint: no --query or --keep")
        removed = asyncio.run(_forget_checkpoint(settings.ring, settings.secret, checkpoint))
        if removed == 0:
            fail(f"nothing at {checkpoint}")
        click.echo(f"deleted {checkpoint}: {removed} files and directories")
        return
    if query is None or keep is None:
        fail("name --query and --keep (or --checkpoint for an sr3:// checkpoint)")
    left: dict[int, SR3Error] = {}
    deleted: list[int] = []
    with SyncClient(settings.ring, settings.secret, options=client_options(settings)) as client:
        batches = query_batches(client, check_query_name(query))
        unseen = _unreachable_members(client)
        if not batches:
            if unseen:
                fail(f"no batch of {query!r} found, but {', '.join(unseen)} did not answer")
            fail(f"no query named {query!r} on the ring (sr3 spark list shows them)")
        for batch_id in batches[: max(0, len(batches) - keep)]:
            try:
                delete_manifest(client, query, batch_id)
                deleted.append(batch_id)
            except SR3Error as exc:
                left[batch_id] = exc
    kept = batches[len(deleted) + len(left) :]
    click.echo(
        f"{query}: deleted {len(deleted)} batches ({_batches(deleted)}); "
        f"kept the newest {len(kept)} ({_batches(kept)})"
    )
    problems = []
    if left:
        first = describe_error(next(iter(left.values())), ring_flag=ring, has_ring=True)
        problems.append(f"could not delete {len(left)} batches ({_batches(list(left))}): {first}")
    if unseen:
        problems.append(f"{', '.join(unseen)} did not answer: batches only they hold were not seen")
    if problems:
        fail(f"{query}: {'; '.join(problems)}; run the same command once the peers are back")


async def _copy_checkpoint(ring: str, secret: str, source: str, target: Path) -> tuple[int, int]:
    from spark_connector.fs_checkpoints import copy_to_local
    from spark_connector.fs_client import FsClient

    async with FsClient(ring, secret) as fs:
        return await copy_to_local(fs, source, target)


async def _forget_checkpoint(ring: str, secret: str, checkpoint: str) -> int:
    from spark_connector.fs_checkpoints import forget_checkpoint
    from spark_connector.fs_client import FsClient

    async with FsClient(ring, secret) as fs:
        return await forget_checkpoint(fs, checkpoint)


def _unreachable_members(client: SyncClient) -> list[str]:
    """Placement members the listing could not reach (down as the client found them or as
    the ring's table has them): batches only they hold were not listed."""
    view = client.run(client.client.ring())
    return [
        member.peer_id
        for member in view.ring.members
        if client.client.view.is_down(member) or view.states.get(member.peer_id) == "down"
    ]


def _batches(batch_ids: list[int]) -> str:
    return ", ".join(str(batch_id) for batch_id in batch_ids) or "none"


def _duration_option(
    _context: click.Context, _param: click.Parameter, value: str | None
) -> int | None:
    from sr3.cli.data import duration_s

    return None if value is None else duration_s(value)


@spark.command("standby")
@click.option("--query", required=True, help="The query's name (its lease: spark/QUERY/lease).")
@click.option("--checkpoint", required=True,
              help="The query's checkpoint: a local directory (pushed by StateSync, pulled by "
                   "standbys) or sr3:///path.")  # fmt: skip
@click.option("--input", "input_dir", help="The demo query's input: a folder of JSON event files.")
@click.option("--output", "output_dir", help="Where the demo query writes its results.")
@click.option("--sink", type=click.Choice(SINKS), default="foreach", show_default=True,
              help="The demo query's sink: foreachBatch (a JSON file per batch) or Spark's "
                   "parquet file sink.")  # fmt: skip
@click.option("--app", help="module:function or path/to/file.py:function: a function (spark, "
                            "job) returning the query's DataStreamWriter, not started (default: "
                            "the demo query). A module is imported from PYTHONPATH or the "
                            "current folder. job has query, checkpoint, input_dir, output_dir, "
                            "trigger_s, holder and the other settings given here "
                            "(docs/standby.md).")  # fmt: skip
@click.option("--trigger", "trigger_s", type=click.FloatRange(0.0, 86_400.0), default=0.5,
              show_default=True,
              help="The demo query's trigger interval in seconds (job.trigger_s for "
                   "--app).")  # fmt: skip
@click.option("--partitions", type=click.IntRange(1, 100_000),
              help="Run the query at this many state partitions once this application takes "
                   "it over (a rescale by handover; RocksDB's provider).")  # fmt: skip
@click.option("--holder", help="This application's name in the lease (default: host:pid).")
@click.option("--lease-timeout", type=float, default=TIMEOUT_S_DEFAULT, show_default=True,
              help="Seconds without a renewal after which a standby may take over.")  # fmt: skip
@click.option("--renew-every", type=float, default=RENEW_EVERY_S_DEFAULT, show_default=True,
              help="Seconds between the active side's renewals.")  # fmt: skip
@click.option("--until-batch", type=click.IntRange(0),
              help="Stop once this batch is committed, releasing the lease.")  # fmt: skip
@click.option("--run-max", callback=_duration_option,
              help="Stop after this long: Ns, Nm, Nh or Nd (default: until stopped).")  # fmt: skip
@click.option("--events", "events_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to append what happened, as JSON lines (default: "
                   "sr3-standby-QUERY-PID.jsonl in the temp folder; printed).")  # fmt: skip
@click.option("--master", default="local[2]", show_default=True, help="The Spark master.")
@click.option("--metrics-port", type=click.IntRange(1, 65535),
              help="Serve the lease and standby metrics on 127.0.0.1:PORT.")  # fmt: skip
@ring_options
@fail_cleanly
def spark_standby(
    query: str, checkpoint: str, input_dir: str | None, output_dir: str | None, sink: str,
    app: str | None, trigger_s: float, partitions: int | None, holder: str | None,
    lease_timeout: float,
    renew_every: float,
    until_batch: int | None, run_max: int | None, events_path: Path | None, master: str,
    metrics_port: int | None, ring: str | None, secret_file: Path | None,
) -> None:  # fmt: skip
    """Drive a query, or stand by for it: start the same command on two or more
    machines. The first to come takes the query's lease and runs it; the others keep
    their checkpoint close behind and take over when the lease lapses (its holder was
    lost) or is released. Exit code: 0 done, 1 failed, 3 --run-max reached, 4 lease
    lost to another application (this one was cut off), 130 interrupted (SIGINT,
    Ctrl-C: the query is stopped and the lease released)."""
    import importlib.util

    from spark_connector.manifest import check_query_name
    from sr3.standby_app import StandbyJob, run

    check_query_name(query)
    if holder is not None:
        check_holder(holder)
    check_timing(lease_timeout, renew_every, DRIFT_DEFAULT)
    if app is None and (input_dir is None or output_dir is None):
        fail("the demo query needs --input and --output (or name your own with --app)")
    app_path = _app_path(app)
    if importlib.util.find_spec("pyspark") is None:
        fail("pyspark is not installed here: sr3 spark standby runs a Spark application")
    settings = ring_settings(ring, secret_file)
    _export_ring(settings)
    events = events_path or Path(tempfile.gettempdir()) / f"sr3-standby-{query}-{os.getpid()}.jsonl"
    job = StandbyJob(
        query=query, checkpoint=_local_or_sr3(checkpoint), input_dir=_local_or_sr3(input_dir),
        output_dir=_local_or_sr3(output_dir), events_path=str(events.resolve()), sink=sink,
        holder=holder or "", lease_timeout_s=lease_timeout, renew_every_s=renew_every,
        until_batch=-1 if until_batch is None else until_batch,
        run_s_max=math.inf if run_max is None else float(run_max), app=app_path,
        master=master, trigger_s=trigger_s, partitions=partitions or 0,
    )  # fmt: skip
    click.echo(f"sr3 standby of {query}: events in {job.events_path}")
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="127.0.0.1")
        click.echo(f"sr3 standby of {query}: metrics at http://127.0.0.1:{metrics_port}/metrics")
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        code = run(job)
    except KeyboardInterrupt:
        fail(f"sr3 standby of {query} interrupted", exit_code=130)
    sys.exit(code)


def _app_path(app: str | None) -> str:
    """``--app`` with a file's path made absolute (the application may run elsewhere)."""
    if not app:
        return ""
    module, _, function = app.rpartition(":")
    if not module or not function:
        fail("--app: module:function or path/to/file.py:function")
    if module.endswith(".py"):
        path = Path(module).resolve()
        if not path.is_file():
            fail(f"--app: {module} is not a file")
        return f"{path}:{function}"
    return app


def _local_or_sr3(path: str | None) -> str:
    """An sr3:// path as given; a local one made absolute (the session may change
    folders); nothing as ``""``."""
    if not path:
        return ""
    return path if path.startswith("sr3:") else str(Path(path).resolve())


def _export_ring(settings: Settings) -> None:
    """Hand the ring, the secret and the client's TLS to the application through this
    process's environment (never a command line, where ``ps`` shows it)."""
    os.environ["SR3_RING"] = settings.ring
    os.environ["SR3_SECRET"] = settings.secret
    tls = resolve_tls(settings.cluster)
    if tls is not None and not os.environ.get("SR3_TLS_CA"):
        os.environ["SR3_TLS_CA"] = str(tls.ca_file)
        if tls.cert_file is not None and tls.key_file is not None:
            os.environ["SR3_TLS_CERT"] = str(tls.cert_file)
            os.environ["SR3_TLS_KEY"] = str(tls.key_file)


@spark.command("conf")
@click.option("--prefix", default="spark/", show_default=True,
              help="The sr3:// path the minted credential reaches.")  # fmt: skip
@click.option("--expires", default="30d", show_default=True, help="Ns, Nm, Nh or Nd.")
@click.option("--credential", envvar="SR3_CREDENTIAL",
              help="Use this scoped credential instead of minting one.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="The conf as a JSON object.")
@click.option("--core-site", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write Hadoop's core-site.xml here (mode 0600: it holds the "
                   "credential and any client key), for `hadoop fs` and distcp.")  # fmt: skip
@ring_options
@fail_cleanly
def spark_conf_command(
    prefix: str, expires: str, credential: str | None, as_json: bool, core_site: Path | None,
    ring: str | None, secret_file: Path | None,
) -> None:  # fmt: skip
    """Print the --conf flags spark-submit needs to checkpoint to sr3:// (the jar, the
    FileSystem, the seeds and a credential scoped to --prefix; never the secret).

    With --core-site, Hadoop's own tools reach sr3:// too: put the file's folder in
    HADOOP_CONF_DIR (or on the classpath) and the jar (spark.jars) on the classpath."""
    from spark_connector.conf import core_site_xml, spark_conf
    from sr3.cli.data import duration_s

    if credential:
        conf = spark_conf(ring, credential=credential)
    else:
        settings = ring_settings(ring, secret_file)
        conf = spark_conf(
            settings.ring, settings.secret, prefix=prefix, expires_s=duration_s(expires)
        )
    if core_site is not None:
        core_site.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(core_site, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as sink:
            sink.write(core_site_xml(conf))
    if as_json:
        click.echo(json.dumps(conf, indent=2))
        return
    for key, value in conf.items():
        click.echo(f"--conf {shlex.quote(f'{key}={value}')}")
