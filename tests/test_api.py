"""The wire contract (``ring.api``): builders and parsers agree, malformed bodies are
refused with ``ProtocolError``, and no route is spelled anywhere but in ``ring.api``."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ring import api, codec, fs_api, records_api
from ring.blobs import BlobRef, Extent
from ring.errors import ProtocolError
from ring.lease import FENCE_MAX

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ring", "recovery", "spark_connector", "sr3", "benchmarks")

chunk_ids = st.binary(min_size=1, max_size=64).map(codec.chunk_id)


def test_routes_are_unique_and_versioned() -> None:
    routes = [value for value in vars(api).values() if isinstance(value, api.Route)]
    assert len(routes) == len(set(routes))
    for route in routes:
        assert route.method in ("GET", "PUT", "POST", "DELETE", "HEAD")
        assert route.pattern.startswith("/v1/") or route == api.METRICS
    assert set(routes) >= api.ANY_TARGET_ROUTES


def test_no_route_or_header_is_spelled_outside_the_contract() -> None:
    """A route string appears once in the code base: in ``ring.api``."""
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "ring" / "api.py":
                continue
            tree = ast.parse(path.read_text(), str(path))
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(
                    node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
                )
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in docstrings
                    and ("/v1/" in node.value or "X-SR3-" in node.value)
                    # prose (docstrings, help texts) may name a route
                    and not any(char.isspace() for char in node.value)
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert offenders == []


@given(st.lists(chunk_ids, max_size=50), st.booleans())
def test_exists_request_round_trips(ids: list[str], sizes: bool) -> None:
    assert api.parse_exists_request(api.exists_request(ids, sizes=sizes)) == (ids, sizes)


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"ids": "x"}',
        b'{"ids": [1]}',
        b'{"ids": ["ABC"]}',
        b"\xff",
        json.dumps({"ids": ["0" * 32] * (api.EXISTS_IDS_MAX + 1)}).encode(),
    ],
)
def test_malformed_exists_requests_are_protocol_errors(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        api.parse_exists_request(body)


def test_exists_answer_with_and_without_sizes() -> None:
    a, b = codec.chunk_id(b"a"), codec.chunk_id(b"b")
    assert api.parse_exists_answer({"present": [a, b], "stored_bytes": {a: 7}}) == {a: 7, b: 0}
    assert api.parse_exists_answer({"present": []}) == {}
    for bad in ({}, {"present": 3}, {"present": [a], "stored_bytes": {a: "x"}}, None):
        with pytest.raises(ProtocolError):
            api.parse_exists_answer(bad)


@given(st.lists(chunk_ids, max_size=20, unique=True), st.binary(max_size=200))
def test_record_envelope_round_trips(refs: list[str], value: bytes) -> None:
    body = records_api.record_envelope(refs, value)
    assert records_api.split_record_envelope(body, len(refs)) == (value, tuple(refs))


def test_record_envelope_refuses_what_is_not_a_chunk_id_or_too_short() -> None:
    with pytest.raises(ProtocolError):
        records_api.record_envelope(["not-an-id"], b"v")
    with pytest.raises(ProtocolError):
        records_api.split_record_envelope(b"short", 1)
    with pytest.raises(ProtocolError):
        records_api.split_record_envelope(b"", api.REFS_MAX + 1)


@given(st.sets(chunk_ids, max_size=30))
def test_refs_body_round_trips(refs: set[str]) -> None:
    assert api.parse_refs(api.refs_body(refs)) == refs


def test_refs_body_of_a_partial_id_is_refused() -> None:
    with pytest.raises(ProtocolError):
        api.parse_refs(b"\x00" * 17)


def test_paths() -> None:
    chunk = codec.chunk_id(b"x")
    assert api.chunk_path(chunk) == f"/v1/chunks/{chunk}"
    assert api.chunk_path(chunk, hint="peer 2/x") == f"/v1/chunks/{chunk}?hint=peer%202%2Fx"
    assert records_api.record_raw_path("a/b") == "/v1/records/a/b"
    assert records_api.record_round_path("a/b", "00ff") == "/v1/records/a/b?view=00ff"
    assert (
        records_api.prepare_path("a/b", "3.ab", "00ff")
        == "/v1/paxos/prepare/a/b?ballot=3.ab&view=00ff"
    )
    assert records_api.accept_path("k", "0.", "00ff") == "/v1/paxos/accept/k?ballot=0.&view=00ff"
    assert (
        records_api.accept_path("k", "3.ab", "00ff", "4.ab")
        == "/v1/paxos/accept/k?ballot=3.ab&view=00ff&next=4.ab"
    )
    assert (
        records_api.records_list_path("a b", 10, include_deleted=True)
        == "/v1/records?prefix=a%20b&limit=10&deleted=1"
    )


@pytest.mark.parametrize(
    ("raw", "default", "expected"),
    [(None, 7, 7), ("0", None, 0), ("123", None, 123), ("9" * 18, None, int("9" * 18))],
)
def test_parse_int_accepts(raw: str | None, default: int | None, expected: int) -> None:
    assert api.parse_int(raw, "n", default) == expected


@pytest.mark.parametrize("raw", [None, "", "-1", "1.5", "1e3", "9" * 19, " 1"])
def test_parse_int_refuses(raw: str | None) -> None:
    with pytest.raises(ProtocolError):
        api.parse_int(raw, "n", None)


def test_parse_flag() -> None:
    assert api.parse_flag(None, "f") is False
    assert api.parse_flag("1", "f") is True
    with pytest.raises(ProtocolError):
        api.parse_flag("yes", "f")


def test_ring_description_round_trips_and_refuses_garbage() -> None:
    description = api.RingDescription(
        (api.MemberState("p1", "127.0.0.1:1", "z", "up"),), 3, 2, 256, False
    )
    assert api.RingDescription.from_json(description.to_json()) == description
    for bad in ({}, {"members": [{}]}, [], None):
        with pytest.raises(ProtocolError):
            api.RingDescription.from_json(bad)


def test_error_bodies() -> None:
    body = json.dumps(api.error_body("version_conflict", "stale", current_version=4)).encode()
    assert api.parse_error(body) == api.ErrorBody("version_conflict", "stale", 4)
    assert api.parse_error(b"<html>oops") == api.ErrorBody("error", "<html>oops", 0)


def test_versions_and_listing_answers() -> None:
    assert records_api.parse_versions_answer({"versions": {"a": 3}}) == {"a": 3}
    assert records_api.parse_keys_request(records_api.versions_request(["a", "b"])) == ["a", "b"]
    assert records_api.parse_records_list({"records": [{"key": "k", "version": 2}]}) == [
        ("k", 2, False)
    ]
    for parse in (
        records_api.parse_versions_answer,
        records_api.parse_records_list,
        api.parse_members_answer,
    ):
        with pytest.raises(ProtocolError):
            parse({"nothing": 1})


def test_info_summary_reads_what_status_needs_and_refuses_garbage() -> None:
    info = api.parse_info(
        {
            "stored_bytes": 10, "chunk_count": 2, "record_count": 1, "epoch": 3,
            "hints_pending": 0, "repair": {"rounds": 4, "last": {"chunks_lost": 0}},
        }
    )  # fmt: skip
    assert (info.stored_bytes, info.epoch, info.repair_rounds, info.chunks_lost) == (10, 3, 4, 0)
    assert info.chunks_under_replicated is None
    for bad in ({}, {"stored_bytes": "x", "chunk_count": 1, "record_count": 1}, [], None):
        with pytest.raises(ProtocolError):
            api.parse_info(bad)


# -- numbers and JSON from the wire (issue 15, item 5) ---------------------------------

NOT_ASCII_DIGITS = [
    "\u00b2",
    "1\u00b2",
    "\uff11\uff12",
    "\u0663",
    "\u06f4",
    "\U0001d7d7",
    "\u216b",
    "\u0661\u0660",
]


@pytest.mark.parametrize("raw", NOT_ASCII_DIGITS)
def test_parse_int_refuses_digits_that_are_not_ascii(raw: str) -> None:
    """``str.isdigit`` takes these, and ``int`` takes some of them: the wire does not."""
    with pytest.raises(ProtocolError):
        api.parse_int(raw, "n", None)


@given(st.integers(min_value=0, max_value=api.VERSION_MAX))
def test_parse_ascii_int_round_trips_every_bounded_integer(value: int) -> None:
    assert api.parse_ascii_int(str(value), "n", api.VERSION_MAX) == value


@given(st.text(max_size=40))
def test_parse_ascii_int_takes_only_bounded_ascii_digits(text: str) -> None:
    ascii_digits = text != "" and all(char in "0123456789" for char in text)
    if ascii_digits and len(text) <= 16 and int(text) <= api.VERSION_MAX:
        assert api.parse_ascii_int(text, "n", api.VERSION_MAX) == int(text)
    else:
        with pytest.raises(ProtocolError):
            api.parse_ascii_int(text, "n", api.VERSION_MAX)


def test_parse_int_holds_to_its_maximum() -> None:
    assert api.parse_int(str(api.VERSION_MAX), "v", None, api.VERSION_MAX) == api.VERSION_MAX
    for raw in (str(api.VERSION_MAX + 1), str(10**30), "0" * 17):
        with pytest.raises(ProtocolError):
            api.parse_int(raw, "v", None, api.VERSION_MAX)


MALFORMED_JSON = {
    "deep list": b"[" * 100_000,
    "deep object": b'{"a":' * 50_000,
    "deep then closed": b"[" * 5000 + b"]" * 5000,
    "huge integer": b'{"ids": ' + b"7" * 5000 + b"}",
    "huge negative integer": b"[-" + b"9" * 5000 + b"]",
    "1e400": b'{"x": 1e400}',
    "-1e400": b"[-1e400]",
    "NaN": b"[NaN]",
    "Infinity": b'{"x": Infinity}',
    "-Infinity": b"[-Infinity]",
    "long fraction": b"[0." + b"1" * 5000 + b"]",
    "not utf-8": b'{"ids": ["\xff"]}',
    "utf-16": '{"ids": []}'.encode("utf-16"),
    "truncated": b'{"ids": [',
}


@pytest.mark.parametrize("kind", sorted(MALFORMED_JSON))
def test_load_json_refuses_what_could_break_the_parser(kind: str) -> None:
    with pytest.raises(ProtocolError):
        api.load_json(MALFORMED_JSON[kind])


@pytest.mark.parametrize("kind", sorted(MALFORMED_JSON))
def test_every_json_body_parser_refuses_with_a_protocol_error(kind: str) -> None:
    body = MALFORMED_JSON[kind]
    for parse in (api.parse_json_object, api.parse_exists_request, records_api.parse_keys_request):
        with pytest.raises(ProtocolError):
            parse(body)


def test_load_json_bounds_size_and_depth() -> None:
    nested = b"[" * 40 + b"]" * 40
    assert api.load_json(nested, depth_max=40) is not None
    with pytest.raises(ProtocolError, match="deep"):
        api.load_json(nested, depth_max=39)
    with pytest.raises(ProtocolError, match="bytes"):
        api.load_json(b"[" + b" " * 100 + b"]", bytes_max=100)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('ab"\\[]{}é\n'), max_size=12),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(alphabet=st.sampled_from('k"\\[{'), max_size=4), children)
    ),
    max_leaves=30,
)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(json_values, st.booleans())
def test_load_json_reads_what_json_writes_and_counts_its_depth(
    value: object, compact: bool
) -> None:
    """Valid input reads as before, and brackets or quotes inside strings do not fool
    the depth count."""
    separators = (",", ":") if compact else None
    body = json.dumps(value, separators=separators, ensure_ascii=compact).encode()
    assert api.load_json(body, depth_max=_depth(value)) == json.loads(body)
    if _depth(value) > 0:
        with pytest.raises(ProtocolError):
            api.load_json(body, depth_max=_depth(value) - 1)


GOSSIP_ENTRY = {
    "peer_id": "p1", "address": "127.0.0.1:7401", "zone": "", "status": "up",
    "epoch": 3, "heartbeat": 9,
}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("epoch", 1.5), ("epoch", True), ("epoch", -1), ("epoch", 2**53), ("epoch", 10**30),
        ("epoch", "3"), ("heartbeat", float("inf")), ("heartbeat", None), ("heartbeat", [1]),
        ("peer_id", 7), ("peer_id", ""), ("zone", None), ("status", "gone"),
        ("address", "ü:1"), ("address", "host"), ("address", "host:99999"),
        ("address", "a b:1"), ("address", "a:1\n"), ("address", ["127.0.0.1:1"]),
    ],
)  # fmt: skip
def test_member_entries_are_typed_and_bounded(field: str, value: object) -> None:
    assert api.parse_member_table({"members": [GOSSIP_ENTRY]})[0].epoch == 3
    with pytest.raises(ProtocolError):
        api.parse_member_table({"members": [{**GOSSIP_ENTRY, field: value}]})


@pytest.mark.parametrize(
    "entry",
    [b'"epoch": 1e400', b'"epoch": -Infinity', b'"epoch": NaN', b'"epoch": ' + b"1" * 5000],
    ids=["1e400", "-Infinity", "NaN", "5000 digits"],
)
def test_gossip_bodies_with_unbounded_numbers_are_protocol_errors(entry: bytes) -> None:
    body = b'{"members": [{"peer_id": "p", "address": "a:1", "status": "up", "heartbeat": 1, '
    with pytest.raises(ProtocolError):
        api.parse_member_table(api.parse_json_object(body + entry + b"}]}"))


def test_error_answers_that_are_not_ours_never_raise() -> None:
    for body in (b"[" * 100_000, b'{"error": "x", "version": 1e400}', b'{"version": NaN}'):
        assert api.parse_error(body).version == 0


def test_parse_hint_takes_a_printable_peer_id_that_fits_a_file_name() -> None:
    assert api.parse_hint(None) is None
    assert api.parse_hint("peer-1") == "peer-1"
    for raw in ("", "\u20ac" * 43, "x" * 129, "a\x00b", "a\nb", "\udcff"):
        with pytest.raises(ProtocolError):
            api.parse_hint(raw)


@pytest.mark.parametrize(
    ("field", "value"),
    [("peer_id", "\ud800x"), ("peer_id", "peer 1"), ("peer_id", "p\x00"), ("zone", "z\u2028")],
)
def test_a_member_entry_names_peers_and_zones_in_printable_ascii(field: str, value: str) -> None:
    """A lone surrogate in a gossiped peer id made ``Ring.build`` raise on every peer
    that learned it (ids are hashed with ``.encode()``)."""
    with pytest.raises(ProtocolError):
        api.parse_member_table({"members": [{**GOSSIP_ENTRY, field: value}]})


def test_keys_and_versions_are_typed_and_bounded() -> None:
    """A key that is not a string is refused, not turned into "None"; a version from
    another peer is an integer in 0..VERSION_MAX (a bogus "newer" one would make a
    leaver drop its copy)."""
    with pytest.raises(ProtocolError):
        records_api.parse_keys_request(b'{"keys": [null, 1.5]}')
    for bad in (True, -1, 1.5, api.VERSION_MAX + 1, "3"):
        with pytest.raises(ProtocolError):
            records_api.parse_versions_answer({"versions": {"k": bad}})
    assert records_api.parse_versions_answer({"versions": {"k": 0}}) == {"k": 0}


def test_a_record_key_with_a_trailing_newline_is_refused() -> None:
    from ring.records import validate_key

    with pytest.raises(ProtocolError):
        validate_key("abc\n")
    assert validate_key("abc") == "abc"


@given(st.text(max_size=20))
def test_a_fence_is_ascii_digits_in_range_and_nothing_else(text: str) -> None:
    """``str.isdigit`` takes "²", "⑤", fullwidth and Arabic-Indic digits (``int`` then
    raised or read them as numbers): a fence is 1..FENCE_MAX in ASCII digits only."""
    query = {"lease": "spark/q/lease", "fence": text}
    ascii_digits = text != "" and all(char in "0123456789" for char in text)
    if ascii_digits and len(text) <= 16 and 1 <= int(text) <= FENCE_MAX:
        assert fs_api.parse_fence(query) == ("spark/q/lease", int(text))
    else:
        with pytest.raises(ProtocolError):
            fs_api.parse_fence(query)


@pytest.mark.parametrize(
    "fence", ["\u00b2", "\u2075", "\u2464", "\uff15", "\u0665", "\u0661\u0665"]
)
def test_a_fence_in_digits_that_are_not_ascii_is_refused(fence: str) -> None:
    with pytest.raises(ProtocolError, match="ASCII"):
        fs_api.parse_fence({"lease": "spark/q/lease", "fence": fence})


def test_a_fence_names_a_lease_record_never_a_files() -> None:
    with pytest.raises(ProtocolError, match="file's record"):
        fs_api.parse_fence({"lease": fs_api.path_key("/spark/q/commits/0"), "fence": "1"})
    assert fs_api.parse_fence({"lease": "fsx/renames/x", "fence": "7"}) == ("fsx/renames/x", 7)
    assert fs_api.parse_fence({}) is None


@pytest.mark.parametrize(
    ("prefix", "key", "within"),
    [
        ("/", "anything/at/all", True),
        ("/spark", "spark/q1/lease", True),
        ("/spark", "spark", True),
        ("/spark", "sparkle/q1/lease", False),
        ("/spark", "other/q1/lease", False),
        ("/spark/q1", "spark/q1/lease", True),
        ("/spark/sessions", "spark/q1/lease", False),
    ],
)
def test_a_scoped_credential_fences_with_leases_under_its_prefix(
    prefix: str, key: str, within: bool
) -> None:
    assert fs_api.lease_within(key, prefix) is within


@pytest.mark.parametrize(
    "target",
    [
        "/v1/fs/files/a%FF",
        "/v1/fs/files/a%ED%A0%80",  # a surrogate
        "/v1/fs/files/a%C0%AF",  # an overlong "/"
        "/v1/fs/files/a%E2%82",  # cut short
        "/v1/fs/rename?from=%2Fa%FF&to=%2Fb",
        "/v1/fs/files/a?lease=spark%2Fq%2Flease&fence=1%FF",
        "/v1/fs/files/a\udcff",  # a raw byte aiohttp kept as a surrogate escape
    ],
)
def test_a_target_whose_escapes_are_not_utf8_is_refused(target: str) -> None:
    with pytest.raises(ProtocolError, match="not UTF-8"):
        api.check_target(target)


@pytest.mark.parametrize(
    "target",
    [
        "/v1/fs/files/a%25FF",  # a name holding "%FF" itself
        "/v1/fs/files/%C3%A9t%C3%A9/%F0%9F%93%81",
        "/v1/fs/rename?from=%2Fa&to=%2Fb+c&op=0123456789abcdef01234567",
        "/v1/ring",
    ],
)
def test_a_target_of_utf8_escapes_is_taken(target: str) -> None:
    api.check_target(target)


# Numbers in answers and stored values that ``int()`` took: a string of digits (ASCII or
# not), a float, a bool, a negative count.
LOOSE_NUMBERS = ["5", "\u0665", 5.0, 5.7, True, -1]


def _with(value: object, path: tuple[str | int, ...], number: object) -> object:
    """``value`` (JSON-shaped) with the item at ``path`` replaced by ``number``."""
    copied = json.loads(json.dumps(value))
    holder = copied
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = number
    return copied


@pytest.mark.parametrize("number", LOOSE_NUMBERS)
def test_numbers_in_answers_and_stored_values_are_json_integers(number: object) -> None:
    """Peers' answers (a ring, an exists answer, info, a record write or listing) and a
    stored blob reference give counts and versions as JSON integers: anything else
    ``int()`` used to take is a ``ProtocolError``."""
    a = codec.chunk_id(b"a")
    ring = api.RingDescription(
        (api.MemberState("p1", "127.0.0.1:1", "z", "up"),), 3, 2, 256, False
    ).to_json()
    info = {"stored_bytes": 10, "chunk_count": 2, "record_count": 1, "epoch": 3}
    blob = BlobRef(4, "0" * 32, (Extent(a, 0, 4),)).to_json()
    cases: list[tuple[Callable[[Any], object], object, tuple[str | int, ...]]] = [
        (api.RingDescription.from_json, ring, ("replication",)),
        (api.RingDescription.from_json, ring, ("vnodes",)),
        (api.parse_exists_answer, {"present": [a], "stored_bytes": {a: 7}}, ("stored_bytes", a)),
        (api.parse_info, info, ("chunk_count",)),
        (api.parse_info, info, ("epoch",)),
        (records_api.parse_written_version, {"version": 2}, ("version",)),
        (records_api.parse_records_list, {"records": [{"key": "k", "version": 2}]},
         ("records", 0, "version")),
        (BlobRef.from_json, blob, ("size",)),
        (BlobRef.from_json, blob, ("extents", 0, 2)),
    ]  # fmt: skip
    for parse, good, path in cases:
        parse(good)
        with pytest.raises(ProtocolError):
            parse(_with(good, path, number))
