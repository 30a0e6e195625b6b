"""The consistent cut of a Spark checkpoint: listings observed on Spark 4.3, synthetic
listings, a model of checkpoint histories (hypothesis), and real Spark restarts.

The real-Spark tests (marked ``spark``) copy only the files of a cut into an empty
directory, read the state there and in the original with Spark's ``statestore`` reader,
restart the query from the copy with more input, and compare with an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spark_connector.checkpoint import (
    _list_items,
    list_checkpoint,
    read_cut,
    read_offsets,
    read_sst_references,
)
from spark_connector.cut import (
    CheckpointError,
    Cut,
    FileEntry,
    committed_batches,
    cut_for_batch,
    snapshot_zips,
    version_floors,
)

# Registers the ``spark`` marker and fixture; imported by pytest, so that its assertions
# are rewritten: the test below imports its helpers only when it runs.
pytest_plugins = ("spark_fixtures",)
SPARK_PROVIDERS = ("hdfs", "rocksdb", "rocksdb-changelog")

LISTINGS = Path(__file__).parent / "fixtures" / "spark_4_3_listings"

References = dict[str, tuple[FileEntry, ...]]


def observed(name: str) -> tuple[list[FileEntry], References]:
    """A listing recorded on Spark 4.3.0, and the SST files each of its zips names."""
    entries: list[FileEntry] = []
    references: References = {}
    for line in (LISTINGS / f"{name}.txt").read_text().splitlines():
        if line.startswith("#"):
            continue
        if line.startswith("@ "):
            _at, zip_path, *files = line.split(" ")
            store = zip_path.rpartition("/")[0]
            references[zip_path] = tuple(
                FileEntry(f"{store}/SSTs/{file.split(':')[1]}", int(file.split(":")[0]))
                for file in files
            )
            continue
        size, path = line.split(" ", 1)
        entries.append(FileEntry(path, int(size)))
    return entries, references


def paths(cut: Cut, prefix: str = "") -> list[str]:
    return [entry.path for entry in cut.files if entry.path.startswith(prefix)]


def listing(*items: str | tuple[str, int]) -> list[FileEntry]:
    return [FileEntry(*item) if isinstance(item, tuple) else FileEntry(item, 10) for item in items]


def query_files(*batches: int, committed: Sequence[int] | None = None) -> list[str]:
    """metadata, offsets/N for ``batches``, commits/N for ``committed`` (default: all)."""
    done = batches if committed is None else committed
    return [
        "metadata",
        *(f"offsets/{batch}" for batch in batches),
        *(f"commits/{batch}" for batch in done),
    ]


# ------------------------------------------------------- listings observed on Spark 4.3


def test_observed_hdfs_takes_newest_snapshot_and_the_deltas_after_it() -> None:
    entries, _ = observed("hdfs_aggregation")
    assert committed_batches(entries) == [16, 17, 18, 19]

    cut = cut_for_batch(entries, 19)
    assert cut.state_version == 20
    assert paths(cut, "state/") == [
        "state/0/0/18.snapshot",
        "state/0/0/19.delta",
        "state/0/0/20.delta",
        "state/0/0/_metadata/schema",
        "state/0/1/18.snapshot",
        "state/0/1/19.delta",
        "state/0/1/20.delta",
        "state/0/_metadata/metadata",
    ]
    assert paths(cut, "offsets/") + paths(cut, "commits/") == [
        "offsets/18",
        "offsets/19",
        "commits/19",
    ]
    # The file source's log compacts every 10th entry into <n>.compact.
    assert paths(cut, "sources/") == [f"sources/0/{n}" for n in range(9)] + ["sources/0/9.compact"]
    assert "metadata" in paths(cut)

    assert paths(cut_for_batch(entries, 17), "state/0/1/") == ["state/0/1/18.snapshot"]
    # Spark purged offsets/15 with commits/15, and a restart after 16 would need it.
    with pytest.raises(CheckpointError, match=r"batch 16 cannot be restarted from: offsets/15"):
        cut_for_batch(entries, 16)


def test_observed_hdfs_without_snapshots_replays_every_delta_from_version_one() -> None:
    entries, _ = observed("hdfs_no_maintenance")
    assert committed_batches(entries) == [11, 12, 13, 14, 15]
    cut = cut_for_batch(entries, 12)
    assert paths(cut, "state/0/1/") == sorted(f"state/0/1/{v}.delta" for v in range(1, 14))
    assert not any(".crc" in path for path in paths(cut))


def test_observed_rocksdb_takes_the_zip_of_version_n_plus_1_and_its_ssts() -> None:
    entries, references = observed("rocksdb_aggregation")
    assert snapshot_zips(entries, 19) == ["state/0/0/20.zip", "state/0/1/20.zip"]
    cut = cut_for_batch(entries, 19, references)
    expected_ssts = sorted(
        entry.path
        for zip_path in ("state/0/0/20.zip", "state/0/1/20.zip")
        for entry in references[zip_path]
    )
    assert sorted(paths(cut, "state/0/0/SSTs/") + paths(cut, "state/0/1/SSTs/")) == expected_ssts
    assert [path for path in paths(cut, "state/") if "SSTs" not in path] == [
        "state/0/0/20.zip",
        "state/0/0/_metadata/schema",
        "state/0/1/20.zip",
        "state/0/_metadata/metadata",
    ]
    # Without the zips' references every SST of the store is taken: a superset.
    everything = cut_for_batch(entries, 19)
    all_ssts = [e.path for e in entries if "/SSTs/" in e.path and "/." not in e.path]
    assert sorted(paths(everything, "state/0/0/SSTs/") + paths(everything, "state/0/1/SSTs/")) == (
        sorted(all_ssts)
    )
    assert set(paths(cut)) < set(paths(everything))


def test_observed_rocksdb_keeps_exactly_the_zips_the_restartable_batches_need() -> None:
    entries, references = observed("rocksdb_aggregation")
    # minBatchesToRetain=3: zips 18-20 are left, so batches 17-19 can be cut; 16 cannot
    # (offsets/15 is gone, and so is 17.zip).
    assert committed_batches(entries) == [16, 17, 18, 19]
    assert [path for path in paths(cut_for_batch(entries, 17, references)) if "zip" in path] == [
        "state/0/0/18.zip",
        "state/0/1/18.zip",
    ]
    with pytest.raises(CheckpointError):
        cut_for_batch(entries, 16, references)
    with pytest.raises(CheckpointError, match=r"state/0/0: cannot rebuild state version 17"):
        cut_for_batch([*entries, FileEntry("offsets/15", 1179)], 16, references)


def test_observed_rocksdb_changelog_takes_zip_then_changelogs() -> None:
    entries, references = observed("rocksdb_changelog_dedup")
    cut = cut_for_batch(entries, 18, references)
    assert cut.state_version == 19
    assert [path for path in paths(cut, "state/0/1/") if "SSTs" not in path] == [
        "state/0/1/18.zip",
        "state/0/1/19.changelog",
    ]
    assert paths(cut, "state/0/1/SSTs/") == sorted(e.path for e in references["state/0/1/18.zip"])
    newest = cut_for_batch(entries, 19, references)
    assert [path for path in paths(newest, "state/0/0/") if "SSTs" not in path] == [
        "state/0/0/20.zip",
        "state/0/0/_metadata/schema",
    ]
    with pytest.raises(CheckpointError, match=r"from the empty version 0: changelog file"):
        # no zip at or below version 17 is left (offsets/15 added: it is gone as well)
        cut_for_batch([*entries, FileEntry("offsets/15", 1)], 16, references)


def test_observed_transform_with_state_keeps_v2_metadata_and_schema_files() -> None:
    entries, references = observed("tws_rocksdb_changelog")
    cut = cut_for_batch(entries, 3, references)
    state = paths(cut, "state/")
    assert "state/0/_metadata/v2/0" in state
    assert [path for path in state if "_stateSchema" in path] == [
        "state/0/_stateSchema/default/0_bb70834f-bdd6-4ef0-bb48-4f0c6c620910"
    ]
    assert [path for path in paths(cut, "state/0/0/") if "SSTs" not in path] == [
        "state/0/0/1.zip",
        "state/0/0/2.changelog",
        "state/0/0/3.changelog",
        "state/0/0/4.changelog",
    ]


def test_observed_stream_stream_join_cuts_every_named_store() -> None:
    entries, _ = observed("join_hdfs")
    cut = cut_for_batch(entries, 1)
    stores = ["left-keyToNumValues", "left-keyWithIndexToValue"]
    stores += ["right-keyToNumValues", "right-keyWithIndexToValue"]
    for partition in (0, 1):
        for store in stores:
            prefix = f"state/0/{partition}/{store}/"
            deltas = [p for p in paths(cut, prefix) if p.endswith(".delta")]
            assert deltas == [f"{prefix}1.delta", f"{prefix}2.delta"]
    assert len([p for p in paths(cut) if p.endswith("_metadata/schema")]) == 4


def test_observed_checkpoint_format_v2_is_refused_clearly() -> None:
    entries, _ = observed("rocksdb_format_v2")
    with pytest.raises(CheckpointError, match="checkpoint format version 2"):
        cut_for_batch(entries, 10)


@pytest.mark.parametrize("name", sorted(path.stem for path in LISTINGS.glob("*.txt")))
def test_observed_cuts_hold_only_listed_visible_files(name: str) -> None:
    entries, references = observed(name)
    listed = {entry.path: entry for entry in entries}
    for batch in committed_batches(entries):
        try:
            cut = cut_for_batch(entries, batch, references)
        except CheckpointError:
            continue
        for entry in cut.files:
            assert listed[entry.path] == entry
            assert not any(part.startswith(".") for part in entry.path.split("/"))


# ------------------------------------------------------------------ synthetic listings


def test_cut_includes_every_operator_and_partition() -> None:
    entries = listing(
        *query_files(0, 1, 2),
        "sources/0/0",
        "state/0/_metadata/metadata",
        "state/1/_metadata/metadata",
        *(f"state/{op}/{part}/{v}.delta" for op in (0, 1) for part in (0, 1, 2) for v in (1, 2, 3)),
        "state/1/1/2.snapshot",
    )
    cut = cut_for_batch(entries, 1)
    assert paths(cut, "state/0/2/") == ["state/0/2/1.delta", "state/0/2/2.delta"]
    assert paths(cut, "state/1/1/") == ["state/1/1/2.snapshot"]
    assert len(paths(cut, "state/")) == 2 + 5 * 2 + 1
    assert paths(cut, "offsets/") == ["offsets/0", "offsets/1"]


def test_uncommitted_batch_is_excluded() -> None:
    entries = listing(
        *query_files(0, 1, 2, committed=[0, 1]),
        *(f"state/0/0/{v}.delta" for v in (1, 2, 3)),
        "state/0/0/3.snapshot",  # maintenance snapshots the newest loaded version
        "sources/0/2",
    )
    assert committed_batches(entries) == [0, 1]
    cut = cut_for_batch(entries, 1)
    assert paths(cut) == [
        "commits/1",
        "metadata",
        "offsets/0",
        "offsets/1",
        "sources/0/2",
        "state/0/0/1.delta",
        "state/0/0/2.delta",
    ]
    with pytest.raises(CheckpointError, match=r"batch 2 is not committed: commits/2 missing"):
        cut_for_batch(entries, 2)


def test_restart_needs_the_offsets_of_the_batch_before() -> None:
    entries = listing(*query_files(3, 4, 5))
    assert paths(cut_for_batch(entries, 4), "offsets/") == ["offsets/3", "offsets/4"]
    with pytest.raises(CheckpointError, match="offsets/2 is gone"):
        cut_for_batch(entries, 3)
    assert paths(cut_for_batch(listing(*query_files(0)), 0), "offsets/") == ["offsets/0"]


def test_commit_without_its_offsets_is_not_a_committed_batch() -> None:
    entries = listing("metadata", "offsets/1", "commits/0", "commits/1")
    assert committed_batches(entries) == [1]


def test_hidden_temp_and_crc_files_are_skipped() -> None:
    entries = listing(
        *query_files(0),
        ".metadata.crc",
        "offsets/.0.crc",
        "offsets/.1.3f1c.tmp",
        "state/0/0/1.delta",
        "state/0/0/.1.delta.crc",
        "state/0/0/.2.delta.8e0a-11.tmp",
        "state/0/0/2.snapshot.tmp",
        "state/0/0/SSTs/.000008-x.sst.crc",
        "sources/0/.0.crc",
        "sources/0/0",
    )
    cut = cut_for_batch(entries, 0)
    assert paths(cut) == ["commits/0", "metadata", "offsets/0", "sources/0/0", "state/0/0/1.delta"]


def test_missing_delta_between_snapshot_and_target_raises() -> None:
    entries = listing(
        *query_files(4, 5),
        *(f"state/0/0/{v}.delta" for v in (3, 4, 6)),
        "state/0/0/3.snapshot",
        *(f"state/0/1/{v}.delta" for v in range(1, 7)),
    )
    with pytest.raises(CheckpointError, match=r"state/0/0: .* from 3.snapshot: delta .* 5 missing"):
        cut_for_batch(entries, 5)


def test_missing_first_deltas_without_snapshot_raises_with_ranges() -> None:
    entries = listing(*query_files(8, 9), *(f"state/0/0/{v}.delta" for v in (3, 4, 5, 7, 8, 9, 10)))
    with pytest.raises(CheckpointError, match=r"version\(s\) 1-2, 6 missing"):
        cut_for_batch(entries, 9)


def test_missing_metadata_raises() -> None:
    with pytest.raises(CheckpointError, match="metadata"):
        cut_for_batch(listing("offsets/0", "commits/0"), 0)


def test_missing_partition_raises() -> None:
    entries = listing(*query_files(0), "state/0/0/1.delta", "state/0/2/1.delta")
    with pytest.raises(CheckpointError, match=r"no state files for \[1\]"):
        cut_for_batch(entries, 0)


def test_state_files_the_driver_cannot_see_are_named_with_the_shared_fs_requirement() -> None:
    """Executors wrote their state partitions to disks the driver does not see: only the
    driver's operator metadata is listed. The error says why and what is needed."""
    entries = listing(*query_files(0), "state/0/_metadata/metadata")
    with pytest.raises(
        CheckpointError, match=r"no state files for \[0, 1\].*file system the driver"
    ):
        cut_for_batch(entries, 0, state_partitions=2)


