"""The run's history: one JSON object per line, in the order things happened.

    {"index": 7, "time": 1.234567, "process": 3, "type": "invoke", "f": "add",
     "key": "chaos/k1", "value": 1, "op_id": null}
    {"index": 9, "time": 1.301, "process": 3, "type": "ok", "f": "add", "key": "chaos/k1",
     "value": 1, "op_id": "c1:17", "attempts": 2, "duplicate": true, "node": "..."}
    {"index": 12, "time": 2.0, "process": "nemesis", "type": "info", "f": "start",
     "value": "kill", "detail": {"node": "n2"}}

Deletes, multi-gets and scans (``client.checker`` reads them; keys are always ``table/key``):

    {"type": "invoke", "f": "delete", "key": "chaos/k1", "value": null, ...}
    {"type": "ok"|"fail"|"info", "f": "delete", "key": "chaos/k1", "value": null,
     "op_id": "c1:18", "attempts": 1, "duplicate": true, "node": "...", "error": "..."}
    {"type": "invoke", "f": "multiget", "keys": ["chaos/k1", "chaos/k4"], "value": null,
     "consistency": "quorum", ...}
    {"type": "ok", "f": "multiget", "keys": [...], "value": [3, 0], "consistency": "quorum"}
    {"type": "invoke", "f": "scan", "table": "chaos", "prefix": "k1", "page_size": 20,
     "value": null, "consistency": "quorum", ...}
    {"type": "ok", "f": "scan", "table": "chaos", "prefix": "k1", "consistency": "quorum",
     "value": [["chaos/k1", 3], ["chaos/k10", 0]]}      # every page of the scan, in order

A failed multi-get or scan is ``fail`` with ``error`` (a scan also says how many counters it
had ``returned`` before it failed); reads carry their ``consistency`` too.

``time`` is seconds since the run began (monotonic). A process runs one op at a time; after an
``info`` (outcome unknown) the driver continues under a new process id, as Jepsen does, so the
crashed op stays concurrent with everything after it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


class History:
    def __init__(self, path: str | Path | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.start = time.monotonic()
        self.counts: Counter[str] = Counter()
        self._file: IO[str] | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "w")  # noqa: SIM115 - closed in close()

    def now(self) -> float:
        return round(time.monotonic() - self.start, 6)

    def record(self, process: Any, type_: str, f: str, value: Any = None,
               **extra: Any) -> dict[str, Any]:
        ev = {"index": len(self.events), "time": self.now(), "process": process, "type": type_,
              "f": f, "value": value}
        ev.update({k: v for k, v in extra.items() if v is not None})
        self.events.append(ev)
        self.counts[f"{f}:{type_}"] += 1
        if self._file is not None:
            self._file.write(json.dumps(ev, separators=(",", ":")) + "\n")
        return ev

    def nemesis(self, f: str, value: str, **detail: Any) -> None:
        self.record("nemesis", "info", f, value, detail=detail or None)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.events)


def load(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
