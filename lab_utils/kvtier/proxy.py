"""A prefill/decode proxy: one prefill engine, one decode engine, on 127.0.0.1 only.

    python -m lab_utils.kvtier.proxy --prefill http://127.0.0.1:8001 --decode http://127.0.0.1:8002 --port 9000

For each POST /v1/completions or /v1/chat/completions:

1. the request goes to the **prefill** engine with `max_tokens` 1 and no streaming: the engine
   computes the prompt's KV cache (and one token nobody sees), and its KV connector saves it;
2. the unchanged request then goes to the **decode** engine, whose connector finds the prompt's KV
   and loads it instead of computing it; its answer (streamed or not) goes back to the client.

This is the flow of vLLM's own disaggregated-serving examples and of vllm-router's PD mode; with
the disk connector the "transfer" is a write by one engine and a read by the other. With NIXL
(`NixlConnector`) the prefill answer would also carry `kv_transfer_params` naming the remote
blocks, which the proxy passes to the decode request; the disk connector needs none (it finds
the KV by the prompt's token ids).

The response carries `X-Prefill-Seconds` (the prefill leg's wall time); `/metrics` counts
requests and sums both legs' seconds in Prometheus' text format.
"""

from __future__ import annotations

import ipaddress
import json
import time


def _require_loopback(host: str) -> None:
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = host == "localhost"
    if not ok:
        raise SystemExit(f"the proxy binds loopback only (127.0.0.1), not {host!r}")


def prefill_body(body: dict) -> dict:
    """The prefill leg's request: the same prompt, one output token, no stream."""
    out = dict(body, max_tokens=1, stream=False)
    for key in ("max_completion_tokens", "min_tokens", "stream_options", "n"):
        out.pop(key, None)
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    return out


def make_app(prefill: str, decode: str):
    """The aiohttp application: /health, /metrics, and the two completion routes."""
    from aiohttp import ClientSession, ClientTimeout, web

    app = web.Application()
    stats = {"requests": 0, "errors": 0, "prefill_seconds": 0.0, "decode_seconds": 0.0}

    async def on_start(app):
        app["session"] = ClientSession(timeout=ClientTimeout(total=None, sock_connect=10))

    async def on_stop(app):
        await app["session"].close()

    async def health(_request):
        return web.Response(text="ok")

    async def metrics(_request):
        lines = [
            "# TYPE pd_proxy_requests_total counter",
            f"pd_proxy_requests_total {stats['requests']}",
            "# TYPE pd_proxy_errors_total counter",
            f"pd_proxy_errors_total {stats['errors']}",
            "# TYPE pd_proxy_prefill_seconds_total counter",
            f"pd_proxy_prefill_seconds_total {stats['prefill_seconds']:.6f}",
            "# TYPE pd_proxy_decode_seconds_total counter",
            f"pd_proxy_decode_seconds_total {stats['decode_seconds']:.6f}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def models(request):
        async with app["session"].get(decode + "/v1/models") as up:
            return web.Response(body=await up.read(), status=up.status, content_type="application/json")

    async def complete(request):
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return web.json_response({"error": "the body must be a JSON object"}, status=400)
        stats["requests"] += 1
        session = app["session"]
        t0 = time.monotonic()
        async with session.post(prefill + request.path, json=prefill_body(body)) as up:
            payload = await up.read()
            if up.status != 200:
                stats["errors"] += 1
                return web.Response(body=payload, status=up.status, content_type="application/json")
        t1 = time.monotonic()
        stats["prefill_seconds"] += t1 - t0
        async with session.post(decode + request.path, json=body) as up:
            resp = web.StreamResponse(status=up.status)
            resp.content_type = up.content_type
            resp.headers["X-Prefill-Seconds"] = f"{t1 - t0:.6f}"
            await resp.prepare(request)
            # a client that disconnects cancels this task; leaving `async with` closes the decode
            # leg's connection, and vLLM aborts the request
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
        stats["decode_seconds"] += time.monotonic() - t1
        if up.status != 200:
            stats["errors"] += 1
        return resp

    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    app.on_startup.append(on_start)
    app.on_cleanup.append(on_stop)
    return app


def main(argv: list[str] | None = None) -> None:
    import argparse

    from aiohttp import web

    parser = argparse.ArgumentParser(prog="python -m lab_utils.kvtier.proxy")
    parser.add_argument("--prefill", required=True, help="the prefill engine, e.g. http://127.0.0.1:8001")
    parser.add_argument("--decode", required=True, help="the decode engine, e.g. http://127.0.0.1:8002")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    _require_loopback(args.host)
    app = make_app(args.prefill.rstrip("/"), args.decode.rstrip("/"))
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
