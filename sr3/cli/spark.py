"""``sr3 spark``: Spark queries' state on the ring (list, restore, forget), and the conf
a session needs to checkpoint to ``sr3://`` (conf)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ring.config import resolve_tls
from ring.errors import SR3Error
from ring.sync_client import SyncClient
from sr3.cli._shared import (
    client_options,
    describe_error,
    fail,
    fail_cleanly,
    ring_options,
    ring_settings,
)

if TYPE_CHECKING:
    from spark_connector.fs_checkpoints import FsCheckpoint
    from spark_connector.restore import RestoreReport


@click.group()
def spark() -> None:
    """Spark queries' state on the ring: list, restore, forget."""


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
    """Queries with state on the ring (pushed by StateSync) and the batches kept for
    each, then the checkpoints Spark wrote to sr3:// under --fs-root."""
    from spark_connector.fs_checkpoints import find_checkpoints
    from spark_connector.fs_client import FsClient
    from spark_connector.sync import ring_queries

    settings = ring_settings(ring, secret_file)
    with SyncClient(settings.ring, settings.secret, options=client_options(settings)) as client:
        queries = ring_queries(client, query)

    async def checkpoints() -> list[FsCheckpoint]:
        async with FsClient(
            settings.ring, settings.secret, tls=resolve_tls(settings.cluster)
        ) as fs:
            return await find_checkpoints(fs, fs_root)

    found = [] if query else asyncio.run(checkpoints())
    if as_json:
        entries = [
            {"query": name, "batches": batches, "latest": batches[-1]}
            for name, batches in queries.items()
        ]
        paths = [
            {"checkpoint": f"sr3://{c.path}", "latest_committed": c.latest_committed} for c in found
        ]
        click.echo(json.dumps({"queries": entries, "checkpoints": paths}, indent=2))
        return
    if not queries and not found:
        click.echo(f"no query has state on the ring, and no sr3:// checkpoint is under {fs_root}")
        return
    for name, batches in queries.items():
        shown = ", ".join(str(batch) for batch in batches)
        click.echo(f"{name}  latest {batches[-1]}  batches {shown}")
    for checkpoint in found:
        latest = checkpoint.latest_committed
        click.echo(
            f"sr3://{checkpoint.path}  latest committed "
            + ("none" if latest is None else str(latest))
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


@spark.command("conf")
@click.option("--prefix", default="spark/", show_default=True,
              help="The sr3:// path the minted credential reaches.")  # fmt: skip
@click.option("--expires", default="30d", show_default=True, help="Ns, Nm, Nh or Nd.")
@click.option("--credential", envvar="SR3_CREDENTIAL",
              help="Use this scoped credential instead of minting one.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="The conf as a JSON object.")
@click.option("--core-site", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write Hadoop's core-site.xml here (mode 0600: it holds the "
                   "credential), for `hadoop fs` and distcp.")  # fmt: skip
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