def test_a_file_source_log_is_cut_at_the_offset_the_batch_recorded() -> None:
    """The driver logged the files of batches 4 and 5 (planned, not committed) before it
    died: a cut at batch 3 (logOffset 3) leaves them out, so the restarted query plans
    batch 4 with the same files as the uninterrupted run."""
    sources = [f"sources/0/{k}" for k in range(6)] + ["sources/1/0"]
    cut = cut_for_batch(listing(*query_files(2, 3), *sources), 3, source_log_ends={0: 3})
    assert paths(cut, "sources/") == [*(f"sources/0/{k}" for k in range(4)), "sources/1/0"]
    # After compaction (9.compact holds 0-9, older entries cleaned): cut above it.
    compacted = ["sources/0/9.compact", "sources/0/10", "sources/0/11", "sources/0/12"]
    cut = cut_for_batch(listing(*query_files(10, 11), *compacted), 11, source_log_ends={0: 10})
    assert paths(cut, "sources/") == sorted(compacted[:2])
    # An entry up to the end is missing: nothing can be vouched for, the log stays whole.
    holes = ["sources/0/0", "sources/0/2", "sources/0/3"]
    cut = cut_for_batch(listing(*query_files(1, 2), *holes), 2, source_log_ends={0: 2})
    assert paths(cut, "sources/") == holes
    # Without ends (no file source, or the caller did not read them): taken whole.
    assert paths(cut_for_batch(listing(*query_files(2, 3), *sources), 3), "sources/") == sources


