# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The log writer thread's loop in C, run without the GIL (``cluster.wal.committer``).

The Python writer thread took the GIL back three times a commit: when ``SimpleQueue.get``
returned, after ``os.write`` and after ``fdatasync``. Under load the event loop holds the GIL
nearly all the time, so each of those was a GIL handover (futex calls and context switches on
both threads): ~9.5 futex calls a commit, and the writer threads used ~12% of a core per node
in ``bench.bench_cluster --phases routed``, for commits that cost ~2% in syscalls. Here the
queue is a C array under a pthread mutex, and ``GroupCommit.run`` waits, writes (``pwritev``),
fdatasyncs and tells the loop (an eventfd the loop reads) with the GIL released; it returns to
Python only for what Python does: a marker (a snapshot's rotation, the stop), a full segment,
an error or an abort.

Threads: the loop thread calls ``push``, ``push_marker``, ``take`` and ``abort``; the writer
thread calls ``run`` and ``pop_marker``. ``push`` keeps a reference to each bytes object (in
``_hold``) until ``take`` hands back the commit that wrote it, so a queued pointer is never
freed. ``abort`` waits for a write or fdatasync in flight, and no I/O starts after it, so the
log may then close the segment's fd.
"""

from libc.errno cimport EINTR, errno
from posix.types cimport off_t
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, realloc
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *m, const void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *m)
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)
    int pthread_cond_init(pthread_cond_t *c, const void *attr)
    int pthread_cond_destroy(pthread_cond_t *c)
    int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
    int pthread_cond_signal(pthread_cond_t *c)

cdef extern from "<unistd.h>" nogil:
    ssize_t write(int fd, const void *buf, size_t n)
    int fdatasync(int fd)

cdef extern from "<sys/uio.h>" nogil:
    cdef struct iovec:
        void *iov_base
        size_t iov_len
    ssize_t pwritev(int fd, const iovec *iov, int iovcnt, off_t offset)

cdef extern from "<time.h>" nogil:
    cdef struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *ts)
    int CLOCK_MONOTONIC

cdef enum:
    # what ``run`` returned for
    S_FULL = 1  # the segment reached its size: rotate, then run again
    S_MARKER = 2  # the next item is a marker: pop it and do what it says
    S_ERROR = 3  # a write or fdatasync failed (the errno is returned with it)
    S_ABORTED = 4  # ``abort`` was called
    MAX_IOV = 1024  # entries a commit writes at most (Linux's IOV_MAX)

FULL, MARKER, ERROR, ABORTED = S_FULL, S_MARKER, S_ERROR, S_ABORTED


cdef struct Item:
    const char *data  # NULL for a marker
    Py_ssize_t size
    Py_ssize_t records


cdef struct Commit:  # what the loop hears, in order: a commit, or a rotation's marker done
    Py_ssize_t entries
    Py_ssize_t records
    Py_ssize_t nbytes
    double seconds
    long long seq  # -1: a commit; else the marker at the head is done, the new segment's seq


cdef double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef int _write_all(int fd, iovec *iov, int n, off_t offset) noexcept nogil:
    """Write every byte of ``iov`` at ``offset`` (a file may take a large write in pieces);
    0 or an errno."""
    cdef ssize_t r
    while n > 0:
        r = pwritev(fd, iov, n, offset)
        if r < 0:
            if errno == EINTR:
                continue
            return errno
        offset += r
        while n > 0 and <size_t>r >= iov[0].iov_len:
            r -= iov[0].iov_len
            iov += 1
            n -= 1
        if n > 0:
            iov[0].iov_base = <char *>iov[0].iov_base + r
            iov[0].iov_len -= r
    return 0


cdef class GroupCommit:
    """The queue between the loop and its writer thread, and the writer's loop (``run``)."""

    cdef pthread_mutex_t mu  # the queue, the commits not yet taken, the flags
    cdef pthread_cond_t cv  # signalled by push, push_marker and abort
    cdef pthread_mutex_t io  # held by the writer for each write + fdatasync
    cdef Item *items
    cdef Py_ssize_t head, tail, cap
    cdef Commit *done
    cdef Py_ssize_t ndone, done_cap
    cdef Py_ssize_t consumed  # items (entries and markers) finished since the last take
    cdef bint waiting, aborted
    cdef int efd
    cdef list _hold  # one object per pushed item not yet released by take, in push order
    cdef iovec iov[MAX_IOV]

    def __cinit__(self, int efd):
        pthread_mutex_init(&self.mu, NULL)
        pthread_mutex_init(&self.io, NULL)
        pthread_cond_init(&self.cv, NULL)
        self.efd = efd
        self._hold = []

    def __dealloc__(self):
        free(self.items)
        free(self.done)
        pthread_cond_destroy(&self.cv)
        pthread_mutex_destroy(&self.io)
        pthread_mutex_destroy(&self.mu)

    cdef int _append(self, const char *data, Py_ssize_t size, Py_ssize_t records) except -1:
        cdef Item *grown
        cdef Py_ssize_t cap, i
        if self.tail == self.cap:
            if self.head > 0:  # slide the unwritten items to the front
                for i in range(self.tail - self.head):
                    self.items[i] = self.items[self.head + i]
                self.tail -= self.head
                self.head = 0
            else:
                cap = self.cap * 2 if self.cap else 64
                grown = <Item *>realloc(self.items, cap * sizeof(Item))
                if grown == NULL:
                    raise MemoryError()
                self.items, self.cap = grown, cap
        self.items[self.tail].data = data
        self.items[self.tail].size = size
        self.items[self.tail].records = records
        self.tail += 1
        return 0

    def push(self, bytes data not None, Py_ssize_t records):
        """Queue one entry (its encoded frames and how many records they hold)."""
        self._queue(data, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), records)

    def push_marker(self):
        """Queue a marker: ``run`` returns MARKER once everything before it is committed."""
        self._queue(None, NULL, 0, 0)

    cdef int _queue(self, object held, const char *data, Py_ssize_t size,
                    Py_ssize_t records) except -1:
        self._hold.append(held)  # first: the writer may take the pointer as soon as it is queued
        pthread_mutex_lock(&self.mu)
        try:
            self._append(data, size, records)
        except MemoryError:
            self._hold.pop()
            raise
        finally:
            pthread_mutex_unlock(&self.mu)
        return 0

    def wake(self):
        """Let the writer take what was pushed (``push`` alone does not wake it)."""
        cdef bint idle
        pthread_mutex_lock(&self.mu)
        idle = self.waiting and self.head < self.tail
        pthread_mutex_unlock(&self.mu)
        if idle:  # after the unlock: a writer woken under the lock would block on it at once
            pthread_cond_signal(&self.cv)

    cdef int _done(self, Py_ssize_t entries, Py_ssize_t records, Py_ssize_t nbytes,
                   double seconds, long long seq) noexcept nogil:
        """Under ``mu``: one more thing for ``take`` to hand over; ENOMEM or 0."""
        cdef Commit *grown
        if self.ndone == self.done_cap:
            grown = <Commit *>realloc(self.done, (self.done_cap * 2 + 16) * sizeof(Commit))
            if grown == NULL:
                return 12  # ENOMEM
            self.done, self.done_cap = grown, self.done_cap * 2 + 16
        self.done[self.ndone].entries = entries
        self.done[self.ndone].records = records
        self.done[self.ndone].nbytes = nbytes
        self.done[self.ndone].seconds = seconds
        self.done[self.ndone].seq = seq
        self.ndone += 1
        return 0

    def pop_marker(self, long long seq):
        """The writer thread has done what the marker at the head said: a rotation to segment
        ``seq`` (``take`` hands it over after the commits before it, before those after it),
        or the stop (``seq`` < 0: nothing to hand over)."""
        cdef uint64_t one = 1
        cdef int err = 0
        pthread_mutex_lock(&self.mu)
        if self.head < self.tail and self.items[self.head].data == NULL:
            self.head += 1
            self.consumed += 1
            if seq >= 0:
                err = self._done(0, 0, 0, 0.0, seq)
        pthread_mutex_unlock(&self.mu)
        if err:
            raise MemoryError()
        if seq >= 0:
            write(self.efd, &one, sizeof(one))

    def take(self):
        """What finished since the last call, in queue order: (entries, records, bytes,
        fdatasync seconds, -1) for a commit, (0, 0, 0, 0.0, seq) for a rotation's marker;
        releases the entries written."""
        cdef Py_ssize_t i, consumed
        out = []
        pthread_mutex_lock(&self.mu)
        for i in range(self.ndone):
            out.append((self.done[i].entries, self.done[i].records, self.done[i].nbytes,
                        self.done[i].seconds, self.done[i].seq))
        self.ndone = 0
        consumed, self.consumed = self.consumed, 0
        pthread_mutex_unlock(&self.mu)
        if consumed:
            del self._hold[:consumed]
        return out

    def abort(self):
        """Stop the writer: no write or fdatasync starts after this returns, and one in flight
        has finished. ``run`` returns ABORTED."""
        with nogil:
            pthread_mutex_lock(&self.io)
            pthread_mutex_lock(&self.mu)
            self.aborted = True
            pthread_cond_signal(&self.cv)
            pthread_mutex_unlock(&self.mu)
            pthread_mutex_unlock(&self.io)

    def run(self, int fd, off_t offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
            Py_ssize_t room, bint sync):
        """The writer thread: commit what is queued, in order, until something needs Python.
        Each commit is one pwritev (the first at ``offset``, each next one after it) of up to
        ``max_records`` records and ``max_bytes`` bytes (an entry is never split, so one larger
        than that is a commit of its own) and one fdatasync (when ``sync``); the loop hears of
        it through the eventfd. Returns (status, bytes written by this call, errno): FULL once
        ``room`` bytes or more are written.
        """
        cdef Py_ssize_t written = 0, n, records, nbytes, i
        cdef int err = 0, status
        cdef double t0, seconds
        cdef uint64_t one = 1
        with nogil:
            while True:
                pthread_mutex_lock(&self.mu)
                while self.head == self.tail and not self.aborted:
                    self.waiting = True
                    pthread_cond_wait(&self.cv, &self.mu)
                    self.waiting = False
                if self.aborted:
                    pthread_mutex_unlock(&self.mu)
                    status = S_ABORTED
                    break
                if self.items[self.head].data == NULL:
                    pthread_mutex_unlock(&self.mu)
                    status = S_MARKER
                    break
                n = records = nbytes = 0
                i = self.head
                while i < self.tail and n < MAX_IOV and self.items[i].data != NULL:
                    if n and (records + self.items[i].records > max_records
                              or nbytes + self.items[i].size > max_bytes):
                        break
                    self.iov[n].iov_base = <void *>self.items[i].data
                    self.iov[n].iov_len = self.items[i].size
                    records += self.items[i].records
                    nbytes += self.items[i].size
                    n += 1
                    i += 1
                pthread_mutex_unlock(&self.mu)

                pthread_mutex_lock(&self.io)
                if self.aborted:  # set under io: the fd may be closed now
                    pthread_mutex_unlock(&self.io)
                    status = S_ABORTED
                    break
                err = _write_all(fd, self.iov, <int>n, offset + written)
                seconds = 0.0
                if err == 0 and sync:
                    t0 = _now()
                    while fdatasync(fd) != 0:
                        if errno != EINTR:
                            err = errno
                            break
                    seconds = _now() - t0
                pthread_mutex_unlock(&self.io)
                if err:
                    status = S_ERROR
                    break
                written += nbytes

                pthread_mutex_lock(&self.mu)
                err = self._done(n, records, nbytes, seconds, -1)
                if err:  # cannot happen in practice; the loop would never hear of the commit
                    pthread_mutex_unlock(&self.mu)
                    status = S_ERROR
                    break
                self.head += n
                self.consumed += n
                if self.head == self.tail:
                    self.head = self.tail = 0
                pthread_mutex_unlock(&self.mu)
                write(self.efd, &one, sizeof(one))  # wakes the loop's reader
                if written >= room:
                    status = S_FULL
                    break
        return status, written, err
