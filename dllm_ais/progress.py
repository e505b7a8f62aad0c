"""One progress-bar helper for the samplers, SFT warm-up, evaluation and the variance study.

`progress_bar(...)` is a tqdm.auto bar when enabled; when not, tqdm is not imported and a stand-in that does nothing
(but iterate) takes its place, so callers use the same code either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


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


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, enabled: bool = True,
                 desc: str | None = None, unit: str = "it", leave: bool = True):
    """tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave) when `enabled`, else a silent stand-in."""
    if not enabled:
        return _NoBar(iterable)
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave)
