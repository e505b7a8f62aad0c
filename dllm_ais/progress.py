"""One progress-bar helper for training, the SFT warm-up, the samplers, evaluation and the variance study.

`progress_bar(...)` is a tqdm.auto bar when enabled and stderr is a terminal. When stderr is not a terminal (a log
file, a job scheduler), a bar that stays on screen (`leave=True`: training, warm-up, evaluation) becomes one plain
line every `LINE_EVERY_S` seconds and one at the end, and a transient one (a sampler's inner bar) says nothing: no
carriage-return bars in the file. When not enabled, tqdm is not imported and a stand-in that does nothing (but
iterate) takes its place, so callers use the same code either way.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator

LINE_EVERY_S = 30.0
"""Seconds between the plain progress lines written when stderr is not a terminal."""


class _NoBar:
    """tqdm's interface as the callers use it (iterate, update, set_postfix[_str], close), doing nothing."""

    def __init__(self, iterable: Iterable | None) -> None:
        self.iterable = iterable

    def __iter__(self) -> Iterator:
        return iter(self.iterable)

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args, **kwargs) -> None:
        pass

    def set_postfix_str(self, s: str = "") -> None:
        pass

    def close(self) -> None:
        pass


class _LineBar(_NoBar):
    """tqdm's interface as plain lines on `stream`: "desc: n/total unit (p %), s elapsed; postfix", at most one per
    `every` seconds, and one when closed."""

    def __init__(self, iterable: Iterable | None, total: int | None, desc: str | None, unit: str, initial: int = 0,
                 stream=None, every: float = LINE_EVERY_S, clock=time.monotonic) -> None:
        super().__init__(iterable)
        self.total = total if total is not None or iterable is None else _len(iterable)
        self.desc, self.unit, self.n, self.postfix = desc or "progress", unit, initial, ""
        self.stream, self.every, self.clock = stream or sys.stderr, every, clock
        self.start = self.last = clock()
        self.closed = False

    def __iter__(self) -> Iterator:
        for item in self.iterable:
            yield item
            self.update(1)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.clock() - self.last >= self.every:
            self._line()

    def set_postfix(self, *args, **kwargs) -> None:
        items = dict(*args, **kwargs)
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "") -> None:
        self.postfix = s

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._line()

    def _line(self) -> None:
        self.last = self.clock()
        done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        share = f" ({100 * self.n / self.total:.0f} %)" if self.total else ""
        more = f"; {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {done} {self.unit}{share}, {self.last - self.start:.0f} s{more}", file=self.stream,
              flush=True)


def _len(iterable) -> int | None:
    try:
        return len(iterable)
    except TypeError:
        return None


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, enabled: bool = True,
                 desc: str | None = None, unit: str = "it", leave: bool = True, initial: int = 0):
    """tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, initial=initial) when `enabled` and stderr is a
    terminal; plain lines (leave) or nothing (transient) when stderr is not one; a silent stand-in when not
    `enabled`."""
    if not enabled:
        return _NoBar(iterable)
    if not sys.stderr.isatty():
        return _LineBar(iterable, total, desc, unit, initial) if leave else _NoBar(iterable)
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, initial=initial)
