"""Model folders for Triton's LLM backends (GPU lab machine): the vLLM backend and TensorRT-LLM.

Neither runs in CPU mode; both are generated and validated here so a learner can carry them to
a GPU machine (docker/triton-compose.yml mounts the repository).

vLLM backend: the model folder holds `1/model.json`, whose keys are vLLM engine arguments
(the same names as `vllm serve` flags, with underscores), and a short config.pbtxt. The backend
does continuous batching and paged KV inside vLLM; Triton's dynamic batcher is not involved.

TensorRT-LLM today: the `llmapi` model of tensorrtllm_backend, a python-backend model whose one
edited file is `tensorrt_llm/1/model.yaml` (LLM API arguments plus a `triton_config` block):
`llmapi_model_yaml` writes and validates it, `write_llmapi_model` lays out the folder,
`read_llmapi_model` checks one back (tensorrtllm_backend docs/llmapi.md; lab_utils.facts).

Historical: the C++ engine backend (`backend: "tensorrtllm"`, `gpt_model_path`, `gpt_model_type`)
was removed in 2026-07 (TensorRT-LLM PR #15907). `trtllm_config` still writes its config.pbtxt
for reading old deployments; no lab generates one as the current form.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from typing import Any

from lab_utils.facts import fact

from .config import (
    GPT_MODEL_TYPES,
    SCHEDULER_POLICIES,
    ConfigError,
    config_from_dict,
    config_problems,
    validate_config,
)


# -- vLLM backend ---------------------------------------------------------------------------
def vllm_engine_arg_names() -> set[str] | None:
    """Field names of the installed vLLM's EngineArgs/AsyncEngineArgs, read from source (no import).

    Importing vLLM takes tens of seconds on a small CPU box; the dataclass fields are plain
    annotated assignments in vllm/engine/arg_utils.py, so `ast` reads them in milliseconds.
    Returns None when vLLM is not installed.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations))) / "engine" / "arg_utils.py"
    if not source.exists():
        return None
    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name in ("EngineArgs", "AsyncEngineArgs"):
            names.update(
                n.target.id
                for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            )
    return names or None


