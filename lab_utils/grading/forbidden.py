"""The catalogue of forbidden references: each family named once, questions name families.

A question that asks the learner to write something the course library, the standard library,
numpy or torch already computes forbids those functions (docs/AUTHORING.md, rule 5):

    @question("09.percentiles", points=3, answers=["percentiles"], forbid=refs("percentiles"))

`refs(*families)` returns the references of the named families, in order, without repeats; a name
that is not a family fails at import. Each family says *what the learner writes* instead, so the
refusal names what was called as what it is ("`statistics.median` is not allowed here: the question
asks you to write the median yourself"). A family may include other families (`+name`).

An entry is "module:attr" or "module:Class.attr"; tests/test_forbidden_catalogue.py checks that
every entry resolves to a real object and that every question's list comes from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab_utils.drills import TOPICS


@dataclass(frozen=True)
class Family:
    name: str
    what: str  # what the question asks the learner to write: "the percentile"
    refs: tuple[str, ...]


class Forbid(tuple):
    """The references of some families (a tuple of specs that remembers the family names)."""

    families: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {}


def family(name: str, what: str, *entries: str) -> None:
    """Register a family. `entries` are specs, or `+other` to include another family's."""
    if name in FAMILIES:
        raise ValueError(f"forbidden-reference family {name!r} is defined twice")
    specs: list[str] = []
    for entry in entries:
        if entry.startswith("+"):
            specs += [s for s in _family(entry[1:]).refs if s not in specs]
        elif ":" not in entry:
            raise ValueError(f"family {name}: {entry!r} is not 'module:attr'")
        elif entry not in specs:
            specs.append(entry)
    FAMILIES[name] = Family(name, what, tuple(specs))


def _family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(
            f"no forbidden-reference family {name!r} (lab_utils/grading/forbidden.py); known: {sorted(FAMILIES)}"
        ) from None


def refs(*names: str) -> Forbid:
    """The references of the families `names`, in order, without repeats."""
    specs: list[str] = []
    for name in names:
        specs += [s for s in _family(name).refs if s not in specs]
    out = Forbid(specs)
    out.families = tuple(names)
    return out


def what_for(spec: str) -> str:
    """What a question forbidding `spec` asks for: the `what` of the smallest family that holds it
    (statistics.median: "the median", though "percentiles" holds it too); "" when none."""
    holding = [fam for fam in FAMILIES.values() if spec in fam.refs]
    return min(holding, key=lambda fam: len(fam.refs)).what if holding else ""


def refusal(spec: str) -> str:
    """The feedback for an answer that is or calls `spec`: names it as what it is."""
    module, _, attr = spec.partition(":")
    what = what_for(spec)
    why = f": the question asks you to write {what} yourself" if what else "; write your own"
    if module.startswith("lab_utils"):
        return f"the course's `{attr}` is not allowed here{why}"
    return f"`{module.split('.')[0]}.{attr}` is not allowed here{why}"


# --- percentiles and medians -------------------------------------------------------------------

family(
    "course_percentiles",
    "the percentile",
    "lab_utils.clients.loadgen:percentile",
    "lab_utils.sim.metrics:percentile",
    "lab_utils.mathutils:percentile",
    "lab_utils.sim.priority:percentile",
)
# sorted ranks and one np.interp at the fractional rank is the interpolation
family("interpolation", "the interpolation", "numpy:interp")
family(
    "library_percentiles",
    "the percentile",
    "numpy:percentile",  # the sandbox replaces numpy.lib's own copy too
    "numpy:quantile",
    "numpy:nanpercentile",
    "numpy:nanquantile",
    "+interpolation",
    "statistics:quantiles",
    "torch:quantile",  # torch is in the course environment (vLLM's)
    "torch:nanquantile",
    "torch:Tensor.quantile",
    "torch:Tensor.nanquantile",
)
family(
    "library_medians",
    "the median",
    "statistics:median",
    "numpy:median",
    "numpy:nanmedian",
    "torch:median",
    "torch:nanmedian",
    "torch:Tensor.median",
    "torch:Tensor.nanmedian",
)
family("percentiles", "the percentile", "+course_percentiles", "+library_percentiles", "+library_medians")
# course code that computes percentiles on the way: a load run's summary, a sweep's row and tails
family(
    "percentile_summaries",
    "the percentile",
    "lab_utils.clients.loadgen:summarize",
    "lab_utils.clients.loadgen:LoadResult",
    "lab_utils.bench.load:level_row",
    "lab_utils.bench.load:level_tails",
    "lab_utils.sim.metrics:summarize",
    "lab_utils.triton.measure:LoadResult",
    "lab_utils.triton.measure:OpenLoopResult",
)
family(
    "histogram_quantiles",
    "the quantile from the histogram's buckets",
    "lab_utils.clients.metrics:histogram_quantile",
    "+interpolation",
)
family("request_records", "the per-request figures", "lab_utils.clients.loadgen:RequestRecord")

