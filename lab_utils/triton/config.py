"""config.pbtxt: parse it the way Triton does, name the bad field, and catch what parses but won't load.

Triton reads `config.pbtxt` as protobuf *text format* into its `inference.ModelConfig` message
(model_config.proto). tritonclient ships the compiled message, so a config can be checked on a
laptop with no server at all:

    cfg = validate_config('name: "mlp"  backend: "python"  max_batch_size: 8 ...')
    cfg.max_batch_size          # 8, a real ModelConfig protobuf

Parsing catches misspelt fields, wrong types and unknown enum values. `config_problems` adds the
checks Triton makes only when it loads the model (a preferred batch size above max_batch_size,
dynamic batching on a model that cannot batch, an ensemble step reading a tensor nobody wrote).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

# names people reach for that DataType spells differently
DTYPE_ALIASES = {
    "TYPE_FLOAT": "TYPE_FP32",
    "TYPE_FLOAT32": "TYPE_FP32",
    "TYPE_FLOAT16": "TYPE_FP16",
    "TYPE_HALF": "TYPE_FP16",
    "TYPE_DOUBLE": "TYPE_FP64",
    "TYPE_FLOAT64": "TYPE_FP64",
    "TYPE_INT": "TYPE_INT32",
    "TYPE_LONG": "TYPE_INT64",
    "TYPE_BYTES": "TYPE_STRING",
    "TYPE_STR": "TYPE_STRING",
    "TYPE_BFLOAT16": "TYPE_BF16",
}
# values the TensorRT-LLM backend accepts for two of its parameters
GPT_MODEL_TYPES = ("inflight_fused_batching", "inflight_batching", "V1")  # V1 = static batching
SCHEDULER_POLICIES = ("max_utilization", "guaranteed_no_evict")
TYPE_NAMES = {
    1: "double",
    2: "float",
    3: "int64",
    4: "uint64",
    5: "int32",
    8: "bool",
    9: "string",
    11: "message",
    12: "bytes",
    13: "uint32",
    14: "enum",
    17: "sint32",
    18: "sint64",
}


class ConfigError(ValueError):
    """A config.pbtxt that Triton would reject; `field` names the culprit when it is known."""

    def __init__(
        self, message: str, field: str | None = None, line: int | None = None, column: int | None = None
    ):
        self.field, self.line, self.column = field, line, column
        super().__init__(message)


def _pb():
    # tritonclient is imported here, not at module import (it pulls in grpc and protobuf).
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2


def _all_fields() -> dict[str, set[str]]:
    """Every field name in ModelConfig and its nested messages -> the types it has there."""
    seen: dict[str, set[str]] = {}
    stack, visited = [_pb().ModelConfig.DESCRIPTOR], set()
    while stack:
        desc = stack.pop()
        if desc.full_name in visited:
            continue
        visited.add(desc.full_name)
        for f in desc.fields:
            if f.message_type is not None:
                kind = f"message {f.message_type.name}"
                stack.append(f.message_type)
            elif f.enum_type is not None:
                kind = f"enum {f.enum_type.name} ({', '.join(v.name for v in f.enum_type.values)})"
            else:
                kind = TYPE_NAMES.get(f.type, "scalar")
            seen.setdefault(f.name, set()).add(kind)
    return seen


def _explain(err: Exception, text: str, where: str) -> ConfigError:
    """Turn protobuf's ParseError into a message that names the field and suggests a fix."""
    msg = str(err)
    line = err.GetLine() if hasattr(err, "GetLine") else None
    col = err.GetColumn() if hasattr(err, "GetColumn") else None
    pos = f"line {line}, column {col}" if line else "somewhere"
    m = re.search(r'Message type "([\w.]+)" has no field named "(\w+)"', msg)
    if m:
        type_name, bad = m.groups()
        desc = _pb().DESCRIPTOR.pool.FindMessageTypeByName(type_name)
        close = difflib.get_close_matches(bad, [f.name for f in desc.fields], n=1)
        hint = (
            f"; did you mean '{close[0]}'?"
            if close
            else f"; {desc.name} has: " + ", ".join(f.name for f in desc.fields)
        )
        return ConfigError(f"{where}: {pos}: unknown field '{bad}' in {desc.name}{hint}", bad, line, col)
    m = re.search(r'Enum type "([\w.]+)" has no value named (\w+)', msg)
    field = _field_at(text, line, col)
    if m:
        enum = _pb().DESCRIPTOR.pool.FindEnumTypeByName(m.group(1))
        names = [v.name for v in enum.values]
        close = (
            [DTYPE_ALIASES[m.group(2)]]
            if m.group(2) in DTYPE_ALIASES
            else difflib.get_close_matches(m.group(2), names, n=1)
        )
        hint = f"did you mean {close[0]}?" if close else "valid values: " + ", ".join(names)
        return ConfigError(
            f"{where}: {pos}: field '{field}' has no value {m.group(2)}; {hint}", field, line, col
        )
    expected = ""
    if field and field in _all_fields():
        expected = f"; '{field}' expects " + " or ".join(sorted(_all_fields()[field]))
    detail = msg.split("': ")[-1] if "': " in msg else msg.split(" : ", 1)[-1]
    return ConfigError(f"{where}: {pos}: bad value for field '{field}': {detail}{expected}", field, line, col)


