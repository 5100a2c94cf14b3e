"""Ready-made configs for the course's Triton models (as dicts in ModelConfig's JSON shape).

The notebook writes the first models by hand; these recipes write the rest, and the tests use
them, so a learner and CI serve exactly the same repository.
"""

from __future__ import annotations

from pathlib import Path

from .repository import template_source, write_model

LLM_MODES = ("text", "tokenize", "generate", "detokenize")


def _params(**kv: object) -> dict:
    return {k: {"string_value": str(v)} for k, v in kv.items()}


def mlp_config(
    name: str = "mlp",
    *,
    width: int = 16,
    hidden: int = 1024,
    layers: int = 4,
    max_batch_size: int = 16,
    dynamic_batching: dict | None = None,
    instances: int = 1,
) -> dict:
    """The MLP used to measure the dynamic batcher; dynamic_batching=None turns batching off."""
    if width < 1 or hidden < 1 or layers < 0:
        raise ValueError(f"width and hidden must be >= 1 and layers >= 0, got {width}, {hidden}, {layers}")
    cfg = {
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch_size,
        # dims leave out the batch dimension: with max_batch_size > 0 Triton adds it in front
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [width]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [width]}],
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
        "parameters": _params(HIDDEN=hidden, LAYERS=layers),
    }
    if dynamic_batching is not None:
        cfg["dynamic_batching"] = dynamic_batching
    return cfg


def cost_stand_in_config(
    name: str = "stand_in",
    *,
    fixed_s: float = 0.004,
    per_item_s: float = 0.001,
    max_batch_size: int = 16,
    dynamic_batching: dict | None = None,
) -> dict:
    """A model that only sleeps fixed_s + per_item_s x batch rows per execution; None = batcher off."""
    if fixed_s < 0 or per_item_s < 0 or fixed_s + per_item_s <= 0:
        raise ValueError(f"fixed_s and per_item_s must be >= 0 and not both 0, got {fixed_s}, {per_item_s}")
    cfg = {
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch_size,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": _params(FIXED_S=fixed_s, PER_ITEM_S=per_item_s),
    }
    if dynamic_batching is not None:
        cfg["dynamic_batching"] = dynamic_batching
    return cfg


def course_llm_config(
    name: str,
    mode: str,
    model_dir: str | Path,
    *,
    decoupled: bool = False,
    max_tokens: int = 32,
    chat: bool = True,
    threads: int = 1,
) -> dict:
    """One course-model job (text, tokenize, generate, detokenize) as a python-backend model."""
    if mode not in LLM_MODES:
        raise ValueError(f"mode must be one of {LLM_MODES}, got {mode!r}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if decoupled and mode != "text":
        raise ValueError("only MODE 'text' streams; the ensemble's parts answer once per request")
    text_in = {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}
    text_out = {"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}
    max_tok = {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": [1], "optional": True}
    ids_in = {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1]}
    ids_out = {"name": "output_ids", "data_type": "TYPE_INT64", "dims": [-1]}
    inputs, outputs = {
        "text": ([text_in, max_tok], [text_out]),
        "tokenize": ([text_in], [ids_in]),
        "generate": ([ids_in, max_tok], [ids_out]),
        "detokenize": ([ids_out], [text_out]),
    }[mode]
    cfg = {
        "name": name,
        "backend": "python",
        "max_batch_size": 0,
        "input": inputs,
        "output": outputs,
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": _params(
            MODE=mode,
            MODEL_DIR=Path(model_dir).resolve(),
            MAX_TOKENS=max_tokens,
            CHAT=str(chat).lower(),
            THREADS=threads,
        ),
    }
    if decoupled:
        cfg["model_transaction_policy"] = {"decoupled": True}
    return cfg


def ensemble_config(
    name: str = "pipeline",
    tokenizer: str = "tokenizer",
    generator: str = "generator",
    detokenizer: str = "detokenizer",
) -> dict:
    """tokenizer -> generator -> detokenizer as one Triton ensemble (text in, text out)."""
    return {
        "name": name,
        "platform": "ensemble",
        "max_batch_size": 0,
        "input": [
            {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": [1]},
        ],
        "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}],
        "ensemble_scheduling": {
            "step": [
                # input_map: {the step model's input name: the ensemble tensor it reads}
                # output_map: {the step model's output name: the ensemble tensor it writes}
                {
                    "model_name": tokenizer,
                    "model_version": -1,
                    "input_map": {"text_input": "text_input"},
                    "output_map": {"input_ids": "prompt_ids"},
                },
                {
                    "model_name": generator,
                    "model_version": -1,
                    "input_map": {"input_ids": "prompt_ids", "max_tokens": "max_tokens"},
                    "output_map": {"output_ids": "new_ids"},
                },
                {
                    "model_name": detokenizer,
                    "model_version": -1,
                    "input_map": {"output_ids": "new_ids"},
                    "output_map": {"text_output": "text_output"},
                },
            ]
        },
    }


def write_llm_models(
    repo: str | Path, model_dir: str | Path, *, max_tokens: int = 32, replace: bool = True
) -> list[str]:
    """Write the course-model folders: llm (text), llm_stream (decoupled), the ensemble and its parts."""
    source = template_source("course_llm")
    models = {
        "llm": course_llm_config("llm", "text", model_dir, max_tokens=max_tokens),
        "llm_stream": course_llm_config(
            "llm_stream", "text", model_dir, decoupled=True, max_tokens=max_tokens
        ),
        "tokenizer": course_llm_config("tokenizer", "tokenize", model_dir),
        "generator": course_llm_config("generator", "generate", model_dir, max_tokens=max_tokens),
        "detokenizer": course_llm_config("detokenizer", "detokenize", model_dir),
    }
    for name, cfg in models.items():
        write_model(repo, name, cfg, {1: {"model.py": source}}, replace=replace)
    write_model(repo, "pipeline", ensemble_config(), {1: {}}, replace=replace)
    return [*models, "pipeline"]
