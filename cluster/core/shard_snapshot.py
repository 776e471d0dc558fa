"""``ShardStore``'s snapshot format: its pages as msgpack chunks, and the loading of them.

A snapshot is ``{"chunks": [chunk, ..., tail]}``: each chunk a msgpack list of
``[table, leaf, keys, who, pn, ...]``, five fields a digest leaf (``cluster.core.pages.Page.split``:
a page of the store holds several leaves, the snapshot keeps the layout of a page a leaf),
the tail ``{"own", "origins", "staged"}``, the store's origin names in number order and its
staged copies (``ShardStore.staged_visible``). The earlier layout
``{"tables": {table: {key: [P0, N0, ...]}}, "origins": [...]}`` still loads. The store's methods
(``dump_chunks``, ``to_bytes``, ``from_bytes``) call these; they read and set its private state,
as its own methods would. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack

from cluster.core.pages import SPAN_BITS
from cluster.core.store_kernel import JOIN, SPLIT


def dump_chunks(store: Any, pages_per_chunk: int) -> Iterator[bytes]:
    """The store as chunks, each encoding up to ``pages_per_chunk`` pages (a record a leaf) as
    they are when it is made; then the origins, last (they only grow, so every origin a chunk
    names is in them).
    A caller may run other code between chunks: a page changed meanwhile is taken as it is then
    (``NodeState``'s snapshot relies on pairs only growing), a page created or emptied meanwhile
    is left out."""
    tables = store._tables
    todo = [(table, at) for table, pages in tables.items() for at in pages]
    pack = msgpack.Packer().pack
    for i in range(0, len(todo), pages_per_chunk):
        flat: list[Any] = []
        for table, at in todo[i:i + pages_per_chunk]:
            page = tables.get(table, {}).get(at)
            if page is not None:  # else its keys were dropped meanwhile (``ShardStore.drop``)
                for part in SPLIT(page):
                    flat += (table, *part)
        yield pack(flat)
    # staged copies (W > 2) as they are once every page is encoded: their visible pairs, the
    # rest of their pairs hidden again on load (a page encoded earlier may lack a rise since:
    # the log's records after the cut bring it back, a STAGED one hidden, a REPLICA one not)
    yield pack({"own": store.own, "origins": store._origins, "staged": store.staged_visible()})


def load(cls: Any, data: bytes, own: str) -> Any:
    """A ``cls`` (``ShardStore``) from a snapshot; ``own`` may differ from the snapshot's (a new
    incarnation). Every key is marked for the digests (``flush_digests``)."""
    blob = msgpack.unpackb(data, strict_map_key=True)
    if "chunks" not in blob:
        return _from_rows(cls, blob, own)
    *chunks, tail = blob["chunks"]
    head = msgpack.unpackb(tail)
    store = cls(own)
    store._origins = list(head["origins"])
    store._index = {name: i for i, name in enumerate(store._origins)}
    store._own = store._origin(own)
    tables = store._tables
    for table, at, parts in _pages(chunks):
        pages = tables.setdefault(table, {})
        if at in pages:  # its leaves were not together (a snapshot of a page a leaf)
            parts = [record[1:] for record in SPLIT(pages[at])] + parts
            store.keys -= len(pages[at])
        page = pages[at] = JOIN(parts, table, at)  # a key of another page: ValueError
        store.keys += len(page)
    store.load_staged(head.get("staged", ()))
    store._index_all()
    return store


def _pages(chunks: list[bytes]) -> Iterator[tuple[str, int, list[tuple[bytes, bytes, bytes]]]]:
    """Each run of records of one page (table, page number) as the chunks hold them, decoded a
    chunk at a time: a page's leaves are together in the snapshots ``dump_chunks`` writes, so a
    load never holds more than a chunk of records (what it held is kept by the allocator)."""
    run: list[tuple[bytes, bytes, bytes]] = []
    where: tuple[str, int] | None = None
    for raw in chunks:
        flat = msgpack.unpackb(raw)
        for i in range(0, len(flat), 5):
            table, leaf, keys, who, pn = flat[i:i + 5]
            if where != (table, leaf >> SPAN_BITS):
                if where is not None:
                    yield (*where, run)
                where, run = (table, leaf >> SPAN_BITS), []
            run.append((keys, who, pn))
    if where is not None:
        yield (*where, run)


def _from_rows(cls: Any, blob: dict[str, Any], own: str) -> Any:
    """A snapshot of the earlier layout (``{"tables": {table: {key: [P0, N0, ...]}}}``)."""
    store = cls(own)
    origins: list[str] = blob["origins"]
    for table, rows in blob["tables"].items():
        for key, row in rows.items():
            for j in range(0, len(row), 2):
                if row[j] or row[j + 1]:
                    store.merge_pair(table, key, origins[j // 2], row[j], row[j + 1])
    return store
