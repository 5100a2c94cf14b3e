"""The course library's figures read: no overlapping tick labels, no legend over data, no texts
on top of each other (`lab_utils.viz.readable.problems`, matplotlib's own bounding boxes, Agg).

Each figure is built the way a lab builds it, on small inputs of the lab's shape. Figures drawn
only inside a notebook are checked where CI runs the solutions (tests/test_notebooks.py,
test_zz_solution_figures_read, through the kernel hook lab_utils.viz.figure_check, tested last
here). The tests before the hook's show the checker fails on bad figures.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lab_utils.viz.readable import problems  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def assert_reads(fig) -> None:
    found = problems(fig)
    assert found == [], "\n".join(found)


# ---- lab 02 and lab 04: block tables and the physical grid ------------------------------------


def lab02_frames():
    """Lab 02's first trace: 12 blocks of 4, two requests decode, one is freed, a third reuses."""
    from lab_utils.kv import KVCacheManager, Request, TraceRecorder

    rec = TraceRecorder(KVCacheManager(num_blocks=12, block_size=4, enable_caching=False))
    a, b, c = (
        Request("a", list(range(10))),
        Request("b", list(range(20, 25))),
        Request("c", list(range(40, 47))),
    )
    rec.allocate(a)
    rec.allocate(b)
    for t in range(3):
        rec.append(a, 100 + t)
        rec.append(b, 200 + t)
    rec.free(a)
    rec.allocate(c)
    return rec.frames


def lab04_frames(caching: bool):
    """Lab 04's roomy cache: 64 blocks of 8, the scenario's three prompts, 10 tokens each."""
    from lab_utils.kv import KVCacheManager, Request, TraceRecorder

    rec = TraceRecorder(KVCacheManager(num_blocks=64, block_size=8, enable_caching=caching))
    shared = list(range(500, 516)) if caching else []
    reqs = [
        Request(f"req-{i}", shared + list(range(1000 * i, 1000 * i + n))) for i, n in enumerate([16, 21, 23])
    ]
    for r in reqs:
        rec.allocate(r)
    for step in range(10):
        for r in reqs:
            rec.append(r, 9000 + step)
    rec.free(reqs[1])
    return rec.frames


def test_lab02_trace_frames_read():
    from lab_utils.viz.blocks import plot_trace

    for fig in plot_trace(lab02_frames()):
        assert_reads(fig)


def test_lab02_fork_and_copy_on_write_frames_read():
    from lab_utils.viz.blocks import plot_trace, record_example

    for fig in plot_trace(record_example()):
        assert_reads(fig)


@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "prefix-cache"])
def test_lab04_64_block_frames_read(caching):
    from lab_utils.viz.blocks import plot_trace

    frames = lab04_frames(caching)
    picks = sorted({0, len(frames) // 3, 2 * len(frames) // 3, len(frames) - 2})  # lab 04's choice
    for fig in plot_trace(frames, indices=picks):
        assert_reads(fig)


@pytest.mark.parametrize("num_requests", [60, 300], ids=["light", "default"])
def test_lab02_utilisation_plot_reads(num_requests):
    from lab_utils.kv import make_workload, simulate_contiguous, simulate_paged
    from lab_utils.viz.blocks import plot_utilisation

    w = make_workload(
        num_requests, seed=0, max_tokens=512, prompt_len=(16, 256), mean_output_len=100, arrivals_per_step=0.5
    )
    assert_reads(plot_utilisation([simulate_contiguous(w, 8192), simulate_paged(w, 8192, 16)]))


# ---- lab 03: batching timelines, throughput against latency, the explorer ---------------------


def test_lab03_step_timelines_read():
    from lab_utils.sim import ContinuousBatching, StaticBatching, StepCostModel, seed_scenario, simulate
    from lab_utils.viz.timeline import plot_timeline

    flat = StepCostModel(fixed_s=0.01, per_token_s=0.0)
    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5))
    plot_timeline(simulate(seed_scenario(), StaticBatching(4), flat), axis="step", ax=axes[0])
    plot_timeline(
        simulate(seed_scenario(), ContinuousBatching(4, 512), flat),
        axis="step",
        ax=axes[1],
        title="continuous batching, no other requests waiting",
    )
    fig.tight_layout()
    assert_reads(fig)


def test_lab03_tight_kv_timelines_read():
    from lab_utils.sim import ContinuousBatching, LengthDist, StepCostModel, poisson_workload, simulate
    from lab_utils.viz.timeline import plot_timeline

    trace = poisson_workload(
        16,
        rate=6.0,
        prompt_len=LengthDist("uniform", low=8, high=48),
        output_len=LengthDist("uniform", low=4, high=24),
        seed=0,
    )
    tight_kv = ContinuousBatching(max_num_seqs=4, max_num_batched_tokens=32, num_kv_blocks=12, block_size=8)
    run = simulate(trace, tight_kv, StepCostModel(fixed_s=0.025, per_token_s=0.001))
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5))
    plot_timeline(run, ax=axes[0], title="my_schedule")
    plot_timeline(run, ax=axes[1], title="the simulator's continuous batching")
    fig.tight_layout()
    assert_reads(fig)
    assert_reads(plot_timeline(run, axis="step"))  # lab 04's tight-cache timeline, a figure of its own


