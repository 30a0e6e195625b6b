"""Query leases (ring.lease, spark_connector.lease) and a standby's incremental pulls
(spark_connector.pull), on a real ring, without Spark.

What it breaks: a holder stops renewing (its clock is frozen, as a killed or cut-off
application's would be), another application waits, takes over, and the old holder
comes back. What must hold: one holder per fence, fences only grow, no one takes a lease
before it lapsed on the taker's own clock, the old holder's renewals, fence checks and
pushes are refused, a released lease is taken at once; a standby's pull fetches only
the files a batch changed and leaves the directory equal to the batch's cut.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import commit_next_batch, materialize

from ring.auth import scoped_credential
from ring.codec import compact_json
from ring.errors import ConfigError, DataUnavailable, Fenced, PeerUnavailable, ProtocolError
from ring.lease import (
    DRIFT_MAX,
    LEASE_BYTES_MAX,
    Lease,
    check_timing,
    first_lease,
    holder_valid_until,
    lapse_after_s,
    parse_lease,
)
from ring.sync_client import SyncClient
from spark_connector.catalog import forget
from spark_connector.checkpoint import read_cut
from spark_connector.lease import QueryLease, check_credential_fences, lease_key, read_lease
from spark_connector.manifest import Manifest, manifest_key
from spark_connector.pull import Puller
from spark_connector.restore import newest_manifest
from spark_connector.standby import Standby
from spark_connector.sync import StateSync
from sr3.local import LocalCluster


class FakeClock:
    """A monotonic clock a test moves by hand (one per application)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_round_trips_and_malformed_values_are_refused() -> None:
    lease = first_lease("host-a:12", 3.0, 1.7e9).renewed(1.7e9 + 1, {"batch": 4})
    assert parse_lease(lease.encode()) == lease
    taken = lease.taken_by("host-b:7", 5.0, 1.8e9)
    assert (taken.fence, taken.holder, taken.timeout_s, taken.note) == (2, "host-b:7", 5.0, None)
    for raw in (
        b"not json",
        b"[]",
        b'{"format": 2}',
        lease.encode().replace(b'"fence":1', b'"fence":0'),
        lease.encode().replace(b'"fence":1', b'"fence":true'),
        lease.encode().replace(b'"timeout_s":3.0', b'"timeout_s":1e9'),
        lease.encode().replace(b'"holder":"host-a:12"', b'"holder":"a/b"'),
        # What ``json.loads`` alone would recurse on (RecursionError, a 500 at every
        # fenced write naming the record), read as a number of any length, or take
        # whole: the bounded loader refuses them.
        b"[" * 100_000 + b"]" * 100_000,
        b'{"format": 1, "note": ' + b'{"a": ' * 40 + b"1" + b"}" * 41,
        lease.encode().replace(b'"fence":1', b'"fence":' + b"1" * 5000),
        lease.encode().replace(b'"timeout_s":3.0', b'"timeout_s":NaN'),
        lease.encode()[:-1] + b',"pad":"' + b"x" * LEASE_BYTES_MAX + b'"}',
    ):
        with pytest.raises(ProtocolError):
            parse_lease(raw)
    with pytest.raises(ConfigError):
        check_timing(3.0, 1.5, 0.05)  # no room for a second try inside the validity
    with pytest.raises(ConfigError):
        check_timing(0.1, 0.01, 0.05)


def test_an_sr3_standby_needs_a_credential_that_reaches_its_lease() -> None:
    """The peers refuse (403) a write fenced with a lease outside the credential's
    prefix: a standby whose session holds such a credential is refused at once, naming
    the lease and the prefixes that reach it; /spark (``spark_conf``'s default) and
    /spark/<query> reach ``spark/<query>/lease``, and so does the cluster secret."""
    secret = "a-cluster-secret-of-enough-length"

    def credential(prefix: str) -> str:
        return scoped_credential(secret, prefix, expires_at=2_000_000_000, issued_at=1)

    for reaching in (credential("/spark"), credential("/spark/q1"), credential("/"), secret, None):
        check_credential_fences(reaching, "q1")
    for prefix in ("/spark/sessions", "/spark/q10", "/other"):
        with pytest.raises(ConfigError, match="spark/q1/lease") as refused:
            check_credential_fences(credential(prefix), "q1")
        assert f"scoped to {prefix}" in str(refused.value) and "/spark/q1" in str(refused.value)


