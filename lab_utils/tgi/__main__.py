"""`python -m lab_utils.tgi --port PORT`: the course's TGI-protocol stand-in on 127.0.0.1.

Flags mirror `text-generation-launcher` for the limits it implements. Ready when GET /health
answers 200; SIGTERM (or Ctrl-C) stops the engine thread and the server.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys


def _defaults() -> dict:
    """TGIConfig's field defaults: the one place the stand-in's limits are set (flags and class agree)."""
    import dataclasses

    from .admission import TGIConfig

    return {f.name: f.default for f in dataclasses.fields(TGIConfig)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = _defaults()
    ap = argparse.ArgumentParser(prog="python -m lab_utils.tgi", description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model-id", default=None, help="model folder (default: the course model)")
    ap.add_argument(
        "--api-key",
        default=os.environ.get("TGI_STAND_IN_API_KEY"),
        help="require 'Authorization: Bearer KEY' (except on /health); prefer the environment "
        "variable TGI_STAND_IN_API_KEY, which `ps` does not show",
    )
    ap.add_argument("--max-input-tokens", type=int, default=d["max_input_tokens"])
    ap.add_argument("--max-total-tokens", type=int, default=d["max_total_tokens"])
    ap.add_argument("--max-batch-prefill-tokens", type=int, default=d["max_batch_prefill_tokens"])
    # the real launcher infers this one from the GPU memory left after the model; the stand-in fixes it
    ap.add_argument("--max-batch-total-tokens", type=int, default=d["max_batch_total_tokens"])
    ap.add_argument("--max-concurrent-requests", type=int, default=d["max_concurrent_requests"])
    ap.add_argument("--waiting-served-ratio", type=float, default=d["waiting_served_ratio"])
    ap.add_argument("--max-waiting-tokens", type=int, default=d["max_waiting_tokens"])
    ap.add_argument("--max-batch-size", type=int, default=d["max_batch_size"])
    ap.add_argument("--max-best-of", type=int, default=d["max_best_of"])
    ap.add_argument("--max-stop-sequences", type=int, default=d["max_stop_sequences"])
    ap.add_argument("--max-top-n-tokens", type=int, default=d["max_top_n_tokens"])
    ap.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument(
        "--payload-limit", type=int, default=2_000_000, help="largest request body in bytes (413 beyond)"
    )
    ap.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="seconds a request may take, queueing included (the stand-in's own limit; 408 beyond)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from .admission import TGIConfig

    try:
        cfg = TGIConfig(
            max_input_tokens=args.max_input_tokens,
            max_total_tokens=args.max_total_tokens,
            max_batch_prefill_tokens=args.max_batch_prefill_tokens,
            max_batch_total_tokens=args.max_batch_total_tokens,
            max_concurrent_requests=args.max_concurrent_requests,
            waiting_served_ratio=args.waiting_served_ratio,
            max_waiting_tokens=args.max_waiting_tokens,
            max_batch_size=args.max_batch_size,
            max_best_of=args.max_best_of,
            max_stop_sequences=args.max_stop_sequences,
            max_top_n_tokens=args.max_top_n_tokens,
        )
    except ValueError as e:
        print(f'Error: ArgumentValidation("{e}")', file=sys.stderr)  # the launcher's wording
        return 2
    import uvicorn

    from . import create_service
    from .server import build_app

    service = create_service(
        cfg,
        model=args.model_id,
        api_key=args.api_key,
        num_threads=args.num_threads,
        payload_limit=args.payload_limit,
        request_timeout=args.request_timeout,
    )
    app = build_app(service)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    )

    def on_term(signum, frame):
        server.should_exit = True

    signal.signal(signal.SIGTERM, on_term)
    print(
        f"TGI-protocol stand-in (llm-serving-lab) on http://127.0.0.1:{args.port} serving "
        f"{service.model_id}; limits: {cfg}",
        flush=True,
    )
    try:
        server.run()
    finally:
        service.worker.stop()
        service.executor.shutdown(wait=False, cancel_futures=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
