"""The per-op loops of a batch on the write path, and the choice of their compiled twins.

A batch of ops crosses a node as lists (``cluster.core.ops``): the edge checks each op, the
leader makes each new one an item and holds it until its quorum answers, then releases it; a
replica encodes each op id for its dedup. These loops are the functions below, the reference;
``cluster/core/_batch.pyx`` compiles the same functions (``pip install`` builds it where a C
compiler is; ``setup.py``), and ``tests/test_batch_kernel.py`` runs both on the same programs.
The module-level names are the compiled ones when the module is built, it gives the reference's
answers on a sample here, and ``IDC_BATCH_KERNEL`` is not ``0``; ``KERNEL`` says which run
(``"c"`` or ``"python"``), ``REASON`` why not C, ``PYTHON`` holds the reference by name.

Pure: plain containers in, plain containers out; the callers own their meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cluster.core.compiled import optional
from idc_contract import INT64_MAX, INT64_MIN

ENV = "IDC_BATCH_KERNEL"

Targets = Callable[[str, str], tuple[str, ...]]


def fast_checked(ops: Sequence[Any], known: set[str], max_op_id_bytes: int, now_ms: int = 0,
                 skew_ms: int = 0, stale_after_ms: int | None = None
                 ) -> list[tuple[Any, ...] | None]:
    """Per op of a ``/v1/batch`` body, its checked form ``(table, key, op_id, delta, attempt,
    age_ms)`` when it has a common shape, else None: the full check (``cluster.edge.validate``)
    judges it. The common shapes: an object of table, key, op_id and delta (names already
    checked, in ``known``; a printable ASCII op id of 1 to ``max_op_id_bytes``; a signed 64-bit
    delta), with any of ``attempt`` (an integer >= 1), ``age_ms`` and ``ts_ms`` (integers >= 0,
    all three at most 2**63 - 1), which the SDK sends, and nothing else. Their meaning is the
    full check's: ``ts_ms`` raises the age to what the node's clock (``now_ms``) says less
    ``skew_ms``, and an op that may be older than ``stale_after_ms`` counts as a retry
    (attempt at least 2)."""
    out: list[tuple[Any, ...] | None] = []
    for op in ops:
        if type(op) is dict and 4 <= len(op) <= 7:
            table, key, op_id, delta = op.get("table"), op.get("key"), op.get("op_id"), op.get(
                "delta")
            if (type(table) is str and table in known and type(key) is str and key in known
                    and type(op_id) is str and op_id.isascii() and op_id.isprintable()
                    and 0 < len(op_id) <= max_op_id_bytes
                    and type(delta) is int and INT64_MIN <= delta <= INT64_MAX):
                if len(op) == 4:
                    out.append((table, key, op_id, delta, 1, 0))
                    continue
                attempt, age_ms, ts_ms = op.get("attempt"), op.get("age_ms"), op.get("ts_ms")
                fields = 4 + (attempt is not None) + (age_ms is not None) + (ts_ms is not None)
                if (fields == len(op) and (attempt is None or _int_at_least(attempt, 1))
                        and (age_ms is None or _int_at_least(age_ms, 0))
                        and (ts_ms is None or _int_at_least(ts_ms, 0))):
                    attempt = 1 if attempt is None else attempt
                    age_ms = stale_ms = 0 if age_ms is None else age_ms
                    if ts_ms is not None:
                        elapsed = now_ms - ts_ms
                        age_ms = max(age_ms, elapsed - skew_ms)
                        stale_ms = max(stale_ms, elapsed)
                    if stale_after_ms is not None and stale_ms > stale_after_ms:
                        attempt = max(attempt, 2)
                    out.append((table, key, op_id, delta, attempt, age_ms))
                    continue
        out.append(None)
    return out


def _int_at_least(value: Any, lo: int) -> bool:
    return type(value) is int and lo <= value <= INT64_MAX


def new_items(ops: Sequence[Sequence[Any]], dups: Sequence[bool], me: str, now: float,
              targets_of: Targets) -> tuple[list[list[Any]], dict[tuple[str, ...], list[Any]],
                                            list[int]]:
    """A leader's batch after its dedup check: an item (``cluster.core.ops.Item``'s fields as a
    list, P and N still 0) for each new op, grouped by the replicas it goes to; and the indices
    of the duplicates, for the caller to answer."""
    applied: list[list[Any]] = []
    groups: dict[tuple[str, ...], list[Any]] = {}
    dup_at: list[int] = []
    for i, op in enumerate(ops):
        if dups[i]:
            dup_at.append(i)
            continue
        table, key, op_id, delta, _attempt = op
        item = [op_id, table, key, me, 0, 0, delta, now]
        applied.append(item)
        targets = targets_of(table, key)
        group = groups.get(targets)
        if group is None:
            groups[targets] = [item]
        else:
            group.append(item)
    return applied, groups, dup_at


def by_leader(ops: Sequence[Sequence[Any]], cached: dict[tuple[str, str], tuple[str, ...]],
              prefs_of: Callable[[str, str], tuple[str, ...]],
              leader_of: Callable[[str, str, Any], str | None], is_live: Any
              ) -> dict[str | None, list[int]]:
    """The indices of the ops (``table, key, ...`` each) by their key's leader, in order of
    first appearance. A key's preference list is read from ``cached`` (the ring's cache, by
    (table, key)), else from ``prefs_of``. Keys with one preference list have one leader:
    ``leader_of(table, key, is_live)`` is asked once a call for each list, not once an op."""
    groups: dict[str | None, list[int]] = {}
    leaders: dict[tuple[str, ...], str | None] = {}
    for i, op in enumerate(ops):
        table, key = op[0], op[1]
        prefs = cached.get((table, key)) or prefs_of(table, key)
        if prefs in leaders:
            leader = leaders[prefs]
        else:
            leader = leaders[prefs] = leader_of(table, key, is_live)
        idx = groups.get(leader)
        if idx is None:
            groups[leader] = [i]
        else:
            idx.append(i)
    return groups


def hold_items(pending: dict[str, Any], by_key: dict[tuple[str, str, str], dict[str, None]],
               items: Sequence[Sequence[Any]]) -> None:
    """Each item unpublished: ``pending[op_id]`` is it, and its id joins its (table, key,
    origin)'s ids in ``by_key``, in order (``cluster.roles.state.NodeState``)."""
    for item in items:
        op_id = item[0]
        pending[op_id] = item
        k = (item[1], item[2], item[3])
        ids = by_key.get(k)
        if ids is None:
            by_key[k] = {op_id: None}
        else:
            ids[op_id] = None


