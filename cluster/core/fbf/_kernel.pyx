# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""The FBF's hot operations compiled: check+insert and check, one id or a batch (optional).

The same bits as ``cluster.core.fbf.hotpath.NumpyPath``: MurmurHash3 x64 128 at the project's
seed (``_murmur3.h``), enhanced double hashing walked mod 2**64 before mod m
(``cluster.core.hashing``), the bit-sliced words of ``cluster.core.fbf.layout`` read and written
in place, Algorithm 2 (corrected: the oldest filter alone is checked) on the AND of an id's k
words. A batch is checked whole before any of it is inserted, and an id repeated in it is a
duplicate of its first occurrence, as the numpy path does. ``hotpath`` chooses between the two.
"""

from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp

import numpy as np


cdef extern from "_murmur3.h" nogil:
    void idc_murmur3_x64_128(const void *key, size_t len, uint32_t seed,
                             uint64_t *out1, uint64_t *out2)

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define IDC_PREFETCH(p) __builtin_prefetch((p), 1, 0)
    #else
    #define IDC_PREFETCH(p) ((void)(p))
    #endif
    """
    void IDC_PREFETCH(const void *p) nogil

cdef enum:
    AHEAD = 8  # ids looked ahead in a batch: their words are prefetched while earlier ids' are read
    MAX_STACK_K = 64  # a single add keeps up to this many positions on the stack


cdef inline uint64_t _load(const char *base, int width, uint64_t p) noexcept nogil:
    if width == 1:
        return (<const uint8_t *>base)[p]
    if width == 2:
        return (<const uint16_t *>base)[p]
    if width == 4:
        return (<const uint32_t *>base)[p]
    return (<const uint64_t *>base)[p]


cdef inline void _or3(char *base, int width, uint64_t p) noexcept nogil:
    # an insert sets bit 0 (the future filter) and bit 1 (the present one): Algorithm 1
    if width == 1:
        (<uint8_t *>base)[p] |= 3
    elif width == 2:
        (<uint16_t *>base)[p] |= 3
    elif width == 4:
        (<uint32_t *>base)[p] |= 3
    else:
        (<uint64_t *>base)[p] |= 3


