"""A query's lease: which application drives it, renewed from the connector.

``QueryLease`` holds or watches record ``spark/<query>/lease`` (``ring.lease``: holder,
fence, timeout; taken and renewed by compare-and-set). The application that holds it is
the query's active driver; every other is a standby that may take it only once it has
lapsed (its version unchanged for ``timeout_s * (1 + drift)`` on the standby's own
monotonic clock) or was released. Each take raises the fence by one.

The holder renews every ``renew_every_s`` on a thread of its own (``start_renewing``)
and counts its lease valid until ``timeout_s * (1 - drift)`` after it sent the last
renewal that succeeded. Everything it writes for the query carries the fence: pushed
manifests are written only after ``check_fence`` read the lease record and found this
holder's fence on it, and ``sr3://`` commit and offset files are sent fenced (the JVM
side, ``Sr3Fence``, is told the fence and how long it stays valid after every renewal),
so the peers refuse them once another holder took over. When a renewal finds another
fence on the record, or the lease's validity runs out before a renewal gets through
(the holder was cut off), the holder is told once (``on_lost``) and must stop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from ring.auth import is_credential, parse_credential
from ring.errors import (
    ConfigError,
    DataUnavailable,
    Fenced,
    ProtocolError,
    QuorumError,
    RecordConflict,
    RecordContention,
    RecordUnknown,
    SR3Error,
)
from ring.fs_api import lease_within
from ring.lease import (
    DRIFT_DEFAULT,
    RENEW_EVERY_S_DEFAULT,
    TIMEOUT_S_DEFAULT,
    Lease,
    check_holder,
    check_timing,
    first_lease,
    holder_valid_until,
    lapse_after_s,
    parse_lease,
)
from ring.sync_client import SyncClient
from spark_connector.manifest import check_query_name

__all__ = [
    "LeaseState",
    "QueryLease",
    "check_credential_fences",
    "default_holder",
    "lease_key",
    "read_lease",
]

log = logging.getLogger(__name__)

# A compare-and-set that failed one of these ways may have taken effect: read to know.
_OUTCOME_UNKNOWN = (RecordUnknown, RecordContention)

HELD = Gauge("sr3_lease_held", "1 while this application holds the query's lease.", ["query"])
FENCE = Gauge("sr3_lease_fence", "Fence of the query's lease this application holds.", ["query"])
RENEW_FAILURES = Counter(
    "sr3_lease_renew_failures", "Lease renewals that did not get through.", ["query"]
)
TAKEOVERS = Counter("sr3_lease_takeovers", "Leases taken over from another holder.", ["query"])
# Failed renewals in a row are retried at once, this many times, before the next period.
RENEW_RETRIES_MAX = 2


def lease_key(query: str) -> str:
    return f"spark/{check_query_name(query)}/lease"


def check_credential_fences(credential: str | None, query: str) -> None:
    """Refuse (``ConfigError``) a scoped credential whose writes cannot be fenced with
    the query's lease: a peer answers 403 to a fenced write whose lease key is not under
    the credential's prefix (``ring.fs_api.lease_within``), so an ``sr3://`` standby
    would lose every offset and commit write after taking over. None, or the cluster
    secret, fences with any lease."""
    if credential is None or not is_credential(credential):
        return
    try:
        prefix = parse_credential(credential).prefix
    except ProtocolError as exc:
        raise ConfigError(f"the session's sr3:// credential: {exc}") from exc
    key = lease_key(query)
    if not lease_within(key, prefix):
        raise ConfigError(
            f"the session's sr3:// credential is scoped to {prefix}, which does not reach "
            f"the lease {key} that fences query {query}'s offset and commit logs: issue one "
            f"scoped to /spark or /spark/{query} (sr3 spark conf --prefix)"
        )


def default_holder() -> str:
    """``host:pid``: what names an application in logs and ``sr3 spark list``."""
    return check_holder(f"{socket.gethostname()}:{os.getpid()}")


def read_lease(client: SyncClient, query: str) -> tuple[Lease | None, int]:
    """The query's lease and its record version (None, 0 when no one ever held it; a
    value that is not a lease is an error)."""
    record = client.get_record(lease_key(query), include_deleted=True)
    if record is None:
        return None, 0
    if record.deleted:
        return None, record.version
    return parse_lease(record.value), record.version


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What an observer saw of a lease: the lease (None: never held, or deleted), its
    record version, and how long (observer's monotonic seconds) that version has been
    seen unchanged."""

    lease: Lease | None
    version: int
    unchanged_s: float
    drift: float = DRIFT_DEFAULT

    @property
    def takeable(self) -> bool:
        lease = self.lease
        if lease is None or lease.released:
            return True
        return self.unchanged_s >= lapse_after_s(lease.timeout_s, self.drift)