def test_missing_highest_partitions_raise_when_the_partition_count_is_known() -> None:
    entries = listing(*query_files(0), "state/0/0/1.delta", "state/0/1/1.delta")
    assert len(paths(cut_for_batch(entries, 0), "state/")) == 2
    with pytest.raises(
        CheckpointError, match=r"expected partitions 0-3; no state files for \[2, 3\]"
    ):
        cut_for_batch(entries, 0, state_partitions=4)
    # Fewer partitions than folders: a checkpoint rescaled down, whose batches from then
    # on read only the partitions below the count.
    assert paths(cut_for_batch(entries, 0, state_partitions=1), "state/") == ["state/0/0/1.delta"]


def test_a_checkpoint_rescaled_down_is_cut_without_the_partitions_it_left_behind() -> None:
    """Spark's repartition from 4 to 2 partitions at batch 2 writes version 3 of
    partitions 0 and 1 (here zips) and leaves partitions 2 and 3 at version 2: the cut
    of batch 2 and every later one holds partitions 0 and 1 only."""
    old = [f"state/0/{p}/{v}.changelog" for p in range(4) for v in (1, 2)]
    new = ["state/0/0/3.zip", "state/0/1/3.zip", "state/0/0/4.changelog", "state/0/1/4.changelog"]
    entries = listing(*query_files(0, 1, 2, 3), *old, *new)
    with pytest.raises(CheckpointError, match="state/0/2: cannot rebuild state version 3"):
        cut_for_batch(entries, 2)  # the count unknown: every folder is a partition
    assert snapshot_zips(entries, 3, state_partitions=2) == ["state/0/0/3.zip", "state/0/1/3.zip"]
    cut = cut_for_batch(entries, 3, state_partitions=2)
    assert paths(cut, "state/") == [
        "state/0/0/3.zip", "state/0/0/4.changelog", "state/0/1/3.zip", "state/0/1/4.changelog",
    ]  # fmt: skip
    # Before the rescale, at 4 partitions, the older batches still cut whole.
    assert len(paths(cut_for_batch(entries, 1, state_partitions=4), "state/")) == 8


def test_partitions_with_different_stores_raise() -> None:
    entries = listing(*query_files(0), "state/0/0/left/1.delta", "state/0/1/right/1.delta")
    with pytest.raises(CheckpointError, match=r"state/0/0: no state files for store\(s\) right"):
        cut_for_batch(entries, 0)