# --- model shape, memory and KV sizing ---------------------------------------------------------

family("model_spec", "the model-shape arithmetic", "lab_utils.memory.spec:ModelSpec")
family(
    "decode_speed",
    "the decode-speed estimate",
    "lab_utils.memory.weights:weight_bytes",
)
family(
    "roofline",
    "the roofline arithmetic",
    "lab_utils.memory.recommend:decode_tokens_per_s",
)
family("linear_shapes", "the projections' shapes", "lab_utils.memory.spec:ModelSpec.linear_shapes")
family(
    "prefill_flops",
    "the prefill arithmetic",
    "lab_utils.memory.spec:ModelSpec.non_embedding_params",
    "lab_utils.memory.spec:ModelSpec.num_params",
    "lab_utils.memory.spec:ModelSpec.linear_params",
    "+linear_shapes",
    "lab_utils.memory.spec:ModelSpec.prefill_flops",
    "lab_utils.memory.spec:ModelSpec.decode_flops_per_token",
)
family("kv_blocks", "the block count", "lab_utils.memory.kv:kv_cache_num_blocks")
family("kv_per_token", "the KV bytes per token", "lab_utils.memory.kv:kv_cache_bytes_per_token")
family(
    "vllm_capacity",
    "vLLM's capacity arithmetic",
    "lab_utils.memory.kv:vllm_kv_cache_report",
    "lab_utils.memory.kv:kv_cache_capacity_tokens",
    "+kv_blocks",
)
family(
    "kv_block_bytes",
    "the KV bytes",
    "+kv_per_token",
    "lab_utils.memory.kv:kv_cache_block_bytes",
    "lab_utils.engine.llama:LlamaConfig.kv_bytes_per_token",
)
family(
    "kv_sizing",
    "the KV-cache sizing",
    "+kv_block_bytes",
    "+vllm_capacity",
    "lab_utils.memory.kv:KVCacheReport",
    "lab_utils.memory.breakdown:memory_breakdown",
)
family(
    "engine_kv_sizing", "the KV-cache sizing", "lab_utils.engine.model_runner:ModelRunner.kv_bytes_per_block"
)
family(
    "kv_dtype_sizing",
    "the bytes of a quantized KV cache",
    "lab_utils.engine.kv_quant:engine_kv_bytes_per_token",
    "lab_utils.engine.kv_quant:kv_cache_dtype",
    "+engine_kv_sizing",
    "+kv_sizing",
)
family(
    "accuracy_gate",
    "the exact interval and the gate",
    "lab_utils.accuracy_gate:clopper_pearson",
    "lab_utils.accuracy_gate:gate_agreement",
    "lab_utils.accuracy_gate:gate_paired",
    "lab_utils.accuracy_gate:paired_bootstrap",
)
family(
    "tp_checks",
    "the parallelism rules",
    "lab_utils.deploy.parallel:parallel_problems",
    "lab_utils.memory.recommend:_tp_allowed",
)
family("kv_heads", "the KV heads per GPU", "lab_utils.memory:kv_heads_per_gpu")
family("tensor_parallel", "the parallelism rules", "+tp_checks", "+kv_heads")
# the drills' calculators (the TP rule, speculative decoding, rejection sampling, prefix blocks,
# replicas, MoE, MLA, all-to-all, KV transfer, load-or-recompute) left the learner's copy for
# grader/drill_calc.py (issue 47): nothing to refuse, no family for them
family(
    "lora_sizing",
    "the LoRA sizing",
    "lab_utils.memory.lora:lora_adapter_bytes",
    "lab_utils.memory.lora:lora_params_per_rank_per_layer",
    "lab_utils.memory.lora:_shapes",
    "lab_utils.memory.lora:adapters_that_fit",
    "+linear_shapes",
)

# --- the KV cache manager and prefix caching ---------------------------------------------------

