"""The course engine: vLLM's offline API over a paged KV cache and a continuous-batching scheduler.

    from lab_utils.engine import LLMEngine, SamplingParams
    engine = LLMEngine()                      # the course model, float32 on CPU
    outs = engine.generate(["Hello"], SamplingParams(temperature=0, max_tokens=20))
    outs[0].outputs[0].text
    LLMEngine(num_speculative_tokens=4)       # n-gram drafts checked in the step (spec_decode.py)

The loop is the one vLLM runs (`EngineCore.step`): `step()` = schedule -> execute -> update -> outputs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import EngineConfig, resolve_model
from .outputs import CompletionOutput, RequestMetrics, RequestOutput
from .request import Request, RequestStatus
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from .snapshot import StepSnapshot, to_sim_result

if TYPE_CHECKING:  # imported lazily at run time
    from .measure import EngineRun

PromptType = str | Sequence[int]


class LLMEngine:
    """Serve a Llama-architecture Hugging Face folder with paged KV and continuous batching.

    Args:
        model: the model folder; None = the course model (`lab_utils.models.course_model_path()`).
        config: an EngineConfig; or pass its fields as keyword arguments (`max_num_seqs=8`).
        kv_cache_manager: None (lab 02's `lab_utils.kv.KVCacheManager`), a class called as
            `cls(num_blocks, block_size, enable_caching=...)`, or a ready instance; either way it
            implements `lab_utils.kv.interface.KVCacheManagerInterface` (a learner's lab 02 class does).
        scheduler: None (the reference `Scheduler`), a class called as `cls(kv, SchedulerConfig)`,
            or a ready instance wired to the same KV manager.
        schedule_fn: a lab 03 policy `schedule_fn(state) -> plan` for the reference Scheduler.
        tokenizer: a tokenizer with encode/decode; None loads the folder's with transformers.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        config: EngineConfig | None = None,
        *,
        kv_cache_manager: Any = None,
        scheduler: Any = None,
        schedule_fn: Callable | None = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        if config is not None and kwargs:
            raise ValueError("pass either config=EngineConfig(...) or keyword arguments, not both")
        self.config = config or EngineConfig(**kwargs)
        self.model_path = resolve_model(model)
        from .llama import LlamaConfig  # fails early, before loading weights, on a foreign folder

        LlamaConfig.from_folder(self.model_path)
        from .model_runner import ModelRunner

        cfg = self.config
        self.device = cfg.resolved_device()
        self.model_runner = ModelRunner(
            self.model_path,
            device=self.device,
            dtype=cfg.resolved_dtype(self.device),
            seed=cfg.seed,
            num_threads=cfg.num_threads,
            fast=cfg.fast,
            kv_cache_dtype=cfg.kv_cache_dtype,
        )
        self.model_config = self.model_runner.config
        self.eos_token_id = self.model_config.eos_token_ids[0] if self.model_config.eos_token_ids else None

        self.kv_cache_manager = self._make_kv_manager(kv_cache_manager)
        self.block_size = int(self.kv_cache_manager.block_size)
        self.num_blocks = int(getattr(self.kv_cache_manager, "num_blocks", self._planned_blocks))
        self.max_model_len = self._resolve_max_model_len()
        self.model_runner.initialize_kv_cache(self.num_blocks, self.block_size)

        sched_cfg = SchedulerConfig(
            cfg.max_num_seqs,
            cfg.max_num_batched_tokens,
            self.max_model_len,
            cfg.enable_chunked_prefill,
            cfg.long_prefill_token_threshold,
        )
        if scheduler is None:
            self.scheduler = Scheduler(self.kv_cache_manager, sched_cfg, schedule_fn=schedule_fn)
        elif isinstance(scheduler, type):
            self.scheduler = scheduler(self.kv_cache_manager, sched_cfg)
        else:
            self.scheduler = scheduler
        self.proposer = None  # speculative decoding: n-gram drafts (spec_decode.py)
        if cfg.num_speculative_tokens:
            from .spec_decode import NgramProposer

            self.proposer = NgramProposer(
                cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max
            )
        self.tokenizer = tokenizer if tokenizer is not None else self._load_tokenizer()
        self._counter = itertools.count()
        self._requests: dict[str, Request] = {}  # live requests, until their last output is returned
        self.request_stats: dict[str, dict] = {}  # per finished request: lengths, times, preemptions
        self.snapshots: list[StepSnapshot] = []
        self._capture: list[dict] | None = None  # per-step plan records while measure() runs
        self.t0 = time.perf_counter()

    # ------------------------------------------------------------------ construction helpers
    def _make_kv_manager(self, kv: Any) -> Any:
        cfg = self.config
        per_block = self.model_runner.kv_bytes_per_block(cfg.block_size)
        self._planned_blocks = cfg.num_kv_blocks or max(1, int(cfg.kv_cache_gib * 2**30 // per_block))
        from lab_utils.kv.interface import missing_members

        if kv is None:
            from lab_utils.kv import KVCacheManager as kv
        if isinstance(kv, type):
            kv = kv(self._planned_blocks, cfg.block_size, enable_caching=cfg.enable_prefix_caching)
        missing = missing_members(kv)
        if missing:
            raise TypeError(
                f"kv_cache_manager lacks {', '.join(missing)}: it must implement "
                "lab_utils.kv.interface.KVCacheManagerInterface (lab 02)"
            )
        return kv

    def _resolve_max_model_len(self) -> int:
        capacity = self.num_blocks * self.block_size
        model_max = self.model_config.max_position_embeddings
        wanted = self.config.max_model_len
        if wanted is None:
            return min(model_max, capacity)
        if wanted > model_max:
            raise ValueError(f"max_model_len={wanted} exceeds the model's context of {model_max} tokens")
        if wanted > capacity:
            raise ValueError(
                f"max_model_len={wanted} tokens does not fit the KV cache "
                f"({self.num_blocks} blocks x {self.block_size} = {capacity} tokens): "
                "one request alone could never finish. Lower max_model_len or add blocks."
            )
        return wanted

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_path)

    # ------------------------------------------------------------------ requests
    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """Prompt text (if any) and validated token ids; raises ValueError on bad input."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: give at least one token of text")
            ids = list(self.tokenizer.encode(prompt))
            text: str | None = prompt
        else:
            try:
                ids = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise ValueError(
                    f"a prompt is a string or a list of token ids, got {type(prompt).__name__}"
                ) from None
            text = None
        if not ids:
            raise ValueError("prompt is empty: give at least one token")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}, "
                "which leaves no room for output. Shorten the prompt or raise max_model_len."
            )
        if not self.config.enable_chunked_prefill and len(ids) > self.config.max_num_batched_tokens:
            raise ValueError(
                f"prompt has {len(ids)} tokens but chunked prefill is off and the token "
                f"budget is {self.config.max_num_batched_tokens}; it could never be scheduled"
            )
        return text, ids

    def add_request(
        self,
        request_id: str | None,
        prompt: PromptType,
        sampling_params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Validate and queue one request; returns its id. A bad request raises and changes nothing."""
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self._tokenize(prompt)
        rid = str(next(self._counter)) if request_id is None else str(request_id)
        if rid in self._requests:
            raise ValueError(f"request id {rid!r} is already in use")
        req = Request(
            rid, ids, params, prompt=text, arrival_time=arrival_time, eos_token_id=self.eos_token_id
        )
        self.scheduler.add_request(req)
        self._requests[rid] = req
        return rid

    def abort_request(self, request_ids: str | Sequence[str]) -> None:
        """Stop requests now and free their blocks."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for req in self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED):
            self._retire(req)

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        """Waiting plus running requests."""
        return self.scheduler.get_num_unfinished_requests()

    # ------------------------------------------------------------------ the loop
    def step(self, *, finished_only: bool = False) -> list[RequestOutput]:
        """One iteration, as vLLM's `EngineCore.step`: schedule -> execute -> update -> outputs.

        With speculative decoding on, the update ends by proposing the next step's drafts.

        Returns an output per request that got a token in this step; with `finished_only`, only
        for those that finished (`generate` uses it, so unfinished text is not detokenized).
        """
        t_start = time.perf_counter()
        scheduler_output = self.scheduler.schedule()
        self._check_progress(scheduler_output)
        t_sched = time.perf_counter()
        runner_output = self.model_runner.execute_model(scheduler_output, self._requests)
        t_exec = time.perf_counter()
        advanced = self._update(scheduler_output, runner_output.sampled_token_ids)
        if self.proposer is not None:
            self.proposer.propose_for(advanced, self.max_model_len)
        outputs = [self._make_output(r) for r in advanced if r.is_finished or not finished_only]
        self._record(scheduler_output, runner_output.sampled_token_ids, advanced, t_start, t_sched, t_exec)
        return outputs

    def _check_progress(self, scheduler_output: SchedulerOutput) -> None:
        if scheduler_output.total_num_scheduled_tokens == 0 and self.has_unfinished_requests():
            # Nothing can change the plan before the next step (no clock, no arrivals): a stall.
            raise RuntimeError(
                f"the scheduler planned no work with {self.get_num_unfinished_requests()} requests "
                "unfinished; a policy must give at least one running or waiting request tokens"
            )

    def _update(
        self, scheduler_output: SchedulerOutput, sampled_token_ids: dict[str, list[int]]
    ) -> list[Request]:
        """Advance every request by the step's work; returns the requests that got a token.

        The scheduler appends the tokens and stops requests on EOS, stop tokens and length; stop
        strings need the tokenizer, so they are checked here. Finished requests are retired.
        """
        self.scheduler.update_from_output(scheduler_output, sampled_token_ids)
        now = time.monotonic()
        advanced = [self._requests[rid] for rid in sampled_token_ids]
        for req in advanced:
            if req.first_token_time is None:
                req.first_token_time = now
            if req.sampling_params.stop_strings and not req.is_finished and self._hit_stop_string(req):
                self.scheduler.finish_requests(req.request_id, RequestStatus.FINISHED_STOPPED)
        for req in advanced:
            if req.is_finished:
                self._retire(req)
        return advanced

    def _hit_stop_string(self, req: Request) -> bool:
        text = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)
        hits = [(text.find(s), s) for s in req.sampling_params.stop_strings if s in text]
        if not hits:
            return False
        req.stop_reason = min(hits)[1]
        return True

    def _make_output(self, req: Request) -> RequestOutput:
        text = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)
        if isinstance(req.stop_reason, str):
            text = text[: text.find(req.stop_reason)]  # the stop string itself is not returned
        reason = req.status.value if req.is_finished else None
        completion = CompletionOutput(0, text, list(req.output_token_ids), reason, req.stop_reason)
        metrics = RequestMetrics(
            req.arrival_time,
            req.first_scheduled_time,
            req.first_token_time,
            req.finished_time,
            req.num_preemptions,
            req.num_cached_tokens,
        )
        return RequestOutput(
            req.request_id, req.prompt, list(req.prompt_token_ids), [completion], req.is_finished, metrics
        )

    def _retire(self, req: Request) -> None:
        """Forget a finished request, keeping its lengths, times and preemptions in request_stats."""
        req.finished_time = time.monotonic()
        self._requests.pop(req.request_id, None)
        self.model_runner.sampler.forget(req.request_id)
        if self.proposer is not None:
            self.proposer.forget(req.request_id)
        self.request_stats[req.request_id] = {
            "arrival_time": req.arrival_time,
            "first_token_time": req.first_token_time,
            "finished_time": req.finished_time,
            "prompt_len": req.num_prompt_tokens,
            "output_len": req.num_output_tokens,
            "num_preemptions": req.num_preemptions,
            "finish_reason": req.status.value,
        }

    def _record(
        self,
        so: SchedulerOutput,
        sampled: dict[str, list[int]],
        advanced: list[Request],
        t_start: float,
        t_sched: float,
        t_exec: float,
    ) -> None:
        """The step's metrics, in one place: `measure()`'s per-step record and a `StepSnapshot`.

        Prefill and decode are the scheduler's split (`so.decode_req_ids`), not re-derived here.
        """
        t_end = time.perf_counter()
        kv = self.kv_cache_manager
        if self._capture is not None:
            self._capture.append(
                {
                    "step": so.step,
                    "schedule_s": t_sched - t_start,
                    "execute_s": t_exec - t_sched,
                    "update_s": t_end - t_exec,
                    "scheduled": {r: int(n) for r, n in so.num_scheduled_tokens.items()},
                    "blocks": {r: len(b) for r, b in so.block_tables.items()},
                    "preempted": list(so.preempted_req_ids),
                    "num_free_blocks": int(getattr(kv, "num_free_blocks", 0)),
                }
            )
        if not self.config.record_steps:
            return
        running = list(self.scheduler.running)
        computed = {r.request_id: r.num_computed_tokens for r in running}
        frame = None
        if self.config.record_frames and hasattr(kv, "block_pool"):
            from lab_utils.kv.trace import snapshot

            desc = f"step {so.step}: {len(so.req_ids)} requests, {so.total_num_scheduled_tokens} tokens"
            frame = snapshot(kv, computed, len(self.snapshots), "step", None, desc, so.blocks_to_copy)
        decode = set(so.decode_req_ids)
        self.snapshots.append(
            StepSnapshot(
                step=so.step,
                start=t_start - self.t0,
                schedule_s=t_sched - t_start,
                execute_s=t_exec - t_sched,
                update_s=t_end - t_exec,
                prefill={r: n for r, n in so.num_scheduled_tokens.items() if r not in decode},
                decode=list(so.decode_req_ids),
                num_computed_tokens=computed,
                block_tables={r.request_id: list(kv.get_block_ids(r.request_id)) for r in running},
                new_req_ids=list(so.new_req_ids),
                preempted_req_ids=list(so.preempted_req_ids),
                finished_req_ids=sorted(r.request_id for r in advanced if r.is_finished),
                num_running=len(running),
                num_waiting=len(self.scheduler.waiting),
                kv_usage=float(getattr(kv, "usage", 0.0)),
                num_free_blocks=int(getattr(kv, "num_free_blocks", 0)),
                frame=frame,
                num_spec_tokens=sum(len(d) for d in so.scheduled_spec_tokens.values()),
                # Each checked request's tokens: the drafts it kept, then the model's own one.
                num_accepted_tokens=sum(
                    len(sampled[r]) - 1 for r in so.scheduled_spec_tokens if r in sampled
                ),
            )
        )

    # ------------------------------------------------------------------ offline API
    def _add_all(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    ) -> list[str]:
        if isinstance(prompts, str) or (
            prompts and isinstance(prompts, Sequence) and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # one prompt, text or token ids
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        for p in prompts:  # validate every prompt before queueing any
            self._tokenize(p)
        return [self.add_request(None, p, sp) for p, sp in zip(prompts, params)]

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts (strings or token-id lists) to completion; outputs in prompt order."""
        ids = self._add_all(prompts, sampling_params)
        wanted = set(ids)
        done: dict[str, RequestOutput] = {}
        while wanted - done.keys():
            if not self.has_unfinished_requests():
                raise RuntimeError("the engine went idle before every request finished")
            for out in self.step(finished_only=True):
                if out.finished and out.request_id in wanted:
                    done[out.request_id] = out
        return [done[i] for i in ids]

    def measure(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        label: str = "",
    ) -> EngineRun:
        """Run prompts like `generate` and return the measured run as an `EngineRun`.

        The run keeps each step's plan (tokens, blocks held, preemptions) and timings and every
        request's output token ids: the raw samples the lab's analysis functions read.
        """

        from .measure import EngineRun

        if self._capture is not None:
            raise RuntimeError("measure() is already running on this engine")
        self._capture = []
        try:
            t0 = time.perf_counter()
            outs = self.generate(prompts, sampling_params)
            wall = time.perf_counter() - t0
            steps = self._capture
        finally:
            self._capture = None
        sc = self.scheduler.config
        settings = {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "max_num_seqs": int(sc.max_num_seqs),
            "max_num_batched_tokens": int(sc.max_num_batched_tokens),
            "max_model_len": int(sc.max_model_len),
        }
        run = EngineRun(
            label=str(label),
            settings=settings,
            request_ids=[o.request_id for o in outs],
            prompt_lens=[len(o.prompt_token_ids) for o in outs],
            output_token_ids=[list(map(int, o.outputs[0].token_ids)) for o in outs],
            wall_s=wall,
            steps=steps,
            free_blocks_after=int(getattr(self.kv_cache_manager, "num_free_blocks", 0)),
        )
        return run

    def stream(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yield a cumulative RequestOutput every time one of these requests gets a token."""
        ids = set(self._add_all(prompts, sampling_params))
        pending = set(ids)
        while pending:
            for out in self.step():
                if out.request_id in ids:
                    yield out
                    if out.finished:
                        pending.discard(out.request_id)

    def sim_result(self, policy: str = "course engine"):
        """The recorded steps as lab 03's SimResult (for its timeline plot)."""
        stats = self.request_stats
        t0 = self.t0
        # request arrival is on the monotonic clock; steps on perf_counter since t0: align both.
        offset = time.monotonic() - (time.perf_counter() - t0)
        return to_sim_result(
            self.snapshots,
            arrivals={r: s["arrival_time"] - offset for r, s in stats.items()},
            prompt_lens={r: s["prompt_len"] for r, s in stats.items()},
            output_lens={r: s["output_len"] for r, s in stats.items()},
            policy=policy,
            num_slots=self.config.max_num_seqs,
        )


class LLM:
    """vLLM's offline entry point: `LLM(model).generate(prompts, sampling_params)`."""

    def __init__(self, model: str | Path | None = None, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine(model, **kwargs)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Same as LLMEngine.generate."""
        return self.llm_engine.generate(prompts, sampling_params)

    def get_tokenizer(self) -> Any:
        """The tokenizer the engine uses."""
        return self.llm_engine.tokenizer