def test_a_store_declared_by_its_schema_file_must_have_state() -> None:
    entries = listing(
        *query_files(0),
        "state/0/0/left/_metadata/schema",
        "state/0/0/right/_metadata/schema",
        "state/0/0/left/1.delta",
    )
    with pytest.raises(CheckpointError, match=r"store\(s\) right"):
        cut_for_batch(entries, 0)
    default = listing(*query_files(0), "state/0/0/_metadata/schema")
    with pytest.raises(CheckpointError, match=r"state/0: expected partitions 0-0; no state files"):
        cut_for_batch(default, 0)


def test_read_offsets_reads_the_state_partitions_from_the_conf(tmp_path: Path) -> None:
    conf = {"batchWatermarkMs": 0, "conf": {"spark.sql.shuffle.partitions": "2"}}
    write_file(tmp_path, "offsets/4", f'v1\n{json.dumps(conf)}\n{{"logOffset":4}}'.encode())
    write_file(tmp_path, "offsets/5", b"v1\n{}\n")
    write_file(tmp_path, "offsets/6", b"v1\n{not json")
    assert read_offsets(tmp_path, 4)[0] == 2
    assert read_offsets(tmp_path, 5)[0] is None
    with pytest.raises(CheckpointError, match="offsets/6"):
        read_offsets(tmp_path, 6)
    with pytest.raises(CheckpointError, match="offsets/7"):
        read_offsets(tmp_path, 7)


def test_files_of_both_providers_in_one_store_raise() -> None:
    entries = listing(*query_files(0), "state/0/0/1.delta", "state/0/0/1.zip")
    with pytest.raises(CheckpointError, match="both the HDFS and RocksDB"):
        cut_for_batch(entries, 0)


@pytest.mark.parametrize(
    "path",
    ["state/0/0/1.delta.bak", "state/0/0/CURRENT", "state/x/0/1.delta", "state/0/0/a/b/1.delta"],
)
def test_unrecognised_state_files_raise(path: str) -> None:
    entries = listing(*query_files(0), "state/0/0/1.delta", path)
    with pytest.raises(CheckpointError, match=r"unexpected|unrecognised"):
        cut_for_batch(entries, 0)


def test_stateless_query_cut_has_no_state() -> None:
    cut = cut_for_batch(listing(*query_files(0, 1), "sources/0/0", "sources/0/1"), 1)
    assert cut.state_version == 2
    assert paths(cut) == [
        "commits/1",
        "metadata",
        "offsets/0",
        "offsets/1",
        "sources/0/0",
        "sources/0/1",
    ]


def test_batch_tagged_operator_metadata_newer_than_the_batch_is_left_out() -> None:
    entries = listing(
        *query_files(2, 3, 4, committed=[3]),
        "state/0/_metadata/v2/0",
        "state/0/_metadata/v2/4",
        "state/0/_stateSchema/default/0_ab",
        "state/0/_stateSchema/default/4_cd",
        *(f"state/0/0/{v}.changelog" for v in range(1, 6)),
    )
    assert paths(cut_for_batch(entries, 3), "state/0/_") == [
        "state/0/_metadata/v2/0",
        "state/0/_stateSchema/default/0_ab",
    ]


def rocksdb_store(store: str = "state/0/0") -> list[FileEntry]:
    return listing(
        f"{store}/1.zip",
        f"{store}/2.zip",
        f"{store}/2.changelog",
        f"{store}/3.changelog",
        f"{store}/4.changelog",
        (f"{store}/SSTs/000008-aa.sst", 100),
        (f"{store}/SSTs/000009-bb.sst", 200),
        (f"{store}/SSTs/000012-cc.sst", 300),  # uploaded for a zip not yet written
    )


def test_rocksdb_cut_takes_zip_its_ssts_and_later_changelogs() -> None:
    entries = listing(*query_files(1, 2, 3, committed=[2])) + rocksdb_store()
    assert snapshot_zips(entries, 2) == ["state/0/0/2.zip"]
    references = {
        "state/0/0/2.zip": (
            FileEntry("state/0/0/SSTs/000008-aa.sst", 100),
            FileEntry("state/0/0/SSTs/000009-bb.sst", 200),
        )
    }
    cut = cut_for_batch(entries, 2, references)
    assert paths(cut, "state/") == [
        "state/0/0/2.zip",
        "state/0/0/3.changelog",
        "state/0/0/SSTs/000008-aa.sst",
        "state/0/0/SSTs/000009-bb.sst",
    ]
    without = cut_for_batch(entries, 2)
    assert paths(without, "state/0/0/SSTs/") == [
        "state/0/0/SSTs/000008-aa.sst",
        "state/0/0/SSTs/000009-bb.sst",
        "state/0/0/SSTs/000012-cc.sst",
    ]


def test_rocksdb_changelogs_from_the_empty_version_need_no_sst() -> None:
    entries = listing(*query_files(0, 1, 2)) + listing(
        *(f"state/0/0/{v}.changelog" for v in (1, 2, 3)), "state/0/0/4.zip"
    )
    assert snapshot_zips(entries, 2) == []
    cut = cut_for_batch(entries, 2, {})
    assert paths(cut, "state/") == [f"state/0/0/{v}.changelog" for v in (1, 2, 3)]


@pytest.mark.parametrize(
    ("references", "message"),
    [
        ({}, "no SST references given"),
        ({"state/0/0/2.zip": (FileEntry("state/0/0/SSTs/000010-dd.sst", 1),)}, "not listed"),
        ({"state/0/0/2.zip": (FileEntry("state/0/0/SSTs/000009-bb.sst", 999),)}, "partial"),
    ],
)
def test_rocksdb_sst_references_are_checked(references: References, message: str) -> None:
    entries = listing(*query_files(1, 2)) + rocksdb_store()
    with pytest.raises(CheckpointError, match=message):
        cut_for_batch(entries, 2, references)


def test_duplicate_paths_in_a_listing_raise() -> None:
    with pytest.raises(CheckpointError, match="twice"):
        cut_for_batch(listing(*query_files(0), "metadata"), 0)


@pytest.mark.parametrize("path", ["/abs", "a//b", "a/../b", "./a", "", "a/"])
def test_file_entries_must_be_relative_paths(path: str) -> None:
    with pytest.raises(CheckpointError):
        FileEntry(path, 1)


def test_file_entry_size_cannot_be_negative() -> None:
    with pytest.raises(CheckpointError, match="negative"):
        FileEntry("a", -1)


# ------------------------------------------------------------------ edges on real files


