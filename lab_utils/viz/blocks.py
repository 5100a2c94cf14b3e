"""Block tables you can watch: plots of a paged KV cache, and a stepper over a recorded trace.

Every plot takes a `lab_utils.kv.Frame` (what `TraceRecorder` records, or `snapshot(kv, ...)`)
and returns a matplotlib Figure. `trace_stepper` wraps the same drawing in ipywidgets (imported
lazily); `plot_trace` draws the frames as static figures for papermill and CI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lab_utils.kv.kv_cache_manager import KVCacheManager
from lab_utils.kv.trace import Frame, TraceRecorder, snapshot

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "Frame",
    "TraceRecorder",
    "snapshot",
    "request_colours",
    "plot_block_tables",
    "plot_memory_grid",
    "plot_frame",
    "plot_trace",
    "trace_stepper",
    "show_trace",
    "plot_utilisation",
]

# CSS class on the stepper's outer box in the page, so a browser test can find it
STEPPER_CLASS = "lab-block-stepper"
_FREE = "#ffffff"
_CACHED = "#e6e6e6"
_SHARED_EDGE = "#111111"


def request_colours(request_ids: Sequence[str]) -> dict[str, tuple]:
    """A stable colour per request id (tab10 in first-seen order, then tab20)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(request_ids) <= 10 else "tab20"]
    return {rid: cmap(i % cmap.N) for i, rid in enumerate(request_ids)}


def _frame_ids(frames: Sequence[Frame]) -> list[str]:
    seen: list[str] = []
    for f in frames:
        for rid in f.block_tables:
            if rid not in seen:
                seen.append(rid)
    return seen


def _block_fill(frame: Frame) -> dict[int, int]:
    """Tokens held in each in-use physical block (the fullest view any request has of it)."""
    fill: dict[int, int] = {}
    for rid, table in frame.block_tables.items():
        n = frame.num_tokens.get(rid, 0)
        for i, block_id in enumerate(table):
            held = max(0, min(frame.block_size, n - i * frame.block_size))
            fill[block_id] = max(fill.get(block_id, 0), held)
    return fill


def _new_axes(ax: Axes | None, size: tuple[float, float]):
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=size)
    return fig, ax


def plot_block_tables(
    frame: Frame, ax: Axes | None = None, colours: dict[str, tuple] | None = None
) -> Figure:
    """One row per request: logical block i → the physical block id that holds it.

    A shared block (ref_cnt > 1) gets a thick edge and its ref count, e.g. "3 ×2".
    The bar under each cell shows how many of its block_size slots are filled.
    """
    from matplotlib.patches import Rectangle

    rids = list(frame.block_tables)
    colours = colours or request_colours(rids)
    width = max([len(t) for t in frame.block_tables.values()] + [4])
    fig, ax = _new_axes(ax, (1.0 + 0.7 * width, 0.8 + 0.55 * max(len(rids), 1)))
    for row, rid in enumerate(rids):
        y = len(rids) - 1 - row
        n = frame.num_tokens.get(rid, 0)
        for i, block_id in enumerate(frame.block_tables[rid]):
            ref = frame.ref_cnt[block_id]
            shared = ref > 1
            ax.add_patch(
                Rectangle(
                    (i, y + 0.1),
                    0.9,
                    0.8,
                    facecolor=colours.get(rid, "grey"),
                    alpha=0.85,
                    edgecolor=_SHARED_EDGE if shared else "white",
                    linewidth=2.5 if shared else 1.0,
                    hatch="//" if shared else None,
                )
            )
            held = max(0, min(frame.block_size, n - i * frame.block_size))
            ax.add_patch(Rectangle((i, y + 0.1), 0.9 * held / frame.block_size, 0.1, facecolor="black"))
            label = f"{block_id}" + (f" ×{ref}" if shared else "")
            ax.text(
                i + 0.45,
                y + 0.55,
                label,
                ha="center",
                va="center",
                fontsize=9,
                color="black",
                fontweight="bold" if shared else "normal",
                # white behind the label of a hatched (shared) block, or the hatching hides it
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
                if shared
                else None,
            )
    if not rids:
        ax.text(width / 2, 0.5, "no request holds blocks", ha="center", va="center", color="#666666")
    ax.set_yticks([len(rids) - 1 - r + 0.5 for r in range(len(rids))], rids)
    ax.set_xticks([i + 0.45 for i in range(width)], [str(i) for i in range(width)])
    ax.set_xlim(-0.1, width)
    ax.set_ylim(0, max(len(rids), 1))
    ax.set_xlabel("logical block (label: physical block id, ×ref_cnt when shared)")
    ax.set_title("block tables")
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    return fig


