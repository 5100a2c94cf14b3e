"""Running asyncio code from a notebook cell as well as from a script.

A Jupyter kernel already runs an event loop in the cell's thread, so `asyncio.run` raises there.
`run_coroutine` then runs the coroutine on a fresh loop in a helper thread and waits for it;
`call_in_thread` does the same for a function that calls `asyncio.run` itself (vLLM's benchmark).
Exceptions come back to the caller unchanged.

Interrupting the cell (KeyboardInterrupt in the waiting thread) stops the work too: the
coroutine's task is cancelled, so a load test stops sending and its `async with` blocks close
their connections, and only then does the KeyboardInterrupt reach the caller. Without this the
helper thread would keep the load running after the cell was interrupted.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# How long an interrupted call waits for its work to wind down (cancel handlers, closing sockets).
STOP_TIMEOUT = 30.0


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _join(th: threading.Thread, stop: Callable[[], None]) -> None:
    """Wait for `th`; on an interrupt, ask it to stop, wait for that, then re-raise."""
    try:
        th.join()
    except BaseException:  # KeyboardInterrupt (the kernel's interrupt) or SystemExit
        stop()
        th.join(timeout=STOP_TIMEOUT)
        raise


def _raise_in(th: threading.Thread, exc_type: type[BaseException]) -> None:
    """Raise `exc_type` inside a running Python thread (at its next bytecode)."""
    if th.ident is not None and th.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(th.ident), ctypes.py_object(exc_type))


def call_in_thread(fn: Callable[[], T]) -> T:
    """Call `fn()` in a new thread (where no event loop runs), wait, and return or raise its outcome.

    An interrupt while waiting raises KeyboardInterrupt inside `fn` as well; `asyncio.run` in `fn`
    then cancels its tasks and closes its loop before the interrupt reaches the caller.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed back to the caller below
            box["error"] = exc

    th = threading.Thread(target=target, daemon=True, name="lab-call-in-thread")
    th.start()
    _join(th, lambda: _raise_in(th, KeyboardInterrupt))
    if "error" in box:
        raise box["error"]
    return box["result"]


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, also where a loop already runs in this thread (a notebook).

    Outside a loop, `asyncio.run` already cancels the task on Ctrl-C. Inside one, the coroutine
    runs on its own loop in a helper thread, and an interrupt cancels it there.
    """
    if not _loop_running():
        return asyncio.run(coro)
    loop = asyncio.new_event_loop()
    box: dict[str, Any] = {}
    task_ready = threading.Event()

    def target() -> None:
        asyncio.set_event_loop(loop)
        try:
            task = loop.create_task(coro)
            box["task"] = task
            task_ready.set()
            box["result"] = loop.run_until_complete(task)
        except BaseException as exc:  # handed back to the caller below
            box["error"] = exc
        finally:
            task_ready.set()
            try:
                _cancel_remaining(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def stop() -> None:
        task_ready.wait(timeout=5)
        task = box.get("task")
        if task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed in between: nothing left to stop
                pass

    th = threading.Thread(target=target, daemon=True, name="lab-run-coroutine")
    th.start()
    _join(th, stop)
    if "error" in box:
        raise box["error"]
    return box["result"]


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
