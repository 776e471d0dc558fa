# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""The shard store's hot methods compiled (optional): ``ShardStore.merge_items`` (a replica's
batch), ``apply_hidden`` (a leader's new op) and ``unhide`` (its publication).

The same data and the same results as the Python methods in ``cluster.core.shards``, which stay
the reference (``tests/test_store_kernel.py`` runs both on the same programs): the pages'
buffers (``cluster.core.pages``) read and written in place, a key found by scanning its page's
key hashes, an entry by bisecting ``who``, and a changed pair's digest move (``pair_hash``:
msgpack of ``[key, origin, P, N]``, MurmurHash3 x64 128) and the digest tree's sums done here,
without a Python call per op; and a page's lookup, its leaves' indexes and its snapshot records
(``find``, ``indexed``, ``split``, ``join``: twins of ``Page``'s methods). ``shards`` binds
these in place of its methods when the module is built and agrees with its own hashes;
``IDC_STORE_KERNEL=0`` keeps the Python ones.
"""

cimport cython
from cpython cimport array
from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize

import sys

from cluster.core.digests import BUCKETS, LEAVES, LEVELS, MASK, SEED, _Group
from cluster.core.pages import MAX_ORIGINS, ORIGIN_BITS, SPAN_BITS, Page


cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member

cdef extern from "_murmur3.h" nogil:
    void idc_murmur3_x64_128(const void *key, size_t len, uint32_t seed,
                             uint64_t *out1, uint64_t *out2)

cdef enum:
    STACK = 512  # bytes of a hashed message kept on the stack; longer ones are allocated

if LEVELS != (BUCKETS, 4096, 65536) or ORIGIN_BITS != 16 or MAX_ORIGINS != 1 << 16 \
        or SPAN_BITS != 4:
    raise ImportError("the store kernel is built for the digest tree (64, 4096, 65536), "
                      "16-bit origin numbers and pages of 16 leaves")
if sys.byteorder != "little":
    raise ImportError("the store kernel writes snapshots' little-endian buffers as they are")

cdef uint32_t _SEED = SEED
cdef long _LEAVES = LEAVES
cdef enum:
    SPAN_BITS_C = 4  # ``pages.SPAN_BITS``
    SPAN = 16  # digest leaves a page (``pages.SPAN``)


# -- a page's fields (``cluster.core.pages.Page``, a class with ``__slots__``) -----------------
# Read where each instance keeps them (the slot's member descriptor says), not through
# ``getattr``: a lookup in the class's dict and a descriptor call each, four a located key.

cdef Py_ssize_t _slot_offset(str name) except -1:
    descr = Page.__dict__[name]
    if type(descr).__name__ != "member_descriptor":
        raise ImportError(f"Page.{name} is not a slot")
    return (<PyMemberDescrObject *><PyObject *>descr).d_member.offset


cdef Py_ssize_t _KEYS = _slot_offset("keys"), _WHO = _slot_offset("who")
cdef Py_ssize_t _PN = _slot_offset("pn"), _ROWS = _slot_offset("rows")


cdef inline object _field(object page, Py_ssize_t offset):
    """``page``'s slot at ``offset`` (a new reference; every slot is set by ``Page()``)."""
    return <object>(<PyObject **>((<char *><PyObject *>page) + offset))[0]


def _fields_agree():
    """The slots read by offset are the attributes (``store_kernel``'s check at import)."""
    page = Page()
    page.add(b"k", 7)
    page.insert(0, 0, 1)
    return (_field(page, _KEYS) is page.keys and _field(page, _WHO) is page.who
            and _field(page, _PN) is page.pn and _field(page, _ROWS) is page.rows)


# -- hashes (``cluster.core.digests.key_hash`` and ``pair_hash``) ------------------------------

cdef inline uint32_t _rotl32(uint32_t x, int r) noexcept nogil:
    return (x << r) | (x >> (32 - r))


cdef uint32_t _murmur3_32(const uint8_t *data, Py_ssize_t n, uint32_t seed) noexcept nogil:
    """MurmurHash3 x86 32 (Austin Appleby, public domain): ``mmh3.hash``'s function."""
    cdef uint32_t h = seed, k
    cdef uint32_t c1 = 0xcc9e2d51U, c2 = 0x1b873593U
    cdef Py_ssize_t i, nblocks = n // 4
    for i in range(nblocks):
        k = (<uint32_t>data[4 * i] | <uint32_t>data[4 * i + 1] << 8
             | <uint32_t>data[4 * i + 2] << 16 | <uint32_t>data[4 * i + 3] << 24)
        k *= c1
        k = _rotl32(k, 15)
        k *= c2
        h ^= k
        h = _rotl32(h, 13)
        h = h * 5 + 0xe6546b64U
    cdef const uint8_t *tail = data + 4 * nblocks
    cdef int rest = n & 3
    k = 0
    if rest == 3:
        k ^= <uint32_t>tail[2] << 16
    if rest >= 2:
        k ^= <uint32_t>tail[1] << 8
    if rest >= 1:
        k ^= tail[0]
        k *= c1
        k = _rotl32(k, 15)
        k *= c2
        h ^= k
    h ^= <uint32_t>n
    h ^= h >> 16
    h *= 0x85ebca6bU
    h ^= h >> 13
    h *= 0xc2b2ae35U
    h ^= h >> 16
    return h


cdef uint32_t _key_hash(str table, str key) except? 0:
    """``mmh3.hash(f"{table}/{key}", SEED)`` without building the string."""
    cdef Py_ssize_t nt, nk
    cdef const char *t = PyUnicode_AsUTF8AndSize(table, &nt)
    cdef const char *k = PyUnicode_AsUTF8AndSize(key, &nk)
    return _name_hash(t, nt, k, nk)


cdef uint32_t _name_hash(const char *t, Py_ssize_t nt, const char *k, Py_ssize_t nk) except? 0:
    """The key hash of key ``k`` (UTF-8) of table ``t``."""
    cdef uint8_t stack[STACK]
    cdef Py_ssize_t n = nt + 1 + nk
    cdef uint8_t *buf = &stack[0] if n <= STACK else <uint8_t *>malloc(n)
    if buf == NULL:
        raise MemoryError()
    memcpy(buf, t, nt)
    buf[nt] = b'/'
    memcpy(buf + nt + 1, k, nk)
    cdef uint32_t h = _murmur3_32(buf, n, _SEED)
    if buf != &stack[0]:
        free(buf)
    return h


cdef inline Py_ssize_t _pack_str(uint8_t *out, const char *s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i = 0
    if n < 32:
        out[0] = 0xa0 | <uint8_t>n
        i = 1
    elif n < 256:
        out[0] = 0xd9
        out[1] = <uint8_t>n
        i = 2
    elif n < 65536:
        out[0] = 0xda
        out[1] = <uint8_t>(n >> 8)
        out[2] = <uint8_t>n
        i = 3
    else:
        out[0] = 0xdb
        out[1] = <uint8_t>(n >> 24)
        out[2] = <uint8_t>(n >> 16)
        out[3] = <uint8_t>(n >> 8)
        out[4] = <uint8_t>n
        i = 5
    memcpy(out + i, s, n)
    return i + n


cdef inline Py_ssize_t _pack_uint(uint8_t *out, uint64_t v) noexcept nogil:
    cdef int size, b
    if v < 128:
        out[0] = <uint8_t>v
        return 1
    if v < 256:
        out[0] = 0xcc
        size = 1
    elif v < 65536:
        out[0] = 0xcd
        size = 2
    elif v < 4294967296ULL:
        out[0] = 0xce
        size = 4
    else:
        out[0] = 0xcf
        size = 8
    for b in range(size):
        out[1 + b] = <uint8_t>(v >> (8 * (size - 1 - b)))
    return 1 + size


cdef uint64_t _pair_hash(const char *k, Py_ssize_t nk, const char *o, Py_ssize_t no,
                         uint64_t p, uint64_t n) except? 0:
    """``cluster.core.digests.pair_hash``: msgpack's bytes of ``(key, origin, p, n)``."""
    if p == 0 and n == 0:
        return 0
    cdef uint8_t stack[STACK]
    cdef Py_ssize_t size = 1 + 5 + nk + 5 + no + 9 + 9, at
    cdef uint8_t *buf = &stack[0] if size <= STACK else <uint8_t *>malloc(size)
    if buf == NULL:
        raise MemoryError()
    buf[0] = 0x94  # an array of 4
    at = 1
    at += _pack_str(buf + at, k, nk)
    at += _pack_str(buf + at, o, no)
    at += _pack_uint(buf + at, p)
    at += _pack_uint(buf + at, n)
    cdef uint64_t h1, h2
    idc_murmur3_x64_128(buf, at, _SEED, &h1, &h2)
    if buf != &stack[0]:
        free(buf)
    return h1


def key_hash(str table, str key) -> int:
    """``cluster.core.digests.key_hash`` (what ``shards`` checks this module against)."""
    return _key_hash(table, key)


def pair_hash(str key, str origin, uint64_t p, uint64_t n) -> int:
    """``cluster.core.digests.pair_hash``."""
    cdef Py_ssize_t nk, no
    cdef const char *k = PyUnicode_AsUTF8AndSize(key, &nk)
    cdef const char *o = PyUnicode_AsUTF8AndSize(origin, &no)
    return _pair_hash(k, nk, o, no, p, n)


# -- pages (``cluster.core.pages.Page.find`` and ``slot``) ------------------------------------

cdef inline uint32_t _kh(const uint64_t *rows, Py_ssize_t r) noexcept nogil:
    """Key ``r``'s 32-bit key hash (``Page.rows``)."""
    return <uint32_t>(rows[2 * r] >> 32)


cdef inline Py_ssize_t _name_at(const uint64_t *rows, Py_ssize_t r) noexcept nogil:
    """Where key ``r``'s name starts in the page's ``keys``."""
    return <Py_ssize_t>(rows[2 * r] & 0xFFFFFFFFU)


cdef inline Py_ssize_t _name_end(const uint64_t *rows, Py_ssize_t r, Py_ssize_t n,
                                 Py_ssize_t total) noexcept nogil:
    """Where key ``r``'s name ends (its separator) in ``keys``, of ``total`` bytes."""
    return (_name_at(rows, r + 1) if r + 1 < n else total) - 1


cdef Py_ssize_t _find(object page, uint32_t h, const char *name, Py_ssize_t n) except? -2:
    """The key number of ``name`` (key hash ``h``) in ``page``, -1 if absent
    (``Page.find``): a scan of the key hashes, the name compared where one matches."""
    cdef array.array rows = _field(page, _ROWS)
    cdef const uint64_t *a = <const uint64_t *>rows.data.as_ulonglongs
    cdef Py_ssize_t size = len(rows) >> 1, i, s, total
    cdef const char *base
    cdef uint64_t want = <uint64_t>h << 32
    for i in range(size):
        if (a[2 * i] & 0xFFFFFFFF00000000ULL) == want:
            keys = _field(page, _KEYS)
            base = PyBytes_AS_STRING(keys)
            total = len(<bytes>keys)
            s = _name_at(a, i)
            if s + n < total and base[s + n] == 0 and memcmp(base + s, name, n) == 0:
                return i
    return -1


def find(page, bytes name, uint32_t h):
    """``Page.find`` of ``name``, whose key hash is ``h``."""
    return _find(page, h, name, len(name))


def indexed(page, long leaf):
    """``Page.indexed``: ``(name, hash)`` of each key of digest ``leaf`` with a flushed hash."""
    cdef array.array rows = page.rows
    cdef bytes keys = page.keys
    cdef const uint64_t *a = <const uint64_t *>rows.data.as_ulonglongs
    cdef const char *base = keys
    cdef Py_ssize_t n = len(rows) >> 1, total = len(keys), r
    out = []
    for r in range(n):
        if a[2 * r + 1] and _kh(a, r) % _LEAVES == leaf:
            out.append((base[_name_at(a, r):_name_end(a, r, n, total)], a[2 * r + 1]))
    return out


def join(list parts, str table, number=None):
    """``Page.join`` of ``parts`` (``(keys, who, pn)`` a leaf, a snapshot's records) for a page of
    ``table`` (numbered ``number``, when given), whose keys' hashes it computes: no Python
    object a key."""
    cdef long want = -1 if number is None else number
    cdef uint32_t h
    cdef Py_ssize_t nt
    cdef const char *t = PyUnicode_AsUTF8AndSize(table, &nt)
    cdef Py_ssize_t nkeys = 0, nent = 0, nbytes = 1, i, j, r = 0, e = 0, at = 1, start, size, count
    cdef bytes keys, who, pn
    cdef const char *k
    cdef const uint64_t *w
    for keys, who, pn in parts:
        size = len(keys)
        k = keys
        if size < 1 or k[0] != 0 or k[size - 1] != 0 or len(who) % 8 or len(pn) != 2 * len(who):
            raise ValueError("a page's keys are NUL-separated and it has one P, N per entry")
        count = 0
        for i in range(1, size):
            count += k[i] == 0
        w = <const uint64_t *>PyBytes_AS_STRING(who)
        if len(who) and <Py_ssize_t>(w[len(who) // 8 - 1] >> 16) >= count:
            raise ValueError("a page's entry names a key it does not hold")
        nkeys += count
        nent += len(who) // 8
        nbytes += size - 1
    page = Page()
    out = PyBytes_FromStringAndSize(NULL, nbytes)
    cdef char *o = PyBytes_AS_STRING(out)
    o[0] = 0
    cdef array.array rows = array.clone(page.rows, 2 * nkeys, True)
    cdef array.array entries = array.clone(page.who, nent, False)
    cdef array.array counts = array.clone(page.pn, 2 * nent, False)
    cdef uint64_t *orow = <uint64_t *>rows.data.as_ulonglongs
    cdef uint64_t *ow = <uint64_t *>entries.data.as_ulonglongs
    cdef uint64_t base
    for keys, who, pn in parts:
        k = keys
        size = len(keys)
        memcpy(o + at, k + 1, size - 1)
        base = <uint64_t>r << 16
        start = 1
        for i in range(1, size):
            if k[i] == 0:
                h = _name_hash(t, nt, k + start, i - start)
                if want >= 0 and (h % _LEAVES) >> SPAN_BITS_C != want:
                    raise ValueError("a page's record holds a key of another page")
                orow[2 * r] = <uint64_t>h << 32 | <uint64_t>(at + start - 1)
                r += 1
                start = i + 1
        w = <const uint64_t *>PyBytes_AS_STRING(who)
        for j in range(len(who) // 8):
            ow[e + j] = w[j] + base
        memcpy(<char *>counts.data.as_ulonglongs + 16 * e, PyBytes_AS_STRING(pn), len(pn))
        e += len(who) // 8
        at += size - 1
    page.keys, page.rows, page.who, page.pn = out, rows, entries, counts
    page.dirty = (<object>1 << nkeys) - 1  # a Python int: one bit a key
    return page


def split(page):
    """``Page.split`` compiled: ``(leaf, keys, who, pn)`` of each digest leaf the page holds
    keys of, in leaf order, each as a page of one leaf has it (snapshots' layout)."""
    cdef array.array rows = page.rows, who = page.who, pn = page.pn
    cdef bytes keys = page.keys
    cdef const uint64_t *a = <const uint64_t *>rows.data.as_ulonglongs
    cdef const uint64_t *w = <const uint64_t *>who.data.as_ulonglongs
    cdef const uint64_t *c = <const uint64_t *>pn.data.as_ulonglongs
    cdef const char *base = keys
    cdef Py_ssize_t n = len(rows) >> 1, m = len(who), total = len(keys), r, j, b, size
    cdef Py_ssize_t nkeys[SPAN]
    cdef Py_ssize_t nent[SPAN]
    cdef Py_ssize_t nbytes[SPAN]
    cdef Py_ssize_t kat[SPAN]  # where the next name goes in each part's keys
    cdef Py_ssize_t eat[SPAN]  # the next entry of each part
    cdef char *kout[SPAN]
    cdef uint64_t *wout[SPAN]
    cdef uint64_t *pout[SPAN]
    cdef long leaf[SPAN]
    cdef uint32_t *number = <uint32_t *>malloc(max(n, 1) * sizeof(uint32_t))
    cdef uint8_t *bucket = <uint8_t *>malloc(max(n, 1))
    if number == NULL or bucket == NULL:
        free(number)
        free(bucket)
        raise MemoryError()
    parts = []
    try:
        for b in range(SPAN):
            nkeys[b] = nent[b] = 0
            nbytes[b] = 1
        for r in range(n):
            b = (_kh(a, r) % _LEAVES) & (SPAN - 1)
            leaf[b] = _kh(a, r) % _LEAVES
            bucket[r] = <uint8_t>b
            number[r] = <uint32_t>nkeys[b]
            nkeys[b] += 1
            nbytes[b] += _name_end(a, r, n, total) + 1 - _name_at(a, r)
        for j in range(m):
            nent[bucket[w[j] >> 16]] += 1
        for b in range(SPAN):
            if nkeys[b]:
                part = (leaf[b], PyBytes_FromStringAndSize(NULL, nbytes[b]),
                        PyBytes_FromStringAndSize(NULL, 8 * nent[b]),
                        PyBytes_FromStringAndSize(NULL, 16 * nent[b]))
                parts.append(part)
                kout[b] = PyBytes_AS_STRING(part[1])
                kout[b][0] = 0
                wout[b] = <uint64_t *>PyBytes_AS_STRING(part[2])
                pout[b] = <uint64_t *>PyBytes_AS_STRING(part[3])
                kat[b] = 1
                eat[b] = 0
        for r in range(n):  # each name with its separator after it
            b = bucket[r]
            size = _name_end(a, r, n, total) + 1 - _name_at(a, r)
            memcpy(kout[b] + kat[b], base + _name_at(a, r), size)
            kat[b] += size
        for j in range(m):
            r = <Py_ssize_t>(w[j] >> 16)
            b = bucket[r]
            wout[b][eat[b]] = (<uint64_t>number[r] << 16) | (w[j] & 0xFFFF)
            pout[b][2 * eat[b]] = c[2 * j]
            pout[b][2 * eat[b] + 1] = c[2 * j + 1]
            eat[b] += 1
    finally:
        free(number)
        free(bucket)
    return parts


cdef Py_ssize_t _slot(array.array who, uint64_t w) noexcept:
    """The index of ``w`` in ``who`` (sorted), ``~j`` when absent (``j``: where it goes)."""
    cdef const uint64_t *a = <const uint64_t *>who.data.as_ulonglongs
    cdef Py_ssize_t lo = 0, hi = len(who), mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < w:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(who) and a[lo] == w:
        return lo
    return ~lo


cdef struct Loc:
    # where one (key, origin) entry lives, valid until the page next changes shape
    PyObject *page  # borrowed: its table's dict of pages holds it
    uint64_t *pn
    Py_ssize_t j, r
    long leaf


@cython.final
cdef class _Store:
    """What one call reads of the store, looked up once (a batch's items share it)."""
    cdef object store, own_name, group_of
    cdef dict tables, index, hidden, dtables
    cdef bint tracking
    cdef Py_ssize_t own
    # the digest group of the last key moved, when every key is in one (no ``group_of``)
    cdef str last_table
    cdef object group
    cdef list sums
    cdef array.array below1

    def __cinit__(self, store):
        self.store = store
        self.tables, self.index, self.hidden = store._tables, store._index, store._hidden
        self.tracking = store._tracking
        self.own, self.own_name = store._own, store.own
        digests = store.digests
        self.dtables, self.group_of = digests._tables, digests.group_of

    cdef int locate(self, str table, str key, Py_ssize_t o, bint create, Loc *at) except -1:
        """``ShardStore._slot`` (``create``), or its lookup alone: 0 when the store holds no
        entry of origin number ``o`` for the key, else 1 and ``at`` filled."""
        cdef dict pages = self.tables.get(table)
        if pages is None:
            if not create:
                return 0
            pages = self.tables[table] = {}
        cdef uint32_t h = _key_hash(table, key)
        cdef long leaf = h % _LEAVES
        page = pages.get(leaf >> SPAN_BITS_C)
        if page is None:
            if not create:
                return 0
            page = pages[leaf >> SPAN_BITS_C] = Page()
        cdef Py_ssize_t nk
        cdef const char *k = PyUnicode_AsUTF8AndSize(key, &nk)
        cdef Py_ssize_t r = _find(page, h, k, nk)
        if r < 0:
            if not create:
                return 0
            r = page.add(key.encode(), h)
            self.store.keys += 1
        cdef Py_ssize_t j = _slot(_field(page, _WHO), (<uint64_t>r << 16) | <uint64_t>o)
        if j < 0:
            if not create:
                return 0
            j = ~j
            page.insert(j, r, o)
        cdef array.array pn = _field(page, _PN)
        at.page, at.pn, at.j, at.r, at.leaf = <PyObject *>page, <uint64_t *>pn.data.as_ulonglongs, j, r, leaf
        return 1

    # -- digest moves (``ShardStore._moved``, ``_move``; ``Digests.update``; ``_Group.add``) ---

    cdef int moved(self, str table, str key, Loc *at, str origin, uint64_t p0, uint64_t n0,
                   uint64_t p1, uint64_t n1) except -1:
        """``origin``'s pair as applied here moved: its visible part (hidden deltas out)
        moves."""
        if not self.tracking:
            return 0
        cdef uint64_t h0, h1
        cdef dict by_origin
        if self.hidden:
            by_origin = self.hidden.get((table, key))
            if by_origin is not None:
                hid = by_origin.get(origin)
                if hid is not None:
                    h0, h1 = hid[0], hid[1]
                    p0, n0 = _less(p0, h0), _less(n0, h1)
                    p1, n1 = _less(p1, h0), _less(n1, h1)
        return self.move(table, key, at, origin, p0, n0, p1, n1)

    cdef int move(self, str table, str key, Loc *at, str origin, uint64_t p0, uint64_t n0,
                  uint64_t p1, uint64_t n1) except -1:
        """``origin``'s visible pair of the key went from (p0, n0) to (p1, n1)."""
        if p0 == p1 and n0 == n1:
            return 0
        cdef Py_ssize_t nk, no
        cdef const char *k = PyUnicode_AsUTF8AndSize(key, &nk)
        cdef const char *o = PyUnicode_AsUTF8AndSize(origin, &no)
        cdef array.array rows = _field(<object>at.page, _ROWS)
        cdef uint64_t *h = <uint64_t *>rows.data.as_ulonglongs + 2 * at.r + 1  # its digest hash
        cdef uint64_t old = h[0]
        cdef uint64_t new = (old + _pair_hash(k, nk, o, no, p1, n1)
                             - _pair_hash(k, nk, o, no, p0, n0))
        h[0] = new
        if self.group_of is not None or self.group is None or table != self.last_table:
            self.find_group(table, key)
        if (new != 0) != (old != 0):
            self.group.size += (new != 0) - (old != 0)
        cdef uint64_t delta = new - old
        cdef long b = at.leaf % 64
        self.sums[b] = <uint64_t>(<uint64_t>self.sums[b] + delta)
        _level_add(self.below1, at.leaf % 4096, delta)
        return 0

    cdef int find_group(self, str table, str key) except -1:
        groups = self.dtables.get(table)
        if groups is None:
            groups = self.dtables[table] = {}
        gid = self.group_of(table, key) if self.group_of is not None else None
        g = groups.get(gid)
        if g is None:
            g = groups[gid] = _Group()
        self.last_table, self.group, self.sums = table, g, g.sums
        below = g.below
        self.below1 = below[0]  # the leaves' sums are read from their pages (digests)
        return 0


cdef inline uint64_t _magnitude(int64_t delta) noexcept nogil:
    return <uint64_t>delta if delta >= 0 else <uint64_t>(-(delta + 1)) + 1


cdef inline uint64_t _less(uint64_t a, uint64_t b) noexcept nogil:
    return a - b if a > b else 0


cdef inline void _level_add(array.array level, long node, uint64_t delta) noexcept:
    """``_Group.add`` at one level (an ``array('Q')`` of its sums by node id)."""
    (<uint64_t *>level.data.as_ulonglongs)[node] += delta


cdef int _counts(fp, fn, uint64_t *p, uint64_t *n) except -1:
    """An item's P and N, integers in [0, 2**64) (ValueError otherwise, as ``ShardStore``)."""
    if type(fp) is int and type(fn) is int and 0 <= fp <= MASK and 0 <= fn <= MASK:
        p[0], n[0] = fp, fn
        return 0
    raise ValueError(f"P and N are integers in [0, 2**64), got ({fp!r}, {fn!r})")


# -- the store's methods ------------------------------------------------------------------------

def merge_items(store, items) -> None:
    """``ShardStore.merge_items``: max-merge each item's pair (``cluster.core.ops.Item``'s
    fields: op id, table, key, origin, P, N, delta, ts)."""
    cdef _Store st = _Store(store)
    cdef dict index = st.index
    cdef Loc at
    cdef uint64_t p, n, p0, n0
    cdef Py_ssize_t j
    cdef str table, key, origin
    for item in items:
        if len(item) != 8:
            raise ValueError(f"an item has 8 fields, not {len(item)}")
        table, key, origin = item[1], item[2], item[3]
        _counts(item[4], item[5], &p, &n)
        o = index.get(origin)
        if o is None:
            o = store._origin(origin)
        st.locate(table, key, o, True, &at)
        j = 2 * at.j
        p0, n0 = at.pn[j], at.pn[j + 1]
        if p > p0 or n > n0:
            if p < p0:
                p = p0
            if n < n0:
                n = n0
            at.pn[j], at.pn[j + 1] = p, n
            st.moved(table, key, &at, origin, p0, n0, p, n)


cdef int _apply_hidden(_Store st, str table, str key, int64_t delta, Loc *at) except -1:
    """Raise the own pair of the key by ``delta`` and hide it; ``at`` holds the pair after."""
    st.locate(table, key, st.own, True, at)
    k = (table, key)
    cdef dict by_origin = st.hidden.get(k)
    if by_origin is None:
        by_origin = st.hidden[k] = {}
    hid = by_origin.get(st.own_name)
    if hid is None:
        hid = by_origin[st.own_name] = [0, 0]
    cdef uint64_t size = _magnitude(delta)
    cdef Py_ssize_t side = 2 * at.j + (0 if delta >= 0 else 1)
    if at.pn[side] + size < at.pn[side]:
        raise OverflowError("a count would pass 2**64 - 1")
    at.pn[side] += size
    hid[0 if delta >= 0 else 1] += size
    return 0


def apply_hidden(store, str table, str key, int64_t delta):
    """``ShardStore.apply_hidden``: raise the own pair by ``delta`` and hide it; the new pair."""
    cdef _Store st = _Store(store)
    cdef Loc at
    _apply_hidden(st, table, key, delta, &at)
    return at.pn[2 * at.j], at.pn[2 * at.j + 1]


def apply_hidden_items(store, list items) -> None:
    """``ShardStore.apply_hidden_items``: ``apply_hidden`` of each item's delta, in order; the
    item's P and N become the pair it raised."""
    cdef _Store st = _Store(store)
    cdef Loc at
    cdef list item
    for item in items:
        if len(item) != 8:
            raise ValueError(f"an item has 8 fields, not {len(item)}")
        _apply_hidden(st, item[1], item[2], item[6], &at)
        item[4], item[5] = at.pn[2 * at.j], at.pn[2 * at.j + 1]


cdef int _unhide(store, _Store st, dict hidden, str table, str key, str origin,
                 int64_t delta) except -1:
    """``delta`` of ``origin``'s pair is visible again; ``st`` None until one is needed."""
    k = (table, key)
    cdef dict by_origin = hidden.get(k)
    if by_origin is None:
        return 0
    pair = by_origin.get(origin)
    if pair is None:
        return 0
    cdef uint64_t b0 = pair[0], b1 = pair[1], a0, a1
    if delta >= 0:
        pair[0] = a0 = _less(b0, _magnitude(delta))
        a1 = b1
    else:
        pair[1] = a1 = _less(b1, _magnitude(delta))
        a0 = b0
    if a0 == 0 and a1 == 0:
        del by_origin[origin]
        if not by_origin:
            del hidden[k]
    if st is None:
        st = _Store(store)
    if not st.tracking:
        return 0
    o = st.index.get(origin)  # a typed dict's get: no method call an op
    if o is None:
        return 0
    cdef Loc at
    if not st.locate(table, key, o, False, &at):
        return 0  # nothing applied: (0, 0) visible either way
    cdef uint64_t p = at.pn[2 * at.j], n = at.pn[2 * at.j + 1]
    st.move(table, key, &at, origin, _less(p, b0), _less(n, b1), _less(p, a0), _less(n, a1))
    return 0


def unhide(store, str table, str key, str origin, int64_t delta) -> None:
    """``ShardStore.unhide``: ``delta`` is published (or compensated), visible again."""
    _unhide(store, None, store._hidden, table, key, origin, delta)


def unhide_items(store, items) -> None:
    """``ShardStore.unhide_items``: ``unhide`` of each item's delta for its origin, in order."""
    cdef _Store st = _Store(store)
    cdef dict hidden = store._hidden
    for item in items:
        if len(item) != 8:
            raise ValueError(f"an item has 8 fields, not {len(item)}")
        _unhide(store, st, hidden, item[1], item[2], item[3], item[6])


# -- staged copies (a write quorum above 2: ``ShardStore.stage``, ``_merge_staged``) -----------

def stage_items(store, items) -> None:
    """``ShardStore.stage_items``: max-merge each item's pair as a staged copy, its rise
    hidden (the visible pair, hence every hash, stays as it was)."""
    cdef _Store st = _Store(store)
    cdef dict index = st.index, hidden = st.hidden, staged = store._staged
    cdef Loc at
    cdef uint64_t p, n, p0, n0, vp, vn
    cdef Py_ssize_t j
    cdef str table, key, origin
    for item in items:
        if len(item) != 8:
            raise ValueError(f"an item has 8 fields, not {len(item)}")
        table, key, origin = item[1], item[2], item[3]
        _counts(item[4], item[5], &p, &n)
        o = index.get(origin)
        if o is None:
            o = store._origin(origin)
        st.locate(table, key, o, True, &at)
        j = 2 * at.j
        p0, n0 = at.pn[j], at.pn[j + 1]
        if p <= p0 and n <= n0:
            continue
        k = (table, key)
        by_origin = hidden.get(k)
        if by_origin is None:
            by_origin = hidden[k] = {}
        hid = by_origin.get(origin)
        if hid is None:
            hid = by_origin[origin] = [0, 0]
        marks = staged.get(k)
        if marks is None:
            marks = staged[k] = set()
        marks.add(origin)
        vp, vn = _less(p0, <uint64_t>hid[0]), _less(n0, <uint64_t>hid[1])
        if p < p0:
            p = p0
        if n < n0:
            n = n0
        at.pn[j], at.pn[j + 1] = p, n
        hid[0], hid[1] = p - vp, n - vn


def merge_visible_items(store, items) -> None:
    """``ShardStore.merge_visible_items``: ``merge_items``, except that the items of an origin
    with a staged copy of the key raise its visible pair to theirs (``_merge_staged``)."""
    cdef dict staged = store._staged
    if not staged:
        merge_items(store, items)
        return
    cdef _Store st = _Store(store)
    cdef dict index = st.index, hidden = st.hidden
    cdef Loc at
    cdef uint64_t p, n, p0, n0, p1, n1, vp0, vn0, vp1, vn1
    cdef Py_ssize_t j
    cdef str table, key, origin
    for item in items:
        if len(item) != 8:
            raise ValueError(f"an item has 8 fields, not {len(item)}")
        table, key, origin = item[1], item[2], item[3]
        _counts(item[4], item[5], &p, &n)
        o = index.get(origin)
        if o is None:
            o = store._origin(origin)
        k = (table, key)
        marks = staged.get(k)
        if marks is not None and origin in marks:
            by_origin = hidden.get(k)
            hid = by_origin.get(origin) if by_origin is not None else None
            if hid is None:  # its hidden part is gone (unhidden): staged no more
                marks.discard(origin)
                if not marks:
                    del staged[k]
            else:
                st.locate(table, key, o, True, &at)
                j = 2 * at.j
                p0, n0 = at.pn[j], at.pn[j + 1]
                vp0, vn0 = _less(p0, <uint64_t>hid[0]), _less(n0, <uint64_t>hid[1])
                vp1, vn1 = (vp0 if vp0 > p else p), (vn0 if vn0 > n else n)
                p1, n1 = (p0 if p0 > p else p), (n0 if n0 > n else n)
                if p1 == p0 and n1 == n0 and vp1 == vp0 and vn1 == vn0:
                    continue
                at.pn[j], at.pn[j + 1] = p1, n1
                hid[0], hid[1] = p1 - vp1, n1 - vn1
                if p1 == vp1 and n1 == vn1:
                    del by_origin[origin]
                    if not by_origin:
                        del hidden[k]
                    marks.discard(origin)
                    if not marks:
                        del staged[k]
                if st.tracking:
                    st.move(table, key, &at, origin, vp0, vn0, vp1, vn1)
                continue
        st.locate(table, key, o, True, &at)
        j = 2 * at.j
        p0, n0 = at.pn[j], at.pn[j + 1]
        if p > p0 or n > n0:
            if p < p0:
                p = p0
            if n < n0:
                n = n0
            at.pn[j], at.pn[j + 1] = p, n
            st.moved(table, key, &at, origin, p0, n0, p, n)
