"""The compiled FBF kernel and the numpy path agree: the same bits and the same answers for any
sequence of operations, so snapshots and the filters replicas exchange do not depend on which ran.

The agreement tests need the kernel and are skipped, saying so, where it is not built or is
switched off (``IDC_FBF_KERNEL=0``); the rest run either way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core.fbf import ForgetfulBloomFilter, hotpath
from cluster.core.hashing import hash_pair

ROOT = Path(__file__).resolve().parents[1]

needs_kernel = pytest.mark.skipif(
    not hotpath.available(),
    reason=f"the compiled FBF kernel is not in use: {hotpath.KERNEL_REASON}",
)


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def twins(m: int, k: int, n_past: int, clock: FakeClock) -> tuple[ForgetfulBloomFilter, ...]:
    """The same filter twice, the first on the kernel, the second on the numpy path."""
    c = ForgetfulBloomFilter(m, k, n_past, 1.0, clock)
    n = ForgetfulBloomFilter(m, k, n_past, 1.0, clock)
    n.use_kernel(False)
    assert (c.kernel, n.kernel) == ("c", "numpy")
    return c, n


def same_state(c: ForgetfulBloomFilter, n: ForgetfulBloomFilter) -> None:
    """The same words and bytes, and the same answers for every id of the pool, one at a time
    and in a batch (probing inserts nothing)."""
    assert c._words.dtype == n._words.dtype
    assert np.array_equal(c._words, n._words)
    assert c.to_bytes() == n.to_bytes()
    for simple in (False, True):
        assert c.contains_many(POOL, simple=simple).tolist() == n.contains_many(
            POOL, simple=simple).tolist()
    assert [(x in c, c._probe(x)) for x in POOL] == [(x in n, n._probe(x)) for x in POOL]


# a small pool of ids, so that batches repeat ids and small filters give false positives
POOL = [f"client-{i % 7}:{i}".encode() for i in range(60)] + [b"", b"x" * 17, bytes(range(40))]
item = st.sampled_from(POOL)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), item),
        st.tuples(st.just("add_many"), st.lists(item, max_size=70)),
        st.tuples(st.just("contains"), item),
        st.tuples(st.just("contains_simple"), item),
        st.tuples(st.just("contains_many"), st.lists(item, max_size=70), st.booleans()),
        st.tuples(st.just("tick"), st.floats(0.0, 1.5) | st.floats(0.0, 150.0)),
        st.tuples(st.just("refresh")),
        st.tuples(st.just("merge"), st.lists(item, max_size=40), st.floats(0.0, 2.0)),
        st.tuples(st.just("grow")),
        st.tuples(st.just("fold")),
        st.tuples(st.just("swap")),
    ),
    min_size=10,  # shorter programs rarely rotate between two adds
    max_size=40,
)


def _merge(f: ForgetfulBloomFilter, peer: ForgetfulBloomFilter) -> str:
    try:
        f.merge(peer.copy())
    except ValueError as exc:
        return str(exc)
    return "merged"


def _apply(f: ForgetfulBloomFilter, op: tuple, clock: FakeClock) -> object:  # type: ignore[type-arg]
    name = op[0]
    if name == "add":
        return f.add(op[1])
    if name == "add_many":
        return f.add_many(op[1]).tolist()
    if name == "contains":
        return op[1] in f
    if name == "contains_simple":
        return f.contains_simple(op[1])
    if name == "contains_many":
        return f.contains_many(op[1], simple=op[2]).tolist()
    if name == "refresh":
        return f.refresh()
    if name == "grow":
        return f.grow()
    if name == "fold":
        return f.fold() if f.m % 2 == 0 and f.m > 8 else None
    raise AssertionError(name)


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(
    m=st.one_of(st.integers(8, 40), st.integers(41, 600)),  # small: false positives, collisions
    k=st.integers(2, 6) | st.integers(1, 12) | st.integers(60, 70),  # past 64: another walk
    # few filters (whose masks the check reads bit by bit often), every word width and its edges
    n_past=st.sampled_from([1, 2]) | st.sampled_from([6, 7, 14, 15, 30, 31, 62]),
    program=ops,
)
def test_kernel_and_numpy_path_agree(m: int, k: int, n_past: int, program: list[tuple]) -> None:  # type: ignore[type-arg]
    clock = FakeClock()
    c, n = twins(m, k, n_past, clock)
    for op in program:
        if op[0] == "tick":
            clock.t += op[1]  # rotations, several at once, or a clear after a long idle spell
            continue
        if op[0] == "merge":  # a peer's filter, written by either path, OR-merged into both
            peer = ForgetfulBloomFilter(c.m, k, n_past, 1.0, FakeClock(clock.t - op[2]))
            peer.use_kernel(len(op[1]) % 2 == 0)
            peer.add_many(op[1])
            peer._clock = clock
            # an on-demand refresh moves a filter off the epochs, and merge refuses it: the same
            # refusal on both paths is agreement too
            assert _merge(c, peer) == _merge(n, peer)
        elif op[0] == "swap":  # each loads the other's snapshot and keeps its own path
            cb, nb = c.to_bytes(), n.to_bytes()
            c = ForgetfulBloomFilter.from_bytes(nb, clock=clock)
            n = ForgetfulBloomFilter.from_bytes(cb, clock=clock)
            n.use_kernel(False)
        else:
            assert _apply(c, op, clock) == _apply(n, op, clock), op
        same_state(c, n)
        assert (c.kernel, n.kernel) == ("c", "numpy")


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=100))
def test_kernel_hash_is_mmh3(data: bytes) -> None:
    k = ForgetfulBloomFilter(64, 3, 1, 1.0)._hot
    assert k.hash_pair(data) == hash_pair(data)  # type: ignore[attr-defined]


@needs_kernel
def test_kernel_takes_what_mmh3_takes() -> None:
    c, n = twins(1 << 12, 5, 2, FakeClock())
    for x in (bytearray(b"ba:1"), memoryview(b"mv:1"), b"b:1"):
        assert c.add(x) is n.add(x) is True
        assert c.add(bytes(x)) is n.add(bytes(x)) is False
    # distinct ids: the numpy path compares repeats as dict keys, which a bytearray cannot be
    batch = [t(f"{t.__name__}:{i}".encode()) for i in range(20) for t in (bytearray, memoryview)]
    assert c.add_many(batch).tolist() == n.add_many(batch).tolist()  # type: ignore[arg-type]
    assert c.add_many(batch).tolist() == n.add_many(batch).tolist() == [False] * 40  # type: ignore[arg-type]
    same_state(c, n)
    for f in (c, n):
        with pytest.raises(TypeError):
            f.add("a str")  # type: ignore[arg-type]


def test_own_hash_function_runs_the_numpy_path() -> None:
    f = ForgetfulBloomFilter(64, 3, 1, 1.0, hash_fn=lambda b: (len(b), 7))
    assert f.kernel == "numpy"
    f.use_kernel(True)
    assert f.kernel == "numpy"


def test_switch_off_by_environment() -> None:
    code = "from cluster.core.fbf import hotpath as h; print(h.KERNEL, h.KERNEL_REASON)"
    env = {**os.environ, "IDC_FBF_KERNEL": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["numpy", "switched", "off", "(IDC_FBF_KERNEL=0)"]
    f = ForgetfulBloomFilter(64, 3, 1, 1.0)
    assert f.kernel == hotpath.KERNEL