def release_ids(pending: dict[str, Any], by_key: dict[tuple[str, str, str], dict[str, None]],
                op_ids: Iterable[str]) -> list[Any]:
    """``hold_items`` undone for these ids: the items of those that were held, in order."""
    out: list[Any] = []
    for op_id in op_ids:
        item = pending.pop(op_id, None)
        if item is None:
            continue
        k = (item[1], item[2], item[3])
        ids = by_key.get(k)
        if ids is not None:
            ids.pop(op_id, None)
            if not ids:
                del by_key[k]
        out.append(item)
    return out


def encoded_ids(items: Sequence[Sequence[Any]], table_at: int, id_at: int
                ) -> tuple[list[bytes], str | None]:
    """Each item's op id (field ``id_at``) UTF-8 encoded, for its table's dedup; and the one
    table (field ``table_at``) of them all, None when there are several (or no item)."""
    ids: list[bytes] = []
    table: str | None = None
    several = False
    for item in items:
        ids.append(item[id_at].encode())
        t = item[table_at]
        if table is None:
            table = t
        elif not several and t != table:
            several = True
    return ids, None if several else table


def needs_touch(items: Sequence[Sequence[Any]], ttl: frozenset[str], last: str) -> bool:
    """Does some item change a key's last change: its origin is ``last`` (a delete's LAST
    item), or its table has a ttl (``NodeState.touch``)."""
    return any(item[3] == last or item[1] in ttl for item in items)


def oldest_ts(items: Sequence[Sequence[Any]]) -> float:
    """The smallest ``ts`` (an item's last field) of a non-empty batch."""
    it = iter(items)
    oldest = next(it)[7]
    for item in it:
        ts = item[7]
        if ts < oldest:
            oldest = ts
    return float(oldest)


NAMES = ("fast_checked", "new_items", "by_leader", "hold_items", "release_ids", "encoded_ids",
         "needs_touch", "oldest_ts")
PYTHON: dict[str, Any] = {name: globals()[name] for name in NAMES}


def _agrees(mod: Any) -> str:
    """Why the compiled module may not stand in for the reference, "" when it may."""
    if any(not hasattr(mod, name) for name in NAMES):
        return "it was built from an older source (a name is missing)"
    ops = [{"table": "t", "key": "k", "op_id": "a:1", "delta": -3},
           {"table": "t", "key": "k", "op_id": "a\x7f", "delta": 1},
           {"table": "t", "key": "k", "op_id": "a:2", "delta": 2**63}]
    ops.append({"table": "t", "key": "k", "op_id": "a:3", "delta": 1, "attempt": 1,
                "age_ms": 5, "ts_ms": 1_000})
    try:
        if mod.fast_checked(ops, {"t", "k"}, 8, 9_000, 1_000, 7_000) != fast_checked(
                ops, {"t", "k"}, 8, 9_000, 1_000, 7_000):
            return "its op check differs from the reference"
    except TypeError:  # built before the check took the clock
        return "it was built from an older source (its op check's arguments)"
    return ""


def _load() -> tuple[Any, str]:
    mod, why = optional("cluster.core._batch", ENV)
    if mod is None:
        return None, why
    why = _agrees(mod)
    return (None, why) if why else (mod, "")


_MODULE, REASON = _load()
KERNEL = "c" if _MODULE is not None else "python"
if _MODULE is not None:
    fast_checked = _MODULE.fast_checked  # noqa: F811
    new_items = _MODULE.new_items  # noqa: F811
    by_leader = _MODULE.by_leader  # noqa: F811
    hold_items = _MODULE.hold_items  # noqa: F811
    release_ids = _MODULE.release_ids  # noqa: F811
    encoded_ids = _MODULE.encoded_ids  # noqa: F811
    needs_touch = _MODULE.needs_touch  # noqa: F811
    oldest_ts = _MODULE.oldest_ts  # noqa: F811
