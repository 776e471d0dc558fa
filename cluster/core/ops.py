"""The op's two shapes on its way through a node, named once (docs/architecture.md, the write path).

    HTTP body --validate--> Op --coordinator--> FORWARD item [*Op, stamp_ms] --> Op
        --leader apply--> Item (held while unpublished, sent in REPLICATE, logged)
        --replica--> the same Item's fields, as msgpack decodes them (a list)

``Op`` is a client op after validation; ``Item`` is one application of it by its leader, with
the pair it raised. The log's own shape is ``cluster.wal.LogRecord`` (another field order:
``cluster.wal.record_fields`` is the one conversion from an item's fields). The per-op answers
are ``cluster.transport.wire.Status`` values, not defined here.

Pure: no I/O and no imports of the layers above. msgpack packs a tuple (a NamedTuple too) as an
array, like a list, so what goes on the wire and into snapshots is the same whichever shape
built it.

**Items stay lists on the hot paths** (measured, ``bench.bench_hotpath``, rows "shape ..."):
building an ``Item`` costs about 0.25 us more than a list, converting a list from the wire about
as much, i.e. some 10 % of the leader's apply and 20 % of the replica's merge per op, while
reading a field by name costs the same as by index. So the leader builds its items as lists and
the replica keeps the lists msgpack decodes (``ItemFields``: an ``Item`` or a list of its
fields); code that reads them unpacks them or uses the ``ITEM_*`` index constants below, which
work on both. ``Item`` instances are built where it costs nothing: settling, hints, recovery.
Ops are ``Op`` instances from the edge and from FORWARD frames; code on the leading path unpacks
them (``table, key, op_id, delta, attempt = op``), so a caller's plain 5-tuple works too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple


class Op(NamedTuple):
    """A client op after validation, as it is routed and led.

    Built at the edge (``cluster.edge.http_api``: ``validate.check_op``'s result without its
    ``age_ms``) and from a FORWARD frame at its leader (``coordinator.unstamped``); read by the
    coordinator (routing), ``admission`` (check, claims, leases, overflow), ``checks`` (retries
    asked on the replicas) and ``Leader._apply_batch``, which turns each new one into an
    ``Item``."""

    table: str
    key: str
    op_id: str
    delta: int  # signed 64-bit
    attempt: int  # >= 1; 2 or more: a retry, checked on the replicas before it applies


class Item(NamedTuple):
    """One application of an op by its leader: the REPLICATE item.

    Built by ``Leader._apply_batch`` (and by ``settle`` when it publishes an in-doubt op again,
    by ``Replica.shareable`` for hints); held in ``NodeState.pending`` while unpublished (and in
    the snapshot's ``in_doubt``); sent to the key's other replicas in a REPLICATE frame, where
    ``Replica`` merges it (a list there, see the module's note); logged as APPLY, REPLICA,
    PUBLISHED or WITHDRAW records through ``cluster.wal.record_fields``."""

    op_id: str
    table: str
    key: str
    origin: str  # the leader's origin id ("n1@7"), whose pair this is
    p: int  # the origin's P entry on the key after this op (unsigned 64-bit)
    n: int  # the origin's N entry
    delta: int  # the op's own delta (signed 64-bit)
    ts: float  # wall-clock seconds when the leader applied it

    @classmethod
    def of(cls, fields: Any) -> Item:
        """An ``Item`` of eight fields in this order (a list from the wire, a snapshot, ...)."""
        return cls._make(fields)


# An item as the hot paths carry it: an ``Item``, or a list of its eight fields in its order
# (built by the leader, decoded from a REPLICATE frame). Read it by unpacking or the constants.
ItemFields = Sequence[Any]
# The index of each ``Item`` field, for ``ItemFields`` (tests/test_ops.py holds them to the class)
ITEM_OP_ID, ITEM_TABLE, ITEM_KEY, ITEM_ORIGIN, ITEM_P, ITEM_N, ITEM_DELTA, ITEM_TS = range(8)
