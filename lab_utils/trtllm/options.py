"""The LLM API options a `trtllm-serve --config FILE.yaml` may set, and a validator for that file.

TensorRT-LLM reads the YAML into its pydantic `TorchLlmArgs` (the PyTorch backend's arguments),
whose nested configs forbid unknown fields. On a GPU machine a typo fails at server start, after
the model has loaded; this schema lets CPU mode reject it in a millisecond, naming the key.

The schema is a SUBSET the course keeps, read from TensorRT-LLM's API reference
(`TorchLlmArgs`, `KvCacheConfig`, `DecodeCudaGraphConfig`; docs for 1.3.0rc27 and 1.4.0rc4,
checked 2026-12-01) and from option files in its own pull requests. Keys outside it may be valid
in your installed version: pass `extra_keys=` or check against `tensorrt_llm.llmapi` on the GPU
machine (`known_options()` says which keys the course keeps).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_SOURCE = (
    "TensorRT-LLM API reference: TorchLlmArgs, KvCacheConfig, DecodeCudaGraphConfig "
    "(docs 1.3.0rc27 / 1.4.0rc4, read 2026-12-01)"
)


class OptionsError(ValueError):
    """An option file is not valid; `key` is the dotted key at fault (e.g. kv_cache_config.dtype)."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


@dataclass(frozen=True)
class Option:
    """One option: the Python types YAML may give it, and optional limits."""

    types: tuple[type, ...]  # accepted types after YAML parsing (bool is never an int here)
    doc: str = ""
    nullable: bool = False  # `null` allowed (e.g. cuda_graph_config: null turns CUDA graphs off)
    choices: tuple[str, ...] | None = None
    low: float | None = None  # inclusive bounds for numbers
    high: float | None = None
    item_type: type | None = None  # for lists
    nested: dict[str, Option] | None = field(default=None, hash=False)  # for sub-configs


def _int(doc: str, low: float | None = None, **kw) -> Option:
    return Option((int,), doc, low=low, **kw)


_KV_CACHE = {
    "free_gpu_memory_fraction": Option(
        (float, int),
        "share of the GPU memory still free after the model loads that the KV cache takes (default 0.9)",
        nullable=True,
        low=0.0,
        high=1.0,
    ),
    "max_tokens": _int("cap on KV-cache tokens; the smaller of this and the fraction wins", 1, nullable=True),
    "enable_block_reuse": Option(
        (bool,), "reuse KV blocks of shared prefixes across requests (default true)"
    ),
    "enable_partial_reuse": Option((bool,), "reuse a partly matching block"),
    "copy_on_partial_reuse": Option((bool,), "copy a partly matching block instead of sharing it"),
    "tokens_per_block": _int("tokens per KV block (a power of two; default 32)", 2),
    "dtype": Option(
        (str,),
        "KV-cache dtype: 'auto' follows the checkpoint, 'fp8' halves it",
        choices=("auto", "fp8", "nvfp4", "float16", "bfloat16"),
    ),
    "host_cache_size": _int("bytes of host memory for offloaded KV blocks", 0, nullable=True),
    "max_attention_window": Option(
        (list,), "per-layer attention windows (sliding window)", nullable=True, item_type=int
    ),
    "sink_token_length": _int("attention-sink tokens kept with a sliding window", 0, nullable=True),
    "event_buffer_max_size": _int("KV-cache events kept for routers (0: off)", 0),
    "use_uvm": Option((bool,), "allocate the KV cache in unified memory"),
    "max_gpu_total_bytes": _int("cap on KV-cache bytes (0: no cap)", 0),
}

_CUDA_GRAPH = {
    "batch_sizes": Option((list,), "batch sizes to capture a decode graph for", nullable=True, item_type=int),
    "max_batch_size": _int("capture graphs up to this batch size (0: derived)", 0),
    "enable_padding": Option((bool,), "round a batch up to the next captured size"),
}

_SCHEDULER = {
    "capacity_scheduler_policy": Option(
        (str,),
        "how requests are admitted",
        choices=("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"),
    ),
    "context_chunking_policy": Option(
        (str,),
        "how long prompts are split",
        choices=("FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"),
        nullable=True,
    ),
}

