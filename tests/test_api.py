"""The wire contract (``ring.api``): builders and parsers agree, malformed bodies are
refused with ``ProtocolError``, and no route is spelled anywhere but in ``ring.api``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ring import api, codec
from ring.errors import ProtocolError

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
    body = api.record_envelope(refs, value)
    assert api.split_record_envelope(body, len(refs)) == (value, tuple(refs))


def test_record_envelope_refuses_what_is_not_a_chunk_id_or_too_short() -> None:
    with pytest.raises(ProtocolError):
        api.record_envelope(["not-an-id"], b"v")
    with pytest.raises(ProtocolError):
        api.split_record_envelope(b"short", 1)
    with pytest.raises(ProtocolError):
        api.split_record_envelope(b"", api.REFS_MAX + 1)


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
    assert api.record_cas_path("a/b", 3, 2) == "/v1/records/a/b?expected_version=3&refs=2"
    assert api.record_delete_path("k", 4) == "/v1/records/k?expected_version=4"
    assert (
        api.record_repair_path("k", 5, 0, deleted=True)
        == "/v1/records/k?version=5&refs=0&deleted=1"
    )
    assert (
        api.records_list_path("a b", 10, include_deleted=True)
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
    assert api.parse_versions_answer({"versions": {"a": 3}}) == {"a": 3}
    assert api.parse_keys_request(api.versions_request(["a", "b"])) == ["a", "b"]
    assert api.parse_records_list({"records": [{"key": "k", "version": 2}]}) == [("k", 2, False)]
    for parse in (api.parse_versions_answer, api.parse_records_list, api.parse_members_answer):
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
