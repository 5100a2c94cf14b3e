"""Timeline plots: geometry on hand-checked runs, measured traces, the explorer and its fallback."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from lab_utils.sim import (  # noqa: E402
    ContinuousBatching,
    StaticBatching,
    StepCostModel,
    fixed_workload,
    poisson_workload,
    seed_scenario,
    simulate,
    sweep_load,
)
from lab_utils.sim.traces import trace_result  # noqa: E402
from lab_utils.viz.timeline import (  # noqa: E402
    TimelineExplorer,
    explorer_figure,
    plot_throughput_latency,
    plot_timeline,
    timeline_explorer,
    timeline_geometry,
)


def xs(verts):
    return [(round(v[0][0], 6), round(v[1][0], 6), round(v[0][1], 2)) for v in verts]


def test_static_seed_geometry_in_steps():
    res = simulate(seed_scenario(), StaticBatching(8), StepCostModel(fixed_s=0.01, per_token_s=0.0))
    geo = timeline_geometry(res, axis="step")
    assert xs(geo["prefill"][0]) == [(0.0, 1.0, s + 0.1) for s in range(8)]
    assert xs(geo["decode"][0]) == [(1.0, 50.0, s + 0.1) for s in range(7)] + [(1.0, 500.0, 7.1)]
    assert xs(geo["padding"]) == [(50.0, 500.0, s + 0.1) for s in range(7)]  # 7 slots held for 450 steps
    assert len(geo["idle"]) == 8 and geo["x_end"] == 500.0
    assert geo["prefill"][1][0] != geo["prefill"][1][1]  # a colour per request


def test_continuous_geometry_has_no_padding_and_marks_preemption():
    wl = fixed_workload([4, 4], [5, 5])
    cfg = ContinuousBatching(max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=3, block_size=4)
    geo = timeline_geometry(simulate(wl, cfg, StepCostModel(fixed_s=1.0, per_token_s=0.0)))
    assert geo["padding"] == []
    assert geo["preempted"] == ([1.0], [1.5])  # B left slot 1 at t=1
    assert xs(geo["decode"][0]) == [(1.0, 5.0, 0.1), (6.0, 9.0, 0.1)]


def test_measured_rows_are_packed_into_lanes():
    rows = [
        {
            "request_id": "a",
            "arrival_time": 10.0,
            "first_token_time": 10.5,
            "finish_time": 12.0,
            "output_len": 4,
        },
        {
            "request_id": "b",
            "arrival_time": 10.2,
            "first_token_time": 10.6,
            "finish_time": 11.0,
            "output_len": 2,
        },
        {
            "request_id": "c",
            "arrival_time": 11.5,
            "first_token_time": 11.7,
            "finish_time": 13.0,
            "output_len": 3,
        },
    ]
    res = trace_result(rows)
    assert res.measured and res.num_slots == 2
    assert [r.residencies[0].slot for r in res.requests] == [0, 1, 1]  # c reuses b's lane
    assert res.requests[0].ttft == pytest.approx(0.5)
    assert res.requests[2].arrival_time == pytest.approx(1.5)  # shifted so the first arrival is 0
    fig = plot_timeline(rows)
    assert "waiting + prefill" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    with pytest.raises(ValueError, match="axis='time'"):
        plot_timeline(res, axis="step")
    with pytest.raises(ValueError, match="first token"):
        trace_result([{**rows[0], "first_token_time": 9.0}])


def test_admission_is_inferred_from_max_concurrency():
    rows = [
        {"request_id": i, "arrival_time": 0.0, "first_token_time": ft, "finish_time": fin, "output_len": 2}
        for i, (ft, fin) in enumerate([(0.2, 1.0), (0.3, 2.0), (1.2, 1.5), (1.8, 3.0)])
    ]
    res = trace_result(rows, max_concurrency=2)
    assert [r.scheduled_time for r in res.requests] == [0.0, 0.0, 1.0, 1.5]  # waits for a free slot
    assert res.num_slots == 2
    assert [r.residencies[0].slot for r in res.requests] == [0, 1, 0, 0]


def test_static_trace_keeps_its_slots_and_padding():
    rows = [
        {
            "request_id": i,
            "arrival_time": 0.0,
            "scheduled_time": 0.0,
            "first_token_time": 0.1,
            "finish_time": f,
            "held_until": 1.0,
            "output_len": 3,
            "slot": i,
        }
        for i, f in enumerate([0.4, 1.0])
    ]
    geo = timeline_geometry(trace_result(rows, num_slots=4))
    assert geo["lanes"] == 4
    assert xs(geo["padding"]) == [(0.4, 1.0, 0.1)]


def test_plot_returns_a_figure_and_draws():
    res = simulate(seed_scenario(), ContinuousBatching(8, 512), StepCostModel(fixed_s=0.01, per_token_s=0.0))
    fig = plot_timeline(res, axis="time", title="seed")
    fig.canvas.draw()
    assert fig.axes[0].get_title() == "seed"
    assert fig.axes[0].get_xlim()[1] == pytest.approx(5.0 * 1.01)


def test_throughput_latency_plot_has_a_line_per_policy():
    rows = sweep_load(
        lambda rate: poisson_workload(20, rate, 16, 8, seed=0),
        {"static": StaticBatching(4), "continuous": ContinuousBatching(4, 64)},
        [1.0, 4.0],
        StepCostModel(0.01, 0.001),
    )
    assert [(r["policy"], r["rate"]) for r in rows] == [
        ("static", 1.0),
        ("continuous", 1.0),
        ("static", 4.0),
        ("continuous", 4.0),
    ]
    fig = plot_throughput_latency(rows, slo=1.0)
    assert len([ln for ln in fig.axes[0].get_lines() if ln.get_label() in ("static", "continuous")]) == 2


def test_explorer_updates_in_place_and_static_fallback():
    ex = TimelineExplorer()
    fig1 = ex.update("static", 4, 2.0)
    n_collections = len(ex.ax.collections)
    fig2 = ex.update("continuous", 8, 5.0)
    assert fig1 is fig2 and len(ex.ax.collections) == n_collections  # refilled, not stacked
    assert ex.ax.get_title().startswith("continuous(max_num_seqs=8)")
    grid = timeline_explorer(interactive=False)
    assert len(grid.axes) == 6
    with pytest.raises(ValueError, match="policy"):
        explorer_figure("round-robin")


def test_explorer_render_is_the_full_figure():
    import io

    import numpy as np
    from PIL import Image

    ex = TimelineExplorer(title=False)
    for setting in [("static", 8, 4.0), ("continuous", 32, 1.0), ("dynamic", 2, 20.0)]:
        png = ex.render(*setting)
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        pixels = np.asarray(Image.open(io.BytesIO(png)))
        ex.fig.canvas.draw()  # everything, legend and labels included, from scratch
        assert np.array_equal(pixels, np.asarray(ex.fig.canvas.buffer_rgba())), setting
    assert ex.summary.startswith("dynamic(max_batch_size=2") and not ex.ax.title.get_visible()


def test_explorer_widget_sends_new_png_bytes_when_a_control_changes():
    pytest.importorskip("ipywidgets")
    box = timeline_explorer()
    controls, summary, image = box.children
    policy, batch, load = controls.children
    seen = [bytes(image.value)]
    assert seen[0].startswith(b"\x89PNG\r\n\x1a\n") and summary.value.startswith("continuous(max_num_seqs=8)")
    for control, value in [(batch, 4), (policy, "static"), (load, 8.0)]:
        control.value = value
        png = bytes(image.value)
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and png not in seen, (control.description, value)
        seen.append(png)
    assert summary.value.startswith("static(batch_size=4) at 8 req/s")
