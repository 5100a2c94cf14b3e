"""The course draft model (lab_utils.draft): its marker, its error when missing, the acceptance
simulation, and (slow) that the built draft agrees with the course model better than the cut it
was distilled from."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from lab_utils import draft
from lab_utils.draft import distill

_BENCH = Path(__file__).resolve().parent.parent / "bench" / "draft_speculation.py"


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    monkeypatch.delenv("COURSE_MODEL", raising=False)
    return tmp_path


def _fake_build(folder: Path, **info) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / draft.MARKER).write_text(json.dumps({"format": draft.FORMAT_VERSION, **info}))


def test_a_missing_draft_says_how_to_build_it(empty_cache):
    assert not draft.draft_ready()
    with pytest.raises(draft.DraftNotBuilt, match=r"make setup.*python -m lab_utils\.draft"):
        draft.draft_path()
    with pytest.raises(FileNotFoundError):  # DraftNotBuilt is one
        draft.draft_info()


def test_the_marker_is_read_and_an_outdated_or_partial_one_is_not_trusted(empty_cache):
    folder = draft.draft_dir()
    assert folder.parent == empty_cache / "models"
    _fake_build(folder, layers_kept=[0, 1, 2, 29], target_layers=30, params=42_000_000, agreement=0.3,
                acceptance_per_position=[0.3, 0.1, 0.05], mean_accepted=0.45)  # fmt: skip
    assert draft.draft_ready() and draft.draft_path() == folder
    info = draft.draft_info()
    assert info["layers_kept"] == [0, 1, 2, 29] and info["acceptance_per_position"][0] == 0.3
    text = draft.format_info(info)
    assert "layers [0, 1, 2, 29] of 30" in text and "30%, 10%, 5%" in text
    (folder / draft.MARKER).write_text(json.dumps({"format": draft.FORMAT_VERSION - 1}))
    assert not draft.draft_ready()
    (folder / draft.MARKER).write_text(json.dumps({"format": draft.FORMAT_VERSION}))
    (folder / "model.safetensors").unlink()  # weights gone: not a draft
    assert not draft.draft_ready()
    (folder / draft.MARKER).write_text("{not json")
    assert not draft.draft_ready()


def test_the_setup_step_is_ready_for_a_learners_own_model(empty_cache, monkeypatch):
    from lab_utils import setup

    assert not setup.STEPS["draft"].done()
    assert setup.STEPS["draft"].command()[-1] == "lab_utils.draft"
    monkeypatch.setenv("COURSE_MODEL", str(empty_cache / "my-model"))
    assert setup.STEPS["draft"].done()
    assert draft.draft_dir().parent == empty_cache / "models" / "drafts"  # never the course draft's folder


def test_simulated_verification_keeps_the_agreeing_prefix_and_then_the_targets_token():
    # k = 3: agree, agree, agree | (target token) | no | (next step) ...
    assert distill.simulate_steps([True, True, True, True, False, True], 3) == (3, [2, 1, 1])
    # step 1 keeps 3 (positions 0-2), the target adds position 3; step 2 starts at 4: miss (keeps 0),
    # the target's token is position 4; step 3 starts at 5: keeps 1
    assert distill.simulate_steps([False] * 4, 3) == (4, [0, 0, 0])  # every step keeps nothing
    assert distill.simulate_steps([True] * 8, 3) == (2, [2, 2, 2])  # 0-2 kept, 3 target, 4-6 kept, 7 target
    assert distill.simulate_steps([], 3) == (0, [0, 0, 0])


def test_lab_prompts_are_varied_and_seeded():
    a, b = distill.lab_prompts(40, seed=1), distill.lab_prompts(40, seed=1)
    assert a == b and len(a) == 40 and len(set(a)) == 40  # all different: the split never leaks
    assert distill.lab_prompts(40, seed=2) != a


def test_the_bench_cost_model():
    spec = importlib.util.spec_from_file_location("draft_speculation", _BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    expected, speedup = bench.gpu_model([0.8, 0.6, 0.4], c=0.3)
    assert expected == pytest.approx(2.8) and speedup == pytest.approx(2.8 / 1.9)
    assert bench.gpu_model([0.0, 0.0, 0.0], c=0.3)[1] < 1  # a draft that is never right costs time
    assert bench.gpu_model([1.0, 1.0], c=0.0) == (3.0, 3.0)


@pytest.mark.slow
def test_the_built_draft_agrees_with_the_course_model_better_than_its_untrained_cut():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lab_utils.models import course_model_path

    if not draft.draft_ready():
        pytest.skip("the draft is not built: `make setup` or `python -m lab_utils.draft` builds it")
    info = draft.draft_info()
    folder, target_dir = draft.draft_path(), course_model_path()
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(folder)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    trained = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert trained.config.num_hidden_layers == len(info["layers_kept"]) < target.config.num_hidden_layers
    # the embedding (and so the tied lm_head) is the target's, frozen
    assert torch.equal(trained.model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert trained.lm_head.weight.data_ptr() == trained.model.embed_tokens.weight.data_ptr()
    clock = distill._Clock(30)
    held = distill._generate(target, tok, info["heldout_prompts"][:6], 0, 48, clock, "test replies", (0, 1))
    untrained, _, _ = distill._student(target_dir, tuple(info["layers_kept"]))
    got, base = distill.evaluate(trained, held), distill.evaluate(untrained, held)
    assert got["heldout_tokens"] >= 100
    assert got["agreement"] >= base["agreement"] + 0.05, (got, base)
    assert got["acceptance_per_position"][0] > base["acceptance_per_position"][0]
    assert got["agreement"] >= 0.5 * info["agreement"]  # near what the build recorded