class QueryLease:
    """One application's side of a query's lease: take it (``try_acquire``), hold it
    (``renew``, ``start_renewing``), check it (``valid``, ``check_fence``), give it up
    (``release``)."""

    def __init__(
        self,
        client: SyncClient,
        query: str,
        holder: str | None = None,
        *,
        timeout_s: float = TIMEOUT_S_DEFAULT,
        renew_every_s: float = RENEW_EVERY_S_DEFAULT,
        drift: float = DRIFT_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        check_timing(timeout_s, renew_every_s, drift)
        self.query = check_query_name(query)
        self.key = lease_key(query)
        self.holder = check_holder(holder) if holder is not None else default_holder()
        self.timeout_s = timeout_s
        self.renew_every_s = renew_every_s
        self.drift = drift
        self._client = client
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        # Held: the lease as written and its record version; when it stops being ours.
        self._lease: Lease | None = None
        self._version = 0
        self._valid_until = 0.0
        self._lost: str | None = None
        # Watched: the version seen and since when (monotonic), to judge a lapse.
        self._seen: tuple[int, float] | None = None
        self._renewer: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._reported = False  # on_lost was called
        self._stop = threading.Event()
        self._listeners: list[Callable[[int, float], None]] = []
        # The lease this holder took over (None: no one held it) and how long it had
        # been seen unchanged then.
        self.taken_from: Lease | None = None
        self.taken_after_s = 0.0
        # Called before each renewal for the note it stores (the newest batch).
        self.note_source: Callable[[], dict[str, Any] | None] | None = None

    # -- watching -----------------------------------------------------------------------

    def observe(self) -> LeaseState:
        """Read the lease record and note how long its version has stayed the same."""
        lease, version = read_lease(self._client, self.query)
        now = self._clock()
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, now)
        return LeaseState(lease, version, now - self._seen[1], self.drift)

    # -- holding ------------------------------------------------------------------------

    @property
    def fence(self) -> int:
        """The fence of the lease held (0 when none is)."""
        lease = self._lease
        return 0 if lease is None else lease.fence

    @property
    def held(self) -> bool:
        return self._lease is not None and self._lost is None

    @property
    def lost(self) -> str | None:
        """Why the lease was lost, or None."""
        return self._lost

    def valid(self) -> bool:
        """True while the lease is held and inside its validity."""
        return self.held and self._clock() < self._valid_until

    def remaining_s(self) -> float:
        """Seconds of validity left (0 when not valid)."""
        return max(0.0, self._valid_until - self._clock()) if self.held else 0.0

    def try_acquire(self) -> LeaseState | None:
        """Take the lease if no one holds it, it was released, or it has lapsed: None
        when taken (``fence`` is ours now), else what was seen (held by another)."""
        state = self.observe()
        # A lease naming this holder is an earlier run's (a restart under the same name):
        # it is waited out like any other, since that run may still be writing.
        if not state.takeable:
            return state
        wall = self._wall()
        if state.lease is None:
            # A lease record deleted by hand restarts no fence: take over its version.
            taken = first_lease(self.holder, self.timeout_s, wall)
        else:
            taken = state.lease.taken_by(self.holder, self.timeout_s, wall)
        sent = self._clock()
        try:
            version = self._client.put_record(
                self.key, taken.encode(), expected_version=state.version
            )
        except RecordConflict:
            return self.observe()  # another standby won this version
        except _OUTCOME_UNKNOWN:
            # The take may have been chosen: it was if the record names this take.
            current, version = read_lease(self._client, self.query)
            if current is None or (current.holder, current.fence) != (taken.holder, taken.fence):
                return self.observe()
        with self._lock:
            self._lease, self._version, self._lost = taken, version, None
            self._valid_until = holder_valid_until(sent, self.timeout_s, self.drift)
        self.taken_from, self.taken_after_s = state.lease, state.unchanged_s
        HELD.labels(self.query).set(1)
        FENCE.labels(self.query).set(taken.fence)
        previous = state.lease
        if previous is not None and not previous.released:
            TAKEOVERS.labels(self.query).inc()
        log.info(
            "sr3 lease of query %s taken by %s with fence %d (%s)", self.query, self.holder,
            taken.fence, "first holder" if previous is None else
            f"from {previous.holder}, fence {previous.fence}, "
            + ("released" if previous.released else f"lapsed {state.unchanged_s:.2f} s unchanged"),
        )  # fmt: skip
        self._tell_listeners()
        return None

    def renew(self) -> None:
        """Renew the held lease once. ``Fenced`` when another holder's fence is on the
        record (the lease is lost for good); ring errors when it could not be written
        (the lease stays held until its validity runs out)."""
        lease = self._lease
        if lease is None or self._lost is not None:
            raise Fenced(self._lost or f"the lease of query {self.query} is not held")
        renewed = lease.renewed(self._wall(), self._current_note())
        sent = self._clock()
        try:
            version = self._client.put_record(
                self.key, renewed.encode(), expected_version=self._version
            )
        except (RecordConflict, *_OUTCOME_UNKNOWN):
            self._adopt_or_lose()
            return
        with self._lock:
            self._lease, self._version = renewed, version
            self._valid_until = holder_valid_until(sent, self.timeout_s, self.drift)
        self._tell_listeners()

    def _current_note(self) -> dict[str, Any] | None:
        source = self.note_source
        if source is None:
            return None
        try:
            return source()
        except Exception:  # a note is for people: never a reason to lose the lease
            log.exception("sr3 lease note of query %s failed", self.query)
            return None

    def _adopt_or_lose(self) -> None:
        """After a conflict: a renewal of ours whose answer was lost is still ours (its
        version is adopted; validity is not extended, as when it was sent is unknown);
        any other value means the lease was taken."""
        current, version = read_lease(self._client, self.query)
        mine = self._lease
        if current is not None and mine is not None and (
            current.holder, current.fence, current.released) == (mine.holder, mine.fence, False
        ):  # fmt: skip
            with self._lock:
                self._lease, self._version = current, version
            return
        who = "no one" if current is None else f"{current.holder} with fence {current.fence}"
        self._lose(
            f"the lease of query {self.query} was taken over: it is held by {who}; this "
            f"application ({self.holder}, fence {self.fence}) is fenced and must stop"
        )
        raise Fenced(self._lost or "")

    def check_fence(self) -> None:
        """Before a write made as holder: the lease is valid here, and the lease record
        still carries this holder's fence (read linearizably). ``Fenced`` otherwise."""
        if not self.valid():
            raise Fenced(
                self._lost
                or f"the lease of query {self.query} (fence {self.fence}) is not valid here: "
                "not renewed in time; another application may hold it"
            )
        current, _version = read_lease(self._client, self.query)
        if current is None or current.fence != self.fence or current.released:
            who = "no one" if current is None else f"{current.holder} with fence {current.fence}"
            self._lose(
                f"the lease of query {self.query} is held by {who}, not by this application "
                f"({self.holder}, fence {self.fence}): fenced"
            )
            raise Fenced(self._lost or "")

    def release(self) -> None:
        """Give the lease up (a standby may take it at once). Nothing when not held."""
        self.stop_renewing()
        lease = self._lease
        if lease is None or self._lost is not None:
            return
        released = Lease(
            lease.holder, lease.fence, lease.timeout_s, lease.acquired_at, self._wall(),
            released=True, note=lease.note,
        )  # fmt: skip
        try:
            self._client.put_record(self.key, released.encode(), expected_version=self._version)
        except (RecordConflict, *_OUTCOME_UNKNOWN, QuorumError, DataUnavailable) as exc:
            log.warning("sr3 lease of query %s not released (it will lapse): %s", self.query, exc)
        self._lose(f"the lease of query {self.query} was released by this application")

    def _lose(self, why: str) -> None:
        with self._lock:
            first = self._lost is None
            self._lost = why
            self._valid_until = 0.0
        HELD.labels(self.query).set(0)
        if first:
            self._tell_listeners()

    # -- renewing in the background ------------------------------------------------------

    def add_listener(self, listener: Callable[[int, float], None]) -> None:
        """``listener(fence, valid_for_s)`` after every take, renewal and loss (0, 0.0),
        from the renewing thread: how the JVM's ``Sr3Fence`` learns the validity."""
        self._listeners.append(listener)

    def _tell_listeners(self) -> None:
        fence, valid_for = (self.fence, self.remaining_s()) if self.held else (0, 0.0)
        for listener in self._listeners:
            try:
                listener(fence, valid_for)
            except Exception:  # a listener's failure must not stop the renewals
                log.exception("sr3 lease listener of query %s failed", self.query)

    def start_renewing(self, on_lost: Callable[[str], None]) -> None:
        """Renew every ``renew_every_s`` on a thread until ``stop_renewing``; call
        ``on_lost(why)`` once when the lease is taken over or runs out. A second thread
        watches the validity itself, so that a renewal stuck in the network (it may
        take the client's whole timeout) does not delay the news past the deadline."""
        if self._renewer is not None:
            raise ConfigError("the lease is renewed already")
        self._stop.clear()
        self._reported = False
        self._renewer = threading.Thread(
            target=self._renew_loop, args=(on_lost,), name=f"sr3-lease-{self.query}", daemon=True
        )
        self._watchdog = threading.Thread(
            target=self._watch_loop, args=(on_lost,), name=f"sr3-lease-watch-{self.query}",
            daemon=True,
        )  # fmt: skip
        self._renewer.start()
        self._watchdog.start()

    def stop_renewing(self) -> None:
        """Stop both threads (a renewal in flight is waited for: at most the client's
        timeout)."""
        renewer, self._renewer = self._renewer, None
        watchdog, self._watchdog = self._watchdog, None
        self._stop.set()
        for thread in (watchdog, renewer):
            if thread is not None:
                thread.join()

    def _renew_loop(self, on_lost: Callable[[str], None]) -> None:
        while not self._stop.wait(self.renew_every_s) and self._lost is None:
            why = self._renew_once()
            if why is not None:
                self._report_lost(on_lost, why)
                return

    def _watch_loop(self, on_lost: Callable[[str], None]) -> None:
        while self.held:
            left = self.remaining_s()
            if left <= 0:
                self._report_lost(on_lost, self._ran_out())
                return
            if self._stop.wait(left):
                return

    def _report_lost(self, on_lost: Callable[[str], None], why: str) -> None:
        """Lose the lease and tell ``on_lost``, once, whichever thread finds it first."""
        with self._lock:
            if self._reported:
                return
            self._reported = True
        self._lose(why)
        on_lost(why)

    def _ran_out(self) -> str:
        return (
            f"the lease of query {self.query} (fence {self.fence}) ran out: no renewal got "
            f"through in time; another application may take it, so this one must stop"
        )

    def _renew_once(self) -> str | None:
        """One period's renewal (with ``RENEW_RETRIES_MAX`` quick retries): None when
        the lease is still ours, else why it is lost."""
        for _attempt in range(1 + RENEW_RETRIES_MAX):
            try:
                self.renew()
                return None
            except Fenced as exc:
                return str(exc)
            except (SR3Error, ProtocolError) as exc:
                RENEW_FAILURES.labels(self.query).inc()
                log.warning("sr3 lease renewal of query %s failed: %s", self.query, exc)
            if not self.valid():
                return self._ran_out()
        return None
