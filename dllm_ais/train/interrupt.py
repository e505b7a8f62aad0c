"""Stopping a training run at a step boundary.

Ctrl-C (SIGINT): the first asks the loop to stop after the current step and write a checkpoint, the second stops at
once. A scheduler's stop (SIGTERM, e.g. SLURM's or Kubernetes's; SIGUSR1, SLURM's warning before it when the job asks
for one with `--signal=USR1@SECONDS`): the current step finishes, a verified checkpoint is written and the command
exits with RESUME_EXIT_CODE, which says "preempted, resume me" (`dllm-ais train --out RUN --resume`). A repeated
SIGTERM/SIGUSR1 changes nothing: the step still finishes (a scheduler's SIGKILL ends it if it must). In a
multi-process run the processes agree (Trainer._any_process): one process's signal stops every one at the same step.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable

RESUME_EXIT_CODE = 75
"""Exit status of a run stopped by SIGTERM / SIGUSR1 after writing its checkpoint: sysexits' EX_TEMPFAIL ("try again
later"); a job script requeues on it (`[ $? -eq 75 ] && scontrol requeue $SLURM_JOB_ID`) and relaunches with
--resume."""

PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1")
"""Signals handled as a scheduler's stop (those this platform has)."""


def resume_command(run) -> str:
    """The command that continues the run in directory `run`, as the user types it."""
    return f"`dllm-ais train --out {run} --resume`"


class Preempted(Exception):
    """A SIGTERM / SIGUSR1 stopped the run at a step boundary, after its checkpoint (the CLI exits with
    RESUME_EXIT_CODE)."""


def install_sigint(stop_requested: Callable[[], bool], request_stop: Callable[..., None],
                   resume: str = "--resume") -> Callable[..., None]:
    """Install the handlers (main thread only; elsewhere nothing happens) and return restore(preempted=False), which
    puts the previous ones back; restore(preempted=True) ignores SIGTERM / SIGUSR1 from then on instead: the process
    is exiting with RESUME_EXIT_CODE, and a launcher's SIGTERM (torchrun's, when another process exited first) must
    not turn that into a kill. stop_requested() says whether a stop was asked already; request_stop(reason) records
    one: reason "Ctrl-C" or a preemption signal's name ("SIGTERM", "SIGUSR1"). `resume`: the command that continues the
run, said on a preemption signal (`resume_command(run)`)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda preempted=False: None
    previous = {signal.SIGINT: signal.getsignal(signal.SIGINT)}

    def on_sigint(signum, frame):
        if stop_requested():
            raise KeyboardInterrupt
        request_stop("Ctrl-C")
        print("\nCtrl-C: finishing this step, then writing a checkpoint (Ctrl-C again to stop now)", file=sys.stderr)

    def on_preempt(signum, frame):
        name = signal.Signals(signum).name
        if not stop_requested():
            request_stop(name)
        print(f"\n{name}: finishing this step, then writing a checkpoint and exiting with {RESUME_EXIT_CODE} (resume "
              f"with {resume})", file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, on_sigint)
    for name in PREEMPT_SIGNALS:
        if hasattr(signal, name):
            sig = getattr(signal, name)
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, on_preempt)

    def restore(preempted: bool = False) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if preempted and sig != signal.SIGINT else handler)

    return restore
