"""lab_utils.viz.blocks: the recorder's frames and the figures drawn from them."""

from __future__ import annotations

import pickle

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from lab_utils.kv import KVCacheManager, Request  # noqa: E402
from lab_utils.viz import blocks  # noqa: E402


@pytest.fixture()
def frames():
    return blocks.record_example(num_blocks=8, block_size=4)


def test_record_example_frames_pin_the_block_tables(frames):
    assert [f.event for f in frames] == [
        "start",
        "allocate",
        "allocate",
        "fork",
        "append",
        "append",
        "free",
        "free",
        "free",
    ]
    assert frames[2].block_tables == {"a": [0, 1, 2], "b": [0, 1, 3]}
    assert frames[2].prefix_cache_hits == 8
    assert frames[3].block_tables["a.1"] == [0, 1, 2] and frames[3].ref_cnt[:4] == [3, 3, 2, 1]
    assert frames[4].copies == [(2, 4)] and frames[4].block_tables["a"] == [0, 1, 4]
    assert frames[4].shared_blocks() == [0, 1]
    assert frames[-1].block_tables == {} and frames[-1].usage == 0.0
    assert frames[-1].free_queue == [5, 6, 7, 3, 4, 2, 1, 0]
    assert frames[-1].block_hash[0] is not None  # freed but still cached


def test_frames_pickle(frames):
    assert pickle.loads(pickle.dumps(frames)) == frames


def test_rejected_events_leave_the_cache_unchanged():
    rec = blocks.TraceRecorder(KVCacheManager(num_blocks=2, block_size=2))
    assert rec.allocate(Request("a", [1, 2, 3])) is True
    big = Request("b", [4, 5, 6])
    assert rec.allocate(big) is False
    assert rec.frames[-1].event == "rejected"
    assert rec.frames[-1].block_tables == rec.frames[-2].block_tables == {"a": [0, 1]}
    a = Request("c", [9])
    assert rec.allocate(a) is False


def test_plots_return_figures_with_one_patch_per_block(frames):
    import matplotlib.pyplot as plt

    fig = blocks.plot_block_tables(frames[4])
    ax = fig.axes[0]
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == sorted(["0 ×3", "1 ×3", "4", "0 ×3", "1 ×3", "3", "0 ×3", "1 ×3", "2"])
    plt.close(fig)
    grid = blocks.plot_memory_grid(frames[4], ncols=4)
    assert len([t for t in grid.axes[0].texts if t.get_text().isdigit()]) == 8
    plt.close(grid)
    figs = blocks.plot_trace(frames, indices=[0, 8])
    assert len(figs) == 2 and all(len(f.axes) == 2 for f in figs)
    for f in figs:
        plt.close(f)


def test_show_trace_static_returns_every_frame(frames):
    import matplotlib.pyplot as plt

    figs = blocks.show_trace(frames[:3], interactive=False)
    assert len(figs) == 3
    for f in figs:
        plt.close(f)


def test_stepper_builds_a_widget(frames):
    pytest.importorskip("ipywidgets")
    box = blocks.trace_stepper(frames)
    slider = box.children[0].children[1]
    assert (slider.min, slider.max) == (0, len(frames) - 1)
    slider.value = 4  # redraws without error


def test_plot_utilisation_labels_each_allocator():
    from lab_utils.kv import WorkloadRequest, simulate_contiguous, simulate_paged

    w = [WorkloadRequest(f"r{i}", i, 8, 4, 16) for i in range(4)]
    fig = blocks.plot_utilisation([simulate_contiguous(w, 64), simulate_paged(w, 64, 4)])
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels[0].startswith("contiguous") and labels[1].startswith("paged")