LLM_API_OPTIONS: dict[str, Option] = {
    "backend": Option(
        (str,),
        "pytorch (default) or _autodeploy; tensorrt is the removed engine flow",
        choices=("pytorch", "_autodeploy"),
        nullable=True,
    ),
    "tokenizer": Option((str,), "tokenizer folder or Hub id when it differs from the model", nullable=True),
    "trust_remote_code": Option((bool,), "run the model repository's own Python code"),
    "dtype": Option(
        (str,),
        "activation/weight dtype for unquantized parts",
        choices=("auto", "float16", "bfloat16", "float32"),
    ),
    "tensor_parallel_size": _int("GPUs each layer is split across", 1),
    "pipeline_parallel_size": _int("GPUs the layers are spread over", 1),
    "moe_expert_parallel_size": _int("GPUs the experts of an MoE model are spread over", 1, nullable=True),
    "enable_attention_dp": Option((bool,), "data-parallel attention (large MoE models)"),
    "max_batch_size": _int("most requests in one in-flight batch", 1),
    "max_num_tokens": _int("most tokens (prefill + decode) in one forward step", 1),
    "max_seq_len": _int("longest prompt + output a request may have", 1, nullable=True),
    "max_beam_width": _int("beams per request (1: no beam search)", 1),
    "enable_chunked_prefill": Option((bool,), "split long prompts into chunks that share steps with decodes"),
    "kv_cache_config": Option((dict,), "KV-cache settings (KvCacheConfig)", nested=_KV_CACHE),
    "cuda_graph_config": Option(
        (dict,), "decode CUDA graphs; null turns them off", nullable=True, nested=_CUDA_GRAPH
    ),
    "scheduler_config": Option((dict,), "admission and chunking policies", nested=_SCHEDULER),
    "attn_backend": Option((str,), "attention kernels", choices=("TRTLLM", "FLASHINFER", "VANILLA")),
    "disable_overlap_scheduler": Option((bool,), "run scheduling and the GPU step one after the other"),
    "guided_decoding_backend": Option(
        (str,), "structured output engine", choices=("xgrammar", "llguidance"), nullable=True
    ),
    "enable_iter_perf_stats": Option((bool,), "collect per-iteration statistics (the /metrics page)"),
    "print_iter_log": Option((bool,), "log every iteration"),
    "return_perf_metrics": Option((bool,), "per-request timing metrics"),
    "num_postprocess_workers": _int("processes that detokenize for the server", 0),
    "speculative_config": Option(
        (dict,),
        "speculative decoding (draft model, Eagle, MTP, n-gram); not checked key by key here",
        nullable=True,
    ),
}


def known_options() -> dict[str, list[str] | str]:
    """The keys the course's schema knows: top-level keys, and the keys inside each sub-config."""
    return {k: (sorted(o.nested) if o.nested else o.doc) for k, o in sorted(LLM_API_OPTIONS.items())}


def _type_name(types: tuple[type, ...]) -> str:
    names = {
        int: "a whole number",
        float: "a number",
        str: "a string",
        bool: "true or false",
        list: "a list",
        dict: "a mapping",
    }
    if float in types:  # an int is a valid float in YAML (1 means 1.0)
        types = tuple(t for t in types if t is not int)
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _check_value(key: str, value: Any, opt: Option) -> None:
    if value is None:
        if opt.nullable:
            return
        raise OptionsError(key, f"may not be null; give {_type_name(opt.types)}")
    # YAML's `true` is a bool, and bool is a subclass of int: never accept it as a number
    if isinstance(value, bool) and bool not in opt.types:
        raise OptionsError(key, f"expected {_type_name(opt.types)}, got the boolean {value!r}")
    if not isinstance(value, opt.types):
        got = type(value).__name__
        hint = " (quote-free numbers in YAML; '0.9' in quotes is a string)" if isinstance(value, str) else ""
        raise OptionsError(key, f"expected {_type_name(opt.types)}, got {got} {value!r}{hint}")
    if opt.choices is not None and value not in opt.choices:
        raise OptionsError(key, f"{value!r} is not one of {list(opt.choices)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if opt.low is not None and value < opt.low:
            raise OptionsError(key, f"{value!r} is below the minimum {opt.low:g}")
        if opt.high is not None and value > opt.high:
            raise OptionsError(key, f"{value!r} is above the maximum {opt.high:g}")
    if isinstance(value, list) and opt.item_type is not None:
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, opt.item_type):
                raise OptionsError(f"{key}[{i}]", f"expected {_type_name((opt.item_type,))}, got {item!r}")
    if isinstance(value, dict) and opt.nested is not None:
        _check_mapping(value, opt.nested, prefix=key + ".")


def _check_mapping(
    options: dict, schema: dict[str, Option], prefix: str = "", extra_keys: frozenset[str] = frozenset()
) -> None:
    for key, value in options.items():
        if not isinstance(key, str):
            raise OptionsError(f"{prefix}{key!r}", "option names are strings")
        dotted = prefix + key
        if key not in schema:
            if dotted in extra_keys:
                continue
            close = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
            hint = f"; did you mean {prefix}{close[0]}?" if close else ""
            raise OptionsError(
                dotted,
                f"unknown option{hint} (the course's schema: {SCHEMA_SOURCE}; "
                "pass extra_keys= for an option your installed version adds)",
            )
        _check_value(dotted, value, schema[key])


def _load(options: str | Path | dict) -> dict:
    if isinstance(options, dict):
        return options
    if isinstance(options, Path) or (
        isinstance(options, str)
        and "\n" not in options
        and options.endswith((".yaml", ".yml"))
        and Path(options).is_file()
    ):
        options = Path(options).read_text()
    import yaml

    try:
        data = yaml.safe_load(options)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise OptionsError("<file>", f"not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise OptionsError(
            "<file>", f"the top level must be a mapping of option: value, got {type(data).__name__}"
        )
    return data


def validate_options(options: str | Path | dict, extra_keys: set[str] | None = None) -> dict:
    """Check an LLM API option file (YAML text, a .yaml path, or a dict); return it as a dict.

    Raises OptionsError naming the dotted key for unknown keys, wrong types, values outside a
    range or a list of choices. `extra_keys` ("a.b" dotted names) are accepted unchecked.
    """
    data = _load(options)
    _check_mapping(data, LLM_API_OPTIONS, extra_keys=frozenset(extra_keys or ()))
    return data


def to_yaml(options: dict) -> str:
    """Validated options as YAML text for `trtllm-serve MODEL --config FILE`."""
    import yaml

    return yaml.safe_dump(validate_options(options), sort_keys=False)
