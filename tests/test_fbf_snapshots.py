"""FBF snapshots are a stored format: ``to_bytes()`` must not change between versions.

``tests/data/fbf_v1/`` was written by the code before the filter and its Algorithm 3 policy were
split (``python tests/test_fbf_snapshots.py`` rewrites it; do that only on a deliberate format
change): the SHA-256 of every snapshot each scenario takes, and a few small snapshots in full.
Each scenario is rebuilt here on a fake clock and must give the same bytes, and each stored
snapshot must load and write itself back unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.core.dedup import load_dedup, make_dedup
from cluster.core.fbf import ForgetfulBloomFilter

DATA = Path(__file__).parent / "data" / "fbf_v1"


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _ids(prefix: str, start: int, n: int) -> list[bytes]:
    return [f"{prefix}:{i}".encode() for i in range(start, start + n)]


def fixed() -> list[bytes]:
    """The paper's fixed N-FBF: single adds, a batch, refreshes, an idle gap, a merge."""
    clock = FakeClock(1000.3)
    f = ForgetfulBloomFilter(m=600, k=4, n_past=2, period=1.0, clock=clock)
    out = []
    for x in _ids("a", 0, 150):
        f.add(x)
    clock.t += 0.9
    f.add_many(_ids("b", 0, 300))
    out.append(f.to_bytes())
    clock.t += 1.4
    f.add_many(_ids("a", 100, 60))
    out.append(f.to_bytes())
    g = ForgetfulBloomFilter(m=600, k=4, n_past=2, period=1.0, clock=clock)
    g.add_many(_ids("g", 0, 120))
    f.merge(g)
    out.append(f.to_bytes())
    clock.t += 30.0  # idle past every generation
    f.add(b"late")
    out.append(f.to_bytes())
    return out


def for_window() -> list[bytes]:
    """``for_window`` on a wall-clock-sized time, fed for a few periods."""
    clock = FakeClock(1_700_000_000.37)
    f = ForgetfulBloomFilter.for_window(window=7.0, rate=300.0, fpp=1e-3, clock=clock)
    out = []
    for step in range(12):
        f.add_many(_ids("w", step * 200, 200))
        clock.t += f.period * 0.7
        out.append(f.to_bytes())
    return out


def _load(f: ForgetfulBloomFilter, clock: FakeClock, rates: list[float], out: list[bytes]) -> None:
    seq = len(out) * 100_000
    for rate in rates:
        n = max(1, int(rate / 10))
        for _ in range(10):
            f.add_many(_ids("r", seq, n))
            seq += n
            clock.t += 0.1
        f.adapt()
        out.append(f.to_bytes())


def adaptive() -> list[bytes]:
    """Algorithm 3: the rate rises 30x (shorter period, more filters, doubled m), then falls
    (folded m, longer period)."""
    clock = FakeClock(10_000.0)
    f = ForgetfulBloomFilter(m=512, k=4, n_past=1, period=5.0, clock=clock, target_fpp=1e-3)
    out: list[bytes] = []
    _load(f, clock, [20.0 * 1.15**i for i in range(25)], out)
    _load(f, clock, [5.0] * 40, out)
    return out


def adaptive_capped() -> list[bytes]:
    """A memory cap the target cannot be met under: the filter says so (over_target)."""
    clock = FakeClock(1_700_000_123.5)
    f = ForgetfulBloomFilter(
        m=256, k=5, n_past=1, period=3.0, clock=clock, target_fpp=1e-5, max_bytes=4096,
        min_period=0.05,
    )
    out: list[bytes] = []
    _load(f, clock, [800.0] * 10, out)
    return out


def dedup() -> list[bytes]:
    """The dedup strategies' framed snapshots, adapting once a second from the hot path."""
    out = []
    for name in ("fbf", "adaptive-fbf"):
        clock = FakeClock(5_000.0)
        d = make_dedup(name, window=2.0, rate=500.0, target_fpp=1e-3, clock=clock)
        for i in range(3000):
            clock.t += 1 / 800
            d.seen_or_add(f"d:{i}".encode())
            if i % 500 == 499:
                d.seen_or_add_many(_ids("batch", i, 120))
                out.append(d.to_bytes())
    return out


SCENARIOS: dict[str, Callable[[], list[bytes]]] = {
    "fixed": fixed,
    "for_window": for_window,
    "adaptive": adaptive,
    "adaptive_capped": adaptive_capped,
    "dedup": dedup,
}


def _digests() -> dict[str, list[str]]:
    return json.loads((DATA / "digests.json").read_text())  # type: ignore[no-any-return]


def _stored(name: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted(DATA.glob(f"{name}-*.bin"))]


@pytest.mark.parametrize("name", SCENARIOS)
def test_snapshots_are_byte_identical_to_the_stored_format(name: str) -> None:
    want = _digests()[name]
    got = [hashlib.sha256(b).hexdigest() for b in SCENARIOS[name]()]
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a == b, f"{name} snapshot {i} differs from the stored bytes"


@pytest.mark.parametrize("name", SCENARIOS)
def test_stored_snapshots_load_and_write_back_unchanged(name: str) -> None:
    stored = _stored(name)
    assert stored, f"no stored snapshots for {name}"
    clock = FakeClock(1e10)  # far past every snapshot: aged out on use, never on load
    for blob in stored:
        assert hashlib.sha256(blob).hexdigest() in _digests()[name]
        if name == "dedup":
            assert load_dedup(blob, clock=clock).to_bytes() == blob
        else:
            assert ForgetfulBloomFilter.from_bytes(blob, clock=clock).to_bytes() == blob


def _regenerate(keep_under: int = 10_000, keep: int = 3) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    for old in DATA.glob("*.bin"):
        old.unlink()
    digests = {}
    for key, build in SCENARIOS.items():
        snaps = build()
        digests[key] = [hashlib.sha256(b).hexdigest() for b in snaps]
        small = [j for j, b in enumerate(snaps) if len(b) < keep_under]
        for j in {small[0], small[len(small) // 2], small[-1]} if len(small) >= keep else small:
            (DATA / f"{key}-{j:03d}.bin").write_bytes(snaps[j])
    (DATA / "digests.json").write_text(json.dumps(digests, indent=1) + "\n")


if __name__ == "__main__":
    _regenerate()


def test_snapshot_parts_load_as_the_same_filter() -> None:
    """``FBFDedup.snapshot_parts`` (a node's snapshot: the words copied once, in parts) loads
    as ``to_bytes`` does, and the copy does not follow later inserts."""
    from cluster.core.dedup import load_dedup, make_dedup

    d = make_dedup("fbf", window=10.0, rate=1000, target_fpp=0.01)
    d.seen_or_add_many([f"a{i}".encode() for i in range(500)])
    parts = d.snapshot_parts()
    d.seen_or_add(b"after")
    loaded = load_dedup(b"".join(parts))
    assert all(loaded.seen_or_add(f"a{i}".encode()) for i in range(0, 500, 7))
    assert b"after" not in loaded
    assert loaded.nbytes() == d.nbytes()
