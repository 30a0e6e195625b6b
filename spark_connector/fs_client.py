"""A client of the ``sr3://`` file namespace (``ring.fs_api``), for ``sr3 fs`` and tests.

It talks to one peer at a time (any peer coordinates) and moves on to the next seed when
one cannot answer (unreachable, 503), at most ``rounds`` times over the seeds. A PUT or
rename keeps its operation id across those attempts, so a retry of one that went through
is recognized by the peer.

Writes, renames and deletes may be fenced (``fence=(lease key, fence)``, ``ring.lease``):
the peer refuses them unless that fence holds the lease now, and the refusal raises
``Fenced``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from types import TracebackType
from urllib.parse import quote

from ring import api, fs_api
from ring.client.view import parse_seeds
from ring.config import resolve, resolve_tls
from ring.errors import Fenced, NotFound, PeerRejected, PeerUnavailable, SR3Error
from ring.fs_api import Stat
from ring.tls import ClientTls, client_context
from ring.transport import Response, Transport

__all__ = ["FsClient", "FsRefused"]

ROUNDS_DEFAULT = 3
BACKOFF_S = 0.2
# Reads of a whole file through ``read`` are bounded: ``get`` streams bigger ones.
READ_BYTES_MAX = 1024**3
# Entries one ``list`` gathers over its pages, at most.
LIST_ENTRIES_MAX = 1_000_000
# A write's fence: the lease record's key and the fence its holder took.
Fence = tuple[str, int]


class FsRefused(SR3Error):
    """The namespace refused a request: ``code`` is the error code (``exists``,
    ``is_directory``, ``not_empty``, ``parent_is_file``, ``forbidden``, ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code


class FsClient:
    """``ring`` and ``secret`` default as for every ``sr3`` command (``SR3_RING``,
    ``SR3_SECRET``, the cluster file); ``secret`` may be a scoped credential."""

    def __init__(
        self,
        ring: str | Sequence[str] | None = None,
        secret: str | None = None,
        *,
        rounds: int = ROUNDS_DEFAULT,
        tls: ClientTls | None = None,
    ) -> None:
        joined = ring if ring is None or isinstance(ring, str) else ",".join(ring)
        settings = resolve(joined, secret, ring_hint="ring=", secret_hint="secret=")
        self.seeds = parse_seeds(settings.ring)
        # HTTPS as the ring's other clients find it (SR3_TLS_*, the cluster file).
        tls = tls if tls is not None else resolve_tls(settings.cluster)
        context = client_context(tls) if tls is not None else None
        self._transport = Transport(settings.secret, tls=context)
        self._rounds = rounds
        self._next = 0

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
        await self._transport.close()

    async def _request(
        self,
        method: str,
        path_qs: str,
        *,
        body: bytes | None = None,
        body_bytes_max: int = api.JSON_BYTES_MAX,
    ) -> Response:
        causes: list[str] = []
        for attempt in range(self._rounds * len(self.seeds)):
            seed = self.seeds[(self._next + attempt) % len(self.seeds)]
            try:
                answer = await self._transport.request(
                    seed,
                    method,
                    path_qs,
                    body=body,
                    body_bytes_max=body_bytes_max,
                    ok=(200, 201, 400, 403, 404, 409, 413),
                )
            except PeerUnavailable as exc:
                causes.append(str(exc))
            except PeerRejected as exc:
                # 503: not ready; 401 clock_skew: that seed's clock or ours is off (the
                # next seed may agree with ours).
                if exc.status != 503 and exc.code != "clock_skew":
                    raise
                causes.append(str(exc))
            else:
                self._next = (self._next + attempt) % len(self.seeds)
                if answer.status >= 400:
                    error = api.parse_error(answer.body)
                    if answer.status == 404:
                        raise NotFound(error.message)
                    if answer.status == 409 and error.code == "fenced":
                        raise Fenced(error.message)
                    raise FsRefused(answer.status, error.code, error.message)
                return answer
            if (attempt + 1) % len(self.seeds) == 0:
                await asyncio.sleep(BACKOFF_S * (attempt + 1) // len(self.seeds))
        raise PeerUnavailable(",".join(self.seeds), "; ".join(causes[-3:]))

    async def stat(self, path: str) -> Stat:
        answer = await self._request("GET", fs_api.fs_path(fs_api.FS_STAT, path))
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
            answer = (
                await self._request("GET", fs_api.fs_path(fs_api.FS_LIST, path) + query)
            ).json()
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
        answer = await self._request(
            "GET", fs_api.fs_path(fs_api.FS_READ, path) + query, body_bytes_max=READ_BYTES_MAX
        )
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
