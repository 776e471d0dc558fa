"""Claims: two checks of one op never both pass (the claim table of one node).

Asking the replicas whether they hold an op and then applying it (``cluster.roles.checks``) is
not atomic: a leader that was paused (or cut off) while another replica took over its keys
resumes with copies of ops that the other replica is checking at that very moment; each answers
the other's ``HOLDS`` "not held" before applying its own copy, both pass, and the op counts twice
(what the pause nemesis found). So a replica that answers "not held" also *claims* the op for
the asker: until the asker's application arrives (its REPLICATE) or the window passes, it
answers any other asker BUSY, and it applies no copy of the op itself. A checker claims the op
at home first, and needs the claim of a majority of the key's replicas counting itself
(``cluster.roles.checks``). A claim that outlives its holder's application (a REPLICATE lost,
the holder paused right after applying) keeps the others out until the window is over, when any
retry of the op is refused as expired anyway; and once the application arrived, the claim stays
as a *fence* against any other leader's copy of the op (``Claims.fence``).

``Claims`` is node-local bookkeeping, one table per node: the check protocol takes and gives
back claims in it (``cluster.roles.checks``, which ``cluster.roles.settle`` uses too), the
leader's admission refuses an op claimed for another node's check and marks a checked op applied
(``cluster.roles.admission``), and the replica refuses fenced copies (``cluster.roles.replica``).
Claims live in memory: a restarted node forgets them (``Claims.forget``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

MAX_CLAIMS = 1_000_000


class Claims:
    """op id -> (node, expiry on the monotonic clock, applied): this node promised ``node``
    that no other check of the op passes here (and that it applies no copy itself) until the
    promise expires. Once ``node``'s application arrives the dedup answers for the op, and the
    claim stays only as a *fence*: a copy of the op from any other leader (a REPLICATE that a
    partition or a pause held back) is refused, so it never becomes visible here next to the
    application that stands. Bounded: the oldest claims go first."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self._c: OrderedDict[str, tuple[str, float, bool]] = OrderedDict()
        # Claims live in memory: a restart forgets the promises made before it, which may
        # still be running (the seed 6154 over-count: a replica claimed an op for one checker,
        # crashed, and after its restart claimed it for a second one; both applied it). Until
        # ``forgot_until`` (monotonic) this node gives no claim on an op it does not know
        # (FORGOT), its own check does not count itself, and it refuses a copy of an op applied
        # before ``forgot_before`` (wall clock, less the skew): it may have fenced it before
        # the crash. An op first sent after that was never promised before: it is exempt.
        self.forgot_until = 0.0
        self.forgot_before = 0.0

    def forget(self, life: float, restarted_wall: float) -> None:
        """This node restarted: what it promised before lasts at most ``life`` from now; a
        copy of an op applied before ``restarted_wall`` may be one it fenced."""
        self.forgot_until = self.clock() + life
        self.forgot_before = restarted_wall

    def amnesiac(self) -> bool:
        """Within a claim's life after a restart (promises made before it are unknown)."""
        return self.forgot_until > 0.0 and self.clock() < self.forgot_until

    def forgets(self, born: float | None) -> bool:
        """Whether this node may have promised an op ``born`` then (unknown: None) before a
        restart it has forgotten: an op first sent after the restart was never claimed
        before it."""
        return self.amnesiac() and (born is None or born < self.forgot_before)

    def __len__(self) -> int:
        return len(self._c)

    def __bool__(self) -> bool:
        """Any live claim or fence (expired ones at the front are dropped first: the write
        path asks this before every batch, and checks claims only when there are some)."""
        c = self._c
        if c:
            now = self.clock()
            while c and next(iter(c.values()))[1] <= now:
                c.popitem(last=False)
        return bool(c)

    def _live(self, op_id: str) -> tuple[str, float, bool] | None:
        got = self._c.get(op_id)
        if got is not None and got[1] <= self.clock():
            del self._c[op_id]
            return None
        return got

    def holder(self, op_id: str) -> str | None:
        """The node holding a live claim on ``op_id`` whose application has not arrived yet."""
        got = self._live(op_id)
        return got[0] if got is not None and not got[2] else None

    def fence(self, op_id: str) -> str | None:
        """The node the op is promised to (claimed, or applied after its claim), or None: a
        copy of the op applied by any other node must not be merged here."""
        got = self._live(op_id)
        return got[0] if got is not None else None

    def take(self, op_id: str, node: str, life: float) -> bool:
        """Claim ``op_id`` for ``node`` (or renew its claim); False when another node holds it."""
        got = self._live(op_id)
        if got is not None and got[0] != node:
            return False
        now = self.clock()
        c = self._c
        c[op_id] = (node, now + life, got is not None and got[2])
        c.move_to_end(op_id)
        while c and (len(c) > MAX_CLAIMS or next(iter(c.values()))[1] <= now):
            c.popitem(last=False)
        return True

    def release(self, op_id: str, node: str) -> None:
        got = self._c.get(op_id)
        if got is not None and got[0] == node and not got[2]:
            del self._c[op_id]

    def applied(self, op_id: str) -> None:
        """The holder's application arrived (or was made here): the dedup answers for the op
        from now on; the claim stays as a fence until it expires."""
        got = self._c.get(op_id)
        if got is not None and not got[2]:
            self._c[op_id] = (got[0], got[1], True)

    def drop(self, op_id: str) -> None:
        """Forget the claim (the op is known to be held elsewhere)."""
        self._c.pop(op_id, None)
