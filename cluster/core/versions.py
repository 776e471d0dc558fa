"""What a node speaks and writes: the protocol versions, and the error for what it cannot read.

One number, the **protocol version**, names both what goes between nodes (peer frames) and what
a node writes to its data directory (log segments, snapshots, the data directory's ``FORMAT``
file). A node speaks every version from ``PROTOCOL_MIN`` to ``PROTOCOL_MAX``; two peers can talk
when their ranges overlap (the HELLO carries the dialer's, ``speaks``).

What a node *sends and writes* is the cluster's **finalized** version, carried with the
membership (``Membership.protocol``; 1 when absent, as in every release before it was named):
a newer form goes out only once every member has been upgraded and an operator finalized
(``python -m cluster finalize``), so until then any node can still be rolled back to the
release it came from (docs/operations.md). Reading is never gated: a node reads every version
it ever wrote.

Protocol versions:

    1  idemcount 0.4.0 and before: frames are ``[kind, req_id, body]``; log segments start
       with their first record; snapshots are file version 1.
    2  frames may name their form, ``[kind, req_id, body, form]`` (a frame without one is form
       1); log segments start with a header naming their format; the data directory holds a
       ``FORMAT`` file with the highest version written into it.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from cluster.core.errors import ConfigError

PROTOCOL_MIN = 1
PROTOCOL_MAX = 2


class FormatError(ConfigError):
    """Something on disk or on the wire is of a newer version than this node reads. Said in one
    line naming both versions; nothing is overwritten (a node refuses to start on it)."""


def newer(what: str, found: int, reads: int = PROTOCOL_MAX) -> FormatError:
    """The one-line refusal: ``what`` is version ``found``, this code reads up to ``reads``."""
    reads_what = "version 1" if reads == 1 else f"versions 1 to {reads}"
    return FormatError(
        f"{what} is version {found}, newer than this node reads ({reads_what}, "
        f"idemcount {release()}): run the release that wrote it, or a later one")


def writable(version: Any, what: str = "format") -> int:
    """``version`` when this code can write it (1 to ``PROTOCOL_MAX``), else ``ValueError``."""
    if type(version) is not int or not 1 <= version <= PROTOCOL_MAX:
        raise ValueError(f"{what} must be 1 to {PROTOCOL_MAX}, got {version!r}")
    return version


def speaks(value: Any) -> tuple[int, int]:
    """The (lowest, highest) protocol a peer announced: a ``[lo, hi]`` pair, or absent for a
    node of a release before versions were named (it speaks 1 only)."""
    if value is None:
        return (1, 1)
    if (isinstance(value, list | tuple) and len(value) == 2
            and all(type(v) is int and v >= 1 for v in value) and value[0] <= value[1]):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"not a protocol range: {value!r}")


def common(a: tuple[int, int], b: tuple[int, int]) -> int | None:
    """The highest version both ranges hold, or None when they do not overlap."""
    hi = min(a[1], b[1])
    return hi if hi >= max(a[0], b[0]) else None


def release() -> str:
    """This code's release (the installed package's version), or "unknown" outside one."""
    try:
        from importlib.metadata import version

        return version("idemcount")
    except Exception:  # noqa: BLE001 - a source tree run without an install
        return "unknown"