def plot_memory_grid(
    frame: Frame, ax: Axes | None = None, ncols: int | None = None, colours: dict[str, tuple] | None = None
) -> Figure:
    """The physical blocks as a grid: owner's colour, ref count, fill; grey = free but cached."""
    from matplotlib.patches import Rectangle

    colours = colours or request_colours(list(frame.block_tables))
    owners: dict[int, list[str]] = {}
    for rid, table in frame.block_tables.items():
        for block_id in table:
            owners.setdefault(block_id, []).append(rid)
    fill = _block_fill(frame)
    dense = frame.num_blocks > 16  # small cells: short labels, or they run into each other
    ncols = ncols or (min(frame.num_blocks, 8) if not dense else 16)
    nrows = -(-frame.num_blocks // ncols)
    # white behind the labels: hatched (shared) and dark blocks stay readable
    label_box = {"boxstyle": "square,pad=0.08", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
    fig, ax = _new_axes(ax, (0.75 * ncols + 1.0, 0.75 * nrows + 0.9))
    free_pos = {b: i for i, b in enumerate(frame.free_queue)}
    for block_id in range(frame.num_blocks):
        r, c = divmod(block_id, ncols)
        x, y = c, nrows - 1 - r
        ref = frame.ref_cnt[block_id]
        who = owners.get(block_id, [])
        if ref > 0:
            face = colours.get(who[0], "grey") if who else "grey"
        else:
            face = _CACHED if frame.block_hash[block_id] else _FREE
        shared = ref > 1
        ax.add_patch(
            Rectangle(
                (x + 0.05, y + 0.05),
                0.9,
                0.9,
                facecolor=face,
                alpha=0.85 if ref else 1.0,
                edgecolor=_SHARED_EDGE if shared else "#999999",
                linewidth=2.5 if shared else 0.8,
                hatch="//" if shared else None,
            )
        )
        if ref > 0:
            ax.add_patch(
                Rectangle(
                    (x + 0.05, y + 0.05),
                    0.9 * fill.get(block_id, 0) / frame.block_size,
                    0.1,
                    facecolor="black",
                )
            )
        ax.text(
            x + 0.5,
            y + 0.62,
            str(block_id),
            ha="center",
            va="center",
            fontsize=7 if dense else 9,
            fontweight="bold" if shared else "normal",
            bbox=label_box if shared else None,
        )
        sub = f"ref {ref}" if ref else (f"free #{free_pos[block_id]}" if block_id in free_pos else "")
        if frame.block_hash[block_id] and not ref:
            sub = f"cached #{free_pos.get(block_id, '?')}"
        if dense:  # the free queue's order is in the title; a cell keeps only what sets it apart
            sub = f"×{ref}" if shared else ("cached" if frame.block_hash[block_id] and not ref else "")
        if sub:
            ax.text(
                x + 0.5,
                y + 0.3,
                sub,
                ha="center",
                va="center",
                fontsize=5.5 if dense else 6.5,
                color="#222222",
                bbox=label_box if shared else None,
            )
    ax.set_xlim(0, ncols)
    ax.set_ylim(0, nrows)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(  # two lines: one is wider than a grid of 8 columns
        f"physical blocks — usage {frame.usage:.0%}\nfree queue front→back "
        f"{frame.free_queue[:6]}{'…' if len(frame.free_queue) > 6 else ''}",
        fontsize=9,
    )
    return fig


def plot_frame(frame: Frame, colours: dict[str, tuple] | None = None, ncols: int | None = None) -> Figure:
    """Block tables and physical grid side by side, titled with the event."""
    import matplotlib.pyplot as plt

    colours = colours or request_colours(list(frame.block_tables))
    grid_rows = -(
        -frame.num_blocks // (ncols or (min(frame.num_blocks, 8) if frame.num_blocks <= 16 else 16))
    )
    height = max(3.2, 0.5 * max(grid_rows, len(frame.block_tables)) + 1.3)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, height), gridspec_kw={"width_ratios": [1.2, 1]})
    plot_block_tables(frame, ax=left, colours=colours)
    plot_memory_grid(frame, ax=right, ncols=ncols, colours=colours)
    hits = (
        f"prefix cache {frame.prefix_cache_hits}/{frame.prefix_cache_queries} tokens hit"
        if frame.prefix_cache_queries
        else ""
    )
    fig.suptitle(f"[{frame.index}] {frame.description}    {hits}", fontsize=10, x=0.02, ha="left")
    fig.tight_layout()
    return fig


