"""Ctrl-C during training: the first SIGINT asks the loop to stop after the current step, the second stops at once."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable


def install_sigint(stop_requested: Callable[[], bool], request_stop: Callable[[], None]) -> Callable[[], None]:
    """Install the handler (main thread only; elsewhere nothing happens) and return the function restoring the
    previous one. stop_requested() says whether a first Ctrl-C came already; request_stop() records one."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        if stop_requested():
            raise KeyboardInterrupt
        request_stop()
        print("\nCtrl-C: finishing this step, then writing a checkpoint (Ctrl-C again to stop now)", file=sys.stderr)

    signal.signal(signal.SIGINT, handler)
    return lambda: signal.signal(signal.SIGINT, previous)
