"""Per-client sliding sequence window, the anti-replay check of RFC 4303 (IPsec ESP, section
3.4.3) with the bitmap of RFC 6479.

Op ids are ``b"<client-id>:<seq>"`` with a decimal seq. Per client: the highest seq seen and a
bitmap of the last W seqs (bit i = seq ``top - i`` seen). A seq above the top slides the window;
one inside it is checked and marked; one below it is, as in the RFC, rejected as a replay and
counted as ``too_old`` (a genuinely new op that arrives more than W seqs late is thus lost: an
undercount the estimate does not include, watch ``too_old``). Exact otherwise, with state per
client instead of per op.

Clients idle longer than ``window`` seconds are evicted, which bounds memory by the clients
active in a window; eviction reopens replays for that client (a retry arriving after its
client's entry is gone is applied again), so ``window`` is the guarantee, as for the others.
The bitmap is a Python int shifted on each advance, which in Python is cheaper than RFC 6479's
ring of words.
"""

from __future__ import annotations

import math
import sys
import time
from collections import OrderedDict
from typing import Any

from cluster.core.dedup._base import Clock, OneByOne, check_version, frame


class _Client:
    __slots__ = ("top", "bits", "last")

    def __init__(self, top: int, bits: int, last: float) -> None:
        self.top, self.bits, self.last = top, bits, last


def parse_op_id(op_id: bytes) -> tuple[bytes, int]:
    """Split ``b"<client>:<seq>"``; ValueError names the expected form."""
    client, sep, seq = op_id.rpartition(b":")
    if not sep or not client or not seq.isdigit():
        raise ValueError(
            f"seqwindow needs op ids of the form b'<client-id>:<decimal seq>', got {op_id[:80]!r}"
        )
    return client, int(seq)


class SeqWindowDedup(OneByOne):
    """Highest seq plus a W-bit replay bitmap per client; idle clients evicted after ``window``."""

    name: str = "seqwindow"

    def __init__(self, window: float, clock: Clock = time.time, replay_window: int = 1024) -> None:
        if not window > 0 or replay_window < 1:
            raise ValueError(
                f"need window > 0 and replay_window >= 1; got {window}, {replay_window}"
            )
        self._window = float(window)
        self._clock = clock
        self.replay_window = replay_window
        self._mask = (1 << replay_window) - 1
        self._clients: OrderedDict[bytes, _Client] = OrderedDict()  # least recently active first
        self._next_sweep = math.inf
        self.too_old = 0
        self.evicted = 0

    def _sweep(self, now: float) -> None:
        cutoff = now - self._window
        clients = self._clients
        while clients:
            oldest = next(iter(clients.values()))
            if oldest.last >= cutoff:
                self._next_sweep = oldest.last + self._window
                return
            clients.popitem(last=False)
            self.evicted += 1
        self._next_sweep = math.inf

    def seen_or_add(self, op_id: bytes) -> bool:
        client, seq = parse_op_id(op_id)
        now = self._clock()
        if now > self._next_sweep:
            self._sweep(now)
        st = self._clients.get(client)
        if st is None:
            self._clients[client] = _Client(seq, 1, now)
            if self._next_sweep == math.inf:
                self._next_sweep = now + self._window
            return False
        self._clients.move_to_end(client)
        st.last = now
        diff = st.top - seq
        if diff < 0:  # a new top: slide the window
            st.bits = ((st.bits << -diff) | 1) & self._mask if -diff < self.replay_window else 1
            st.top = seq
            return False
        if diff >= self.replay_window:
            self.too_old += 1
            return True
        bit = 1 << diff
        if st.bits & bit:
            return True
        st.bits |= bit
        return False

    def __contains__(self, op_id: bytes) -> bool:
        client, seq = parse_op_id(op_id)
        st = self._clients.get(client)
        if st is None or st.last < self._clock() - self._window:
            return False
        diff = st.top - seq
        return diff >= self.replay_window or (diff >= 0 and bool(st.bits >> diff & 1))

    def nbytes(self) -> int:
        """The ordered dict plus, per client, its key, its state object and the ints inside."""
        per_client = sum(
            sys.getsizeof(key) + sys.getsizeof(st) + sys.getsizeof(st.top)
            + sys.getsizeof(st.bits) + sys.getsizeof(st.last)
            for key, st in self._clients.items()
        )
        return sys.getsizeof(self._clients) + per_client

    @property
    def window(self) -> float:
        return self._window

    def estimated_fpp(self) -> float:
        return 0.0  # exact inside the replay window; see ``too_old`` for what falls below it

    def stats(self) -> dict[str, float]:
        return {"clients": float(len(self._clients)), "too_old": float(self.too_old),
                "evicted": float(self.evicted), "replay_window": float(self.replay_window)}

    def to_bytes(self) -> bytes:
        nb = (self.replay_window + 7) // 8
        clients = [(k, st.top, st.bits.to_bytes(nb, "little"), st.last)
                   for k, st in self._clients.items()]
        return frame(self.name, 1, [self._window, self.replay_window, self.too_old, clients])

    @classmethod
    def from_payload(cls, version: int, payload: Any, clock: Clock) -> SeqWindowDedup:
        check_version(cls.name, version, 1)
        window, replay_window, too_old, clients = payload
        d = cls(window, clock, replay_window)
        d.too_old = too_old
        for key, top, bits, last in clients:
            d._clients[key] = _Client(top, int.from_bytes(bits, "little"), last)
        if d._clients:
            d._next_sweep = next(iter(d._clients.values())).last + window
        return d