cdef class Kernel:
    """One filter's words (a C-contiguous numpy array of unsigned words, kept referenced and
    pinned while this lives), its k and its filter count. ``hash_seed`` is
    ``cluster.core.hashing.SEED``."""

    cdef Py_buffer _view
    cdef bint _held
    cdef char *_base
    cdef int _width
    cdef readonly uint64_t m
    cdef readonly int k
    cdef uint64_t _live, _pairmask
    cdef int _oldest
    cdef uint32_t _seed

    def __cinit__(self, words, int k, int nfilters, uint64_t hash_seed):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not 3 <= nfilters <= 64:
            raise ValueError(f"nfilters must be in 3..64, got {nfilters}")
        PyObject_GetBuffer(words, &self._view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
        self._held = True
        if self._view.itemsize not in (1, 2, 4, 8) or self._view.itemsize * 8 < nfilters:
            raise ValueError(f"words of {self._view.itemsize} bytes cannot hold {nfilters} filters")
        self._base = <char *>self._view.buf
        self._width = <int>self._view.itemsize
        self.m = <uint64_t>(self._view.len // self._view.itemsize)
        if self.m < 1:
            raise ValueError("empty words")
        self.k = k
        self._live = (<uint64_t>-1) >> (64 - nfilters)
        self._pairmask = (((<uint64_t>1) << (nfilters - 1)) - 1) & ~(<uint64_t>1)
        self._oldest = nfilters - 1
        self._seed = <uint32_t>hash_seed

    def __dealloc__(self):
        if self._held:
            PyBuffer_Release(&self._view)

    cdef inline bint _member(self, uint64_t w) noexcept nogil:
        # Algorithm 2 on the AND mask: the future alone, an adjacent (present, past...) pair,
        # or the oldest past alone
        return (w & 1) != 0 or (w & (w >> 1) & self._pairmask) != 0 or (w >> self._oldest) != 0

    cdef inline uint64_t _mask(self, uint64_t x, uint64_t y) noexcept nogil:
        cdef uint64_t w = self._live, i
        for i in range(<uint64_t>self.k):
            w &= _load(self._base, self._width, x % self.m)
            x += y
            y += i
        return w

    cdef int _hash(self, item, uint64_t *h1, uint64_t *h2) except -1:
        cdef const unsigned char[::1] mv
        if PyBytes_CheckExact(item):
            idc_murmur3_x64_128(PyBytes_AS_STRING(item), <size_t>PyBytes_GET_SIZE(item),
                                self._seed, h1, h2)
        else:  # any other buffer, as mmh3 takes it (a str is refused, as mmh3 refuses it)
            mv = memoryview(item).cast("B")
            if mv.shape[0] == 0:
                idc_murmur3_x64_128(b"", 0, self._seed, h1, h2)
            else:
                idc_murmur3_x64_128(&mv[0], <size_t>mv.shape[0], self._seed, h1, h2)
        h2[0] |= 1
        return 0

    def hash_pair(self, item):
        """``cluster.core.hashing.hash_pair``, computed here (the import-time self-check)."""
        cdef uint64_t h1, h2
        self._hash(item, &h1, &h2)
        return h1, h2

    # -- one id ----------------------------------------------------------------------------

    def add(self, item):
        """Algorithm 1: insert into future and present unless a member; True when it was new."""
        cdef uint64_t h1, h2, x, y, i, w
        cdef uint64_t pos[MAX_STACK_K]
        self._hash(item, &h1, &h2)
        if self.k > MAX_STACK_K:
            if self._member(self._mask(h1, h2)):
                return False
            x, y = h1, h2
            for i in range(<uint64_t>self.k):
                _or3(self._base, self._width, x % self.m)
                x += y
                y += i
            return True
        x, y, w = h1, h2, self._live
        for i in range(<uint64_t>self.k):
            pos[i] = x % self.m
            w &= _load(self._base, self._width, pos[i])
            x += y
            y += i
        if self._member(w):
            return False
        for i in range(<uint64_t>self.k):
            _or3(self._base, self._width, pos[i])
        return True

    def shift(self):
        """A refresh in place, one pass over the words: every filter ages by one, the oldest
        drops, an empty future begins (``layout.shift``, which numpy does in two)."""
        cdef uint64_t i, n = self.m, live = self._live
        cdef char *base = self._base
        with nogil:
            if self._width == 1:
                for i in range(n):
                    (<uint8_t *>base)[i] = <uint8_t>(((<uint8_t *>base)[i] << 1) & live)
            elif self._width == 2:
                for i in range(n):
                    (<uint16_t *>base)[i] = <uint16_t>(((<uint16_t *>base)[i] << 1) & live)
            elif self._width == 4:
                for i in range(n):
                    (<uint32_t *>base)[i] = <uint32_t>(((<uint32_t *>base)[i] << 1) & live)
            else:
                for i in range(n):
                    (<uint64_t *>base)[i] = ((<uint64_t *>base)[i] << 1) & live

    def probe(self, item):
        """The AND of the item's k words: bit j set when the item is in filter j."""
        cdef uint64_t h1, h2
        self._hash(item, &h1, &h2)
        return self._mask(h1, h2)

    def contains(self, item):
        """Algorithm 2 (the oldest filter alone always checked)."""
        cdef uint64_t h1, h2
        self._hash(item, &h1, &h2)
        return self._member(self._mask(h1, h2))

    # -- batches ---------------------------------------------------------------------------

    cdef list _hash_all(self, items, uint64_t *hs):
        """Hash every item into hs (h1, h2 interleaved); the items as bytes, in order."""
        cdef list seq = list(items)
        cdef Py_ssize_t i, n = len(seq)
        for i in range(n):
            it = seq[i]
            self._hash(it, &hs[2 * i], &hs[2 * i + 1])
            if not PyBytes_CheckExact(it):
                seq[i] = memoryview(it).tobytes()  # bytes, for the comparison of repeats
        return seq

    cdef void _positions(self, const uint64_t *hs, Py_ssize_t i, uint64_t *pos) noexcept nogil:
        cdef uint64_t x = hs[2 * i], y = hs[2 * i + 1], t
        for t in range(<uint64_t>self.k):
            pos[t] = x % self.m
            IDC_PREFETCH(self._base + pos[t] * <uint64_t>self._width)
            x += y
            y += t

    cdef void _masks(self, const uint64_t *hs, Py_ssize_t n, uint64_t *pos,
                     uint64_t *masks) noexcept nogil:
        """Every item's AND mask, its positions (n*k) kept; positions are computed (and their
        words prefetched) AHEAD ids before they are read."""
        cdef Py_ssize_t i, j, k = self.k
        cdef uint64_t w
        cdef Py_ssize_t t
        for i in range(n + AHEAD):
            if i < n:
                self._positions(hs, i, &pos[i * k])
            j = i - AHEAD
            if j >= 0:
                w = self._live
                for t in range(k):
                    w &= _load(self._base, self._width, pos[j * k + t])
                masks[j] = w

    def add_many(self, items):
        """Algorithm 1 for a batch, checked whole before any insert; a bool array, True where new.

        An id repeated in the batch is a duplicate of its first occurrence."""
        cdef Py_ssize_t n = len(items), i, k = self.k
        out = np.zeros(n, dtype=np.bool_)
        if n == 0:
            return out
        cdef unsigned char[::1] new = out.view(np.uint8)
        cdef uint64_t *hs = <uint64_t *>malloc(n * 2 * sizeof(uint64_t))
        cdef uint64_t *masks = <uint64_t *>malloc(n * sizeof(uint64_t))
        cdef uint64_t *pos = <uint64_t *>malloc(n * k * sizeof(uint64_t))
        cdef Py_ssize_t t, j
        try:
            if hs == NULL or masks == NULL or pos == NULL:
                raise MemoryError()
            seq = self._hash_all(items, hs)
            self._masks(hs, n, pos, masks)
            for i in range(n):
                new[i] = not self._member(masks[i])
            _drop_repeats(seq, hs, n, new)
            for i in range(n + AHEAD):
                if i < n and new[i]:
                    for t in range(k):
                        IDC_PREFETCH(self._base + pos[i * k + t] * <uint64_t>self._width)
                j = i - AHEAD
                if j >= 0 and new[j]:
                    for t in range(k):
                        _or3(self._base, self._width, pos[j * k + t])
        finally:
            free(hs)
            free(masks)
            free(pos)
        return out

    def contains_many(self, items, bint simple=False):
        """Algorithm 2 (or, ``simple``, "in any filter") for a batch; a bool array."""
        cdef Py_ssize_t n = len(items), i
        out = np.zeros(n, dtype=np.bool_)
        if n == 0:
            return out
        cdef unsigned char[::1] got = out.view(np.uint8)
        cdef uint64_t *hs = <uint64_t *>malloc(n * 2 * sizeof(uint64_t))
        cdef uint64_t *masks = <uint64_t *>malloc(n * sizeof(uint64_t))
        cdef uint64_t *pos = <uint64_t *>malloc(n * self.k * sizeof(uint64_t))
        try:
            if hs == NULL or masks == NULL or pos == NULL:
                raise MemoryError()
            self._hash_all(items, hs)
            self._masks(hs, n, pos, masks)
            for i in range(n):
                got[i] = masks[i] != 0 if simple else self._member(masks[i])
        finally:
            free(hs)
            free(masks)
            free(pos)
        return out


cdef int _drop_repeats(list seq, const uint64_t *hs, Py_ssize_t n,
                       unsigned char[::1] new) except -1:
    """Mark every repeat of an earlier id of the batch not new: an open-addressed table of first
    occurrences keyed by h1, the bytes compared only when h1 matches."""
    cdef Py_ssize_t size = 1, i, j
    cdef uint64_t mask, slot
    while size < 2 * n:
        size <<= 1
    mask = <uint64_t>(size - 1)
    cdef Py_ssize_t *table = <Py_ssize_t *>calloc(size, sizeof(Py_ssize_t))  # index + 1; 0: empty
    if table == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            slot = hs[2 * i] & mask
            while table[slot]:
                j = table[slot] - 1
                if hs[2 * j] == hs[2 * i] and _same(seq[j], seq[i]):
                    new[i] = 0
                    break
                slot = (slot + 1) & mask
            else:
                table[slot] = i + 1
    finally:
        free(table)
    return 0


cdef inline bint _same(bytes a, bytes b):
    cdef Py_ssize_t n = PyBytes_GET_SIZE(a)
    return n == PyBytes_GET_SIZE(b) and memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), n) == 0
