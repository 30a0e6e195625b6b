"""A client of the ``sr3://`` file namespace (``ring.fs_api``), for ``sr3 fs`` and tests.

It talks to one peer at a time (any peer coordinates) and moves on to the next seed when
one cannot answer (unreachable, 503), at most ``rounds`` times over the seeds. A PUT or
rename keeps its operation id across those attempts, so a retry of one that went through
is recognized by the peer.

A peer that stops answering without closing its connections (frozen: SIGSTOP, a paused
VM; its kernel still accepts and buffers) costs a request at most ``PROBE_AFTER_S`` +
``PROBE_TIMEOUT_S``: a request not answered within ``PROBE_AFTER_S`` gets its peer
probed (``GET /v1/health``, answered from memory) on connections of its own, again while
it waits; a probe unanswered within ``PROBE_TIMEOUT_S`` gives the request up there
(``stats.abandoned``) and it goes on through the next seed. A peer that answers probes
is waited for as long as its answer takes (the transport's read timeout bounds a silence
of the connection itself), so a long upload or read of a live peer is never cut. Peers
do not commit a write they stalled across or that came just after a stall, nor one
whose client left (``filesystem.freshness``), so a write given up on one peer cannot
land there after its retry through another, and after a newer write of the same path.

Reads are hedged as well: a stat or listing, or a read of at most ``HEDGED_READ_BYTES_MAX``
bytes, not answered within the p95 of recent answers of its kind
(``ring.client.view.LatencyWindow``: 5 ms to 1 s) is also sent to the next seed, and the
first answer is taken (``stats.hedges``; one hedge per attempt).

Writes, renames and deletes may be fenced (``fence=(lease key, fence)``, ``ring.lease``):
the peer refuses them unless that fence holds the lease now, and the refusal raises
``Fenced``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote

from ring import api, fs_api
from ring.client.view import LatencyWindow, parse_seeds
from ring.config import resolve, resolve_tls
from ring.errors import Fenced, NotFound, PeerRejected, PeerUnavailable, SR3Error
from ring.fs_api import Stat
from ring.tls import ClientTls, client_context
from ring.transport import Response, Timeouts, Transport

__all__ = ["FsClient", "FsClientStats", "FsRefused"]

ROUNDS_DEFAULT = 3
# The pause after the first round over the seeds, doubling after each next one.
BACKOFF_S = 0.2
# After a round in which a seed answered 425 ``stalled``, the next waits at least this:
# a peer refuses writes that arrive within ``filesystem.freshness.AFTER_STALL_S`` (1 s)
# after a stall of its event loop, so a round sooner is refused again when every seed
# paused together (a ring of one seed, a host that paused).
STALLED_PAUSE_S = 1.1
# Reads of a whole file through ``read`` are bounded: ``get`` streams bigger ones.
READ_BYTES_MAX = 1024**3
# Entries one ``list`` gathers over its pages, at most.
LIST_ENTRIES_MAX = 1_000_000
# A request waiting this long gets its peer probed, and again as long as it waits (one
# probe of a peer at a time, at most one per PROBE_AFTER_S); a probe unanswered within
# PROBE_TIMEOUT_S (connecting included) gives the request up on that peer. Peers count a
# pause of their event loop above 0.2 s as a stall (``filesystem.freshness.STALL_S``): a
# probe crosses four turns of it, 0.8 s, under PROBE_TIMEOUT_S.
PROBE_AFTER_S = 0.1
PROBE_TIMEOUT_S = 1.0
# Reads hedged to the next seed: stats, listings, and ranges of at most this many bytes
# (a whole file of unknown size is not sent twice).
HEDGED_READ_BYTES_MAX = 8 * 1024 * 1024
# Statuses answered to the caller (refusals raise their errors); others raise
# ``PeerRejected``, and 503 and 401 clock_skew go on to the next seed.
ANSWERED = (200, 201, 400, 403, 404, 409, 413)
# Connecting to a peer, and the silence of a connection that ends an attempt.
TIMEOUTS = Timeouts(connect_s=3.0, read_s=30.0)
# A write's fence: the lease record's key and the fence its holder took.
Fence = tuple[str, int]


class FsRefused(SR3Error):
    """The namespace refused a request: ``code`` is the error code (``exists``,
    ``is_directory``, ``not_empty``, ``parent_is_file``, ``forbidden``, ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code


@dataclass(slots=True)
class FsClientStats:
    """What the client did around peers that did not answer, so far."""

    # Reads also sent to the next seed (their first peer had not answered in time).
    hedges: int = 0
    # Requests given up on a peer that did not answer a liveness probe.
    abandoned: int = 0
    probes: int = 0


class _Failed(Exception):
    """An attempt (over one seed, or two with a hedge) that got no answer."""

    def __init__(self, causes: list[str], seeds: int, *, stalled: bool) -> None:
        super().__init__("; ".join(causes))
        self.causes = causes
        self.seeds = seeds
        # A seed answered 425 stalled (it paused, and refuses writes for a while).
        self.stalled = stalled


class FsClient:
    """``ring`` and ``secret`` default as for every ``sr3`` command (``SR3_RING``,
    ``SR3_SECRET``, the cluster file); ``secret`` may be a scoped credential.
    ``timeouts``: connecting to a peer, and the silence of a connection that ends an
    attempt (``ring.transport.Timeouts``: 3 s and 30 s)."""

    def __init__(
        self,
        ring: str | Sequence[str] | None = None,
        secret: str | None = None,
        *,
        rounds: int = ROUNDS_DEFAULT,
        tls: ClientTls | None = None,
        timeouts: Timeouts = TIMEOUTS,
    ) -> None:
        joined = ring if ring is None or isinstance(ring, str) else ",".join(ring)
        settings = resolve(joined, secret, ring_hint="ring=", secret_hint="secret=")
        self.seeds = parse_seeds(settings.ring)
        # HTTPS as the ring's other clients find it (SR3_TLS_*, the cluster file).
        tls = tls if tls is not None else resolve_tls(settings.cluster)
        context = client_context(tls) if tls is not None else None
        self._transport = Transport(settings.secret, timeouts=timeouts, tls=context)
        # Probes on connections of their own: never queued behind the requests they ask about.
        self._probe_transport = Transport(
            settings.secret, timeouts=Timeouts(PROBE_TIMEOUT_S, PROBE_TIMEOUT_S), tls=context
        )
        self._probes: dict[str, tuple[float, asyncio.Task[bool]]] = {}
        self._rounds = rounds
        self._next = 0
        self._reads = LatencyWindow()
        self._lookups = LatencyWindow()
        self.stats = FsClientStats()

    async def __aenter__(self) -> FsClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await _stopped([task for _started, task in self._probes.values()])
        self._probes.clear()
        await self._transport.close()
        await self._probe_transport.close()

    async def _request(
        self,
        method: str,
        path_qs: str,
        *,
        body: bytes | None = None,
        body_bytes_max: int = api.JSON_BYTES_MAX,
        hedged: LatencyWindow | None = None,
    ) -> Response:
        """``hedged``: a read, hedged after the delay of these recent answers."""
        causes: list[str] = []
        attempts = self._rounds * len(self.seeds)
        attempt = 0
        stalled = False  # in this round
        while attempt < attempts:
            first = (self._next + attempt) % len(self.seeds)
            try:
                index, answer = await self._attempt(
                    first, method, path_qs, body, body_bytes_max, hedged
                )
            except _Failed as failed:
                causes += failed.causes
                stalled = stalled or failed.stalled
                for _seed in range(failed.seeds):
                    attempt += 1
                    if attempt % len(self.seeds) == 0 and attempt < attempts:
                        await asyncio.sleep(_pause_s(attempt // len(self.seeds), stalled))
                        stalled = False
                continue
            self._next = index
            if answer.status >= 400:
                error = api.parse_error(answer.body)
                if answer.status == 404:
                    raise NotFound(error.message)
                if answer.status == 409 and error.code == "fenced":
                    raise Fenced(error.message)
                raise FsRefused(answer.status, error.code, error.message)
            return answer
        raise PeerUnavailable(",".join(self.seeds), "; ".join(causes[-3:]))

    async def _attempt(
        self,
        first: int,
        method: str,
        path_qs: str,
        body: bytes | None,
        body_bytes_max: int,
        hedged: LatencyWindow | None,
    ) -> tuple[int, Response]:
        """The answer of ``seeds[first]``, or for a hedged read of the next seed when the
        first has not answered within the hedge delay (whichever answers first); which
        seed answered. ``_Failed`` when none did (refused, unreachable, 503, silent)."""
        count = len(self.seeds)
        hedge_after_s = hedged.delay_s() if hedged is not None and count > 1 else None
        lanes: dict[asyncio.Task[Response], tuple[int, float]] = {}

        def launch(index: int) -> None:
            seed = self.seeds[index]
            answer = self._supervised(seed, method, path_qs, body, body_bytes_max)
            lanes[asyncio.create_task(answer)] = (index, time.monotonic())

        launch(first)
        tried = 1
        started = time.monotonic()
        causes: list[str] = []
        stalled = False
        try:
            while lanes:
                wait_s = None
                if hedge_after_s is not None:
                    wait_s = max(0.0, started + hedge_after_s - time.monotonic())
                done, _ = await asyncio.wait(
                    lanes, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:  # the hedge delay passed without an answer
                    hedge_after_s = None
                    self.stats.hedges += 1
                    launch((first + 1) % count)
                    tried = 2
                    continue
                for task in done:
                    index, launched = lanes.pop(task)
                    try:
                        answer = task.result()
                    except PeerUnavailable as exc:
                        causes.append(str(exc))
                        continue
                    except PeerRejected as exc:
                        # 503: not ready; 425 stalled: that seed paused while (or just
                        # before) serving it and did not commit; 401 clock_skew: that
                        # seed's clock or ours is off (the next seed may agree with ours).
                        if exc.status != 503 and exc.code not in ("clock_skew", "stalled"):
                            raise
                        causes.append(str(exc))
                        stalled = stalled or exc.code == "stalled"
                        continue
                    if hedged is not None:
                        hedged.add(time.monotonic() - launched)
                    return index, answer
                if not lanes:
                    break  # failed before its hedge: the next seed, at once
        finally:
            await _stopped(lanes)
        raise _Failed(causes, tried, stalled=stalled)

    async def _supervised(
        self, seed: str, method: str, path_qs: str, body: bytes | None, body_bytes_max: int
    ) -> Response:
        """One request to ``seed``, given up (``PeerUnavailable``) when it has not
        answered and ``seed`` does not answer a liveness probe in time."""
        request = asyncio.create_task(
            self._transport.request(
                seed, method, path_qs, body=body, body_bytes_max=body_bytes_max, ok=ANSWERED
            )
        )
        try:
            while True:
                await asyncio.wait({request}, timeout=PROBE_AFTER_S)
                if request.done():
                    return request.result()
                probe = self._probe(seed)
                await asyncio.wait({request, probe}, return_when=asyncio.FIRST_COMPLETED)
                if request.done():
                    return request.result()
                if not probe.result():
                    self.stats.abandoned += 1
                    raise PeerUnavailable(
                        seed,
                        f"{method} {path_qs[:60]}: no answer, and none to a liveness probe "
                        f"within {PROBE_TIMEOUT_S} s (frozen?)",
                    )
        finally:
            await _stopped([request])

    def _probe(self, seed: str) -> asyncio.Task[bool]:
        """The liveness probe of ``seed`` still running or started within
        ``PROBE_AFTER_S``, else a new one: requests waiting on one peer share its probes."""
        now = time.monotonic()
        last = self._probes.get(seed)
        if last is not None and (not last[1].done() or now - last[0] < PROBE_AFTER_S):
            return last[1]
        probe = asyncio.create_task(self._alive(seed))
        self._probes[seed] = (now, probe)
        return probe

    async def _alive(self, seed: str) -> bool:
        """Whether ``seed`` answers ``GET /v1/health`` within ``PROBE_TIMEOUT_S``."""
        self.stats.probes += 1
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await self._probe_transport.request(seed, "GET", api.HEALTH.pattern)
        except (PeerUnavailable, TimeoutError):
            return False
        except SR3Error:
            return True  # it answered, if not as a healthy peer does: it is not frozen
        return True

    async def stat(self, path: str) -> Stat:
        answer = await self._request(
            "GET", fs_api.fs_path(fs_api.FS_STAT, path), hedged=self._lookups
        )
        return fs_api.parse_stat(answer.json())

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def list(self, path: str, *, page_entries: int | None = None) -> list[Stat]:
        """The children of a directory (of a file: itself), every page of them
        (``page_entries``: a page's size, the peers' largest when None)."""
        entries: list[Stat] = []
        after = ""
        while True:
            pairs = [f"after={quote(after, safe='')}"] if after else []
            pairs += [f"limit={page_entries}"] if page_entries is not None else []
            query = "?" + "&".join(pairs) if pairs else ""
            listed = await self._request(
                "GET", fs_api.fs_path(fs_api.FS_LIST, path) + query, hedged=self._lookups
            )
            answer = listed.json()
            if not isinstance(answer, dict) or not isinstance(answer.get("entries"), list):
                raise SR3Error("a listing is {'entries': [...]}")
            page = [fs_api.parse_stat(entry) for entry in answer["entries"]]
            entries += page
            following = answer.get("next")
            if not answer.get("truncated"):
                return entries
            if not isinstance(following, str) or not following or len(entries) > LIST_ENTRIES_MAX:
                raise SR3Error(f"{path}: a listing without an end, or over {LIST_ENTRIES_MAX}")
            after = following

    async def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        query = f"?offset={offset}" + ("" if length is None else f"&length={length}")
        small = length is not None and length <= HEDGED_READ_BYTES_MAX
        answer = await self._request(
            "GET", fs_api.fs_path(fs_api.FS_READ, path) + query, body_bytes_max=READ_BYTES_MAX,
            hedged=self._reads if small else None,
        )  # fmt: skip
        return answer.body

    async def write(
        self, path: str, data: bytes, *, overwrite: bool = False, fence: Fence | None = None
    ) -> Stat:
        op = secrets.token_hex(12)
        query = f"?op={op}" + ("&overwrite=1" if overwrite else "") + _fenced(fence)
        answer = await self._request(
            "PUT", fs_api.fs_path(fs_api.FS_WRITE, path) + query, body=data
        )
        return fs_api.parse_stat(answer.json())

    async def delete(
        self, path: str, *, recursive: bool = False, fence: Fence | None = None
    ) -> int:
        pairs = ["recursive=1"] if recursive else []
        pairs += [fs_api.fence_query(*fence)] if fence is not None else []
        query = "?" + "&".join(pairs) if pairs else ""
        answer = await self._request("DELETE", fs_api.fs_path(fs_api.FS_DELETE, path) + query)
        deleted = answer.json().get("deleted") if isinstance(answer.json(), dict) else None
        if not isinstance(deleted, int):
            raise SR3Error("a delete answers {'deleted': n}")
        return deleted

    async def rename(
        self, source: str, target: str, *, overwrite: bool = False, fence: Fence | None = None
    ) -> Stat:
        query = (
            f"?from={quote(fs_api.validate_path(source), safe='')}"
            f"&to={quote(fs_api.validate_path(target), safe='')}&op={secrets.token_hex(12)}"
            + ("&overwrite=1" if overwrite else "")
            + _fenced(fence)
        )
        answer = await self._request("POST", fs_api.FS_RENAME.pattern + query)
        return fs_api.parse_stat(answer.json())

    async def mkdirs(self, path: str) -> bool:
        answer = await self._request("POST", fs_api.fs_path(fs_api.FS_MKDIRS, path))
        return bool(answer.json().get("created"))


def _fenced(fence: Fence | None) -> str:
    """The query parameters a fenced request adds after others (none when unfenced)."""
    return "" if fence is None else "&" + fs_api.fence_query(*fence)


def _pause_s(rounds: int, stalled: bool) -> float:
    """The pause after ``rounds`` rounds over the seeds failed (the last one with a
    seed answering 425 stalled when ``stalled``)."""
    pause_s = BACKOFF_S * (1 << (rounds - 1))
    return max(pause_s, STALLED_PAUSE_S) if stalled else pause_s


async def _stopped(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` still running and wait for them; their outcomes are dropped."""
    tasks = list(tasks)
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: a given-up attempt's error is not reported