@given(
    delay_s=st.floats(min_value=1e-6, max_value=5.0),
    timeout_s=st.floats(min_value=0.5, max_value=600.0),
    drift=st.floats(min_value=0.0, max_value=DRIFT_MAX),
    holder_rate=st.floats(min_value=-1.0, max_value=1.0),
    observer_rate=st.floats(min_value=-1.0, max_value=1.0),
)
def test_a_holder_stops_before_any_observer_may_take_over(
    delay_s: float, timeout_s: float, drift: float, holder_rate: float, observer_rate: float
) -> None:
    """In real time: the renewal is sent at 0 and first seen by the observer at
    ``delay_s``; each clock runs at a rate within ``drift`` of true time."""
    holder_speed = 1 + holder_rate * drift
    observer_speed = 1 + observer_rate * drift
    holder_end = holder_valid_until(0.0, timeout_s, drift) / holder_speed
    observer_takes = delay_s + lapse_after_s(timeout_s, drift) / observer_speed
    assert holder_end < observer_takes


def make_lease(client: SyncClient, holder: str, clock: FakeClock, query: str) -> QueryLease:
    return QueryLease(client, query, holder, timeout_s=3.0, renew_every_s=1.0, clock=clock)


def test_one_holder_at_a_time_and_the_old_one_is_fenced(ring: LocalCluster) -> None:
    query = f"lease-{random.randrange(10**9)}"
    clock_a, clock_b = FakeClock(), FakeClock()
    with SyncClient(ring.ring, ring.secret) as client:
        a = make_lease(client, "host-a:1", clock_a, query)
        b = make_lease(client, "host-b:2", clock_b, query)
        assert a.try_acquire() is None and a.fence == 1 and a.valid()
        seen = b.try_acquire()
        assert seen is not None and seen.lease is not None and seen.lease.holder == "host-a:1"
        # a renews while b's clock runs past the timeout: every renewal is a new version,
        # so b never sees one unchanged for long enough.
        for _ in range(5):
            clock_a.now += 1.0
            clock_b.now += 1.0
            a.renew()
            assert b.try_acquire() is not None
        a.check_fence()
        # a stops renewing (frozen: killed, or cut off). b must wait T(1+drift) of its
        # own time after it first saw the last version.
        assert b.try_acquire() is not None  # first sight of a's last renewal
        clock_b.now += lapse_after_s(3.0, b.drift) - 0.01
        assert b.try_acquire() is not None, "taken before the lease lapsed"
        clock_b.now += 0.02
        assert b.try_acquire() is None and b.fence == 2
        lease, _version = read_lease(client, query)
        assert lease is not None and (lease.holder, lease.fence) == ("host-b:2", 2)
        # a comes back: its renewal and its fence check are refused, for good.
        with pytest.raises(Fenced, match="host-b:2 with fence 2"):
            a.renew()
        assert not a.held and a.lost is not None
        with pytest.raises(Fenced):
            a.check_fence()
        b.check_fence()
        # b releases: a third application takes it at once, fence 3.
        b.release()
        c = make_lease(client, "host-c:3", FakeClock(), query)
        assert c.try_acquire() is None and c.fence == 3
        c.release()
        client.delete_record(lease_key(query), expected_version=read_lease(client, query)[1])


def test_a_holder_whose_lease_ran_out_refuses_its_own_writes(ring: LocalCluster) -> None:
    query = f"lease-{random.randrange(10**9)}"
    clock = FakeClock()
    with SyncClient(ring.ring, ring.secret) as client:
        a = make_lease(client, "host-a:1", clock, query)
        assert a.try_acquire() is None
        clock.now += 3.0 * (1 - a.drift) + 0.001  # past its validity, nothing renewed
        assert not a.valid()
        with pytest.raises(Fenced, match="not valid here"):
            a.check_fence()  # refused before any write, even with its fence on the record
        a.renew()  # it may renew (no one took it): valid again from the renewal
        assert a.valid()
        a.release()


def test_the_renewing_thread_tells_a_holder_that_was_taken_over(ring: LocalCluster) -> None:
    query = f"lease-{random.randrange(10**9)}"
    with SyncClient(ring.ring, ring.secret) as client:
        a = QueryLease(client, query, "host-a:1", timeout_s=1.0, renew_every_s=0.2)
        assert a.try_acquire() is None
        told: list[str] = []
        done = threading.Event()
        a.start_renewing(lambda why: (told.append(why), done.set()))
        # Another application writes over the lease (as one would after a lapse).
        lease, version = read_lease(client, query)
        assert lease is not None
        taken = lease.taken_by("host-b:2", 1.0, 1.8e9)
        client.put_record(lease_key(query), taken.encode(), expected_version=version)
        assert done.wait(10.0), "the holder was never told"
        a.stop_renewing()
        assert "host-b:2 with fence 2" in told[0] and not a.held


