"""pytest plugin: write each failing test's traceback the moment it fails, so that a run killed at its time limit
still says why (scripts/gpu_quick.py's tests part loads it with `-p pytest_report_now`, scripts/ on PYTHONPATH)."""

from __future__ import annotations

_terminal = None


def pytest_sessionstart(session) -> None:  # the terminal reporter is registered by now
    global _terminal
    _terminal = session.config.pluginmanager.get_plugin("terminalreporter")


def pytest_runtest_logreport(report) -> None:
    if report.failed and _terminal is not None:
        _terminal.write_line(f"\n--- {report.nodeid} failed ({report.when}):\n{report.longreprtext}\n", flush=True)