def plot_trace(
    frames: Sequence[Frame], indices: Sequence[int] | None = None, ncols: int | None = None
) -> list[Figure]:
    """Static figures of the chosen frames (all by default), colours consistent across them."""
    colours = request_colours(_frame_ids(frames))
    chosen = range(len(frames)) if indices is None else indices
    return [plot_frame(frames[i], colours=colours, ncols=ncols) for i in chosen]


def trace_stepper(frames: Sequence[Frame], ncols: int | None = None):
    """An ipywidgets stepper (play button, slider) over the frames; needs a widget front end."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    if not frames:
        raise ValueError("no frames to show: record some events with TraceRecorder first")
    colours = request_colours(_frame_ids(frames))
    out = widgets.Output()
    slider = widgets.IntSlider(
        value=0, min=0, max=len(frames) - 1, description="event", continuous_update=False
    )
    play = widgets.Play(value=0, min=0, max=len(frames) - 1, interval=900)
    widgets.jslink((play, "value"), (slider, "value"))

    def draw(change=None) -> None:
        with out:
            out.clear_output(wait=True)
            fig = plot_frame(frames[slider.value], colours=colours, ncols=ncols)
            display(fig)
            plt.close(fig)

    slider.observe(draw, names="value")
    draw()
    box = widgets.VBox([widgets.HBox([play, slider]), out])
    box.add_class(STEPPER_CLASS)  # a stable hook for the browser test (tests/test_browser.py)
    return box


def _widget_front_end() -> bool:
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show_trace(frames: Sequence[Frame], interactive: bool | None = None, ncols: int | None = None):
    """The stepper when a widget front end is there, else every frame as a static figure.

    `interactive=None` guesses (ipywidgets importable and a Jupyter kernel running); pass False
    under papermill or in a script to get static figures. Returns the widget or the figures.
    """
    import matplotlib.pyplot as plt

    if interactive is None:
        interactive = _widget_front_end()
    if interactive:
        from IPython.display import display

        box = trace_stepper(frames, ncols=ncols)
        display(box)
        return box
    figs = plot_trace(frames, ncols=ncols)
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            for fig in figs:
                display(fig)
                plt.close(fig)
    except ImportError:
        pass
    return figs


def plot_utilisation(timelines: Sequence, ax: Axes | None = None) -> Figure:
    """Tokens stored ÷ memory reserved per step for each MemoryTimeline (contiguous vs paged)."""
    fig, ax = _new_axes(ax, (8, 3.2))
    for tl in timelines:
        ax.plot(
            tl.utilisation,
            label=f"{tl.allocator} (mean {tl.mean_utilisation:.0%}, peak {tl.peak_running} running)",
        )
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("step (one decode iteration)")
    ax.set_ylabel("stored ÷ reserved")
    ax.set_title("KV memory utilisation")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def record_example(num_blocks: int = 8, block_size: int = 4) -> list[Frame]:
    """A short demo trace: shared system prompt, a prefix-cache hit, fork with copy-on-write, frees."""
    from lab_utils.kv.request import Request

    rec = TraceRecorder(KVCacheManager(num_blocks, block_size))
    system = list(range(100, 100 + 2 * block_size))
    a = Request("a", system + [1, 2])
    b = Request("b", system + [3])
    rec.allocate(a)
    rec.allocate(b)
    c = Request("a.1", list(a.prompt_token_ids), [], a.num_computed_tokens)
    rec.fork(a, c)
    rec.append(a, 11)
    rec.append(c, 12)
    rec.free(b)
    rec.free(a)
    rec.free(c)
    return rec.frames
