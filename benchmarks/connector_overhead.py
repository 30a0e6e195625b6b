"""Parts 1 and 2 of the connector benchmark: the overhead of ``StateSync`` on a running
query (two copies of the events query, fed in alternating blocks, with and without the
connector) and the bytes it uploads per batch against the checkpoint bytes each batch
wrote. ``measure_overhead`` runs both for one state store provider."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from connector_probes import (
    Bench,
    RecordingSync,
    listing,
    ring_stored_bytes,
    step_figures,
    tree_bytes,
)
from connector_settings import PROVIDER_CONF, PROVIDERS, TARGET_OVERHEAD_RATIO
from connector_spark import (
    BatchFigures,
    batches_from,
    check_query,
    start_events_query,
    write_events,
)
from connector_stats import (
    Listing,
    bench_batches,
    cpu_delta,
    extra_cpu,
    median,
    new_files,
    pair_interval,
    pair_ratios,
    upload_summary,
)


@dataclass(slots=True)
class Side:
    """One copy of the overhead query: with the connector (``sync``) or without."""

    label: str
    query: Any
    input_dir: Path
    checkpoint_dir: Path
    sync: RecordingSync | None
    next_file: int = 0
    batches: list[BatchFigures] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    # The checkpoint as last listed: new files are counted from here on.
    listed: Listing = field(default_factory=dict)


def stage(side: Side, bench: Bench, count: int) -> list[Path]:
    """Generate ``side``'s next ``count`` input files beside its input directory (not
    yet seen by the query): generating one takes about a quarter of a second of this
    process's CPU, which, written straight into the directory, overlapped the block's
    first batches and took a core from them (on either side, at random)."""
    staging = side.input_dir.with_name(side.input_dir.name + "-staged")
    staged = [write_events(staging, side.next_file + n, bench.settings) for n in range(count)]
    side.next_file += count
    return staged


def feed(side: Side, staged: Sequence[Path]) -> tuple[list[BatchFigures], float, float]:
    """Rename the ``staged`` files into ``side``'s input directory together and wait until
    they are processed (and pushed): the batches, the wall seconds of processing, and
    the seconds then waited for the push."""
    first_batch_id = side.next_file - len(staged)
    started = time.perf_counter()
    for path in staged:
        path.rename(side.input_dir / path.name)
    side.query.processAllAvailable()
    wall_s = time.perf_counter() - started
    check_query(side.query)
    batches = batches_from(side.query, first_batch_id)
    ids = [batch.batch_id for batch in batches]
    if ids != list(range(first_batch_id, side.next_file)):
        raise RuntimeError(f"{side.label}: expected batches {first_batch_id}..; got {ids}")
    flush_s = 0.0 if side.sync is None else side.sync.wait_pushed(side.next_file - 1)
    return batches, wall_s, flush_s


def run_block(side: Side, bench: Bench) -> None:
    staged = stage(side, bench, bench.settings.block_batches)
    cpu_before = bench.processes.sample()
    batches, wall_s, flush_s = feed(side, staged)
    cpu = cpu_delta(cpu_before, bench.processes.sample())
    side.batches.extend(batches)
    block: dict[str, Any] = {
        "batch_ids": [batches[0].batch_id, batches[-1].batch_id],
        "trigger_ms_median": median([batch.trigger_ms for batch in batches]),
        "wall_s": round(wall_s, 3),
        "flush_wait_s": round(flush_s, 3),
        "cpu_s": cpu,
    }
    if side.sync is not None:
        pushes = side.sync.take_pushes()
        before, side.listed = side.listed, listing(side.checkpoint_dir)
        created = new_files(before, side.listed)
        block |= {
            "pushes": len(pushes),
            "uploaded_bytes": sum(report.bytes_read for report, _ in pushes),
            "new_bytes_visible": created.bytes_visible,
            "new_bytes_all": created.bytes_all,
        }
    side.blocks.append(block)


def upload_steps(side: Side, bench: Bench, count: int) -> list[dict[str, Any]]:
    """``count`` single batches, each processed and pushed before the next: per batch, the
    bytes uploaded against the checkpoint bytes the batch wrote."""
    assert side.sync is not None, "upload is measured on the connector side"
    steps = []
    for _ in range(count):
        batches, _wall_s, flush_s = feed(side, stage(side, bench, 1))
        before, side.listed = side.listed, listing(side.checkpoint_dir)
        steps.append(step_figures(side.sync, before, side.listed))
        steps[-1] |= {"batch_id": batches[0].batch_id, "trigger_ms": batches[0].trigger_ms}
        steps[-1] |= {"flush_wait_s": round(flush_s, 3)}
    return steps


def side_summary(side: Side) -> dict[str, Any]:
    trigger_ms = [batch.trigger_ms for batch in side.batches]
    cpu: dict[str, float | None] = {}
    for block in side.blocks:
        for name, seconds in block["cpu_s"].items():
            present = cpu.get(name, 0.0) is not None and seconds is not None
            cpu[name] = (cpu.get(name) or 0.0) + seconds if present else None
    return {
        "batches": len(trigger_ms),
        "trigger_ms_median": median(trigger_ms),
        "trigger_ms_mean": statistics.fmean(trigger_ms),
        "trigger_ms_p90": statistics.quantiles(trigger_ms, n=10)[-1]
        if len(trigger_ms) > 1
        else None,
        "wall_s_per_batch_median": median(
            [block["wall_s"] / bench_batches(block) for block in side.blocks]
        ),
        "flush_wait_s_median": median([block["flush_wait_s"] for block in side.blocks]),
        "cpu_s": cpu,
        "state_rows_last": side.batches[-1].state_rows if side.batches else None,
        "blocks": side.blocks,
        "per_batch": [asdict(batch) for batch in side.batches],
    }


def run_sides(bench: Bench, with_side: Side, without_side: Side) -> None:
    """Warm both queries up, then alternate blocks: with, without, without, with, ...

    The warm-up alternates too, in blocks of the same size: batch times keep falling for
    the first few dozen batches of a JVM (code still being compiled), and a warm-up fed
    one side after the other left the first measured block, the connector's, paying
    for it (about 750 against 600 ms per batch with 10 warm-up batches each)."""
    settings = bench.settings
    left = {with_side.label: settings.warmup_batches, without_side.label: settings.warmup_batches}
    pair = 0
    while any(left.values()):
        order = (with_side, without_side) if pair % 2 == 0 else (without_side, with_side)
        for side in order:
            count = min(left[side.label], settings.block_batches)
            if count:
                feed(side, stage(side, bench, count))
                left[side.label] -= count
        pair += 1
    assert with_side.sync is not None
    with_side.sync.take_pushes()
    with_side.listed = listing(with_side.checkpoint_dir)
    for pair in range(settings.blocks):
        order = (with_side, without_side) if pair % 2 == 0 else (without_side, with_side)
        for side in order:
            run_block(side, bench)
        bench.log(
            f"  blocks {pair + 1}/{settings.blocks}: median trigger ms "
            f"with {with_side.blocks[-1]['trigger_ms_median']}, "
            f"without {without_side.blocks[-1]['trigger_ms_median']}"
        )


def measure_overhead(bench: Bench, provider: str) -> dict[str, Any]:
    """Part 1 (and the upload figures of part 2) for one state store provider."""
    spark, cluster = bench.spark, bench.cluster
    spark.conf.set(PROVIDER_CONF, PROVIDERS[provider])
    root = bench.work / f"overhead-{provider}"
    name = f"overhead-{provider}"
    sides: list[Side] = []
    sync = RecordingSync(cluster.ring, name, root / "ckpt-with", cluster.secret)
    try:
        sync.attach(spark)  # every batch's plan on the ring before it runs
        for label, side_sync in (("with", sync), ("without", None)):
            input_dir = root / f"in-{label}"
            input_dir.mkdir(parents=True)
            checkpoint = root / f"ckpt-{label}"
            if side_sync is not None:
                checkpoint = side_sync.checkpoint_dir
            query = start_events_query(spark, input_dir, checkpoint, f"{name}-{label}")
            sides.append(Side(label, query, input_dir, checkpoint, side_sync))
        sync.register(sides[0].query, spark)
        stored_before = ring_stored_bytes(bench.client)
        run_sides(bench, sides[0], sides[1])
        steps = upload_steps(sides[0], bench, bench.settings.upload_batches)
        stored_after = ring_stored_bytes(bench.client)
    finally:
        sync.close()
        for side in sides:
            side.query.stop()
    with_figures, without_figures = side_summary(sides[0]), side_summary(sides[1])
    ratio = with_figures["trigger_ms_median"] / without_figures["trigger_ms_median"]
    blocks = sides[0].blocks
    pairs = pair_ratios(blocks, sides[1].blocks)
    uploaded = sum(block["uploaded_bytes"] for block in blocks)
    visible = sum(block["new_bytes_visible"] for block in blocks)
    return {
        "provider": provider,
        "trigger_ms_median": {
            "with": with_figures["trigger_ms_median"],
            "without": without_figures["trigger_ms_median"],
        },
        "ratio": ratio,
        "target_ratio": TARGET_OVERHEAD_RATIO,
        "target_met": ratio <= TARGET_OVERHEAD_RATIO,
        # Per pair of neighbouring blocks, with / without: a slow stretch of the machine
        # moves one pair, not the pooled medians' balance.
        "pair_ratios": pairs,
        # [mean, low, high]: the pair ratios' mean and its bootstrap 95 % interval.
        "pair_ratio_interval": pair_interval(pairs),
        "extra_cpu_s_per_batch": extra_cpu(with_figures, without_figures),
        "with": with_figures,
        "without": without_figures,
        "blocks_upload": {
            "uploaded_bytes": uploaded,
            "new_bytes_visible": visible,
            "new_bytes_all": sum(block["new_bytes_all"] for block in blocks),
            "ratio_visible": uploaded / visible if visible else None,
        },
        "upload": upload_summary(steps),
        "ring_stored_bytes_delta": stored_after - stored_before,
        "checkpoint_bytes": tree_bytes(sides[0].checkpoint_dir),
    }