# lab 02's waste figure (never_used_fraction) left the learner's copy for grader/hidden/lab02.py
# (`_ref_never_used`, fingerprinted as the hidden reference; issue 47 item 2): no family for it
family("max_concurrent", "the concurrency figure", "lab_utils.kv.workload:max_concurrent_requests")
family(
    "prefix_lookup",
    "the prefix lookup",
    "lab_utils.kv.kv_cache_manager:KVCacheManager.get_computed_blocks",
    "lab_utils.kv.block_pool:hash_request_blocks",
)
family(
    "kv_manager",
    "the block manager",
    "lab_utils.kv.kv_cache_manager:KVCacheManager",
    "lab_utils.kv.block_pool:BlockPool",
    "+prefix_lookup",
)
family(
    "prometheus_parsers",
    "the metrics parsing",
    "lab_utils.kv.metrics:parse_prometheus",
    "lab_utils.kv.metrics:vllm_kv_metrics",
    "lab_utils.clients.metrics:parse_prometheus",
    "lab_utils.clients.metrics:metric_value",
    "lab_utils.clients.metrics:_parse_labels",
    "lab_utils.clients.metrics:_parse_value",
    "lab_utils.clients.metrics:scrape",
    "lab_utils.clients.metrics:MetricsSampler",
    "lab_utils.triton.measure:parse_metrics",
    "lab_utils.triton.measure:metric_value",
    "lab_utils.triton.measure:MetricsSampler",
    "prometheus_client.parser:text_string_to_metric_families",
    "prometheus_client.parser:text_fd_to_metric_families",
    "prometheus_client.parser:_parse_sample",
    "prometheus_client.parser:parse_labels",
    "prometheus_client.openmetrics.parser:text_string_to_metric_families",
    "prometheus_client.openmetrics.parser:text_fd_to_metric_families",
    "prometheus_client.openmetrics.parser:_parse_sample",
)

# --- batching, scheduling and simulators -------------------------------------------------------

family(
    "reference_schedule",
    "the scheduling step",
    "lab_utils.sim.scheduler:reference_schedule",
    "lab_utils.engine.scheduler:Scheduler.reference_schedule",
)
family("tgi_sim", "the prediction", "lab_utils.tgi.measure:tgi_sim")
family("simulate", "the prediction", "lab_utils.sim.simulator:simulate", "lab_utils.sim:simulate")
family(
    "batching_policies", "the prediction", "lab_utils.sim:StaticBatching", "lab_utils.sim:ContinuousBatching"
)
family(
    "simulators",
    "the prediction",
    "+simulate",
    "lab_utils.sim.simulator:_run_static",
    "lab_utils.sim.simulator:_run_continuous_plain",
    "lab_utils.sim.simulator:_run_continuous_fast",
    "lab_utils.sim.metrics:sweep_load",
    "lab_utils.sim.measure:measure_batching_gain",
    "lab_utils.drills.measure:measure_batching_gain",
    "lab_utils.drills.measure:measure_workload",
    "lab_utils.tgi.measure:vllm_sim",
    "+tgi_sim",
    "lab_utils.tgi.measure:compare_tgi_vllm",
    "lab_utils.deploy.disagg:colocated",
    "lab_utils.deploy.disagg:disaggregated",
    "lab_utils.deploy.disagg:compare_pools",
    "lab_utils.viz.timeline:explorer_result",
)
family("slot_utilisation", "the utilisation figure", "lab_utils.sim.metrics:slot_utilisation")
family("batching_measurement", "the measured summary", "lab_utils.drills.measure:BatchingMeasurement")
family(
    "batching_gain_measure",
    "the measured gain",
    "lab_utils.sim.measure:_throughput",
    "lab_utils.sim.measure:BatchingGain",
    "+percentile_summaries",
    "+batching_measurement",
)
family("batching_models", "the batching model", "+simulators", "+batching_policies")
family(
    "goodput",
    "the goodput",
    "lab_utils.sim.metrics:goodput",
    "lab_utils.bench.load:goodput_rps",
    "lab_utils.bench.load:SLO.met",
    "lab_utils.sim.metrics:SLO.met_by",
)
family("slo", "the objective test", "lab_utils.bench.load:SLO")
family(
    "engine_runs",
    "the prediction",
    "lab_utils.engine.measure:EngineRun.peak_blocks",
    "lab_utils.engine.llm_engine:LLMEngine",
    "lab_utils.engine.llm_engine:LLM",
    "lab_utils.engine.scheduler:Scheduler",
    "+simulate",
)
family(
    "priority_simulators",
    "the prediction",
    "lab_utils.sim.priority:simulate_priority",
    "+simulate",
    "+batching_policies",
    "+reference_schedule",
)

