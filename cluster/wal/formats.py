"""The data directory's ``FORMAT`` file: the highest format (protocol version) written into it.

    <data_dir>/FORMAT    the version as decimal digits and a newline, e.g. ``2``

No file means 1: idemcount 0.4.0 and before wrote none, and a node whose cluster has not
finalized a higher version (``cluster.core.versions``) writes none either, so a data directory
at 1 stays byte for byte one that 0.4.0 reads. The node reads it at start, before it touches
anything else (``read_format``: a newer number refuses the start), and raises it
(``write_format``) before the first file of a higher format lands in the directory; it is
never lowered, so a release that cannot read every file is told so by this one file, even
before it would meet the first newer segment or snapshot.
"""

from __future__ import annotations

from pathlib import Path

from cluster.core.errors import ConfigError
from cluster.core.versions import PROTOCOL_MAX, newer, writable
from cluster.wal.files import write_durably

__all__ = ["FORMAT_FILE", "read_format", "write_format"]

FORMAT_FILE = "FORMAT"
_MAX_BYTES = 64  # a version number and a newline; more is not a FORMAT file


def read_format(data_dir: Path) -> int:
    """The format the data directory holds: 1 without a ``FORMAT`` file (or without the
    directory). ``FormatError`` naming the file and both versions when it is above
    ``PROTOCOL_MAX``; a one-line ``ConfigError`` when the file holds no version number or
    cannot be read."""
    path = Path(data_dir) / FORMAT_FILE
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        return 1
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > _MAX_BYTES or not text.isdecimal() or not text.isascii() or int(text) < 1:
        raise ConfigError(f"{path}: not a format version (a number from 1): {raw[:20]!r}")
    version = int(text)
    if version > PROTOCOL_MAX:
        raise newer(f"data directory {Path(data_dir)} (its {FORMAT_FILE} file)", version)
    return version


def write_format(data_dir: Path, version: int) -> None:
    """Record that files of format ``version`` may now be written into ``data_dir``: durably
    (``write_durably``: the old content or the new survives a crash), and only when it raises
    the number there (at 1, or at or below what the file says, nothing is written). Raises as
    ``read_format`` does for a file already there it cannot read; ``ValueError`` for a version
    this code does not write."""
    if writable(version) <= read_format(data_dir):
        return
    write_durably(Path(data_dir) / FORMAT_FILE, f"{version}\n")
