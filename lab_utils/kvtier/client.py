"""One streamed completion, recorded as raw timestamps.

    rec = stream_completion(srv.base_url, srv.model_name, prompt_ids, max_tokens=16)
    rec["sent"], rec["token_times"], rec["text"]

`token_times` holds the arrival time (time.monotonic) of every streamed chunk that carried text,
one per token for vLLM's completions stream. TTFT and TPOT are left to the learner.
"""

from __future__ import annotations

import json
import time
import urllib.request


def stream_completion(
    base_url: str, model: str, prompt: list[int] | str, max_tokens: int = 16, timeout: float = 300
) -> dict:
    """POST /completions with stream=True, greedy; {"sent", "token_times", "text", "ok", "headers"}."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": int(max_tokens),
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        base_url.rstrip("/") + "/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    sent, times, parts, ok, headers = time.monotonic(), [], [], False, {}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            headers = {k.lower(): v for k, v in resp.headers.items()}
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    ok = True
                    break
                choice = json.loads(data)["choices"][0]
                if choice.get("text"):
                    times.append(time.monotonic())
                    parts.append(choice["text"])
    except OSError:
        ok = False
    return {"sent": sent, "token_times": times, "text": "".join(parts), "ok": ok, "headers": headers}


__all__ = ["stream_completion"]
