"""What the ring holds of Spark queries: their batches, the newest one, and deleting them.

A query's batches on the ring are the manifests listed under its prefix (a manifest is
complete when it exists, so no pointer is kept): ``ring_queries`` lists them,
``latest_batch`` is the highest, and ``forget`` deletes all but the newest few (and the
plans of batches no longer after the newest: ``spark_connector.plans``). Chunks no
remaining manifest references are collected by the peers once their grace period has
passed (``ring.gc``).
"""

from __future__ import annotations

from ring.errors import ConfigError, RecordConflict
from ring.sync_client import SyncClient
from spark_connector.manifest import manifest_key, manifests_prefix, plans_prefix

__all__ = [
    "delete_manifest",
    "delete_plans",
    "forget",
    "latest_batch",
    "query_batches",
    "ring_queries",
]


def ring_queries(client: SyncClient, query: str | None = None) -> dict[str, list[int]]:
    """Queries with manifests on the ring (or just ``query``) and their batch ids."""
    prefix = manifests_prefix(query) if query is not None else "spark/"
    found: dict[str, list[int]] = {}
    for key in client.list_records(prefix):
        parts = key.split("/")
        if (
            len(parts) == 4
            and parts[0] == "spark"
            and parts[2] == "batches"
            and parts[3].isascii()
            and parts[3].isdigit()
        ):
            found.setdefault(parts[1], []).append(int(parts[3]))
    return {name: sorted(batches) for name, batches in sorted(found.items())}


def query_batches(client: SyncClient, query: str) -> list[int]:
    """Batch ids of ``query`` on the ring, oldest first."""
    return ring_queries(client, query).get(query, [])


def latest_batch(client: SyncClient, query: str) -> int | None:
    """The newest batch of ``query`` on the ring, or None."""
    batches = query_batches(client, query)
    return batches[-1] if batches else None


def forget(client: SyncClient, query: str, keep: int) -> list[int]:
    """Delete the manifests of ``query`` but the newest ``keep``. The batch ids deleted,
    oldest first. Chunks no manifest references any more are collected by the peers
    after their grace period."""
    if keep < 0:
        raise ConfigError("keep must be 0 or more")
    batches = query_batches(client, query)
    doomed = batches[: max(0, len(batches) - keep)]
    for batch_id in doomed:
        delete_manifest(client, query, batch_id)
    # A plan is of the batch after the newest manifest: those up to it are stale, and
    # with no manifest kept, the rest go too.
    if keep == 0:
        delete_plans(client, query)
    elif batches:
        delete_plans(client, query, batches[-1])
    return doomed


def delete_plans(client: SyncClient, query: str, up_to: int | None = None) -> list[int]:
    """Delete ``query``'s plans (``spark_connector.plans``) of batches up to ``up_to``
    (None: all of them); the batch ids deleted, oldest first."""
    deleted = []
    for key, version in sorted(client.list_records(plans_prefix(query)).items()):
        name = key.rsplit("/", 1)[-1]
        if not name.isascii() or not name.isdigit():
            continue
        batch_id = int(name)
        if up_to is not None and batch_id > up_to:
            continue
        try:
            client.delete_record(key, expected_version=version)
        except RecordConflict:
            continue  # written again since the listing: whoever did keeps it
        deleted.append(batch_id)
    return deleted


def delete_manifest(client: SyncClient, query: str, batch_id: int, version: int = 0) -> None:
    """Delete the manifest of ``batch_id``: at ``version`` when the caller knows it (what
    it wrote), else, or when that is not the current version, at the version read first."""
    key = manifest_key(query, batch_id)
    if version > 0:
        try:
            client.delete_record(key, expected_version=version)
            return
        except RecordConflict:
            pass
    current = client.get_record(key, include_deleted=True)
    if current is not None and not current.deleted:
        client.delete_record(key, expected_version=current.version)
