"""A long command's progress in the terminal's idiom: one line on stderr, redrawn in place
(what it is doing, k of n and the time left where it knows them, the time so far), and
nothing at all when stderr is not a terminal, so a log holds only the command's own lines.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

CLEAR = "\r\033[K"  # to the line's start, and erase it


class StatusLine:
    """`what`: the command's doing ("perf: 9 sizes"); `total`: how many steps, if known.
    Used as a context manager, it redraws every `redraw_s` (the elapsed time moves while
    a step runs) from a thread of its own, which `close` stops."""

    def __init__(self, what: str, total: int | None = None, *, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, redraw_s: float = 0.5) -> None:  # fmt: skip
        self.what, self.total, self.clock, self.redraw_s = what, total, clock, redraw_s
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.detail = ""
        self.t0 = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = ""

    def __enter__(self) -> StatusLine:
        if self.tty:
            self._thread = threading.Thread(target=self._redraw_loop, name="status-line", daemon=True)
            self._thread.start()
        self.draw()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def line(self) -> str:
        elapsed = self.clock() - self.t0
        parts = [self.what]
        if self.total:
            parts.append(f"{self.done}/{self.total}")
            if 0 < self.done < self.total:
                parts.append(f"~{elapsed / self.done * (self.total - self.done):.0f} s left")
        if self.detail:
            parts.append(self.detail)
        parts.append(f"{elapsed:.0f} s")
        return ", ".join(parts)

    def step(self, detail: str = "") -> None:
        """One step done; `detail`: what comes next, or what just ended."""
        self.done += 1
        self.detail = detail
        self.draw()

    def set(self, done: int | None = None, total: int | None = None, detail: str | None = None) -> None:
        """Where the command stands; cheap enough for every step of a hot loop (the redraw
        thread shows it; nothing is written here)."""
        self.done = self.done if done is None else done
        self.total = self.total if total is None else total
        self.detail = self.detail if detail is None else detail

    def say(self, text: str) -> None:
        """A line that stays (stdout, as the command prints it), the status line redrawn below."""
        with self._lock:
            if self.tty:
                self.stream.write(CLEAR)
                self.stream.flush()
            print(text, flush=True)
        self.draw()

    def draw(self, only_if_changed: bool = False) -> None:
        if not self.tty:
            return
        with self._lock:
            text = self.line()
            if only_if_changed and text == self._drawn:
                return
            self._drawn = text
            self.stream.write(CLEAR + text)
            self.stream.flush()

    def close(self) -> None:
        """Stop redrawing and erase the line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.tty:
            with self._lock:
                self.stream.write(CLEAR)
                self.stream.flush()

    def _redraw_loop(self) -> None:
        while not self._stop.wait(self.redraw_s):
            self.draw(only_if_changed=True)