def test_lab03_measured_trace_timeline_reads():
    from lab_utils.viz.timeline import plot_timeline

    rows = [
        {
            "request_id": i,
            "arrival_time": 0.05 * i,
            "first_token_time": 0.05 * i + 0.2,
            "finish_time": 0.05 * i + 0.4 + 0.1 * (i % 5),
            "output_len": 8 + 4 * (i % 5),
        }
        for i in range(12)
    ]
    assert_reads(plot_timeline(rows, title="vLLM, measured"))


def test_lab03_throughput_latency_reads():
    from lab_utils.sim import (
        ContinuousBatching,
        LengthDist,
        StaticBatching,
        StepCostModel,
        poisson_workload,
        sweep_load,
    )
    from lab_utils.viz.timeline import plot_throughput_latency

    def workload(rate: float):
        return poisson_workload(
            60,
            rate,
            prompt_len=LengthDist("uniform", low=32, high=256),
            output_len=LengthDist("lognormal", mean=64, sigma=0.8, high=400),
            seed=0,
        )

    rows = sweep_load(
        workload,
        {
            "static, batch 8": StaticBatching(8),
            "static, batch 32": StaticBatching(32),
            "continuous, max_num_seqs 32": ContinuousBatching(32, 2048),
        },
        [0.5, 1, 2, 4, 8],
        StepCostModel(fixed_s=0.025, per_token_s=0.001),
    )
    assert_reads(plot_throughput_latency(rows, latency="e2e_p99"))


@pytest.mark.parametrize(
    "setting", [("static", 8, 4.0), ("continuous", 32, 1.0), ("dynamic", 2, 20.0), ("continuous", 8, 30.0)]
)
def test_lab03_explorer_reads(setting):
    from lab_utils.viz.timeline import TimelineExplorer

    for title in (True, False):
        explorer = TimelineExplorer(title=title)
        assert_reads(explorer.update(*setting))


def test_lab03_explorer_static_grid_reads():
    from lab_utils.viz.timeline import timeline_explorer

    assert_reads(timeline_explorer(interactive=False))


# ---- lab 09 autoscaling, the drills' score plot -----------------------------------------------


def test_lab09_autoscaling_runs_read():
    from lab_utils.bench.autoscale import (
        ReplicaModel,
        make_trace,
        plot_runs,
        queue_policy,
        seed_policy,
        simulate,
        utilisation_policy,
    )
    from lab_utils.grading import lab_scenario

    scenario = lab_scenario("09", 0)
    trace, model = make_trace(**scenario["trace"]), ReplicaModel(**scenario["replica"])
    runs = [
        simulate(trace, seed_policy(), model, name="seeds' rule"),
        simulate(trace, utilisation_policy, model, name="utilisation 80/40"),
        simulate(trace, queue_policy, model, name="queue"),
    ]
    assert_reads(plot_runs(trace, runs, title=f"{trace.name}: replicas and TTFT p95"))


def test_drill_score_plot_reads():
    from lab_utils.drills import make_drills
    from lab_utils.viz.drill_runner import DrillSession

    drills = make_drills(5, n=8)
    session = DrillSession(drills)
    for i, d in enumerate(drills):
        session.answer(d.answer if i % 3 else d.answer * 2, seconds=10 + 7 * i)
    assert_reads(session.plot())


# ---- the checker fails where it should --------------------------------------------------------


def test_checker_reports_overlapping_tick_labels():
    fig, ax = plt.subplots(figsize=(4, 3))
    names = [f"a rather long request name {i}" for i in range(8)]
    ax.bar(names, range(8))
    ax.set_title("crowded")
    found = problems(fig)
    assert len(found) == 1 and found[0].startswith("axes 'crowded': ") and "x tick labels overlap" in found[0]
    ax.tick_params(axis="x", labelrotation=90, labelsize=6)  # the fix
    fig.set_size_inches(4, 6)
    assert problems(fig) == []


