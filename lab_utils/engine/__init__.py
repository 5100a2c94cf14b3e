"""The course engine: paged KV cache + continuous batching on a real model, in vLLM's shape.

    from lab_utils.engine import LLMEngine, SamplingParams
    engine = LLMEngine(max_num_seqs=8)                 # course model, float32
    out = engine.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))
    out[0].outputs[0].text

Modules, one idea each: `sampling_params`, `request`, `scheduler` (the plan), `llama` (the model
and paged attention, in plain torch), `kv_quant` (how K/V are stored: `kv_cache_dtype` fp8 or
int8), `fast` (the same model with CPU kernels, behind one switch: `LLMEngine(fast=False)` runs
`llama` alone), `model_runner` (plan -> tensors -> tokens), `sampler`, `spec_decode` (n-gram
drafts for speculative decoding, off unless `num_speculative_tokens` is set; sampled requests keep
drafts by rejection sampling), `llm_engine` (the loop), `snapshot` (per-step records for the
plots), `serve` (an OpenAI-style HTTP server over the engine: `python -m lab_utils.engine.serve
--port 8000`, or `lab_utils.servers.EngineServer`).
Nothing heavy is imported until used.
"""

from .config import EngineConfig
from .llm_engine import LLM, LLMEngine
from .measure import EngineRun
from .outputs import CompletionOutput, RequestMetrics, RequestOutput
from .request import Request, RequestStatus
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from .snapshot import StepSnapshot, to_sim_result

__all__ = [
    "CompletionOutput",
    "EngineConfig",
    "EngineRun",
    "LLM",
    "LLMEngine",
    "Request",
    "RequestMetrics",
    "RequestOutput",
    "RequestStatus",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "StepSnapshot",
    "to_sim_result",
]