# --- servers, TGI, Triton, TensorRT-LLM --------------------------------------------------------

family(
    "client_kwargs",
    "the client's settings",
    "lab_utils.servers.vllm:VLLMServer.client_kwargs",
    "lab_utils.servers.base:OpenAIAddresses",
)
family(
    "tgi_admission_class",
    "TGI's admission rule",
    "lab_utils.tgi.admission:TGIAdmission",
    "lab_utils.tgi:TGIAdmission",
)
family(
    "tgi_admission",
    "TGI's admission rule",
    "lab_utils.tgi.admission:min_batch_size",
    "lab_utils.tgi:min_batch_size",
    "lab_utils.tgi.admission:next_batch",
    "lab_utils.tgi:next_batch",
    "lab_utils.tgi.admission:reserved_tokens",
    "lab_utils.tgi:reserved_tokens",
    "+tgi_admission_class",
)
family("tgi_simulators", "the prediction", "+tgi_sim", "+tgi_admission_class", "+simulate")
family("late_arrival", "the measured wait", "lab_utils.tgi.measure:LateArrival")
family(
    "tgi_wait_models",
    "the prediction",
    "lab_utils.tgi.measure:late_arrival",
    "+late_arrival",
    "lab_utils.tgi.measure:ttft_by_prefill_budget",
    "+tgi_simulators",
    "+simulators",
)
family("router_run", "the router's figures", "lab_utils.tgi.measure:RouterRun")
family(
    "json_schema_writers",
    "the JSON schema",
    "pydantic:create_model",
    "pydantic:TypeAdapter",
    "pydantic:BaseModel.model_json_schema",
    "pydantic.json_schema:model_json_schema",
    "pydantic.json_schema:models_json_schema",
    "pydantic.json_schema:GenerateJsonSchema",
    "openai.lib._pydantic:to_strict_json_schema",
    "msgspec.json:schema",
    "msgspec.json:schema_components",
)
family("triton_mlp_config", "the model configuration", "lab_utils.triton.recipes:mlp_config")
family("triton_ensemble_config", "the ensemble configuration", "lab_utils.triton.recipes:ensemble_config")
family(
    "dynamic_batching_simulators",
    "the prediction",
    "+simulate",
    "lab_utils.sim.policies:DynamicBatching",
    "lab_utils.sim:DynamicBatching",
)
family(
    "triton_batch_stats",
    "the batch statistics",
    "lab_utils.triton.measure:batch_counts",
    "lab_utils.triton.measure:BatchCounts",
    "lab_utils.triton.measure:settled_counts",
    "lab_utils.triton.measure:measure_batcher",
)
family(
    "trtllm_kv_planning",
    "the KV-cache plan",
    "lab_utils.trtllm.plan:concurrent_sequences",
    "lab_utils.trtllm.plan:plan_memory",
    "+kv_blocks",
)
family(
    "quantizers",
    "the quantizer",
    "lab_utils.trtllm.quant:quantize",
    "lab_utils.trtllm.quant:fake_quantize",
    "lab_utils.trtllm.quant:awq_quantize",
)
family(
    "quantized_bytes",
    "the byte count",
    "lab_utils.trtllm.plan:nvfp4_matrix_bytes",
    "lab_utils.trtllm.plan:weight_bytes_in",
    "lab_utils.trtllm.quant:QuantizedWeight.nbytes",
    "+quantizers",
    "lab_utils.memory.weights:_four_bit_matrix_bytes",
)
# lab 08's group_quantize (codes and scales as a pair) and predict_rms_error are written by the
# learner; their references are the grader's (grader/hidden/lab08.py: _ref_group, _ref_predict), which
# the fingerprint watch covers (issue 47 item 2): the library quantizes only through `quantize`

# --- benchmarking, autoscaling, deployment -----------------------------------------------------