def test_checker_reports_a_legend_over_a_line_and_over_bars():
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3))
    left.plot([0, 1, 2, 3], [0, 1, 2, 3], label="rising")
    left.plot([0, 3], [3, 3], label="flat top")
    left.set_title("lines")
    left.legend(loc="upper left")  # over "flat top" (and the top of "rising"'s range is clear)
    right.bar(["a", "b", "c"], [3, 3, 3], label="bars")
    right.set_ylabel("height")
    right.legend(loc="center")
    found = problems(fig)
    assert any(m.startswith("axes 'lines': the legend covers data") and "'flat top'" in m for m in found), (
        found
    )
    assert any(m.startswith("axes 1 ('height'): the legend covers data") and "patch" in m for m in found), (
        found
    )
    left.legend(loc="lower right")
    right.legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the plot
    found = problems(fig)
    assert found == ["axes 1 ('height'): the legend (bars) runs off the figure's edge (it is cut off)"], found
    assert problems(fig, cropped=True) == []  # shown inline, cropped to what is drawn, it fits
    fig.subplots_adjust(right=0.8)
    assert problems(fig) == []


def test_checker_reports_a_figure_legend_and_overlapping_annotations():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.scatter([0.5], [0.5], label="point")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    fig.legend(loc="center")
    ax.annotate("first note", (0.2, 0.2))
    ax.annotate("second note", (0.22, 0.21))
    found = problems(fig)
    assert any("the legend covers data" in m and "PathCollection" in m for m in found), found
    assert any("pair(s) of texts overlap ('first note'/'second note')" in m for m in found), found


def test_checker_never_passes_an_empty_figure():
    from matplotlib.figure import Figure

    assert problems(Figure()) == ["the figure has no visible axes: nothing was drawn"]
    fig, ax = plt.subplots()
    ax.set_title("nothing")
    assert problems(fig) == ["the figure's axes (axes 'nothing') hold no data and no text"]


# ---- the kernel-side hook: LAB_FIGURE_CHECK checks every figure a notebook shows ---------------

HOOKED_SESSION = r"""
import json, os, sys
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
config = Config()
config.HistoryManager.hist_file = ":memory:"  # no history database written
shell = InteractiveShell.instance(config=config)
cells = [
    "import lab_utils",
    # overlapping tick labels, shown with display() (the inline backend's way)
    "import matplotlib.pyplot as plt\nfrom IPython.display import display\n"
    "fig, ax = plt.subplots(figsize=(2, 2))\nax.plot(range(30))\nax.set_xticks(range(30))\n"
    "ax.set_xticklabels([f'label {i}' for i in range(30)])\ndisplay(fig)\nplt.close(fig)",
    # a clean figure left open at the end of the cell (plt.show() draws nothing under Agg)
    "fig, ax = plt.subplots()\nax.plot([1, 3], label='line')\nax.set_title('clean')\nplt.show()",
    "print('no figure here')",
    # a check that raises is recorded; the figure is still displayed
    "import lab_utils.viz.readable as r\ndef broken(fig, **kw):\n    raise RuntimeError('boom')\n"
    "r.problems = broken\nfig, ax = plt.subplots()\nax.plot([1, 2])\ndisplay(fig)\nplt.close(fig)",
]
for cell in cells:
    result = shell.run_cell(cell, store_history=True)
    assert result.success, (cell, result.error_in_exec)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("matplotlib", "lab_utils"))))
"""


def _hooked_session(tmp_path, record):
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LAB_FIGURE_CHECK"}
    env["MPLBACKEND"] = "Agg"  # as the grader runs notebooks
    if record is not None:
        env["LAB_FIGURE_CHECK"] = str(record)
    script = tmp_path / "session.py"
    script.write_text(HOOKED_SESSION)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_figure_check_hook_records_each_figure_shown(tmp_path):
    import json

    record = tmp_path / "figures.jsonl"
    _hooked_session(tmp_path, record)
    figures = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(f["cell"], f["how"]) for f in figures] == [
        (2, "displayed"),
        (3, "open at the end of the cell"),
        (5, "displayed"),
    ], figures
    overlapping, clean, broken = figures
    assert len(overlapping["problems"]) == 1 and "x tick labels overlap" in overlapping["problems"][0]
    assert overlapping["source"] == "import matplotlib.pyplot as plt" and overlapping["error"] is None
    assert clean["problems"] == [] and clean["figure"] == "clean" and clean["error"] is None
    assert broken["problems"] == [] and broken["error"] == "RuntimeError: boom"


def test_figure_check_hook_does_nothing_when_the_variable_is_unset(tmp_path):
    modules = _hooked_session(tmp_path, None)
    assert "lab_utils.viz.figure_check" not in modules
    assert not list(tmp_path.glob("*.jsonl"))
    # and importing lab_utils alone imports no matplotlib
    import subprocess
    import sys

    probe = "import sys, lab_utils; print(any(m.startswith('matplotlib') for m in sys.modules))"
    env = {k: v for k, v in __import__("os").environ.items() if k != "LAB_FIGURE_CHECK"}
    assert (
        subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout.strip()
        == "False"
    )
