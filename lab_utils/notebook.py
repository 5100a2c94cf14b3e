"""Run All reaches the end: a cell that needs an answer not written yet says what to write and goes on.

A lab's answer starts as a stub that raises `NotImplementedError`, and an answer that is a value
is not defined at all until its cell runs (`NameError`). Cells that use an answer wrap the use, so
the pictures, servers and measurements that do not need it still run:

    PREDICTED = answer_or_none(lambda: predicted_blocks(SCENARIO),
                               "write predicted_blocks in section 3 to see the prediction")

    with attempt("write slot_spans in section 2 to see each request's runs"):
        for rid, table in tables.items():
            print(rid, slot_spans(table, 0, n, 16))

Any other exception (a bug in a half-written answer) still shows its traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

NOT_WRITTEN = (NotImplementedError, NameError)  # a stub's raise; a value whose cell has not run


def _say(todo: str, exc: BaseException) -> None:
    why = "" if isinstance(exc, NotImplementedError) else f" ({exc})"
    print(f"⏭ not written yet: {todo}{why}")


class attempt:  # noqa: N801 (reads as a statement: `with attempt(...)`)
    """A `with` block that stops quietly, printing `todo` in one line, when an answer is not written.

    After the block, `.ok` is True when it ran to its end.
    """

    def __init__(self, todo: str):
        self.todo = todo
        self.ok = False

    def __enter__(self) -> attempt:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.ok = True
            return False
        if issubclass(exc_type, NOT_WRITTEN):
            _say(self.todo, exc)
            return True
        return False


def answer_or_none(compute: Callable[[], T], todo: str) -> T | None:
    """`compute()`, or None (after printing `todo` in one line) when the answer it calls is not written."""
    try:
        return compute()
    except NOT_WRITTEN as exc:
        _say(todo, exc)
        return None


# ------------------------------------------------------------------------------------ progress
# A cell that runs longer than about 15 s says what it is doing, how far it is and the time left,
# in lines a test can read back from an executed notebook (tests/test_notebooks.py).
PROGRESS_PATTERN = r"\b\d+/\d+ done\b.*\bs left\b|\bnot ready yet after \d+ s\b"


def progress(items, what: str | None, total: int | None = None, every_s: float = 10.0):
    """Yield each of `items`, printing `what: i/n done, T s so far, about L s left` as it goes.

    A line comes after the first item, then at most every `every_s` seconds, and after the last.
    With `what` None (or empty) it yields them silently: a library function's `progress=` option.
    """
    import time

    if not what:
        yield from items
        return
    items = list(items) if total is None else items
    total = len(items) if total is None else total
    t0 = last = time.monotonic()
    for i, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if i == 1 or i == total or now - last >= every_s:
            last, spent = now, now - t0
            left = spent / i * (total - i)
            print(f"{what}: {i}/{total} done, {spent:.0f} s so far, about {left:.0f} s left", flush=True)


class waiting:  # noqa: N801 (reads as a statement: `with waiting(...)`)
    """A block that is one long step (an engine's start-up): say every `every_s` seconds that it runs.

    A timer thread prints `what: not ready yet after N s` while the block runs (the form a server's
    start-up prints, lab_utils.servers.base); the end of the block prints `what: ready after N s`.
    `.seconds` is the block's time.
    """

    def __init__(self, what: str, every_s: float = 10.0):
        self.what, self.every_s, self.seconds = what, every_s, None

    def __enter__(self) -> waiting:
        import threading
        import time

        self._t0, self._stop = time.monotonic(), threading.Event()

        def tick() -> None:
            while not self._stop.wait(self.every_s):
                print(f"{self.what}: not ready yet after {time.monotonic() - self._t0:.0f} s", flush=True)

        self._thread = threading.Thread(target=tick, name="waiting", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        import time

        self._stop.set()
        self._thread.join()
        self.seconds = time.monotonic() - self._t0
        if exc_type is None:
            print(f"{self.what}: ready after {self.seconds:.0f} s", flush=True)
        return False
