"""Unit tests for ring.errors: the messages users read.

What must hold: ``DataUnavailable`` says what it names, chunks as chunks (the default,
for the chunk readers and recovery) and records as records (a named file whose record
no quorum answered for is not "a chunk unavailable on every replica")."""

from __future__ import annotations

from ring.errors import DataUnavailable


def test_data_unavailable_names_chunks_as_chunks_and_records_as_records() -> None:
    chunk_id = "ab" * 32
    chunks = DataUnavailable([chunk_id], ["peer-2: refused"])
    assert chunks.kind == "chunk" and chunks.missing == [chunk_id]
    assert str(chunks) == f"1 chunk(s) unavailable on every replica: {chunk_id} (peer-2: refused)"

    record = DataUnavailable(["blob/f1"], ["peer-1: timeout"], kind="record")
    assert record.kind == "record" and record.missing == ["blob/f1"]
    assert str(record) == (
        "1 record(s) unavailable: too few of their replicas answered: blob/f1 (peer-1: timeout)"
    )
    assert "chunk" not in str(record)

    prefix = DataUnavailable(["blob/"], ["too few peers answered the scan"], kind="prefix")
    assert str(prefix) == (
        "records under 1 prefix(es) unavailable: blob/ (too few peers answered the scan)"
    )
