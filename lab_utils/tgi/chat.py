"""TGI's Messages API (`POST /v1/chat/completions`, OpenAI's chat shape) over the same generation path."""

from __future__ import annotations

import time
from typing import Any

from .protocol import STAND_IN, GenerateParams, validation

# Fields the stand-in accepts only when null (huggingface_hub and the text-generation client send them).
_NULL_ONLY = (
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "tools",
    "tool_choice",
    "tool_prompt",
    "top_logprobs",
    "repetition_penalty",
)
_KNOWN = {
    "model",
    "messages",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "response_format",
    "logprobs",
    "stream_options",
    "user",
    *_NULL_ONLY,
}


def _grammar(fmt: Any) -> dict | None:
    """TGI's response_format ({"type": "json", "value": schema}) or OpenAI's json_schema form."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise validation("response_format must be an object")
    kind = fmt.get("type")
    if kind in ("json", "json_object", "regex") and "value" in fmt:
        return {"type": "json" if kind == "json_object" else kind, "value": fmt["value"]}
    if kind == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        return {"type": "json", "value": fmt["json_schema"].get("schema")}
    if kind == "text":
        return None
    raise validation(f'response_format {fmt!r} is not supported: use {{"type": "json", "value": <schema>}}')


def to_params(service, body: Any) -> tuple[GenerateParams, bool]:
    """Validate a chat request and turn it into a generation request."""
    cfg = service.config
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise validation("a chat request needs a non-empty `messages` list")
    unknown = set(body) - _KNOWN
    if unknown:
        raise validation(f"unknown field(s) {sorted(unknown)} (the course stand-in rejects them)")
    for name in _NULL_ONLY:
        if body.get(name) not in (None, [], {}):
            raise validation(f"`{name}` is not implemented by the {STAND_IN}")
    if (body.get("n") or 1) != 1:
        raise validation("`n` must be 1")
    from .protocol import _float

    temperature = _float(body, "temperature")  # numbers are checked before any templating
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    max_new = body.get("max_completion_tokens") or body.get("max_tokens")
    params = {
        "max_new_tokens": max_new,
        "seed": body.get("seed"),
        "stop": stop,
        "top_p": body.get("top_p"),
        "grammar": _grammar(body.get("response_format")),
    }
    # OpenAI semantics: temperature 0 is greedy; absent means sample at 1.0.
    if temperature is None or temperature > 0:
        params["temperature"] = temperature
        params["do_sample"] = True
    elif temperature < 0:
        raise validation("`temperature` must be >= 0")
    from .protocol import validate

    try:
        text = service.tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
    except Exception as e:  # noqa: BLE001 - a malformed message list
        raise validation(f"cannot apply the chat template: {e}") from None
    ids = service.tok.encode(text, add_special_tokens=False)
    stream = bool(body.get("stream"))
    p = validate({"inputs": "x", "parameters": params}, cfg, lambda _: ids, stream=stream)
    return p, stream


async def chat_completion(service, body: Any, Slot, sse, headers: dict, request=None):
    """Answer one chat request (JSON, or SSE chunks ending with `data: [DONE]`)."""
    from starlette.responses import JSONResponse

    from .server import make_id

    # the chat template, the tokenizer and the grammar compile run off the event loop
    p, stream = await service.off_loop(service.prepare_chat, body)
    created = int(time.time())
    cid = make_id()
    model = service.model_id
    reason_map = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
    slot = Slot().__enter__()
    if not stream:
        p.details = True  # for the token counts in `usage`
        try:
            out = await service.generate_watched(p, request)
        finally:
            slot.__exit__()
        if out is None:  # the client went away; nobody reads this
            return JSONResponse({}, status_code=499, headers=headers)
        return JSONResponse(_complete(cid, created, model, out, p), headers=headers)

    async def chunks():
        try:
            async for ev in service.stream(p):
                if "error" in ev:
                    yield ev
                    return
                piece = "" if ev["token"]["special"] else ev["token"]["text"]
                done = ev.get("details")
                yield {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "system_fingerprint": STAND_IN,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": piece},
                            "logprobs": None,
                            "finish_reason": reason_map[done["finish_reason"]] if done else None,
                        }
                    ],
                }
        finally:
            slot.__exit__()

    resp = sse(chunks())
    resp.body_iterator = _append_done(resp.body_iterator)
    return resp


async def _append_done(it):
    async for part in it:
        yield part
    yield "data: [DONE]\n\n"


def _complete(cid: str, created: int, model: str, out: dict, p: GenerateParams) -> dict:
    d = out.get("details") or {}
    n_out = d.get("generated_tokens", 0)
    reason = {"length": "length"}.get(d.get("finish_reason"), "stop")
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": STAND_IN,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": out["generated_text"]},
                "logprobs": None,
                "finish_reason": reason,
            }
        ],
        "usage": {
            "prompt_tokens": len(p.input_ids),
            "completion_tokens": n_out,
            "total_tokens": len(p.input_ids) + n_out,
        },
    }
