"""Lab 12's adapter measurements: the round robin over adapters, a mixed batch against a fake
server, a process tree's memory, and (slow, with the course model) a merged adapter that answers
as the adapter does."""

from __future__ import annotations

import os

import pytest
from test_clients import fake_server  # noqa: F401  (the tiny OpenAI-style streaming server)

from lab_utils.lora.bench import assign, mixed_batch, server_memory


def test_assign_is_round_robin():
    assert assign(["a", "b"], 5) == ["a", "b", "a", "b", "a"]
    assert assign(["smol"], 3) == ["smol"] * 3
    with pytest.raises(ValueError, match="at least one model"):
        assign([], 2)


def test_mixed_batch_sends_every_request_at_once_spread_over_the_models(fake_server):  # noqa: F811
    url, state = fake_server
    # 100 chunks of 5 ms: each request lasts long enough for the others to start beside it
    row = mixed_batch(url, ["a", "b", "c"], [f"p{i}" for i in range(7)], max_tokens=100)
    assert row["distinct"] == 3 and row["num_ok"] == 7 and row["output_tokens"] == 700
    assert state["max_in_flight"] > 3  # the three groups (3, 2, 2 requests) run at the same time
    models = sorted(b["model"] for b in state["bodies"])
    assert models == ["a", "a", "a", "b", "b", "c", "c"]
    assert all(b["ignore_eos"] and b["temperature"] == 0 for b in state["bodies"])
    by_prompt = {b["prompt"]: b["model"] for b in state["bodies"]}
    assert [by_prompt[f"p{i}"] for i in range(7)] == assign(["a", "b", "c"], 7)
    assert row["ttft_p50"] <= row["ttft_p90"] and row["tpot_p50"] > 0
    assert row["output_tokens_per_s"] == pytest.approx(700 / row["wall_s"])
    assert sorted(r["model"] for r in row["records"]) == models and all(r["ok"] for r in row["records"])


def test_server_memory_sums_the_process_tree():
    m = server_memory(os.getpid())
    assert m["rss_bytes"] > 10 << 20
    assert 0 < m["pss_bytes"] <= m["rss_bytes"] * 1.01


@pytest.mark.slow
def test_merged_adapter_changes_only_the_adapted_weights_and_answers_like_the_adapter(tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lab_utils import lora
    from lab_utils.lora.merge import MARKER, merge, weight_bytes
    from lab_utils.lora.train import LAYERS, TARGET_MODULES
    from lab_utils.models import course_model_path

    folder = tmp_path / "json"
    merge(lora.adapter_path("json"), folder)
    assert (folder / MARKER).exists() and (folder / "tokenizer.json").exists()
    assert weight_bytes(folder) == pytest.approx(weight_bytes(course_model_path()), rel=0.01)
    base = load_file(next(course_model_path().glob("*.safetensors")))
    merged = load_file(next(folder.glob("*.safetensors")))
    assert set(merged) == set(base)  # a plain model: no lora_A / lora_B left
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    adapted = {f"model.layers.{i}.self_attn.{m}.weight" for i in LAYERS for m in TARGET_MODULES}
    assert changed and changed <= adapted
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for country, _ in lora.HELD_OUT[:2]:
        ids = tok(lora.prompt(country), return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=16, do_sample=False)
        text = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        assert text == lora.generate("json", lora.prompt(country), max_new_tokens=16)
