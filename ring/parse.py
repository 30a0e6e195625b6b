"""Bounded parsing of untrusted input: ASCII integers with an explicit bound, 0/1 flags,
and JSON bounded in size, nesting and number length before and while it is parsed.

Every number a peer takes from the wire goes through ``parse_ascii_int`` (``str.isdigit``
and ``int`` also accept "²" and fullwidth digits), every JSON body or stored JSON value
through ``load_json`` (``json.loads`` alone recurses without bound and accepts NaN,
Infinity and numbers of any length), and every request target through ``check_target``
(aiohttp keeps a path's escapes that are not UTF-8, such as ``%FF``, as their literal
text and turns a query's into U+FFFD: either way two URLs would name one thing).
``ring.api`` re-exports these with the rest of the wire contract.
"""

from __future__ import annotations

import json
import math
from itertools import accumulate
from typing import Any
from urllib.parse import unquote_to_bytes

from ring.errors import ProtocolError

__all__ = [
    "INT_DIGITS_MAX",
    "JSON_BYTES_MAX",
    "JSON_DEPTH_MAX",
    "JSON_INT_MAX",
    "JSON_NUMBER_CHARS_MAX",
    "QUERY_INT_MAX",
    "check_target",
    "json_int",
    "load_json",
    "parse_ascii_int",
    "parse_flag",
    "parse_int",
    "parse_json_object",
]

# Digits of an integer query parameter: anything longer is refused before ``int()``.
INT_DIGITS_MAX = 18
QUERY_INT_MAX = 10**INT_DIGITS_MAX - 1
# Integers read from JSON (record versions, member epochs and heartbeats) stay below
# 2**53, so every JSON reader (Java, JavaScript) holds them exactly.
JSON_INT_MAX = 2**53 - 1
# A JSON body or answer: its size, its nesting, and the digits of any number in it.
JSON_BYTES_MAX = 16 * 1024 * 1024
JSON_DEPTH_MAX = 32
JSON_NUMBER_CHARS_MAX = 32
_DIGITS = frozenset("0123456789")


def parse_ascii_int(text: str, name: str, maximum: int) -> int:
    """``text`` as an integer in ``0..maximum``: ASCII digits only (``str.isdigit`` and
    ``int`` also take "²" or fullwidth digits), at most as many as ``maximum`` has."""
    if not text or len(text) > len(str(maximum)) or not _DIGITS.issuperset(text):
        raise ProtocolError(f"{name} must be a non-negative integer of ASCII digits")
    value = int(text)
    if value > maximum:
        raise ProtocolError(f"{name} must be at most {maximum}")
    return value


def check_target(raw: str) -> None:
    """Refuse a request target (path and query, as sent) whose percent-escapes do not
    decode to UTF-8: a lone ``%FF``, an encoded surrogate (``%ED%A0%80``), an overlong
    form (``%C0%AF``). Strict UTF-8 is what every client encodes names with."""
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeError:
        raise ProtocolError(
            "the request's path or query has percent-escapes that are not UTF-8"
        ) from None


def parse_int(raw: str | None, name: str, default: int | None, maximum: int = QUERY_INT_MAX) -> int:
    """A non-negative integer query parameter; ``default`` when absent (None: required)."""
    if raw is None:
        if default is None:
            raise ProtocolError(f"query parameter {name!r} is required")
        return default
    return parse_ascii_int(raw, f"query parameter {name!r}", maximum)


def json_int(value: Any, name: str, maximum: int = JSON_INT_MAX) -> int:
    """A JSON number that must be an integer in ``0..maximum`` (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ProtocolError(f"{name} must be an integer between 0 and {maximum}")
    return value


def parse_flag(raw: str | None, name: str) -> bool:
    """An optional 0/1 query parameter (absent: 0)."""
    if raw is None:
        return False
    if raw not in ("0", "1"):
        raise ProtocolError(f"query parameter {name!r} must be 0 or 1")
    return raw == "1"


def _json_depth(body: bytes) -> int:
    """The deepest nesting of ``[``/``{`` outside strings, read from the bytes without
    recursion (an upper bound where the JSON is malformed)."""
    # Escape pairs first (a run of backslashes pairs up from its left), so that every
    # quote left delimits a string; then the brackets between strings.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_BRACKET_STEPS.__getitem__, outside), initial=0))


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEPS = tuple(1 if b in b"[{" else -1 for b in range(256))


def _json_number(text: str) -> str:
    if len(text) > JSON_NUMBER_CHARS_MAX:
        raise ProtocolError(f"a JSON number of {len(text)} characters is too long")
    return text


def _json_int(text: str) -> int:
    return int(_json_number(text))


def _json_float(text: str) -> float:
    value = float(_json_number(text))
    if not math.isfinite(value):
        raise ProtocolError(f"the JSON number {text} is out of range")
    return value


def _json_constant(text: str) -> Any:
    raise ProtocolError(f"{text} is not a JSON number")


def load_json(
    body: bytes, *, bytes_max: int = JSON_BYTES_MAX, depth_max: int = JSON_DEPTH_MAX
) -> Any:
    """Parse a JSON body, bounded before and while parsing: at most ``bytes_max`` bytes
    of UTF-8, nested at most ``depth_max`` deep, numbers of at most
    ``JSON_NUMBER_CHARS_MAX`` characters and finite (no NaN, no Infinity)."""
    if len(body) > bytes_max:
        raise ProtocolError(f"a JSON body of {len(body)} bytes is above {bytes_max}")
    depth = _json_depth(body)
    if depth > depth_max:
        raise ProtocolError(f"a JSON body nested {depth} deep is above {depth_max}")
    try:
        return json.loads(
            body.decode("utf-8"),
            parse_int=_json_int,
            parse_float=_json_float,
            parse_constant=_json_constant,
        )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"body is not valid JSON: {exc}") from exc


def parse_json_object(body: bytes) -> dict[str, Any]:
    parsed = load_json(body)
    if not isinstance(parsed, dict):
        raise ProtocolError("request body must be a JSON object")
    return parsed
