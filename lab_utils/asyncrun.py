"""Running asyncio code from a notebook cell as well as from a script.

A Jupyter kernel already runs an event loop in the cell's thread, so `asyncio.run` raises there.
`run_coroutine` then runs the coroutine on a fresh loop in a helper thread and waits for it;
`call_in_thread` does the same for a function that calls `asyncio.run` itself (vLLM's benchmark).
Exceptions come back to the caller unchanged.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def call_in_thread(fn: Callable[[], T]) -> T:
    """Call `fn()` in a new thread (where no event loop runs), wait, and return or raise its outcome."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed back to the caller below
            box["error"] = exc

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, also where a loop already runs in this thread (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    return call_in_thread(lambda: asyncio.run(coro))
