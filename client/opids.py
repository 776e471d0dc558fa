"""Op ids ``<client-id>:<seq>`` whose sequence numbers are never reused, even after a restart.

With a state file, sequence numbers are handed out from reserved blocks: before the first number
of a block is used, the end of the block is written to the file and fsynced (write to a temporary
file, fsync, rename, fsync the directory). A client that crashes and restarts starts after the
last reserved block, so it may skip numbers but never repeats one: a repeat would be taken for a
retry and silently dropped by the cluster's dedup.

The state file is a JSON object ``{"client_id": ..., "next_seq": ...}`` and, from layout 2 on,
``"format": <layout>``. A file without ``format`` is layout 1: idemcount 0.4.0's, and what this
SDK writes (``STATE_FORMAT``), byte for byte, so a client can go back to 0.4.0 on its file. A
file of a later layout than ``STATE_FORMAT`` is refused with a one-line ``ConfigurationError``
and never overwritten.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from client.config import CLIENT_ID_RE
from client.errors import ConfigurationError

STATE_FORMAT = 1  # the state file's layout: what this SDK writes, the highest it reads


def new_client_id() -> str:
    return "c" + uuid.uuid4().hex[:16]


class OpIdSource:
    """Hands out op ids for one client id; thread-unsafe (one event loop owns it)."""

    def __init__(self, client_id: str | None = None, path: str | os.PathLike[str] | None = None,
                 *, block: int = 1000) -> None:
        self.path = Path(path) if path is not None else None
        self.block = block
        stored_id, stored_next = self._load()
        if client_id is None:
            client_id = stored_id or new_client_id()
        elif stored_id is not None and stored_id != client_id:
            raise ConfigurationError(
                f"client_id: {client_id!r} differs from {stored_id!r} stored in {self.path}; "
                "one state file belongs to one client id")
        if not CLIENT_ID_RE.fullmatch(client_id):
            raise ConfigurationError(f"client_id: must match [A-Za-z0-9_.-]{{1,100}}, "
                                     f"got {client_id!r}")
        self.client_id = client_id
        self._next = stored_next
        self._limit = stored_next if self.path is not None else float("inf")
        self.reservations = 0

    def _load(self) -> tuple[str | None, int]:
        if self.path is None:
            return None, 0
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None, 0
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"state_path: cannot read {self.path}: {exc}") from exc
        form = data.get("format", 1) if isinstance(data, dict) else None
        if type(form) is int and form > STATE_FORMAT:  # a later SDK wrote it: leave it be
            raise ConfigurationError(
                f"state_path: {self.path} is format {form}, newer than this SDK reads (formats "
                f"1 to {STATE_FORMAT}): use the release that wrote it, or a later one")
        try:
            if type(form) is not int or form < 1:
                raise ValueError(f"format {form!r}")
            return str(data["client_id"]), int(data["next_seq"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"state_path: {self.path} is not a client state file") \
                from exc

    def _reserve(self) -> None:
        assert self.path is not None
        limit = self._next + self.block
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            head = {"format": STATE_FORMAT} if STATE_FORMAT > 1 else {}  # 1: as 0.4.0 wrote
            json.dump({**head, "client_id": self.client_id, "next_seq": limit}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._limit = limit
        self.reservations += 1

    @property
    def next_seq(self) -> int:
        return self._next

    def next(self) -> str:
        if self._next >= self._limit:
            self._reserve()
        seq = self._next
        self._next += 1
        return f"{self.client_id}:{seq}"
