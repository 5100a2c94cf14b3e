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
    starts = {s.start: i for i, s in enumerate(result.steps)}
    ends = {s.end: i + 1 for i, s in enumerate(result.steps)}

    def to_step(t: float, is_end: bool) -> float:
        table = ends if is_end else starts
        if t in table:
            return float(table[t])
        import bisect

        times = [s.start for s in result.steps]
        return float(bisect.bisect_left(times, t))

    return to_step


def plot_timeline(source, *, axis: str = "time", ax=None, title: str | None = None,
                  max_slots: int | None = None, label_requests: bool | None = None):
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
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    result = _as_result(source)
    if axis not in ("time", "step"):
        raise ValueError(f"axis must be 'time' or 'step', got {axis!r}")
    if axis == "step" and not result.steps:
        raise ValueError("axis='step' needs step records; a measured trace only has times, use axis='time'")
    to_x = _step_axis(result) if axis == "step" else (lambda t, is_end: t)
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.9 + 0.32 * min(result.num_slots, max_slots or 10 ** 9, 40)))
    else:
        fig = ax.figure
    ids = [r.request_id for r in result.requests]
    colours = request_colours(ids)
    lanes = result.num_slots if max_slots is None else min(result.num_slots, max_slots)
    if label_requests is None:
        label_requests = len(ids) <= 40

    prefill, decode, padding = ([], [], []), ([], [], []), []
    preempt_x, preempt_y = [], []
    t_end = 0.0
    for r in result.requests:
        for res in r.residencies:
            if res.slot >= lanes:
                continue
            y0, y1 = res.slot + 0.1, res.slot + 0.9
            x0, xp, x1 = to_x(res.start, False), to_x(res.prefill_end, True), to_x(res.end, True)
            if xp > x0:
                prefill[0].append([(x0, y0), (xp, y0), (xp, y1), (x0, y1)])
                prefill[1].append(colours[r.request_id])
            if x1 > xp:
                decode[0].append([(xp, y0), (x1, y0), (x1, y1), (xp, y1)])
                decode[1].append(colours[r.request_id])
            if res.held_until is not None and res.held_until > res.end:
                xh = to_x(res.held_until, True)
                padding.append([(x1, y0), (xh, y0), (xh, y1), (x1, y1)])
            if res.end != r.finish_time:  # preempted here
                preempt_x.append(x1)
                preempt_y.append(res.slot + 0.5)
            if label_requests and x1 > x0:
                ax.text((x0 + x1) / 2, res.slot + 0.5, str(r.request_id), ha="center", va="center", fontsize=7)
            t_end = max(t_end, to_x(res.release, True))
    ax.add_collection(PolyCollection([[(0, s + 0.05), (t_end, s + 0.05), (t_end, s + 0.95), (0, s + 0.95)]
                                      for s in range(lanes)], facecolors=IDLE_COLOUR, edgecolors="none"))
    if prefill[0]:
        ax.add_collection(PolyCollection(prefill[0], facecolors=prefill[1], edgecolors="white",
                                         hatch="////", alpha=0.55, linewidths=0.3))
    if decode[0]:
        ax.add_collection(PolyCollection(decode[0], facecolors=decode[1], edgecolors="white", linewidths=0.3))
    if padding:
        ax.add_collection(PolyCollection(padding, facecolors=PADDING_COLOUR, edgecolors="white",
                                         hatch="xx", alpha=0.6, linewidths=0.3))
    if preempt_x:
        ax.plot(preempt_x, preempt_y, "rx", markersize=6, label="preempted")
    ax.set_xlim(0, t_end * 1.01 if t_end > 0 else 1)
    ax.set_ylim(lanes, 0)
    ax.set_ylabel("batch slot")
    ax.set_xlabel("engine step" if axis == "step" else "time (s)")
    if lanes <= 40:
        ax.set_yticks([s + 0.5 for s in range(lanes)], [str(s) for s in range(lanes)])
    first_label = "waiting + prefill" if result.measured else "prefill"
    handles = [Patch(facecolor="#777777", alpha=0.55, hatch="////", label=first_label),
               Patch(facecolor="#555555", label="decode"),
               Patch(facecolor=PADDING_COLOUR, alpha=0.6, hatch="xx", label="padding (finished, slot held)"),
               Patch(facecolor=IDLE_COLOUR, edgecolor="#cccccc", label="idle slot")]
    if preempt_x:
        handles.append(ax.lines[-1])
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18 if lanes <= 12 else -0.08),
              ncol=len(handles), fontsize=8, frameon=False)
    ax.set_title(title or result.policy)
    fig.tight_layout()
    return fig


