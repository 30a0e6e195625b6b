"""The wire contract of the file namespace (``sr3://``): routes, limits, body shapes.

Every peer serves these routes (``filesystem.service`` installs them); any peer
coordinates a request: it reads and writes the file's metadata record by consensus and
its chunks on the key's replicas, so a client (the Java ``sr3://`` FileSystem, ``sr3
fs``) talks to one peer and fails over to another.

    PUT    /v1/fs/files/{path}[?overwrite=1]   create the file from the body, visible
                                               atomically when 201 answers
                                               -> stat; 409 "exists" (no overwrite and a
                                               file is there), 409 "is_directory", 409
                                               "parent_is_file", 409 "fenced", 413
                                               "too_large"
    GET    /v1/fs/files/{path}[?offset=N&length=M]   the bytes (a range: M at most to
                                               the end); X-SR3-File-Size, X-SR3-Mtime-Ms;
                                               404 "not_found", 409 "is_directory"
    GET    /v1/fs/stat/{path}                  stat (a file's with "checksum"); 404
                                               "not_found"
    GET    /v1/fs/list/{path}[?after=NAME&limit=N]   {"path", "type", "entries": [stat
                                               with "name"], "truncated"}: the direct
                                               children by name after NAME (of a file:
                                               itself); 404 "not_found"
    DELETE /v1/fs/files/{path}[?recursive=1]   {"deleted": files and directories removed}
                                               (0 when nothing was there); 409 "not_empty",
                                               409 "fenced"
    POST   /v1/fs/rename?from=P&to=Q[&overwrite=1]   move a file, replacing Q atomically
                                               with overwrite -> stat of Q; 404
                                               "not_found", 409 "exists", 409
                                               "is_directory" (Q is one, or P is), 409
                                               "fenced"
    POST   /v1/fs/mkdirs/{path}                {"created": bool}; 409 "parent_is_file"
    GET    /v1/fs/usage/{path}                 {"capacity", "used", "remaining", "peers"}:
                                               the ring's bytes on disk, summed over the
                                               peers that answered (Hadoop's df)

PUT, DELETE and rename may also be fenced: ``lease=<record key>&fence=<n>`` (both or
neither) says the writer holds the lease in that record with fence ``n``
(``ring.lease``); the peer reads the lease record first and refuses with 409 "fenced"
when its fence is not ``n`` (taken over since, or never held), writing nothing. ``n``
is ASCII digits in 1..``FENCE_MAX`` and the key is never a file's record (``fs/``):
else 400. A scoped credential names a lease under its prefix (``lease_within``): else
403.

PUT and rename take ``op=<24 lowercase hex digits>``, the operation's id, the same on
every retry: a retry that finds its operation already done answers as the first attempt
would have (a create-if-absent that succeeded is not then refused as "exists").

A write of any kind (PUT, DELETE, rename, mkdirs) may answer 425 "stalled", having
written nothing: its coordinator stalled (frozen, its event loop blocked) while serving
it or just before it came, or its client closed the connection, so the client may have
sent it through another peer meanwhile (``filesystem.freshness``). Retry it there.

A stat is ``{"path", "type": "file"|"directory", "size", "mtime_ms", "version"}``, and
a file's stat (not a listing's entries) ``"checksum"``: ``CHECKSUM_ALGORITHM`` of its
bytes, hex, equal for equal bytes (``distcp -update`` compares them). Paths
are absolute, ``/``-separated, without empty, ``.`` or ``..`` components; a component is
any UTF-8 text without control characters (spaces, ``%``, ``=`` and non-ASCII letters
included: Spark escapes partition values as ``%XX``), at most ``COMPONENT_BYTES_MAX``
bytes. In a URL a path follows the route without its leading ``/`` (the root is the
empty path), each component percent-encoded (UTF-8; escapes that do not decode to UTF-8
are refused, ``ring.parse.check_target``). ``ROOT`` is always a directory.

On the ring a path is a record key (``path_key``), which allows fewer characters: every
byte of a character outside ``[A-Za-z0-9._=-]`` is written ``:XX`` (``:`` itself
included), so a key names exactly one path and its components stay apart. A path's key
is at most ``PATH_CHARS_MAX`` characters: a name of safe characters counts one per
character, any other character three per UTF-8 byte.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from ring.api import (
    FS_DELETE,
    FS_LIST,
    FS_MKDIRS,
    FS_READ,
    FS_RENAME,
    FS_STAT,
    FS_USAGE,
    FS_WRITE,
    HEADER_FILE_SIZE,
    HEADER_FILE_TAG,
    HEADER_MTIME_MS,
    Route,
    parse_ascii_int,
)
from ring.errors import ProtocolError
from ring.lease import FENCE_MAX
from ring.records import validate_key

__all__ = [
    "fence_query",
    "lease_within",
    "parse_fence",
    "FENCED_ROUTES",
    "FILE_BYTES_MAX",
    "FS_DELETE",
    "FS_LIST",
    "FS_MKDIRS",
    "FS_READ",
    "FS_RENAME",
    "FS_USAGE",
    "FS_ROUTES",
    "FS_STAT",
    "FS_WRITE",
    "HEADER_FILE_SIZE",
    "HEADER_FILE_TAG",
    "HEADER_MTIME_MS",
    "LIST_LIMIT_MAX",
    "MTIME_MS_MAX",
    "PATH_CHARS_MAX",
    "PATH_KEY_PREFIX",
    "COMPONENT_BYTES_MAX",
    "CHECKSUM_ALGORITHM",
    "ROOT",
    "STREAMED_BODY_ROUTES",
    "Stat",
    "components",
    "entries_prefix",
    "key_name",
    "name_of_key",
    "file_tag",
    "path_key",
    "fs_path",
    "parent",
    "parse_stat",
    "parse_op",
    "parse_tag",
    "paths_of",
    "route_path",
    "stat_body",
    "validate_path",
]

FS_ROUTES = (FS_WRITE, FS_READ, FS_DELETE, FS_STAT, FS_LIST, FS_RENAME, FS_MKDIRS, FS_USAGE)
# Bodies the handler reads as they arrive (bounded by FILE_BYTES_MAX) and checks against
# the signed digest, instead of the peer buffering them before it authenticates.
STREAMED_BODY_ROUTES = frozenset({FS_WRITE})
# The routes a write may fence (``lease=&fence=``).
FENCED_ROUTES = frozenset({FS_WRITE, FS_DELETE, FS_RENAME})


ROOT = "/"
# Every file and directory is the record PATH_KEY_PREFIX + its path without the leading
# "/" (the value says which it is): a stat reads one record, and a directory's entries
# are the keys under its own plus "/".
PATH_KEY_PREFIX = "fs/"
# Record keys are at most 512 characters; the prefix above is 3. The bound is on the
# key's form of the path (``path_key``: three characters per escaped byte).
PATH_CHARS_MAX = 500
# As HDFS's default (dfs.namenode.fs-limits.max-component-length): UTF-8 bytes.
COMPONENT_BYTES_MAX = 255
# One file: a Spark state file is at most a few GiB (a RocksDB checkpoint zip).
FILE_BYTES_MAX = 64 * 1024**3
LIST_LIMIT_MAX = 10_000
MTIME_MS_MAX = 10**15
# Characters a record key holds as they are; every other byte is escaped as ":XX".
_KEY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._=-")
_ESCAPED = re.compile(r":([0-9A-F]{2})")
OP_PATTERN = re.compile(r"^[0-9a-f]{24}$")
# A file's checksum in a stat: xxh3-128 of its bytes (what a chunked file's blob records).
CHECKSUM_ALGORITHM = "XXH3-128"
_CHECKSUM = re.compile(r"^[0-9a-f]{32}$")

FileType = Literal["file", "directory"]


def validate_path(path: str) -> str:
    """``path`` if it is a valid absolute path (``ProtocolError`` if not)."""
    if path == ROOT:
        return path
    if not path.startswith("/"):
        raise ProtocolError(f"invalid path {path[:80]!r}: not absolute")
    for part in path[1:].split("/"):
        if part in ("", ".", ".."):
            raise ProtocolError(f"invalid path {path[:80]!r}: an empty, '.' or '..' component")
        try:
            encoded = part.encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError(f"invalid path {path[:80]!r}: not UTF-8") from None
        if len(encoded) > COMPONENT_BYTES_MAX:
            raise ProtocolError(
                f"invalid path {path[:80]!r}: a component is at most {COMPONENT_BYTES_MAX} "
                "bytes (UTF-8)"
            )
        if any(unicodedata.category(char) == "Cc" for char in part):
            raise ProtocolError(f"invalid path {path[:80]!r}: a control character")
    if len(key_name(path[1:])) > PATH_CHARS_MAX:
        raise ProtocolError(
            f"invalid path {path[:80]!r}: longer than {PATH_CHARS_MAX} characters on the "
            "ring (a character other than [A-Za-z0-9._=-] counts 3 per UTF-8 byte)"
        )
    return path


def key_name(name: str) -> str:
    """How a name (a component, or components joined by "/") is written in a record
    key: every byte of a character outside ``[A-Za-z0-9._=-]`` as ``:XX``."""
    return "/".join(
        "".join(chr(byte) if byte in _KEY_SAFE else f":{byte:02X}" for byte in part.encode("utf-8"))
        for part in name.split("/")
    )


def name_of_key(text: str) -> str:
    """The name ``key_name`` wrote as ``text`` (``ProtocolError`` when it is not one)."""
    if ":" not in text:
        return text
    raw = bytearray()
    index = 0
    while index < len(text):
        if text[index] == ":":
            match = _ESCAPED.match(text, index)
            if match is None:
                raise ProtocolError(f"not a key's name: {text[:80]!r}")
            raw.append(int(match.group(1), 16))
            index = match.end()
        else:
            raw += text[index].encode("utf-8")
            index += 1
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"not a key's name: {text[:80]!r}") from None
    if key_name(name) != text:  # one key per name: no escaped safe character
        raise ProtocolError(f"not a key's name: {text[:80]!r}")
    return name


_TAG = re.compile(r"^(0|[1-9][0-9]{0,15})\.([0-9a-f]{0,64})$")


def file_tag(version: int, op: str) -> str:
    """Names one version of a file as written (its record's version and operation id):
    a version number alone comes back once a deleted path is created again."""
    return f"{version}.{op}"


def parse_tag(raw: str | None) -> tuple[int, str] | None:
    """A ``file_tag`` from the query (``tag``), or None when there is none."""
    if raw is None:
        return None
    match = _TAG.fullmatch(raw)
    if match is None:
        raise ProtocolError("tag is <version>.<op> as a read's first answer named it")
    return int(match.group(1)), match.group(2)


def parse_op(raw: str | None) -> str | None:
    """An operation id from the query (``op``), or None when there is none."""
    if raw is None:
        return None
    if OP_PATTERN.fullmatch(raw) is None:
        raise ProtocolError("op is 24 lowercase hex digits")
    return raw


def fence_query(lease_key: str, fence: int) -> str:
    """The query parameters of a write fenced by the lease in ``lease_key``."""
    return f"lease={quote(validate_key(lease_key), safe='')}&fence={fence}"


def parse_fence(query: Mapping[str, str]) -> tuple[str, int] | None:
    """The lease key and fence a write names, or None when it is not fenced."""
    key, fence = query.get("lease"), query.get("fence")
    if key is None and fence is None:
        return None
    if key is None or fence is None:
        raise ProtocolError("a fenced write names both lease=<record key> and fence=<n>")
    validate_key(key)
    if key.startswith(PATH_KEY_PREFIX):
        raise ProtocolError(f"lease {key[:80]!r} is a file's record, not a lease's")
    try:
        number = parse_ascii_int(fence, "fence", FENCE_MAX)
    except ProtocolError:
        number = 0
    if number < 1:
        raise ProtocolError(f"fence is an integer of ASCII digits in 1..{FENCE_MAX}")
    return key, number


def lease_within(key: str, prefix: str) -> bool:
    """Whether a credential scoped to the path ``prefix`` may fence its writes with the
    lease record ``key``: a key under the prefix written as a record key (``/spark``
    reaches ``spark/<query>/lease``, the Spark connector's leases; ``/`` reaches every
    key). The peer reads that record for the request, and its answer says whether it
    exists and who holds it: no more than the credential's own prefix may tell."""
    if prefix == ROOT:
        return True
    scope = validate_path(prefix)[1:]
    return key == scope or key.startswith(scope + "/")


def components(path: str) -> list[str]:
    return [] if path == ROOT else validate_path(path)[1:].split("/")


def parent(path: str) -> str:
    """The directory holding ``path`` (the root for the root)."""
    head = validate_path(path).rpartition("/")[0]
    return head or ROOT


def path_key(path: str) -> str:
    """The record of the file or directory at ``path`` (the root has none)."""
    if path == ROOT:
        raise ProtocolError("the root is always a directory and has no record")
    return PATH_KEY_PREFIX + key_name(validate_path(path)[1:])


def entries_prefix(path: str) -> str:
    """The key prefix of everything under the directory ``path``."""
    return PATH_KEY_PREFIX if path == ROOT else path_key(path) + "/"


def fs_path(route: Route, path: str) -> str:
    """The URL path of ``route`` for the file system ``path`` (not for rename)."""
    encoded = "/".join(quote(part, safe="") for part in components(path))
    return route.pattern.replace("{path:.*}", encoded)


def route_path(raw: str) -> str:
    """The file system path a route's ``{path}`` match names (aiohttp decodes it)."""
    return ROOT if raw in ("", "/") else validate_path("/" + raw.rstrip("/"))


def paths_of(route: Route, match: Mapping[str, str], query: Mapping[str, str]) -> list[str]:
    """Every path a request on ``route`` touches (an authorization decision covers all
    of them); ``ProtocolError`` when one is missing or invalid."""
    if route == FS_RENAME:
        return [validate_path(query.get("from", "")), validate_path(query.get("to", ""))]
    return [route_path(match.get("path", ""))]


@dataclass(frozen=True, slots=True)
class Stat:
    path: str
    type: FileType
    size: int
    mtime_ms: int
    version: int
    # A file's content checksum (CHECKSUM_ALGORITHM, hex): equal bytes, equal checksums;
    # "" for a directory, and in listings (a stat reads it from the file's record).
    checksum: str = ""

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


def stat_body(stat: Stat) -> dict[str, Any]:
    body: dict[str, Any] = {
        "path": stat.path,
        "type": stat.type,
        "size": stat.size,
        "mtime_ms": stat.mtime_ms,
        "version": stat.version,
    }
    if stat.checksum:
        body["checksum"] = stat.checksum
    return body


def _bounded(value: Any, name: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ProtocolError(f"{name} must be an integer in 0..{maximum}")
    return value


def parse_stat(answer: Any) -> Stat:
    if not isinstance(answer, dict):
        raise ProtocolError("a stat is a JSON object")
    kind = answer.get("type")
    if kind not in ("file", "directory"):
        raise ProtocolError("a stat's type is 'file' or 'directory'")
    path = answer.get("path")
    return Stat(
        validate_path(path if isinstance(path, str) else ""),
        kind,
        _bounded(answer.get("size"), "size", FILE_BYTES_MAX),
        _bounded(answer.get("mtime_ms"), "mtime_ms", MTIME_MS_MAX),
        _bounded(answer.get("version"), "version", 2**53 - 1),
        _checksum(answer.get("checksum", "")),
    )


def _checksum(value: Any) -> str:
    if not isinstance(value, str) or (value and _CHECKSUM.fullmatch(value) is None):
        raise ProtocolError(f"a checksum is {CHECKSUM_ALGORITHM} as 32 lowercase hex digits")
    return value
