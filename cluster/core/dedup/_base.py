"""The interface every dedup strategy implements, and the sizing and snapshot helpers they share."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import msgpack

Clock = Callable[[], float]
LN2 = math.log(2.0)


@runtime_checkable
class Dedup(Protocol):
    """Decides whether an op id was already applied; a node runs with any one of these."""

    name: str

    def seen_or_add(self, op_id: bytes) -> bool:
        """True: already seen (a duplicate, do not apply). False: new, and now recorded."""
        ...

    def seen_or_add_many(self, op_ids: Sequence[bytes]) -> list[bool]:
        """``seen_or_add`` for each id in order, as one call: a list of bools (not a numpy
        array), True where the id is a duplicate. A repeat inside the batch is a duplicate of
        its first occurrence. Time-based strategies read the clock once for the batch."""
        ...

    def __contains__(self, op_id: bytes) -> bool:
        """Check only; records nothing."""
        ...

    def nbytes(self) -> int:
        """Bytes of memory the dedup state uses."""
        ...

    @property
    def window(self) -> float:
        """Seconds an id is guaranteed remembered (math.inf: never forgets; 0: no guarantee)."""
        ...

    def estimated_fpp(self) -> float:
        """The strategy's own estimate of the probability a new id is taken as a duplicate."""
        ...

    def stats(self) -> dict[str, float]:
        """A few numbers to export as metrics."""
        ...

    def to_bytes(self) -> bytes:
        """Versioned snapshot, starting with the strategy's name; ``load_dedup`` inverts it."""
        ...


class _Filter(Protocol):
    """What a filter structure offers the strategy wrapping it."""

    @property
    def window(self) -> float: ...

    def nbytes(self) -> int: ...

    def estimated_fpp(self) -> float: ...

    def __contains__(self, item: bytes) -> bool: ...


F = TypeVar("F", bound=_Filter)


class FilterBacked(Generic[F]):
    """A strategy that is one filter structure (``fbf``, ``dleft-window``): the calls that only
    forward to it, and ``filter``, which anti-entropy merges replicas through."""

    def __init__(self, f: F) -> None:
        self._f = f

    @property
    def filter(self) -> F:
        return self._f

    def __contains__(self, op_id: bytes) -> bool:
        return op_id in self._f

    def nbytes(self) -> int:
        return self._f.nbytes()

    @property
    def window(self) -> float:
        return self._f.window

    def estimated_fpp(self) -> float:
        return self._f.estimated_fpp()


class OneByOne:
    """``seen_or_add_many`` as a loop of ``seen_or_add``, for strategies with no batch path."""

    seen_or_add: Callable[[bytes], bool]  # each strategy's own

    def seen_or_add_many(self, op_ids: Sequence[bytes]) -> list[bool]:
        seen = self.seen_or_add
        return [seen(x) for x in op_ids]


def design_items(window: float, rate: float) -> int:
    """Ids alive at once at the design load: ``rate`` ids/s remembered for ``window`` s."""
    return max(1, math.ceil(window * rate))


def bloom_shape(n: int, fpp: float) -> tuple[int, int]:
    """The textbook optimum for ``n`` items at ``fpp``: m = -n ln p / (ln 2)^2, k = (m/n) ln 2."""
    m = max(8, math.ceil(-n * math.log(fpp) / LN2**2))
    k = max(1, round(m / n * LN2))
    return m, k


def poisson_sf(lam: float, k: int) -> float:
    """P(X >= k) for X ~ Poisson(lam), summed upward in log space so tiny tails stay accurate."""
    if k <= 0:
        return 1.0
    total, i = 0.0, k
    while True:
        term = math.exp(-lam + i * math.log(lam) - math.lgamma(i + 1)) if lam > 0 else 0.0
        total += term
        if i > lam and term < total * 1e-17 or i > k + 100_000:
            return min(1.0, total)
        i += 1


# A snapshot is  name  b"\0"  version-byte  msgpack(payload).
def frame(name: str, version: int, payload: Any) -> bytes:
    return name.encode("ascii") + b"\0" + bytes((version,)) + msgpack.packb(payload)


def frame_parts(name: str, version: int, payload: list[bytes | memoryview]
                ) -> list[bytes | memoryview]:
    """``frame`` of a bytes payload given in parts, as parts: the same bytes, its msgpack bin
    header the one ``packb`` writes (bin 8, 16 or 32 by size)."""
    size = sum(len(part) for part in payload)
    if size < 1 << 8:
        head = b"\xc4" + size.to_bytes(1, "big")
    elif size < 1 << 16:
        head = b"\xc5" + size.to_bytes(2, "big")
    else:
        head = b"\xc6" + size.to_bytes(4, "big")
    return [name.encode("ascii") + b"\0" + bytes((version,)) + head, *payload]


def unframe(data: bytes) -> tuple[str, int, Any]:
    cut = data.find(b"\0")
    if cut <= 0 or cut + 1 >= len(data):
        raise ValueError("not a dedup snapshot: missing '<name>\\0<version>' tag")
    try:
        name = data[:cut].decode("ascii")
    except UnicodeDecodeError as exc:
        raise ValueError("not a dedup snapshot: tag is not ASCII") from exc
    return name, data[cut + 1], msgpack.unpackb(data[cut + 2 :], strict_map_key=False)


def check_version(name: str, version: int, supported: int) -> None:
    if version != supported:
        raise ValueError(f"{name} snapshot version {version}, this code reads version {supported}")


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (the first 13 primes as bases)."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in bases:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_prime(n: int) -> int:
    while not is_prime(n):
        n += 1
    return n
