"""The fast record constructor builds records equal to ``LogRecord(...)``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cluster.wal import LogRecord, make_record


@given(st.integers(1, 4), st.text(max_size=10), st.text(max_size=5), st.text(max_size=5),
       st.integers(-(2**63), 2**63 - 1), st.text(max_size=5), st.integers(0, 2**64 - 1),
       st.integers(0, 2**64 - 1), st.floats(allow_nan=False))
def test_make_record_equals_constructor(kind: int, op_id: str, table: str, key: str, delta: int,
                                        origin: str, p: int, n: int, ts: float) -> None:
    args = (kind, op_id, table, key, delta, origin, p, n, ts)
    rec = make_record(*args)
    assert type(rec) is LogRecord
    assert rec == LogRecord(*args)
    assert hash(rec) == hash(LogRecord(*args))
