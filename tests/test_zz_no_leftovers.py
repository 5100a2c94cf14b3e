"""Runs last (file order): nothing the suite started is still running."""

from __future__ import annotations

import time


def test_no_process_left_behind():
    import psutil

    from lab_utils.servers import running_servers, stop_all

    leaked = running_servers()
    stop_all()  # so one leak does not spoil the next run, but the test still fails
    assert leaked == [], f"servers left running: {leaked}"
    deadline = time.monotonic() + 10
    while True:
        alive = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert alive == [], "child processes still running: " + "; ".join(
        " ".join(p.cmdline()[:4]) for p in alive
    )