def write_file(root: Path, path: str, data: bytes = b"x") -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def write_zip(root: Path, path: str, metadata: str) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("CURRENT", "MANIFEST-000005\n")
        archive.writestr("metadata", metadata)


def rocksdb_metadata(*ssts: tuple[str, int], logs: Sequence[tuple[str, int]] = ()) -> str:
    body = {
        "sstFiles": [
            {
                "localFileName": name.split("-")[0] + ".sst",
                "dfsSstFileName": name,
                "sizeBytes": size,
            }
            for name, size in ssts
        ],
        "numKeys": 3,
    }
    if logs:
        body["logFiles"] = [
            {
                "localFileName": name.split("-")[0] + ".log",
                "dfsLogFileName": name,
                "sizeBytes": size,
            }
            for name, size in logs
        ]
    return "v1\n" + json.dumps(body)


def test_list_checkpoint_walks_files_with_sizes(tmp_path: Path) -> None:
    write_file(tmp_path, "metadata", b"12345")
    write_file(tmp_path, "offsets/0", b"")
    write_file(tmp_path, "state/0/0/1.delta", b"abc")
    write_file(tmp_path, "state/0/0/.1.delta.crc", b"ab")
    write_file(tmp_path, "state/0/0/2.delta.tmp", b"ab")
    write_file(tmp_path, "offsets/.hidden/1", b"ab")
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / "metadata", tmp_path / "link")
    listed = list_checkpoint(tmp_path)
    assert listed == [
        FileEntry("metadata", 5),
        FileEntry("offsets/0", 0),
        FileEntry("state/0/0/1.delta", 3),
    ]
    assert [entry.mtime_ns for entry in listed] == [
        (tmp_path / entry.path).stat().st_mtime_ns for entry in listed
    ]


def test_list_checkpoint_tolerates_files_disappearing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for path in ("metadata", "state/0/0/1.delta", "state/0/0/2.delta", "state/0/1/1.delta"):
        write_file(tmp_path, path)
    real_scandir = os.scandir

    class Vanishing:
        """scandir that deletes some entries between listing and stat, as maintenance does."""

        def __init__(self, path: Any) -> None:
            self.scan = real_scandir(path)

        def __enter__(self) -> Iterator[os.DirEntry[str]]:
            return self.entries()

        def __exit__(self, *exc: object) -> None:
            self.scan.close()

        def entries(self) -> Iterator[os.DirEntry[str]]:
            for item in self.scan:
                if item.name == "1.delta" and "/0/0" in item.path:
                    os.remove(item.path)
                if item.name == "1":
                    shutil.rmtree(item.path)  # a whole directory goes before it is walked
                yield item

    monkeypatch.setattr(os, "scandir", Vanishing)
    assert [entry.path for entry in list_checkpoint(tmp_path)] == ["metadata", "state/0/0/2.delta"]


def test_list_checkpoint_of_a_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        list_checkpoint(tmp_path / "nope")


def test_read_sst_references_parses_ssts_and_logs(tmp_path: Path) -> None:
    metadata = rocksdb_metadata(("000008-aa.sst", 100), logs=[("000011-ee.log", 7)])
    write_zip(tmp_path, "state/0/0/2.zip", metadata)
    assert read_sst_references(tmp_path, ["state/0/0/2.zip"]) == {
        "state/0/0/2.zip": (
            FileEntry("state/0/0/SSTs/000008-aa.sst", 100),
            FileEntry("state/0/0/logs/000011-ee.log", 7),
        )
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("not a zip", "cannot read"),
        ("v1\n{not json", "malformed"),
        ('v1\n{"sstFiles": [{"dfsSstFileName": "x.sst"}]}', "malformed"),
        ("garbage\n{}", "malformed"),
    ],
)
def test_read_sst_references_translates_failures(
    tmp_path: Path, content: str | None, message: str
) -> None:
    if content == "not a zip":
        write_file(tmp_path, "state/0/0/2.zip", b"PK?")
    elif content is not None:
        write_zip(tmp_path, "state/0/0/2.zip", content)
    with pytest.raises(CheckpointError, match=message):
        read_sst_references(tmp_path, ["state/0/0/2.zip"])