family("coordinated_omission", "the correction", "lab_utils.bench.load:latency_from_intended")
family(
    "cost_per_token",
    "the cost arithmetic",
    "lab_utils.bench.autoscale:AutoscaleRun.cost_per_million_tokens",
    "lab_utils.bench.autoscale:AutoscaleRun.cost_usd",
)
family(
    "knee", "the knee", "lab_utils.bench.load:knee_rate_model", "lab_utils.bench.autoscale:ReplicaModel.step"
)
family("littles_law", "Little's law", "lab_utils.bench.load:littles_law")
family(
    "scaling_policies",
    "the scaling policy",
    "lab_utils.bench.autoscale:queue_policy",
    "lab_utils.bench.autoscale:utilisation_policy",
    "lab_utils.bench.autoscale:seed_policy",
    "lab_utils.bench.autoscale:fixed_policy",
)
family("routing_run", "the routing figures", "lab_utils.routing:RoutingRun")
family("gateway", "the gateway's admission", "lab_utils.gateway:TokenBucket", "lab_utils.gateway:Admission")

# --- interview drills --------------------------------------------------------------------------

family(
    "drill_calculators",
    "the drill's arithmetic",
    *(f"+{name}" for name in ("tensor_parallel", "roofline", "batching_models", "cost_per_token")),
    *(f"+{name}" for name in ("prefill_flops", "goodput", "decode_speed")),
)
# what else answers a drill: the model-shape helpers, and the drill generators themselves (a drill
# replayed from its inputs carries its answer)
family(
    "drill_library",
    "the drill's arithmetic",
    "lab_utils.memory:kv_cache_bytes_per_token",
    "lab_utils.memory:weight_bytes",
    "lab_utils.memory:activation_bytes",
    "lab_utils.drills:make_drills",
    *(f"lab_utils.drills.topics:{name}" for name in TOPICS),
)

# --- labs 04 (speculative decoding) and 14 (KV beyond one engine) --------------------------------

family(
    "speculative_verifiers",
    "the verification step",
    "lab_utils.engine.model_runner:accept_greedy",
    "lab_utils.engine.sampler:Sampler.accept_sampled",
    "lab_utils.engine.sampler:Sampler.sample",
    # transformers' assisted generation verifies drafts by rejection sampling in one call
    "transformers.generation.utils:_speculative_sampling",
)
family("kv_transfer", "the transfer time", "lab_utils.deploy.disagg:transfer_seconds")
# lab 14: vLLM's disk connector rounds a prompt down to the whole blocks it stores, last token left out
family(
    "stored_tokens",
    "the stored tokens",
    "vllm.distributed.kv_transfer.kv_connector.v1.example_connector:align_to_block_size",
)
# lab 13: vLLM's expert-parallel load balancer (EPLB) replicates hot experts and packs them on GPUs
_EPLB = "vllm.distributed.eplb.policy.default:DefaultEplbPolicy"
family(
    "expert_placement",
    "the expert placement",
    f"{_EPLB}.rebalance_experts",
    f"{_EPLB}.rebalance_experts_hierarchical",
    f"{_EPLB}.replicate_experts",
    f"{_EPLB}.balanced_packing",
)
family(
    "kv_tier_counters",
    "the counters' arithmetic",
    "lab_utils.kvtier.metrics:counters",
    "lab_utils.routing:prefix_cache_counters",
    "+prometheus_parsers",
)

# --- lab 15 (reasoning models and agents) ------------------------------------------------------

_R1 = "vllm.reasoning.deepseek_r1_reasoning_parser:DeepSeekR1ReasoningParser"
family(
    "reasoning_parsers",
    "the output's split",
    f"{_R1}.extract_reasoning",
    "vllm.reasoning.basic_parsers:BaseThinkingReasoningParser.extract_reasoning",
    "vllm.tool_parsers.hermes_tool_parser:Hermes2ProToolParser.extract_tool_calls",
    # the build's format score reads the same tags (strictly; it is not a parser, but close)
    "lab_utils.reasoning.build:score",
)
family(
    "thinking_budget",
    "the thinking budget's effect",
    "vllm.v1.sample.thinking_budget_state:ThinkingBudgetStateHolder",
    "vllm.v1.sample.thinking_budget_state:ThinkingBudgetStateHolder.update_state",
    "vllm.v1.sample.thinking_budget_state:ThinkingBudgetStateHolder.apply_to_logits",
)
family(
    "prefix_cache_model",
    "the prefix-cache hits",
    "+kv_manager",
    "lab_utils.routing:cacheable_prefix_tokens",
)
