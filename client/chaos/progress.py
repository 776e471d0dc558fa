"""A plain-text progress bar on stderr: redrawn in place on a terminal, one line every few
seconds otherwise (CI logs)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    def __init__(self, total: float, status: Callable[[], str], *, stream: TextIO | None = None,
                 width: int = 30, enabled: bool = True) -> None:
        self.total = total
        self.status = status
        self.stream = stream or sys.stderr
        self.width = width
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._stop = asyncio.Event()

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        frac = min(1.0, elapsed / self.total) if self.total > 0 else 1.0
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        return f"[{bar}] {elapsed:5.1f}/{self.total:.0f}s {self.status()}"

    async def run(self) -> None:
        if not self.enabled:
            await self._stop.wait()
            return
        every = 0.25 if self.tty else 5.0
        while not self._stop.is_set():
            self._draw()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), every)
        self._draw(final=True)

    def _draw(self, final: bool = False) -> None:
        text = self.line()
        if self.tty:
            self.stream.write("\r\x1b[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def stop(self) -> None:
        self._stop.set()

    def note(self, text: str) -> None:
        if self.enabled:
            self.stream.write(("\r\x1b[K" if self.tty else "") + text + "\n")
            self.stream.flush()