def _field_at(text: str, line: int | None, col: int | None) -> str | None:
    """The last `name:` written before (line, col): the field whose value failed to parse."""
    if not line:
        return None
    lines = text.splitlines()
    before = "\n".join(lines[: line - 1] + [lines[line - 1][: max(0, (col or 1) - 1)]])
    names = re.findall(r"(\w+)\s*:", before)
    return names[-1] if names else None


def validate_config(text: str, where: str = "config.pbtxt"):
    """Parse config.pbtxt text into Triton's ModelConfig protobuf; raise ConfigError naming the bad field."""
    from google.protobuf import text_format

    if not isinstance(text, str):
        raise ConfigError(f"{where}: expected the config as text, got {type(text).__name__}")
    try:
        return text_format.Parse(text, _pb().ModelConfig())
    except text_format.ParseError as err:
        raise _explain(err, text, where) from None


def config_from_dict(config: dict[str, Any], where: str = "config") -> str:
    """Render a dict shaped like ModelConfig's JSON form as config.pbtxt text (validated on the way)."""
    from google.protobuf import json_format, text_format

    try:
        message = json_format.ParseDict(config, _pb().ModelConfig())
    except json_format.ParseError as err:
        m = re.search(r'no field named "(\w+)"', str(err))
        raise ConfigError(f"{where}: {err}", m.group(1) if m else None) from None
    return text_format.MessageToString(message)


def config_to_dict(cfg) -> dict[str, Any]:
    """A ModelConfig protobuf (or config text) as a plain dict, field names as in config.pbtxt."""
    from google.protobuf import json_format

    if isinstance(cfg, str):
        cfg = validate_config(cfg)
    return json_format.MessageToDict(cfg, preserving_proto_field_name=True)


def config_problems(cfg, folder_name: str | None = None) -> list[str]:
    """What Triton would refuse at load time although the text parses (empty list: none found)."""
    if isinstance(cfg, str):
        cfg = validate_config(cfg)
    problems: list[str] = []
    if folder_name is not None and cfg.name and cfg.name != folder_name:
        problems.append(f"name '{cfg.name}' differs from its folder '{folder_name}'")
    if not cfg.backend and not cfg.platform:
        problems.append('set backend (e.g. "python") or platform (e.g. "ensemble")')
    if cfg.platform and cfg.platform not in (
        "ensemble",
        "tensorrt_plan",
        "onnxruntime_onnx",
        "pytorch_libtorch",
        "tensorflow_savedmodel",
        "tensorflow_graphdef",
    ):
        problems.append(
            f"platform '{cfg.platform}' is not a Triton platform; LLM backends are "
            'chosen with backend: "tensorrtllm", "vllm" or "python"'
        )
    if cfg.HasField("dynamic_batching"):
        if cfg.max_batch_size <= 0:
            problems.append("dynamic_batching needs max_batch_size > 0 (0 means the model cannot batch)")
        for size in cfg.dynamic_batching.preferred_batch_size:
            if size > cfg.max_batch_size > 0:
                problems.append(f"preferred_batch_size {size} exceeds max_batch_size {cfg.max_batch_size}")
    for tensor in list(cfg.input) + list(cfg.output):
        if not tensor.name:
            problems.append("every input and output needs a name")
        if tensor.data_type == 0:
            problems.append(f"tensor '{tensor.name}' has no data_type")
        if not tensor.dims and not tensor.HasField("reshape"):
            problems.append(f"tensor '{tensor.name}' has no dims (use [-1] for a variable length)")
    if cfg.platform == "ensemble":
        problems.extend(_ensemble_problems(cfg))
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    if "gpt_model_type" in params and params["gpt_model_type"] not in GPT_MODEL_TYPES:
        problems.append(
            f"parameter gpt_model_type '{params['gpt_model_type']}' is the batching mode, "
            f"one of {GPT_MODEL_TYPES}, not the model family"
        )
    if "batch_scheduler_policy" in params and params["batch_scheduler_policy"] not in SCHEDULER_POLICIES:
        problems.append(
            f"parameter batch_scheduler_policy '{params['batch_scheduler_policy']}' "
            f"must be one of {SCHEDULER_POLICIES}"
        )
    return problems


def _ensemble_problems(cfg) -> list[str]:
    """Every step reads tensors that exist, every ensemble output is written by some step."""
    problems: list[str] = []
    steps = cfg.ensemble_scheduling.step
    if not steps:
        return ["an ensemble needs ensemble_scheduling { step [...] }"]
    available = {t.name for t in cfg.input}
    for i, step in enumerate(steps):
        for model_input, tensor in step.input_map.items():
            if tensor not in available:
                problems.append(
                    f"step {i} ({step.model_name}) reads '{tensor}' for its input "
                    f"'{model_input}', but no ensemble input or earlier step produces it"
                )
        available.update(step.output_map.values())
    for out in cfg.output:
        if out.name not in available:
            problems.append(f"ensemble output '{out.name}' is not written by any step's output_map")
    return problems
