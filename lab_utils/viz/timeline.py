"""Batching timelines: which request sits in which batch slot, when, doing what.

Each horizontal lane is a batch slot. A request is one colour; the hatched part of its bar is
prefill (for a measured trace: waiting + prefill, arrival to first token), the solid part is
decode, grey cross-hatching is a slot held by a finished request that still computes padding
(static batching), and bare lane is an idle slot. The same function draws a simulation
(`SimResult`) and a real run (`lab_utils.sim.traces.trace_result` of measured times).

matplotlib and ipywidgets are imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lab_utils.sim.results import SimResult

PADDING_COLOUR = "#9e9e9e"
IDLE_COLOUR = "#f3f3f3"


def _as_result(source) -> SimResult:
    if isinstance(source, SimResult):
        return source
    from lab_utils.sim.traces import trace_result

    return trace_result(list(source))


def request_colours(request_ids: Sequence) -> dict:
    """A stable colour per request (cycling through matplotlib's tab20)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {rid: cmap(i % 20) for i, rid in enumerate(request_ids)}


def _step_axis(result: SimResult):
    """Map step start/end times to step indices (for axis='step')."""
    import bisect

    starts = {s.start: i for i, s in enumerate(result.steps)}
    ends = {s.end: i + 1 for i, s in enumerate(result.steps)}
    start_times = [s.start for s in result.steps]

    def to_step(t: float, is_end: bool) -> float:
        table = ends if is_end else starts
        if t in table:
            return float(table[t])
        return float(bisect.bisect_left(start_times, t))  # a time between steps (an idle gap)

    return to_step


def _rect(x0: float, x1: float, y0: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def timeline_geometry(result: SimResult, axis: str = "time", lanes: int | None = None) -> dict:
    """The rectangles of a timeline, before drawing: prefill / decode / padding / idle boxes and markers.

    Returns a dict with "prefill" and "decode" ([verts], [colours]), "padding" and "idle" [verts],
    "preempted" ([x], [y]), "labels" [(x, y, text)] and "x_end".
    """
    if axis not in ("time", "step"):
        raise ValueError(f"axis must be 'time' or 'step', got {axis!r}")
    if axis == "step" and not result.steps:
        raise ValueError("axis='step' needs step records; a measured trace only has times, use axis='time'")
    to_x = _step_axis(result) if axis == "step" else (lambda t, is_end: t)
    lanes = result.num_slots if lanes is None else min(result.num_slots, lanes)
    colours = request_colours([r.request_id for r in result.requests])
    geo = {
        "prefill": ([], []),
        "decode": ([], []),
        "padding": [],
        "idle": [],
        "preempted": ([], []),
        "labels": [],
        "x_end": 0.0,
        "lanes": lanes,
    }
    x_end = 0.0
    for r in result.requests:
        colour = colours[r.request_id]
        for res in r.residencies:
            if res.slot >= lanes:
                continue
            y0, y1 = res.slot + 0.1, res.slot + 0.9
            x0, xp, x1 = to_x(res.start, False), to_x(res.prefill_end, True), to_x(res.end, True)
            if xp > x0:
                geo["prefill"][0].append(_rect(x0, xp, y0, y1))
                geo["prefill"][1].append(colour)
            if x1 > xp:
                geo["decode"][0].append(_rect(xp, x1, y0, y1))
                geo["decode"][1].append(colour)
            if res.held_until is not None and res.held_until > res.end:
                geo["padding"].append(_rect(x1, to_x(res.held_until, True), y0, y1))
            if res.end != r.finish_time:  # this stay ended in a preemption
                geo["preempted"][0].append(x1)
                geo["preempted"][1].append(res.slot + 0.5)
            geo["labels"].append(((x0 + x1) / 2, res.slot + 0.5, str(r.request_id)))
            x_end = max(x_end, to_x(res.release, True))
    geo["idle"] = [_rect(0, x_end, s + 0.05, s + 0.95) for s in range(lanes)]
    geo["x_end"] = x_end
    return geo


def _legend_handles(measured: bool) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    return [
        Patch(
            facecolor="#777777",
            alpha=0.55,
            hatch="////",
            label="waiting + prefill" if measured else "prefill",
        ),
        Patch(facecolor="tab:blue", label="decode (each request its colour)"),
        Patch(facecolor=PADDING_COLOUR, alpha=0.6, hatch="xx", label="padding (finished, slot held)"),
        Patch(facecolor=IDLE_COLOUR, edgecolor="#cccccc", label="idle slot"),
        Line2D([], [], color="red", marker="x", linestyle="none", label="preempted"),
    ]


class _TimelineArtists:
    """The artists of one timeline Axes, created once and refilled by `set`."""

    def __init__(self, ax, measured: bool, lanes: int, legend: bool = True) -> None:
        from matplotlib.collections import PolyCollection

        self.ax = ax
        self.idle = ax.add_collection(PolyCollection([], facecolors=IDLE_COLOUR, edgecolors="none"))
        self.prefill = ax.add_collection(
            PolyCollection([], edgecolors="white", hatch="////", alpha=0.55, linewidths=0.3)
        )
        self.decode = ax.add_collection(PolyCollection([], edgecolors="white", linewidths=0.3))
        self.padding = ax.add_collection(
            PolyCollection(
                [], facecolors=PADDING_COLOUR, edgecolors="white", hatch="xx", alpha=0.6, linewidths=0.3
            )
        )
        (self.preempted,) = ax.plot([], [], "rx", markersize=6)
        self.texts: list = []
        if legend:
            ax.legend(
                handles=_legend_handles(measured),
                loc="lower center",
                bbox_to_anchor=(0.5, 1.0),
                ncol=5,
                fontsize=8,
                frameon=False,
                borderaxespad=0.2,
            )

    def set(self, geo: dict, label_requests: bool) -> None:
        self.idle.set_verts(geo["idle"])
        self.prefill.set_verts(geo["prefill"][0])
        self.prefill.set_facecolor(geo["prefill"][1])
        self.decode.set_verts(geo["decode"][0])
        self.decode.set_facecolor(geo["decode"][1])
        self.padding.set_verts(geo["padding"])
        self.preempted.set_data(*geo["preempted"])
        for t in self.texts:
            t.remove()
        self.texts = (
            [self.ax.text(x, y, s, ha="center", va="center", fontsize=7) for x, y, s in geo["labels"]]
            if label_requests
            else []
        )
        x_end, lanes = geo["x_end"], geo["lanes"]
        self.ax.set_xlim(0, x_end * 1.01 if x_end > 0 else 1)
        self.ax.set_ylim(lanes, 0)
        if lanes <= 40:
            shown = range(0, lanes, self._lane_tick_step(lanes))
            self.ax.set_yticks([s + 0.5 for s in shown], [str(s) for s in shown])

    def _lane_tick_step(self, lanes: int) -> int:
        """Label every lane while the labels fit the Axes' height, else every 2nd, 3rd, ... lane."""
        import math

        import matplotlib
        from matplotlib.font_manager import FontProperties

        label_pt = 1.3 * FontProperties(size=matplotlib.rcParams["ytick.labelsize"]).get_size_in_points()
        height_pt = self.ax.get_position().height * self.ax.figure.get_figheight() * 72
        return max(1, math.ceil(lanes * label_pt / max(height_pt, 1.0)))


def plot_timeline(
    source,
    *,
    axis: str = "time",
    ax=None,
    title: str | None = None,
    max_slots: int | None = None,
    label_requests: bool | None = None,
):
    """Draw batch slots over time (or steps): a colour per request, prefill hatched, padding grey, idle bare.

    Args:
        source: a SimResult (simulated or measured) or a list of measured request rows
            (dicts with request_id, arrival_time, first_token_time, finish_time; see traces).
        axis: "time" (seconds) or "step" (engine steps; simulations only).
        ax: draw into this Axes instead of a new Figure.
        max_slots: draw only the first lanes (a 256-slot engine is unreadable otherwise).
        label_requests: write request ids on the bars (default: when there are few requests).
    Returns:
        the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    result = _as_result(source)
    geo = timeline_geometry(result, axis, max_slots)
    new_figure = ax is None
    if new_figure:
        fig, ax = plt.subplots(figsize=(10, 0.9 + 0.32 * min(geo["lanes"], 40)))
    else:
        fig = ax.figure
    if label_requests is None:
        label_requests = len(result.requests) <= 40
    _TimelineArtists(ax, result.measured, geo["lanes"]).set(geo, label_requests)
    ax.set_ylabel("batch slot")
    ax.set_xlabel("engine step" if axis == "step" else "time (s)")
    ax.set_title(title or result.policy, fontsize=10, pad=22)
    if new_figure:
        fig.tight_layout()  # costly (it measures every label); the explorer keeps its layout
    return fig


def plot_throughput_latency(
    rows: list[dict],
    *,
    latency: str = "e2e_p99",
    throughput: str = "output_tokens_per_s",
    ax=None,
    slo: float | None = None,
):
    """Throughput against a latency percentile, one line per policy, one point per load (rows of `sweep_load`)."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
    else:
        fig = ax.figure
    ax.set_yscale("log")
    notes = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        pts = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["rate"])
        ax.plot([p[throughput] for p in pts], [p[latency] for p in pts], "o-", label=policy)
        for p in pts:
            notes.append(
                ax.annotate(
                    f"{p['rate']:g}/s",
                    (p[throughput], p[latency]),
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(3, 3),
                )
            )
    if slo is not None:
        ax.axhline(slo, color="red", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    ax.set_xlabel(throughput.replace("_", " "))
    ax.set_ylabel(f"{latency.replace('_', ' ')} (s)")
    ax.set_title("throughput vs latency as the arrival rate grows (labels: requests/s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _drop_covered_notes(ax, notes)
    return fig


def _drop_covered_notes(ax, notes: list) -> None:
    """Remove each rate label that would print over one kept before it (lines that meet at low load)."""
    from lab_utils.viz.readable import overlaps

    ax.get_xlim(), ax.get_ylim()  # settle the autoscaled limits the labels are placed by
    kept = []
    for note in notes:
        box = note.get_window_extent()
        if any(overlaps(box, other) for other in kept):
            note.remove()
        else:
            kept.append(box)


def explorer_result(
    policy: str = "continuous",
    batch_size: int = 8,
    load: float = 2.0,
    *,
    make_workload: Callable[[float], list] | None = None,
    cost=None,
) -> tuple[SimResult, str]:
    """Simulate one explorer setting; returns the result and a one-line summary for the title.

    Args:
        policy: "static", "continuous" or "dynamic".
        batch_size: static batch size / max_num_seqs / Triton's max_batch_size.
        load: arrival rate in requests per second.
        make_workload: rate -> workload (default: 32 requests, mixed lengths, seed 0).
    """
    from lab_utils.sim import (
        ContinuousBatching,
        DynamicBatching,
        LengthDist,
        StaticBatching,
        StepCostModel,
        poisson_workload,
        simulate,
        summarize,
    )

    if make_workload is None:

        def make_workload(rate: float) -> list:
            return poisson_workload(
                32,
                rate,
                LengthDist("uniform", low=16, high=128),
                LengthDist("choice", values=(8, 16, 32, 96)),
                seed=0,
            )

    cost = cost or StepCostModel(fixed_s=0.02, per_token_s=0.0005, per_context_token_s=0.0)
    batch_size = int(batch_size)
    if policy == "static":
        cfg = StaticBatching(batch_size)
    elif policy == "continuous":
        cfg = ContinuousBatching(batch_size, max(512, batch_size))
    elif policy == "dynamic":
        cfg = DynamicBatching(batch_size, max_queue_delay_microseconds=50_000)
    else:
        raise ValueError(f"policy must be 'static', 'continuous' or 'dynamic', got {policy!r}")
    result = simulate(make_workload(float(load)), cfg, cost)
    m = summarize(result)
    if policy == "dynamic":  # one forward pass answers a whole request: its tok/s is not an LLM's
        return result, (
            f"{cfg.name} at {load:.3g} req/s: one-shot model, one pass per request (tok/s not comparable "
            f"with LLM decoding), {len(result.requests) / max(len(result.steps), 1):.1f} requests per pass, "
            f"p50 latency {m.ttft_p50:.2f} s"
        )
    return result, (
        f"{cfg.name} at {load:.3g} req/s: {m.output_tokens_per_s:.0f} tok/s, "
        f"p50 TTFT {m.ttft_p50:.2f} s, slot use {m.slot_utilisation:.0%}"
    )


def explorer_figure(
    policy: str = "continuous",
    batch_size: int = 8,
    load: float = 2.0,
    *,
    make_workload: Callable[[float], list] | None = None,
    cost=None,
    axis: str = "time",
    ax=None,
):
    """The timeline the explorer shows for one setting, as a Figure (or drawn into `ax`)."""
    result, title = explorer_result(policy, batch_size, load, make_workload=make_workload, cost=cost)
    return plot_timeline(
        result, ax=ax, axis=axis, label_requests=False, max_slots=32, title=_wrap_title(title)
    )


def _wrap_title(title: str, width: int = 110) -> str:
    """A summary line on two lines when it is wider than a 10-inch figure (the dynamic policy's is)."""
    import textwrap

    return textwrap.fill(title, width)


EXPLORER_CLASS = "lab-timeline-explorer"  # CSS class on the explorer's outer box in the page
EXPLORER_DPI = (
    72  # the widget's image: 10 inches = 720 pixels wide; more dots cost more milliseconds per update
)


class TimelineExplorer:
    """One figure whose artists are refilled for each (policy, batch size, load): what the widget drives.

    A widget update must feel instant (< 100 ms). Letting IPython display the figure costs a full
    draw at 100 dpi plus a tight bounding box (100-200 ms on a 2-core machine), so `render` does
    less: what never changes (legend, axis labels) is drawn once into a background that is copied
    back each time; only the Axes is redrawn, at `dpi`, and encoded as a fast-compressed PNG for an
    `ipywidgets.Image`. Text is the costliest thing Agg draws, so with `title=False` the one-line
    summary is left to the widget (`summary`, drawn by the browser). See `bench/sim_speed.py`.
    """

    def __init__(
        self,
        make_workload: Callable[[float], list] | None = None,
        cost=None,
        *,
        dpi: int = EXPLORER_DPI,
        title: bool = True,
    ) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.make_workload = make_workload
        self.cost = cost
        self.summary = ""  # the setting and its throughput/latency, one line (the Axes title)
        # a Figure outside pyplot: the notebook never shows it by itself, only the PNG of `render`
        self.fig = Figure(figsize=(10, 4.2 if title else 3.8), dpi=dpi)
        FigureCanvasAgg(self.fig)
        self.ax = self.fig.add_subplot()
        left, right, top, bottom = 0.07, 0.98, 0.83 if title else 0.91, 0.12
        self.fig.subplots_adjust(left=left, right=right, top=top, bottom=bottom)
        self.ax.title.set_visible(title)
        self.artists = _TimelineArtists(self.ax, False, 8, legend=False)
        # legend and axis labels hang on the figure, where the Axes would put them: background
        self.fig.legend(
            handles=_legend_handles(False),
            loc="lower center",
            bbox_to_anchor=((left + right) / 2, top),
            ncol=5,
            fontsize=8,
            frameon=False,
            borderaxespad=0.2,
        )
        self.fig.text((left + right) / 2, 0.015, "time (s)", ha="center", va="bottom")
        self.fig.text(0.012, (top + bottom) / 2, "batch slot", rotation=90, ha="left", va="center")
        self._background = None  # (canvas size, saved pixels of everything but the Axes)

    def update(self, policy: str = "continuous", batch_size: int = 8, load: float = 2.0):
        """Re-simulate and refill the timeline; returns the Figure."""
        result, title = explorer_result(
            policy, batch_size, load, make_workload=self.make_workload, cost=self.cost
        )
        self.artists.set(timeline_geometry(result, "time", 32), label_requests=False)
        self.summary = title
        self.ax.set_title(_wrap_title(title), fontsize=10, pad=22)
        return self.fig

    def png(self) -> bytes:
        """The figure as it stands, as PNG bytes: the saved background plus a fresh draw of the Axes."""
        import io

        import numpy as np
        from PIL import Image  # matplotlib depends on Pillow

        canvas = self.fig.canvas
        size = canvas.get_width_height()
        if self._background is None or self._background[0] != size:
            self.ax.set_visible(False)
            canvas.draw()
            self._background = (size, canvas.copy_from_bbox(self.fig.bbox))
            self.ax.set_visible(True)
        canvas.restore_region(self._background[1])
        self.fig.draw_artist(self.ax)
        buf = io.BytesIO()
        # compress_level 1 encodes about 1.6x faster than the default (6) for a file about 15% larger
        Image.fromarray(np.asarray(canvas.buffer_rgba())).save(buf, format="png", compress_level=1)
        return buf.getvalue()

    def render(self, policy: str = "continuous", batch_size: int = 8, load: float = 2.0) -> bytes:
        """One widget update, everything the learner waits for: simulate, refill the artists, PNG bytes."""
        self.update(policy, batch_size, load)
        return self.png()


def timeline_explorer(
    make_workload: Callable[[float], list] | None = None, cost=None, *, interactive: bool = True
):
    """Controls for policy, batch size and load over a live timeline; a static grid without ipywidgets.

    Returns the ipywidgets box (display it) or, when ipywidgets is missing or `interactive` is
    False, one Figure with the three policies side by side at two loads. Each change of a control
    replaces the PNG bytes of the box's `ipywidgets.Image` (`TimelineExplorer.render`).
    """
    if interactive:
        try:
            import ipywidgets as widgets
        except ImportError:
            interactive = False
    if not interactive:
        return _static_grid(make_workload, cost)

    explorer = TimelineExplorer(make_workload, cost, title=False)
    policy = widgets.Dropdown(
        options=["static", "continuous", "dynamic"], value="continuous", description="policy"
    )
    batch = widgets.IntSlider(value=8, min=1, max=32, description="batch size")
    load = widgets.FloatLogSlider(value=2.0, base=10, min=-1, max=1.5, step=0.05, description="req/s")
    image = widgets.Image(format="png")
    summary = widgets.Label()

    def redraw(_=None) -> None:
        image.value = explorer.render(policy.value, batch.value, load.value)
        summary.value = explorer.summary

    for w in (policy, batch, load):
        w.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([widgets.HBox([policy, batch, load]), summary, image])
    box.add_class(EXPLORER_CLASS)  # a stable hook for the browser test (tests/test_browser.py)
    return box


def _static_grid(make_workload, cost):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(15, 11))
    for row, policy in enumerate(("static", "continuous", "dynamic")):
        for col, load in enumerate((1.0, 8.0)):
            ax = axes[row][col]
            explorer_figure(policy, 8, load, make_workload=make_workload, cost=cost, ax=ax)
            ax.get_legend().remove()  # one legend for the six: each is wider than half the figure
            # the summary, wider than half the figure on one line, would run into its neighbour's
            ax.set_title(_wrap_title(ax.get_title(), 100), fontsize=8, pad=4)
    fig.legend(handles=_legend_handles(False), loc="upper center", ncol=5, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig
