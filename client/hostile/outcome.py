"""What came back: one raw HTTP answer, one class's tally of answers and broken expectations,
and the check that an HTTP refusal is a 4xx in the contract's error shape."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack


@dataclass
class Failure:
    kind: str  # 5xx, shape, status, code, open, reply, effect, connect, timeout
    case: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.case}: {self.detail}"


@dataclass
class Outcome:
    """One class's tally (summed over rounds by the runner)."""

    requests: int = 0
    seen: Counter[str] = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    failure_kinds: Counter[str] = field(default_factory=Counter)
    skipped: str = ""
    notes: set[str] = field(default_factory=set)
    seconds: float = 0.0

    def fail(self, kind: str, case: str, detail: str) -> None:
        self.failure_kinds[kind] += 1
        if len(self.failures) < 20:
            self.failures.append(Failure(kind, case, detail))

    def merge(self, other: Outcome) -> None:
        self.requests += other.requests
        self.seen.update(other.seen)
        self.failure_kinds.update(other.failure_kinds)
        room = 20 - len(self.failures)
        if room > 0:
            self.failures.extend(other.failures[:room])
        self.skipped = other.skipped or self.skipped
        self.notes |= other.notes
        self.seconds += other.seconds

    @property
    def ok(self) -> bool:
        return not self.failure_kinds

    def verdict(self) -> str:
        if self.skipped:
            return f"skipped ({self.skipped})"
        if self.ok:
            return "ok"
        return "FAIL " + ",".join(f"{k}x{n}" for k, n in sorted(self.failure_kinds.items()))


@dataclass
class Answer:
    """One raw HTTP exchange: the first response, if any, and how the connection ended."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    end: str = "closed"  # closed (EOF from the node), open (still open at our deadline), reset
    elapsed: float = 0.0
    error: str = ""

    @property
    def label(self) -> str:
        if self.status is not None:
            return str(self.status)
        return self.error or self.end

    @property
    def ctype(self) -> str:
        return self.headers.get("content-type", "")

    def error_obj(self) -> dict[str, Any] | None:
        """The ``error`` object when the body has the contract's error shape, else None."""
        return error_shape(self.ctype, self.body)

    @property
    def code(self) -> str | None:
        err = self.error_obj()
        return err["code"] if err else None

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.label}) after {self.elapsed:.2f}s"
        text = self.body[:120].decode("utf-8", "replace").replace("\n", " ")
        return f"{self.status} {self.ctype or '-'} {text!r}"


def error_shape(ctype: str, body: bytes) -> dict[str, Any] | None:
    try:
        if "msgpack" in ctype:
            obj = msgpack.unpackb(body, raw=False)
        elif "json" in ctype:
            obj = json.loads(body)
        else:
            return None
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    if (isinstance(err, dict) and isinstance(err.get("code"), str) and err["code"]
            and isinstance(err.get("message"), str)):
        return err
    return None


def expect_reject(out: Outcome, case: str, ans: Answer, statuses: Iterable[int] = (400,),
                  codes: Iterable[str] | None = None, *, may_close: bool = False) -> None:
    """Record ``ans`` and check it: one of ``statuses`` (4xx) in the contract's error shape with
    one of ``codes``; ``may_close``: the node may also close without answering."""
    out.seen[ans.label] += 1
    if ans.error == "connect":
        out.fail("connect", case, "the node did not accept a connection")
        return
    if ans.status is None:
        if not may_close or ans.end == "open":
            out.fail("status", case, f"expected {sorted(statuses)}: {ans.describe()}")
        return
    wanted = set(statuses)
    if ans.status >= 500:
        out.fail("5xx", case, ans.describe())
        return
    if ans.status not in wanted:
        out.fail("status", case, f"expected {sorted(wanted)}, got {ans.describe()}")
    if ans.status >= 400:
        err = ans.error_obj()
        if err is None:
            out.fail("shape", case, f"not the contract's error shape: {ans.describe()}")
        elif codes is not None and err["code"] not in set(codes):
            out.fail("code", case, f"expected code in {sorted(set(codes))}: {ans.describe()}")
