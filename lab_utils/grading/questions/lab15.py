"""Lab 15 (reasoning models and agents): split a raw completion into reasoning, answer and tool
calls by the rules of vLLM's deepseek_r1 and hermes parsers; predict what a thinking budget does
to a token stream (a prediction, measured on the served model); predict the prefix-cache hits of an
agent-session trace on replicas behind a router (a prediction, measured on one engine); and the
price of a session under a provider's prompt-cache price sheet.

Public checks run at most two fixed cases and a few properties; hidden checks (grader/hidden/lab15.py)
call the same functions on cases drawn from the judge's key.
"""

from __future__ import annotations

import math

from lab_utils.grading.checks import close
from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import limits, question, scenario

# graded as submitted (LIGHT = False): the kernel and one vLLM server
limits("15", memory_mb=8192, timeout=1200)


@scenario("15")
def _(rng):
    """A provider's price sheet and an agent session's shape."""
    read, write = rng.choice([(0.1, 1.25), (0.1, 2.0), (0.25, 1.0), (0.5, 1.0)])
    base = rng.choice([0.5, 1.0, 3.0, 15.0])  # $ per million input tokens
    return {
        "prices": {
            "input": base,
            "output": base * rng.choice([4.0, 5.0, 8.0]),
            "cache_read": round(base * read, 4),
            "cache_write": round(base * write, 4),
            "min_cache_tokens": rng.choice([1024, 2048, 4096]),
        },
        "session": {
            "system_tokens": rng.choice([1500, 3000, 8000]),
            "turns": rng.choice([10, 30, 50]),
            "tool_result_tokens": rng.choice([200, 800, 2000]),
            "output_tokens": rng.choice([150, 400]),
        },
    }


@question("15.split_output", points=4, answers=["split_output"], forbid=refs("reasoning_parsers"))
def _(split_output):
    """split_output(text): {"reasoning", "content", "tool_calls"} from a raw completion, by the
    deepseek_r1 and hermes parsers' rules."""
    got = dict(split_output("<think>It is 2 + 2.</think>Four."))
    assert set(got) == {"reasoning", "content", "tool_calls"}, "return {'reasoning', 'content', 'tool_calls'}"
    assert got["reasoning"] == "It is 2 + 2." and got["content"] == "Four.", "the tags separate the two"
    assert list(got["tool_calls"]) == [], "no call in this text"
    call = dict(
        split_output('<think>t</think><tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    )
    calls = [dict(c) for c in call["tool_calls"]]
    assert len(calls) == 1 and calls[0].get("name") == "f", "one call to f: {'name': 'f', 'arguments': {...}}"
    assert dict(calls[0]["arguments"]) == {"x": 1}, "the arguments as parsed JSON"


@question(
    "15.budget_cut",
    points=3,
    answers=["budget_cut"],
    predict=True,
    forbid=refs("thinking_budget", "reasoning_parsers"),
)
def _(budget_cut):
    """budget_cut(prompt, wanted, budget, start, end): {"output", "thinking", "forced"}: what a
    server with a thinking budget returns when the model would write `wanted`, in the lab's model."""
    wanted = [7, 1, 2, 3, 8, 5]  # 7 opens a thought, 8 closes it
    free = dict(budget_cut([4, 4], list(wanted), None, 7, 8))
    assert set(free) == {"output", "thinking", "forced"}, "return {'output', 'thinking', 'forced'}"
    assert [int(t) for t in free["output"]] == wanted and int(free["forced"]) == 0, (
        "without a budget the output is what the model wanted"
    )
    assert int(free["thinking"]) == 3, "the tokens between the tags are the thinking"
    cut = dict(budget_cut([4, 4], list(wanted), 1, 7, 8))
    out = [int(t) for t in cut["output"]]
    assert int(cut["thinking"]) <= 1 and int(cut["forced"]) >= 1, "a budget of 1 stops a thought of 3"
    assert out[0] == 7 and 8 in out, "the thought still opens, and is closed"


@question(
    "15.session_hits",
    points=4,
    answers=["session_hits"],
    predict=True,
    forbid=refs("prefix_cache_model"),
)
def _(session_hits):
    """session_hits(trace, num_replicas, policy, block_size): the prefix-cache hit tokens of each
    request of a trace, in the lab's model of replicas behind a router."""
    a = list(range(40))
    trace = [{"session": "s", "tokens": a[:20]}, {"session": "s", "tokens": a[:40]}]
    got = [int(h) for h in session_hits([dict(r) for r in trace], 1, "round_robin", 8)]
    assert len(got) == 2 and got[0] == 0, "one hit count per request; a first request finds an empty cache"
    assert 0 < got[1] < 40 and got[1] % 8 == 0, "hits come in whole blocks, and never the whole prompt"


@question("15.session_cost", points=3, answers=["session_cost"])
def _(session_cost):
    """session_cost(turns, prices, cached): the $ price of a session's turns under a price sheet,
    with the provider's prompt cache (cached=True) or without."""
    prices = {"input": 1.0, "output": 4.0, "cache_read": 0.1, "cache_write": 1.25, "min_cache_tokens": 1024}
    turns = [{"prompt_tokens": 2000 + 500 * t, "output_tokens": 100} for t in range(5)]
    plain = float(session_cost([dict(t) for t in turns], dict(prices), False))
    cached = float(session_cost([dict(t) for t in turns], dict(prices), True))
    assert math.isfinite(plain) and 0 < plain < 1, "dollars, at $ per million tokens"
    assert cached < plain, "re-reading 2,000+ tokens a turn at a tenth of the price saves money"
    one = float(session_cost([dict(turns[0])], dict(prices), True))
    assert one > float(session_cost([dict(turns[0])], dict(prices), False)), (
        "a single turn only writes the cache, at more than the input price"
    )
    assert close(float(session_cost([], dict(prices), True)), 0.0, 1e-12), "no turns, no cost"