def test_read_cut_uses_the_newest_committed_batch_and_zip_references(tmp_path: Path) -> None:
    for path in [*query_files(0, 1, 2, committed=[0, 1]), "state/0/0/1.changelog"]:
        write_file(tmp_path, path)
    write_file(tmp_path, "state/0/0/SSTs/000008-aa.sst", b"a" * 100)
    write_file(tmp_path, "state/0/0/SSTs/000012-cc.sst", b"c" * 30)
    write_zip(tmp_path, "state/0/0/2.zip", rocksdb_metadata(("000008-aa.sst", 100)))
    write_file(tmp_path, "state/0/0/3.changelog")
    cut = read_cut(tmp_path)
    assert cut.batch_id == 1
    assert paths(cut, "state/") == ["state/0/0/2.zip", "state/0/0/SSTs/000008-aa.sst"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no committed batch"):
        read_cut(empty)


def test_read_cut_stats_only_the_files_of_the_cut_and_checks_sst_sizes_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint keeps many versions a cut does not need: they are listed by name,
    never stat-ed. The cut's entries carry the sizes and times a full listing gives, and
    an SST whose size is not the one its zip records is still refused."""
    batches = list(range(12))
    for path in query_files(*batches, committed=batches):
        write_file(tmp_path, path)
    for version in range(1, 13):
        write_file(tmp_path, f"state/0/0/{version}.changelog", b"c" * version)
    write_file(tmp_path, "state/0/0/SSTs/000008-aa.sst", b"a" * 100)
    write_zip(tmp_path, "state/0/0/10.zip", rocksdb_metadata(("000008-aa.sst", 100)))
    stated: list[str] = []
    real_stat = os.stat

    def counting(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        stated.append(Path(path).relative_to(tmp_path).as_posix())
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting)
    cut = read_cut(tmp_path)
    assert cut.batch_id == 11
    assert sorted(path for path in stated if path != ".") == [entry.path for entry in cut.files]
    stated.clear()  # with a zip cache, the zip's stat for the cache serves the cut too
    assert read_cut(tmp_path, zip_cache={}) == cut
    monkeypatch.setattr(os, "stat", real_stat)
    assert sorted(path for path in stated if path != ".") == [entry.path for entry in cut.files]
    assert paths(cut, "state/0/0/") == [
        "state/0/0/10.zip", "state/0/0/11.changelog", "state/0/0/12.changelog",
        "state/0/0/SSTs/000008-aa.sst",
    ]  # fmt: skip
    listed = {entry.path: entry for entry in list_checkpoint(tmp_path)}
    assert [(e.size, e.mtime_ns) for e in cut.files] == [
        (listed[e.path].size, listed[e.path].mtime_ns) for e in cut.files
    ]
    write_file(tmp_path, "state/0/0/SSTs/000008-aa.sst", b"a" * 99)
    with pytest.raises(CheckpointError, match="partial upload"):
        read_cut(tmp_path)


def test_read_cut_reads_a_zip_again_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for path in [*query_files(0, 1, 2, committed=[0, 1]), "state/0/0/1.changelog"]:
        write_file(tmp_path, path)
    write_file(tmp_path, "state/0/0/SSTs/000008-aa.sst", b"a" * 100)
    write_file(tmp_path, "state/0/0/SSTs/000012-cc.sst", b"c" * 30)
    write_zip(tmp_path, "state/0/0/2.zip", rocksdb_metadata(("000008-aa.sst", 100)))
    opened: list[str] = []
    real_zipfile = zipfile.ZipFile

    def counting(path: Any, *args: Any, **kwargs: Any) -> zipfile.ZipFile:
        if (args[0] if args else kwargs.get("mode", "r")) == "r":
            opened.append(Path(path).name)
        return real_zipfile(path, *args, **kwargs)

    monkeypatch.setattr(zipfile, "ZipFile", counting)
    cache: dict[str, Any] = {}
    first = read_cut(tmp_path, zip_cache=cache)
    assert read_cut(tmp_path, zip_cache=cache) == first
    assert opened == ["2.zip"]
    # Rewritten in place (a test of the cache's key, not something Spark does).
    time.sleep(0.01)
    write_zip(tmp_path, "state/0/0/2.zip", rocksdb_metadata(("000012-cc.sst", 30)))
    again = read_cut(tmp_path, zip_cache=cache)
    assert opened == ["2.zip", "2.zip"]
    assert paths(again, "state/") == ["state/0/0/2.zip", "state/0/0/SSTs/000012-cc.sst"]
    assert list(cache) == ["state/0/0/2.zip"]


# ------------------------------------------------------- model of checkpoint histories


@dataclass
class History:
    """A checkpoint written the way Spark writes one, file contents kept beside the listing.

    A step file holds the changes of its version, a snapshot or zip the whole state; so a
    cut can be replayed and compared with the state the model knows for each version.
    """

    provider: str
    stores: list[str]
    partitions: int
    sizes: dict[str, int] = field(default_factory=dict)
    contents: dict[str, tuple[str, dict[int, int | None]]] = field(default_factory=dict)
    truth: dict[tuple[str, int], dict[int, int]] = field(default_factory=dict)
    zip_ssts: dict[str, tuple[FileEntry, ...]] = field(default_factory=dict)
    sst_number: int = 0
    newest_committed: int = -1

    def write(self, path: str, size: int = 10, content: Any = None) -> None:
        self.sizes[path] = size
        parent, _, name = path.rpartition("/")
        self.sizes[f"{parent}/.{name}.crc" if parent else f".{name}.crc"] = 12
        if content is not None:
            self.contents[path] = content

    def delete(self, path: str) -> None:
        self.sizes.pop(path, None)
        parent, _, name = path.rpartition("/")
        self.sizes.pop(f"{parent}/.{name}.crc" if parent else f".{name}.crc", None)

    def write_zip(self, store: str, version: int, draw: Callable[[Any], Any]) -> None:
        """A RocksDB zip: a new SST for this version plus some SSTs of the previous zip."""
        previous = max((z for z in self.zip_ssts if z.startswith(f"{store}/")), default=None)
        kept = (
            [s for s in self.zip_ssts.get(previous, ()) if draw(st.booleans())] if previous else []
        )
        self.sst_number += 1
        sst = FileEntry(
            f"{store}/SSTs/{self.sst_number:06d}-{version}.sst", draw(st.integers(1, 999))
        )
        self.write(sst.path, sst.size)
        path = f"{store}/{version}.zip"
        self.zip_ssts[path] = (*kept, sst)
        self.write(path, 50, ("full", dict(self.truth[(store, version)])))

    def entries(self) -> list[FileEntry]:
        return [FileEntry(path, size) for path, size in self.sizes.items()]

    def versioned(self, store: str) -> dict[int, set[str]]:
        found: dict[int, set[str]] = {}
        for path in self.sizes:
            parent, _, name = path.rpartition("/")
            version, _, kind = name.partition(".")
            if parent == store and version.isdigit():
                found.setdefault(int(version), set()).add(kind)
        return found


def build_history(draw: Callable[[Any], Any]) -> tuple[History, int]:
    """Batches with random state changes, periodic maintenance (snapshot, then delete what
    no retained batch needs), and maybe a last batch that is planned but not committed."""
    provider = draw(st.sampled_from(["hdfs", "rocksdb", "rocksdb-changelog"]))
    names = draw(st.sampled_from([[""], ["left", "right"]]))
    partitions = draw(st.integers(1, 3))
    stores = [
        f"state/{op}/{part}" + (f"/{name}" if name else "")
        for op in range(draw(st.integers(1, 2)))
        for part in range(partitions)
        for name in names
    ]
    history = History(provider, stores, partitions)
    retain = draw(st.integers(1, 5))
    batches = draw(st.integers(1, 25))
    in_flight = draw(st.booleans())
    history.write("metadata")
    for op in {store.split("/")[1] for store in stores}:
        history.write(f"state/{op}/_metadata/metadata")
        for name in names:
            history.write(f"state/{op}/0/" + (f"{name}/" if name else "") + "_metadata/schema")
    for batch in range(batches):
        version = batch + 1
        history.write(f"offsets/{batch}", 100)
        history.write(f"sources/0/{batch}", 20)
        for store in stores:
            changes = {key: draw(st.one_of(st.none(), st.integers(0, 9))) for key in range(3)}
            changes = {key: value for key, value in changes.items() if draw(st.booleans())}
            state = dict(history.truth.get((store, version - 1), {}))
            for key, value in changes.items():
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = value
            history.truth[(store, version)] = state
            if provider == "rocksdb":
                history.write_zip(store, version, draw)
            else:
                step = "delta" if provider == "hdfs" else "changelog"
                history.write(f"{store}/{version}.{step}", 30, ("step", changes))
        if draw(st.integers(0, 9)) == 0:
            history.write(f"state/0/0/.{version}.delta.{batch}.tmp", 3)
        if not (in_flight and batch == batches - 1):
            history.write(f"commits/{batch}", 40)
            history.newest_committed = batch
        if draw(st.booleans()):
            maintain(history, draw, retain)
    return history, batches - 1 if in_flight else -1


def maintain(history: History, draw: Callable[[Any], Any], retain: int) -> None:
    """Spark's maintenance: snapshot the newest version of some stores, then delete old
    versions and log entries that the newest ``retain`` versions do not need."""
    for store in history.stores:
        versions = history.versioned(store)
        newest = max(versions)
        if history.provider != "rocksdb" and draw(st.booleans()):
            if history.provider == "hdfs":
                full = ("full", dict(history.truth[(store, newest)]))
                history.write(f"{store}/{newest}.snapshot", 50, full)
            elif f"{store}/{newest}.zip" not in history.zip_ssts:
                history.write_zip(store, newest, draw)
        base_kind = "snapshot" if history.provider == "hdfs" else "zip"
        oldest_kept = newest - retain
        base = max(
            (v for v, kinds in versions.items() if base_kind in kinds and v <= oldest_kept),
            default=0,
        )
        for version in [v for v in history.versioned(store) if v < base]:
            for kind in ("delta", "snapshot", "changelog", "zip"):
                history.delete(f"{store}/{version}.{kind}")
                history.zip_ssts.pop(f"{store}/{version}.zip", None)
        referenced = {sst.path for ssts in history.zip_ssts.values() for sst in ssts}
        for path in [p for p in history.sizes if p.startswith(f"{store}/SSTs/") and "/." not in p]:
            if path not in referenced and draw(st.booleans()):
                history.delete(path)
    newest_batch = max(max(history.versioned(store)) for store in history.stores) - 1
    for path in list(history.sizes):
        log, _, name = path.partition("/")
        if log in ("offsets", "commits") and name.isdigit() and int(name) < newest_batch - retain:
            history.delete(path)


def replay(history: History, cut: Cut, store: str) -> dict[int, int]:
    """Rebuild a store's state from the files of a cut alone, checking the chain's shape."""
    files = {}
    for entry in cut.files:
        parent, _, name = entry.path.rpartition("/")
        version, _, kind = name.partition(".")
        if parent == store and version.isdigit():
            files[(int(version), kind)] = entry.path
    assert all(version <= cut.state_version for version, _ in files), "a file newer than N+1"
    bases = sorted(version for version, kind in files if kind in ("snapshot", "zip"))
    assert len(bases) <= 1, f"{store}: more than one base in the cut"
    base = bases[0] if bases else 0
    steps = sorted(version for version, kind in files if kind in ("delta", "changelog"))
    assert steps == list(range(base + 1, cut.state_version + 1)), f"{store}: chain {base}+{steps}"
    base_kind = "snapshot" if history.provider == "hdfs" else "zip"
    step_kind = "delta" if history.provider == "hdfs" else "changelog"
    chain = [files[(base, base_kind)]] if base else []
    chain += [files[(version, step_kind)] for version in steps]
    state: dict[int, int] = {}
    for path in chain:
        for key, value in history.contents[path][1].items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


def zips_or_snapshots(cut: Cut) -> bool:
    return any(entry.path.endswith((".zip", ".snapshot")) for entry in cut.files)


def check_cut(history: History, entries: list[FileEntry], batch: int, cut: Cut) -> None:
    listed = {entry.path: entry for entry in entries}
    assert cut.batch_id == batch and cut.state_version == batch + 1
    for entry in cut.files:
        assert listed[entry.path] == entry
        assert not any(part.startswith(".") for part in entry.path.split("/"))
        assert not entry.path.endswith(".tmp")
    logs = {p for p in paths(cut) if p.startswith(("offsets/", "commits/"))}
    assert logs == {f"offsets/{batch - 1}", f"offsets/{batch}", f"commits/{batch}"} - (
        {"offsets/-1"}
    )
    for store in history.stores:
        assert replay(history, cut, store) == history.truth[(store, batch + 1)]
        zips = [p for p in paths(cut, f"{store}/") if p.endswith(".zip")]
        expected_ssts = sorted(sst.path for z in zips for sst in history.zip_ssts[z])
        assert paths(cut, f"{store}/SSTs/") == expected_ssts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_committed_batch_cuts_to_a_chain_reaching_exactly_n_plus_1(
    data: st.DataObject,
) -> None:
    history, in_flight = build_history(data.draw)
    entries = history.entries()
    batches = committed_batches(entries)
    assert in_flight not in batches
    # Maintenance never drops the newest committed batch.
    assert batches[-1:] == ([history.newest_committed] if history.newest_committed >= 0 else [])
    for batch in batches:
        references = {z: history.zip_ssts[z] for z in snapshot_zips(entries, batch)}
        if batch > 0 and f"offsets/{batch - 1}" not in history.sizes:
            with pytest.raises(CheckpointError, match=f"offsets/{batch - 1} is gone"):
                cut_for_batch(entries, batch, references, history.partitions)
            event("oldest kept batch: offsets/N-1 purged")
            continue
        cut = cut_for_batch(entries, batch, references, history.partitions)
        check_cut(history, entries, batch, cut)
        event(f"{history.provider}: base " + ("yes" if zips_or_snapshots(cut) else "none"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_lost_file_gives_an_error_or_a_still_correct_cut(data: st.DataObject) -> None:
    history, _ = build_history(data.draw)
    visible = sorted(p for p in history.sizes if "/." not in p and not p.startswith("."))
    history.delete(data.draw(st.sampled_from(visible)))
    entries = history.entries()
    for batch in committed_batches(entries):
        try:
            references = {z: history.zip_ssts[z] for z in snapshot_zips(entries, batch)}
            cut = cut_for_batch(entries, batch, references, history.partitions)
        except CheckpointError:
            event("lost file: CheckpointError")
            continue
        check_cut(history, entries, batch, cut)
        event("lost file: still a correct cut")


# ------------------------------------------------------------------------- real Spark


def copy_cut(source: Path, cut: Cut, target: Path) -> None:
    target.mkdir(parents=True)
    for entry in cut.files:
        destination = target / entry.path
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / entry.path, destination)


def replays_steps(cut: Cut) -> bool:
    return any(entry.path.endswith((".delta", ".changelog")) for entry in cut.files)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("provider", SPARK_PROVIDERS)
def test_spark_reads_and_restarts_from_copied_cuts(
    spark: Any, provider: str, tmp_path: Path
) -> None:
    """Copy only the cut of each committed batch N into an empty directory: Spark's state
    reader sees the same state at N there as in the original. Then restart the query from
    the cut of a batch before the newest one (so newer files existed and were left out)
    with more input: the output equals that of a run that was never interrupted."""
    from spark_fixtures import run_query, state_rows, write_input

    inputs, original = tmp_path / "in", tmp_path / "original"
    for index in range(4):
        write_input(inputs, index)
    first = run_query(spark, inputs, original, provider)

    batches = committed_batches(list_checkpoint(original))
    assert batches == list(range(len(batches))) and len(batches) >= 3
    cuts = {batch: read_cut(original, batch) for batch in batches}
    for batch, cut in cuts.items():
        copy = tmp_path / f"cut-{batch}"
        copy_cut(original, cut, copy)
        for operator in (0, 1):  # 0: the aggregation, 1: dropDuplicates
            expected_state = state_rows(spark, original, batch, operator)
            assert expected_state, f"no state at batch {batch}: the comparison proves nothing"
            assert state_rows(spark, copy, batch, operator) == expected_state

    # Maintenance runs on its own clock: prefer a cut that replays deltas or changelogs.
    older = batches[:-1]
    batch = next((b for b in reversed(older) if replays_steps(cuts[b])), older[-1])
    restored = tmp_path / f"cut-{batch}"
    for index in range(4, 6):
        write_input(inputs, index)
    second = run_query(spark, inputs, restored, provider)
    uninterrupted = run_query(spark, inputs, tmp_path / "uninterrupted", provider)

    resumed = [row for b, rows in first.items() if b <= batch for row in rows]
    resumed += [row for b, rows in second.items() if b > batch for row in rows]
    expected = [row for rows in uninterrupted.values() for row in rows]
    assert expected, "the query emitted nothing: the comparison would prove nothing"
    assert sorted(resumed) == sorted(expected)


@given(
    present=st.sets(st.integers(0, 40), max_size=30),
    compactions=st.sets(st.integers(0, 40), max_size=4),
    end=st.integers(0, 40),
)
def test_a_source_log_is_trimmed_exactly_above_its_end_or_kept_whole(
    present: set[int], compactions: set[int], end: int
) -> None:
    """Whatever the log holds: entries at or below the end are never dropped, and either
    every entry above it is dropped (the log up to the end is complete from its newest
    compaction) or nothing is."""
    names = {f"sources/0/{k}" for k in present - compactions}
    names |= {f"sources/0/{k}.compact" for k in compactions}
    names |= {"sources/0/metadata", "sources/1/7"}
    cut = cut_for_batch(listing(*query_files(0), *sorted(names)), 0, source_log_ends={0: end})
    kept = set(paths(cut, "sources/"))
    assert {"sources/0/metadata", "sources/1/7"} <= kept
    log_names = {name for name in names if name.startswith("sources/0/") and "metadata" not in name}
    number = {name: int(name.rsplit("/", 1)[1].split(".")[0]) for name in log_names}
    assert {name for name in log_names if number[name] <= end} <= kept
    above = {name for name in log_names if number[name] > end}
    base = max((k for k in compactions if k <= end), default=-1) + 1
    complete = all(k in present | compactions for k in range(base, end + 1))
    assert not (above & kept) if complete else above <= kept


def test_a_cut_from_the_last_cuts_bases_is_the_cut_a_full_listing_gives(tmp_path: Path) -> None:
    """Breaks nothing: a push cuts from the bases of its last cut (``version_floors``),
    leaving older versioned files unread. Must hold: for every later batch the cut is
    the one a full listing gives (HDFS: snapshots every 10 deltas; RocksDB: a zip every
    10 changelogs and its SST), the older versions are not listed at all, and a floor
    above the base a cut needs is refused (the pusher then lists everything)."""
    batches = list(range(40))
    for path in query_files(*batches, committed=batches):
        write_file(tmp_path, path)
    for version in range(1, 41):
        for partition in range(3):
            write_file(tmp_path, f"state/0/{partition}/{version}.delta")
            write_file(tmp_path, f"state/0/{partition}/.{version}.delta.crc")
            if version % 10 == 0:
                write_file(tmp_path, f"state/0/{partition}/{version}.snapshot")
        write_file(tmp_path, f"state/1/0/{version}.changelog")
        if version % 10 == 0:
            write_zip(tmp_path, f"state/1/0/{version}.zip", rocksdb_metadata(("000008-aa.sst", 1)))
    write_file(tmp_path, "state/1/0/SSTs/000008-aa.sst")
    floors: dict[str, int] = {}
    for batch in range(15, 40):
        full = read_cut(tmp_path, batch)
        if floors:
            assert read_cut(tmp_path, batch, floors=floors) == full, batch
        floors = version_floors(full)
    assert floors == {"state/0/0": 40, "state/0/1": 40, "state/0/2": 40, "state/1/0": 40}
    listed = [path for path, _item in _list_items(tmp_path, {"state/0/0": 30})]
    deltas = [f"state/0/0/{v}.delta" for v in range(31, 41)]
    assert [p for p in listed if p.startswith("state/0/0/")] == sorted(
        ["state/0/0/30.delta", "state/0/0/30.snapshot", *deltas, "state/0/0/40.snapshot"]
    )
    with pytest.raises(CheckpointError, match="cannot rebuild"):
        read_cut(tmp_path, 25, floors={"state/0/0": 27})
