from __future__ import annotations

import pytest

from lab_utils.runtime import frameworks, resolve_backend


def test_resolve_backend_on_this_machine():
    import torch

    expected = "gpu" if torch.cuda.is_available() else "cpu"
    assert resolve_backend("auto") == expected
    assert resolve_backend("CPU") == "cpu"


def test_bad_backend_names_the_choices():
    with pytest.raises(ValueError, match="auto"):
        resolve_backend("tpu")


def test_gpu_without_cuda_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="no CUDA"):
        resolve_backend("gpu")


def test_frameworks_table_is_honest_about_tgi():
    rows = {f.name: f for f in frameworks()}
    assert rows["torch"].installed
    assert not rows["text-generation-inference"].usable
    assert "Docker" in rows["text-generation-inference"].note
