# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twins of ``cluster.core.batch_kernel``'s functions: the same answers, with no
bytecode between the dict and list operations of each op. The reference's docstrings say what
each computes; ``tests/test_batch_kernel.py`` holds the two to the same results."""

from cpython.unicode cimport PyUnicode_GET_LENGTH, PyUnicode_1BYTE_DATA

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem, PyDict_DelItem
from cpython.ref cimport PyObject
from libc.stdint cimport uint8_t

cdef object _INT64_MIN = -(2**63)
cdef object _INT64_MAX = 2**63 - 1


cdef inline bint _printable_ascii(str s, Py_ssize_t most):
    """``s.isascii() and s.isprintable() and 0 < len(s) <= most``."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(s), i
    if n == 0 or n > most or not PyUnicode_IS_ASCII(s):
        return False
    cdef const uint8_t *b = <const uint8_t *>PyUnicode_1BYTE_DATA(s)
    for i in range(n):
        if b[i] < 0x20 or b[i] > 0x7e:
            return False
    return True


cdef inline bint _int_at_least(object value, object lo):
    return type(value) is int and lo <= value <= _INT64_MAX


def fast_checked(list ops, set known, Py_ssize_t max_op_id_bytes, now_ms=0, skew_ms=0,
                 stale_after_ms=None):
    cdef list out = []
    cdef object op, table, key, op_id, delta, attempt, age_ms, ts_ms, stale_ms, elapsed
    cdef dict d
    cdef Py_ssize_t n, fields
    for op in ops:
        if type(op) is dict:
            d = <dict>op
            n = len(d)
            if 4 <= n <= 7:
                table, key, op_id, delta = d.get("table"), d.get("key"), d.get("op_id"), \
                    d.get("delta")
                if (type(table) is str and table in known and type(key) is str
                        and key in known and type(op_id) is str
                        and _printable_ascii(<str>op_id, max_op_id_bytes)
                        and type(delta) is int and _INT64_MIN <= delta <= _INT64_MAX):
                    if n == 4:
                        out.append((table, key, op_id, delta, 1, 0))
                        continue
                    attempt, age_ms, ts_ms = d.get("attempt"), d.get("age_ms"), d.get("ts_ms")
                    fields = 4 + (attempt is not None) + (age_ms is not None) + \
                        (ts_ms is not None)
                    if (fields == n and (attempt is None or _int_at_least(attempt, 1))
                            and (age_ms is None or _int_at_least(age_ms, 0))
                            and (ts_ms is None or _int_at_least(ts_ms, 0))):
                        if attempt is None:
                            attempt = 1
                        if age_ms is None:
                            age_ms = 0
                        stale_ms = age_ms
                        if ts_ms is not None:
                            elapsed = now_ms - ts_ms
                            if elapsed - skew_ms > age_ms:
                                age_ms = elapsed - skew_ms
                            if elapsed > stale_ms:
                                stale_ms = elapsed
                        if stale_after_ms is not None and stale_ms > stale_after_ms \
                                and attempt < 2:
                            attempt = 2
                        out.append((table, key, op_id, delta, attempt, age_ms))
                        continue
        out.append(None)
    return out


cdef inline int _push(dict groups, object key, object value) except -1:
    """``groups.setdefault(key, []).append(value)``, without a list made for a key it has."""
    cdef PyObject *got = PyDict_GetItem(groups, key)
    if got is NULL:
        groups[key] = [value]
    else:
        (<list>got).append(value)
    return 0


def new_items(ops, dups, str me, now, targets_of):
    cdef list applied = [], dup_at = [], item
    cdef dict groups = {}
    cdef Py_ssize_t i = 0
    for op in ops:
        if dups[i]:
            dup_at.append(i)
            i += 1
            continue
        table, key, op_id, delta, _attempt = op
        item = [op_id, table, key, me, 0, 0, delta, now]
        applied.append(item)
        _push(groups, targets_of(table, key), item)
        i += 1
    return applied, groups, dup_at


def by_leader(ops, dict cached, prefs_of, leader_of, is_live):
    cdef dict groups = {}, leaders = {}
    cdef Py_ssize_t i = 0
    cdef PyObject *got
    for op in ops:
        table, key = op[0], op[1]
        got = PyDict_GetItem(cached, (table, key))
        prefs = <object>got if got is not NULL and <object>got else prefs_of(table, key)
        got = PyDict_GetItem(leaders, prefs)
        if got is NULL:
            leader = leader_of(table, key, is_live)
            leaders[prefs] = leader
        else:
            leader = <object>got
        _push(groups, leader, i)
        i += 1
    return groups


def hold_items(dict pending, dict by_key, items):
    cdef PyObject *got
    for item in items:
        op_id = item[0]
        pending[op_id] = item
        k = (item[1], item[2], item[3])
        got = PyDict_GetItem(by_key, k)
        if got is NULL:
            by_key[k] = {op_id: None}
        else:
            PyDict_SetItem(<dict>got, op_id, None)


def release_ids(dict pending, dict by_key, op_ids):
    cdef list out = []
    cdef PyObject *got
    cdef dict ids
    for op_id in op_ids:
        got = PyDict_GetItem(pending, op_id)
        if got is NULL:
            continue
        item = <object>got
        PyDict_DelItem(pending, op_id)
        k = (item[1], item[2], item[3])
        got = PyDict_GetItem(by_key, k)
        if got is not NULL:
            ids = <dict>got
            if PyDict_GetItem(ids, op_id) is not NULL:
                PyDict_DelItem(ids, op_id)
            if not ids:
                PyDict_DelItem(by_key, k)
        out.append(item)
    return out


def encoded_ids(items, Py_ssize_t table_at, Py_ssize_t id_at):
    cdef list ids = []
    cdef object table = None
    cdef bint several = False
    for item in items:
        ids.append(item[id_at].encode())
        t = item[table_at]
        if table is None:
            table = t
        elif not several and t != table:
            several = True
    return ids, (None if several else table)


def needs_touch(items, frozenset ttl, str last):
    for item in items:
        if item[3] == last or item[1] in ttl:
            return True
    return False


def oldest_ts(items):
    it = iter(items)
    oldest = next(it)[7]
    for item in it:
        ts = item[7]
        if ts < oldest:
            oldest = ts
    return float(oldest)