def vllm_model_json(
    model: str,
    *,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    enforce_eager: bool = False,
    **engine_args: Any,
) -> dict[str, Any]:
    """The vLLM backend's model.json, checked against the installed vLLM's engine argument names."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization is a fraction of GPU memory in (0, 1], got {gpu_memory_utilization}"
        )
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    args: dict[str, Any] = {
        "model": model,
        "gpu_memory_utilization": gpu_memory_utilization,
        "tensor_parallel_size": tensor_parallel_size,
        "enforce_eager": enforce_eager,
    }
    if max_model_len is not None:
        args["max_model_len"] = int(max_model_len)
    args.update(engine_args)
    known = vllm_engine_arg_names()
    if known is not None:
        unknown = sorted(set(args) - known)
        if unknown:
            import difflib

            hints = [
                f"{u} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(u, known, 1)) else u
                for u in unknown
            ]
            raise ValueError("not vLLM engine arguments in the installed vLLM: " + ", ".join(hints))
    return args


def vllm_backend_config(name: str) -> str:
    """config.pbtxt for a vLLM-backend model: the backend fills inputs/outputs and decoupled itself."""
    text = config_from_dict(
        {
            "name": name,
            "backend": "vllm",
            # KIND_MODEL: the backend places the model on GPUs itself (tensor_parallel_size in model.json)
            "instance_group": [{"count": 1, "kind": "KIND_MODEL"}],
        }
    )
    validate_config(text)
    return text


# -- Historical: the C++ TensorRT-LLM engine backend (removed 2026-07, PR #15907) -------------
def trtllm_config(
    *,
    engine_dir: str,
    max_batch_size: int = 64,
    max_tokens_in_paged_kv_cache: int | None = None,
    kv_cache_free_gpu_mem_fraction: float = 0.9,
    gpt_model_type: str = "inflight_fused_batching",
    batch_scheduler_policy: str = "max_utilization",
    decoupled: bool = True,
    enable_kv_cache_reuse: bool = False,
    max_queue_delay_microseconds: int = 0,
    name: str = "tensorrt_llm",
) -> str:
    """Historical: config.pbtxt of Triton's removed C++ TensorRT-LLM engine backend, validated.

    Kept for reading deployments of releases before 2026-07; the current form is the llmapi
    model (`llmapi_model_yaml`).

    The KV cache gets `kv_cache_free_gpu_mem_fraction` of the GPU memory left after the engine
    loads, capped at `max_tokens_in_paged_kv_cache` tokens when that is set.
    """
    if not 0 < kv_cache_free_gpu_mem_fraction <= 1:
        raise ValueError(
            "kv_cache_free_gpu_mem_fraction is a fraction of the *free* GPU memory, "
            f"in (0, 1]; got {kv_cache_free_gpu_mem_fraction}"
        )
    if max_tokens_in_paged_kv_cache is not None and max_tokens_in_paged_kv_cache < 1:
        raise ValueError(
            f"max_tokens_in_paged_kv_cache must be a positive token count, got {max_tokens_in_paged_kv_cache}"
        )
    if gpt_model_type not in GPT_MODEL_TYPES:
        raise ValueError(
            f"gpt_model_type (the template's batching_strategy) must be one of {GPT_MODEL_TYPES}, "
            f"got {gpt_model_type!r}"
        )
    if batch_scheduler_policy not in SCHEDULER_POLICIES:
        raise ValueError(
            f"batch_scheduler_policy must be one of {SCHEDULER_POLICIES}, got {batch_scheduler_policy!r}"
        )
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    params = {
        "gpt_model_path": engine_dir,
        "gpt_model_type": gpt_model_type,
        "batch_scheduler_policy": batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": kv_cache_free_gpu_mem_fraction,
        "enable_kv_cache_reuse": str(enable_kv_cache_reuse).lower(),
        "max_beam_width": 1,
        "exclude_input_in_output": "true",
    }
    if max_tokens_in_paged_kv_cache is not None:
        params["max_tokens_in_paged_kv_cache"] = int(max_tokens_in_paged_kv_cache)

    def scalar(tensor: str, dtype: str = "TYPE_INT32", optional: bool = False) -> dict:
        # one value per request; reshape drops the [1] so the backend sees a scalar
        t = {"name": tensor, "data_type": dtype, "dims": [1], "reshape": {"shape": []}}
        return {**t, "optional": True} if optional else t

    cfg = {
        "name": name,
        "backend": "tensorrtllm",
        "max_batch_size": max_batch_size,
        # streaming needs several responses per request: a decoupled model
        "model_transaction_policy": {"decoupled": decoupled},
        # requests reach the batch manager through Triton's queue; the batch manager then adds
        # and removes sequences at every decode step (in-flight batching)
        "dynamic_batching": {
            "preferred_batch_size": [max_batch_size],
            "max_queue_delay_microseconds": max_queue_delay_microseconds,
        },
        "input": [
            {"name": "input_ids", "data_type": "TYPE_INT32", "dims": [-1], "allow_ragged_batch": True},
            scalar("input_lengths"),
            scalar("request_output_len"),
            scalar("end_id", optional=True),
            scalar("pad_id", optional=True),
            scalar("streaming", "TYPE_BOOL", optional=True),
        ],
        "output": [
            {"name": "output_ids", "data_type": "TYPE_INT32", "dims": [-1, -1]},
            {"name": "sequence_length", "data_type": "TYPE_INT32", "dims": [-1]},
        ],
        # KIND_CPU on purpose: the backend, not Triton, owns the GPUs (through MPI ranks)
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {k: {"string_value": str(v)} for k, v in params.items()},
    }
    text = config_from_dict(cfg, name)
    problems = config_problems(validate_config(text), folder_name=name)
    if problems:
        raise ConfigError(f"{name}: " + "; ".join(problems))
    return text


def write_vllm_model(repo: str | Path, name: str, model_json: dict[str, Any]) -> Path:
    """Write `<repo>/<name>/config.pbtxt` and `1/model.json` for the vLLM backend."""
    from .repository import write_model

    return write_model(
        repo,
        name,
        vllm_backend_config(name),
        {1: {"model.json": json.dumps(model_json, indent=2) + "\n"}},
        replace=True,
    )


# -- TensorRT-LLM through the LLM API: the llmapi model (replaces the engine backend above) ---------
LLMAPI_TEMPLATE = fact("triton.llmapi_layout")["template"]  # in the -trtllm-python-py3 container


def llmapi_model_yaml(
    model: str,
    options: dict[str, Any] | None = None,
    *,
    decoupled: bool = False,
    max_batch_size: int = 0,
) -> str:
    """`tensorrt_llm/1/model.yaml` of tensorrtllm_backend's llmapi model, validated.

    The llmapi model is a python-backend model (`model.py`, `config.pbtxt`) shipped in the
    container at `LLMAPI_TEMPLATE`; what a deployment changes is this file: the LLM API arguments
    (`model`, `backend: pytorch`, then the options `trtllm-serve --config` takes, checked here
    against `lab_utils.trtllm.options`) and a `triton_config` block with what would otherwise sit
    in config.pbtxt. Batching happens inside the LLM API's executor (in-flight), not in Triton:
    the template keeps Triton's `max_batch_size` at 0.
    """
    import yaml

    from lab_utils.trtllm.options import validate_options

    opts = dict(options or {})
    for key in ("model", "triton_config"):
        if key in opts:
            raise ValueError(f"{key} is set by its own argument, not in options")
    opts = {"backend": opts.pop("backend", fact("triton.llmapi_backend")), **opts}
    validate_options(opts)
    if max_batch_size < 0:
        raise ValueError(f"max_batch_size must be >= 0, got {max_batch_size}")
    triton = {"max_batch_size": int(max_batch_size), "decoupled": bool(decoupled)}
    body = {"model": model, **opts, "triton_config": triton}
    return yaml.safe_dump(body, sort_keys=False)


def read_llmapi_model(text: str) -> dict[str, Any]:
    """Parse and check a `tensorrt_llm/1/model.yaml` of the llmapi model; returns the parsed dict.

    Raises ValueError naming what Triton's llmapi model would refuse: no `model`, engine-backend
    parameter names, a `triton_config` that is not a mapping, LLM API options outside the schema
    the course keeps (`lab_utils.trtllm.options`).
    """
    import yaml

    from lab_utils.trtllm.options import validate_options

    body = yaml.safe_load(text)
    if not isinstance(body, dict) or not body.get("model"):
        raise ValueError("model.yaml needs a `model`: a Hugging Face id or a local folder")
    old = sorted(k for k in body if k in _ENGINE_BACKEND_KEYS)
    if old:
        raise ValueError(
            f"{', '.join(old)}: parameters of the removed C++ engine backend's config.pbtxt, not "
            "LLM API arguments (lab 08 maps them to LLM API names)"
        )
    triton = body.get("triton_config", {})
    if not isinstance(triton, dict):
        raise ValueError("triton_config is a mapping of config.pbtxt overrides")
    validate_options({k: v for k, v in body.items() if k not in ("model", "triton_config")})
    return body


_ENGINE_BACKEND_KEYS = {
    "gpt_model_path",
    "gpt_model_type",
    "kv_cache_free_gpu_mem_fraction",
    "max_tokens_in_paged_kv_cache",
    "batch_scheduler_policy",
    "enable_kv_cache_reuse",
    "engine_dir",
}


def write_llmapi_model(repo: str | Path, model_yaml: str, name: str = "tensorrt_llm") -> Path:
    """Write `<repo>/<name>/1/model.yaml` (checked with `read_llmapi_model`); returns the model folder.

    `model.py` and `config.pbtxt` of the llmapi model come from the container (`LLMAPI_TEMPLATE`):
    copy that folder over this one on the GPU machine, keeping this model.yaml.
    """
    read_llmapi_model(model_yaml)
    folder = Path(repo) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.yaml").write_text(model_yaml)
    return folder