def plot_throughput_latency(rows: list[dict], *, latency: str = "e2e_p99", throughput: str = "output_tokens_per_s",
                            ax=None, slo: float | None = None):
    """Throughput against a latency percentile, one line per policy, one point per load (rows of `sweep_load`)."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
    else:
        fig = ax.figure
    for policy in dict.fromkeys(r["policy"] for r in rows):
        pts = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["rate"])
        ax.plot([p[throughput] for p in pts], [p[latency] for p in pts], "o-", label=policy)
        for p in pts:
            ax.annotate(f"{p['rate']:g}/s", (p[throughput], p[latency]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    if slo is not None:
        ax.axhline(slo, color="red", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    ax.set_xlabel(throughput.replace("_", " "))
    ax.set_ylabel(f"{latency.replace('_', ' ')} (s)")
    ax.set_yscale("log")
    ax.set_title("throughput vs latency as the arrival rate grows (labels: requests/s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def explorer_figure(policy: str = "continuous", batch_size: int = 8, load: float = 2.0, *,
                    make_workload: Callable[[float], list] | None = None, cost=None, axis: str = "time",
                    ax=None):
    """The figure the interactive explorer shows for one setting: simulate, then draw the timeline.

    Args:
        policy: "static", "continuous" or "dynamic".
        batch_size: static batch size / max_num_seqs / Triton's max_batch_size.
        load: arrival rate in requests per second.
        make_workload: rate -> workload (default: 32 requests, mixed lengths, seed 0).
    """
    import matplotlib.pyplot as plt

    from lab_utils.sim import (ContinuousBatching, DynamicBatching, LengthDist, StaticBatching,
                               StepCostModel, poisson_workload, simulate, summarize)

    if make_workload is None:
        def make_workload(rate: float) -> list:
            return poisson_workload(32, rate, LengthDist("uniform", low=16, high=128),
                                    LengthDist("choice", values=(8, 16, 32, 96)), seed=0)
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
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.9 + 0.32 * min(batch_size, 32)))
    return plot_timeline(result, ax=ax, axis=axis, label_requests=False,
                  title=(f"{cfg.name} at {load:g} req/s — {m.output_tokens_per_s:.0f} tok/s, "
                         f"p50 TTFT {m.ttft_p50:.2f} s, slot use {m.slot_utilisation:.0%}"))


def timeline_explorer(make_workload: Callable[[float], list] | None = None, cost=None, *,
                      interactive: bool = True):
    """Sliders for policy, batch size and load over a live timeline; a static grid without ipywidgets.

    Returns the ipywidgets box (display it) or, when ipywidgets is missing or `interactive` is
    False, one Figure with the three policies side by side at two loads.
    """
    if interactive:
        try:
            import ipywidgets as widgets
        except ImportError:
            interactive = False
    if not interactive:
        return _static_grid(make_workload, cost)
    import matplotlib.pyplot as plt
    from IPython.display import display

    policy = widgets.Dropdown(options=["static", "continuous", "dynamic"], value="continuous", description="policy")
    batch = widgets.IntSlider(value=8, min=1, max=32, description="batch size")
    load = widgets.FloatLogSlider(value=2.0, base=10, min=-1, max=1.5, step=0.05, description="req/s")
    out = widgets.Output()

    def redraw(_=None) -> None:
        with out:
            out.clear_output(wait=True)
            fig = explorer_figure(policy.value, batch.value, load.value, make_workload=make_workload, cost=cost)
            display(fig)
            plt.close(fig)

    for w in (policy, batch, load):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([policy, batch, load]), out])


def _static_grid(make_workload, cost):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(15, 11))
    for row, policy in enumerate(("static", "continuous", "dynamic")):
        for col, load in enumerate((1.0, 8.0)):
            explorer_figure(policy, 8, load, make_workload=make_workload, cost=cost, ax=axes[row][col])
            axes[row][col].title.set_fontsize(8)
    fig.tight_layout()
    return fig