def test_a_fenced_holder_pushes_nothing(
    ring: LocalCluster, tmp_path: Path, rng: random.Random
) -> None:
    query = f"fenced-push-{random.randrange(10**9)}"
    source = tmp_path / "ckpt"
    materialize(source, rng)
    clock = FakeClock()
    with SyncClient(ring.ring, ring.secret) as client:
        lease = make_lease(client, "host-a:1", clock, query)
        assert lease.try_acquire() is None
        with StateSync(ring.ring, query, source, ring.secret, lease=lease) as sync:
            assert sync.push().batch_id == 19
            other = make_lease(client, "host-b:2", FakeClock(), query)
            current, version = read_lease(client, query)
            assert current is not None
            client.put_record(
                lease_key(query),
                current.taken_by(other.holder, 3.0, 1.8e9).encode(),
                expected_version=version,
            )
            commit_next_batch(source, rng)
            with pytest.raises(Fenced, match="host-b:2"):
                sync.push()
            assert sync.batches() == [19], "a fenced holder's manifest landed"
            sync.forget(0)


def test_a_standby_pull_fetches_only_what_a_batch_changed(
    ring: LocalCluster, tmp_path: Path, rng: random.Random
) -> None:
    query = f"pull-{random.randrange(10**9)}"
    source, standby = tmp_path / "active", tmp_path / "standby"
    materialize(source, rng)
    with (
        StateSync(ring.ring, query, source, ring.secret, keep_batches=2) as sync,
        SyncClient(ring.ring, ring.secret) as client,
    ):
        sync.push()
        puller = Puller(client, query, standby)
        first = puller.pull()
        assert first is not None and first.whole and first.batch_id == 19
        assert puller.pull() is None, "nothing new: nothing fetched"
        new_files = commit_next_batch(source, rng)
        sync.push()
        second = puller.pull()
        assert second is not None and not second.whole and second.batch_id == 20
        assert second.bytes_fetched == sum(path.stat().st_size for path in new_files)
        assert second.files_fetched == len(new_files)
        # The directory is exactly batch 20's cut, byte for byte.
        cut = read_cut(source, 20)
        for entry in cut.files:
            assert (standby / entry.path).read_bytes() == (source / entry.path).read_bytes()
        named = {entry.path for entry in cut.files}
        held = {str(path.relative_to(standby)) for path in standby.rglob("*") if path.is_file()}
        assert held == named, "the directory is not the batch's cut"
        dropped = {e.path for e in read_cut(source, 19).files} - named
        assert second.files_deleted == len(dropped)
        sync.forget(0)


def test_a_lease_record_that_is_not_a_lease_is_an_error(ring: LocalCluster) -> None:
    query = f"lease-{random.randrange(10**9)}"
    with SyncClient(ring.ring, ring.secret) as client:
        client.put_record(lease_key(query), b'{"format": 1}', expected_version=0)
        with pytest.raises(ProtocolError):
            make_lease(client, "host-a:1", FakeClock(), query).try_acquire()
        client.delete_record(lease_key(query), expected_version=1)
        # A deleted lease record is taken again, fence 1, over the tombstone's version.
        lease = make_lease(client, "host-a:1", FakeClock(), query)
        assert lease.try_acquire() is None and lease.fence == 1
        assert isinstance(read_lease(client, query)[0], Lease)
        lease.release()


class StuckRenewals:
    """A ring client whose record writes hang until released (a renewal lost in a
    partition, waiting out the client's timeout); reads go to the real client."""

    def __init__(self, client: SyncClient) -> None:
        self._client = client
        self.release = threading.Event()
        self.stuck = threading.Event()

    def get_record(self, key: str, **options: Any) -> Any:
        return self._client.get_record(key, **options)

    def put_record(self, key: str, value: bytes, **options: Any) -> int:
        self.stuck.set()
        self.release.wait(30.0)
        raise PeerUnavailable(key, "the test's partition")


def test_a_holder_is_told_when_its_lease_runs_out_even_while_a_renewal_hangs(
    ring: LocalCluster,
) -> None:
    query = f"lease-{random.randrange(10**9)}"
    with SyncClient(ring.ring, ring.secret) as client:
        lease = QueryLease(client, query, "host-a:1", timeout_s=1.0, renew_every_s=0.2)
        assert lease.try_acquire() is None
        stuck = StuckRenewals(client)
        lease._client = stuck  # type: ignore[assignment]
        told: list[str] = []
        lost = threading.Event()
        lease.start_renewing(lambda why: (told.append(why), lost.set()))
        try:
            assert stuck.stuck.wait(10.0), "no renewal was attempted"
            # The renewal hangs; the holder must hear that its lease ran out while it
            # still hangs, not when the client's timeout ends it.
            assert lost.wait(10.0), "never told that the lease ran out"
            assert not stuck.release.is_set()
            assert "ran out" in told[0] and not lease.valid()
        finally:
            stuck.release.set()
            lease.stop_renewing()
        assert len(told) == 1, "told more than once"


def test_a_manifest_from_a_holder_that_was_taken_over_is_not_the_newest(
    ring: LocalCluster,
) -> None:
    """A late manifest of the old holder (fence 1) above the new holder's batches (fence
    2) is skipped; without fences the newest batch is the newest manifest."""
    query = f"fenced-manifests-{random.randrange(10**9)}"

    def put(batch_id: int, fence: int | None) -> None:
        manifest = Manifest(query, batch_id, batch_id + 1, "/ckpt", (), fence=fence)
        client.put_record(
            manifest_key(query, batch_id), compact_json(manifest.to_json()), expected_version=0
        )

    with SyncClient(ring.ring, ring.secret) as client:
        put(4, 1)
        put(5, 2)
        put(6, 1)  # the old holder's push, landed after the takeover
        newest = newest_manifest(client, query)
        assert newest is not None and (newest.batch_id, newest.fence) == (5, 2)
        put(7, 2)
        newest = newest_manifest(client, query)
        assert newest is not None and newest.batch_id == 7
        forget(client, query, 0)
        put(8, None)
        put(9, None)
        newest = newest_manifest(client, query)
        assert newest is not None and newest.batch_id == 9
        forget(client, query, 0)


class FlakyReads:
    """A ring client whose first ``failures`` record reads fail as a ring that cannot
    reach a quorum does; everything else goes to the real client."""

    def __init__(self, client: SyncClient, failures: int) -> None:
        self._client = client
        self.failures = failures

    def get_record(self, key: str, **options: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise DataUnavailable(f"record {key}: too few acceptors answered (the test's)")
        return self._client.get_record(key, **options)

    def put_record(self, key: str, value: bytes, **options: Any) -> int:
        return self._client.put_record(key, value, **options)


def test_a_standby_keeps_waiting_while_the_ring_cannot_decide_the_lease(
    ring: LocalCluster, tmp_path: Path
) -> None:
    query = f"standby-flaky-{random.randrange(10**9)}"
    with SyncClient(ring.ring, ring.secret) as client:
        holder = QueryLease(client, query, "host-a:1", timeout_s=1.0, renew_every_s=0.2)
        assert holder.try_acquire() is None
        standby = Standby(
            ring.ring, query, tmp_path / "b", ring.secret, start=lambda: None, holder="host-b:2",
            timeout_s=1.0, renew_every_s=0.2, poll_s=0.05, warm=False,
        )  # fmt: skip
        flaky = FlakyReads(client, failures=5)
        standby.lease._client = flaky  # type: ignore[assignment]
        try:
            holder.release()
            standby.take_over(timeout_s=30.0)
            assert flaky.failures == 0 and standby.lease.fence == 2
        finally:
            standby.close()


class _WarmUpQuery:
    """Stands for Spark's streaming builders and query in a standby's warm-up (the test
    is about the scratch directory): started, it writes a state file into the checkpoint
    directory it was given, as Spark's state store maintenance does."""

    def __init__(self) -> None:
        self.checkpoint: Path | None = None
        self.readStream = self.writeStream = self

    def option(self, name: str, value: object) -> _WarmUpQuery:
        if name == "checkpointLocation":
            self.checkpoint = Path(str(value))
        return self

    def start(self) -> _WarmUpQuery:
        assert self.checkpoint is not None
        (self.checkpoint / "state" / "0").mkdir(parents=True)
        (self.checkpoint / "state" / "0" / "1.snapshot").write_bytes(b"state")
        return self

    def awaitTermination(self, _timeout_s: float) -> bool:
        return True

    def __getattr__(self, _name: str) -> Any:
        return lambda *_args, **_options: self


def test_a_warm_up_directory_spark_still_writes_into_does_not_fail_the_standby(
    ring: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks: the warm-up query's state directory cannot be removed when the warm-up
    ends ("Directory not empty": Spark's maintenance thread wrote a snapshot into it
    meanwhile). Must hold: the standby goes on (the warm-up is an optimization)."""
    query = f"standby-warm-{random.randrange(10**9)}"
    warm = _WarmUpQuery()
    standby = Standby(
        ring.ring, query, tmp_path / "b", ring.secret, start=lambda: None, spark=warm,
        holder="host-b:2", timeout_s=1.0, renew_every_s=0.2, poll_s=0.05,
    )  # fmt: skip
    real_rmdir = os.rmdir

    def busy_rmdir(path: Any, *args: Any, **options: Any) -> None:
        if str(path) == "0":
            raise OSError(errno.ENOTEMPTY, "Directory not empty", "0")
        real_rmdir(path, *args, **options)

    monkeypatch.setattr(os, "rmdir", busy_rmdir)
    try:
        standby._warm_spark()
    finally:
        monkeypatch.undo()
        standby.close()
    assert warm.checkpoint is not None
