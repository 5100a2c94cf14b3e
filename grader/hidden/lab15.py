"""Lab 15: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab15`. Every reference is here.
"""

from __future__ import annotations

import json
import re

from grader.registry import hidden
from lab_utils.grading.checks import close

# --------------------------------------------------------------------------- 15.split_output

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def _ref_split(text: str) -> dict:
    before, tag, after = text.partition("<think>")
    rest = after if tag else before
    if "</think>" not in rest:
        return {"reasoning": rest, "content": None, "tool_calls": []}
    reasoning, _, content = rest.partition("</think>")
    content = content or None
    calls = []
    if content is not None and "<tool_call>" in content:
        try:
            for m in _CALL.findall(content):
                obj = json.loads(m[0] if m[0] else m[1])
                if not isinstance(obj["name"], str):
                    raise TypeError("a name is a string")
                calls.append({"name": obj["name"], "arguments": obj["arguments"]})
        except (ValueError, KeyError, TypeError):
            calls = []  # one bad call: nothing is a call, the whole text stays content
        if calls:
            content = content[: content.find("<tool_call>")] or None
    return {"reasoning": reasoning, "content": content, "tool_calls": calls}


_WORDS = [
    "the",
    "user",
    "wants",
    "weather",
    "so",
    "I",
    "call",
    "it",
    "42",
    "is",
    "then",
    "answer",
    "Paris",
    "{",
    "}",
]


def _words(rng, lo=1, hi=8) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _call_text(rng) -> str:
    args = rng.choice([{}, {"city": "Oslo"}, {"a": 1, "b": [1, 2]}, {"q": {"nested": {"deep": "}"}}}])
    kind = rng.random()
    if kind < 0.12:  # malformed JSON
        body = rng.choice(
            ['{"name": "f", "arguments": {"x": 1}', "{name: f}", '{"name": "f", "arguments": }']
        )
    elif kind < 0.2:  # valid JSON, not a call
        body = rng.choice(['{"name": "f"}', '["f", {}]', '{"arguments": {}}', '{"name": 3, "arguments": {}}'])
    else:
        body = json.dumps({"name": rng.choice(["get_weather", "calculate", "f"]), "arguments": args})
    ws = rng.choice(["", "\n", " "])
    closed = rng.random() < 0.9
    return f"<tool_call>{ws}{body}{ws}" + ("</tool_call>" if closed else "")


def _raw_output(rng) -> str:
    head = rng.choice(["", "", "", "preamble "])  # text before <think> (dropped) or no tag at all
    think = rng.choice(["<think>", "<think>", "<think>", ""])
    reasoning = _words(rng, 0, 10)
    close_tag = rng.random() < 0.8
    text = head + think + reasoning
    if not close_tag:
        return text
    text += "</think>"
    kind = rng.random()
    if kind < 0.3:
        text += _words(rng, 0, 8)
    elif kind < 0.9:
        text += rng.choice(["", "", "Let me check. "])
        for _ in range(rng.choice([1, 1, 2, 3])):
            text += _call_text(rng) + rng.choice(["", "\n", " and more text"])
    return text


@hidden("15.split_output")
def _(split_output, rng, scenario):
    wrong, n = 0, 40
    for _ in range(n):
        text = _raw_output(rng)
        want = _ref_split(text)
        try:
            got = dict(split_output(text))
            calls = [
                {"name": str(dict(c)["name"]), "arguments": dict(c)["arguments"]} for c in got["tool_calls"]
            ]
            ok = (
                got["reasoning"] == want["reasoning"]
                and got["content"] == want["content"]
                and json.dumps(calls, sort_keys=True) == json.dumps(want["tool_calls"], sort_keys=True)
            )
        except (KeyError, TypeError, ValueError):
            ok = False
        wrong += not ok
    assert not wrong, f"wrong on {wrong} of {n} unseen completions"


# --------------------------------------------------------------------------- 15.budget_cut


def _ref_budget(prompt, wanted, budget, start, end):
    last_s = max((i for i, t in enumerate(prompt) if t == start), default=-1)
    last_e = max((i for i, t in enumerate(prompt) if t == end), default=-1)
    open_, count = last_s > last_e, (len(prompt) - last_s - 1 if last_s > last_e else 0)
    out, thinking, forced = [], 0, 0
    queue = list(wanted)
    while queue:
        if open_ and budget is not None and count >= budget and queue[0] != end:
            tok, forced = end, forced + 1  # inserted: the model's token comes next
        else:
            tok = queue.pop(0)
        out.append(tok)
        if open_ and tok == end:
            open_, count = False, 0
        elif open_:
            count, thinking = count + 1, thinking + 1
        elif tok == start:
            open_, count = True, 0
    return {"output": out, "thinking": thinking, "forced": forced}


def _budget_case(rng):
    start, end = rng.sample(range(1000, 60000), 2)
    words = [rng.randrange(0, 900) for _ in range(40)]

    def text(lo, hi):
        return [rng.choice(words) for _ in range(rng.randint(lo, hi))]

    prompt = text(0, 12)
    kind = rng.random()
    if kind < 0.3:  # the template opened the thought in the prompt
        prompt += [start] + text(0, 8)
    elif kind < 0.45:  # a closed thought in the prompt (an earlier turn kept its thinking)
        prompt += [start] + text(0, 5) + [end] + text(0, 4)
    wanted = []
    in_prompt_open = kind < 0.3
    if not in_prompt_open and rng.random() < 0.9:
        wanted += text(0, 2) + [start]
    wanted += text(0, 25)
    if rng.random() < 0.85:
        wanted += [end] + text(0, 10)
        if rng.random() < 0.3:  # a second thought later in the answer
            wanted += [start] + text(0, 12) + ([end] + text(0, 4) if rng.random() < 0.7 else [])
        if rng.random() < 0.2:  # a stray closing tag in the answer
            wanted += [end] + text(0, 3)
    budget = rng.choice([None, 0, 1, 2, 3, 5, 8, 13, 20, 40])
    return prompt, wanted, budget, start, end


@hidden("15.budget_cut")
def _(budget_cut, rng, scenario):
    wrong, n = 0, 40
    for _ in range(n):
        prompt, wanted, budget, start, end = _budget_case(rng)
        want = _ref_budget(prompt, wanted, budget, start, end)
        try:
            got = dict(budget_cut(list(prompt), list(wanted), budget, start, end))
            ok = (
                [int(t) for t in got["output"]] == want["output"]
                and int(got["thinking"]) == want["thinking"]
                and int(got["forced"]) == want["forced"]
            )
        except (KeyError, TypeError, ValueError):
            ok = False
        wrong += not ok
    assert not wrong, f"wrong on {wrong} of {n} unseen prompts, streams and budgets"


# --------------------------------------------------------------------------- 15.session_hits


def _ref_hits(trace, num_replicas, policy, block_size):
    caches = [set() for _ in range(num_replicas)]  # each replica: the block-chain prefixes it holds
    sessions: dict = {}
    hits = []
    for i, req in enumerate(trace):
        if policy == "round_robin":
            r = i % num_replicas
        else:
            r = sessions.setdefault(req["session"], len(sessions) % num_replicas)
        toks = tuple(req["tokens"])
        n = 0
        while (n + 1) * block_size <= len(toks) - 1 and toks[: (n + 1) * block_size] in caches[r]:
            n += 1
        hits.append(n * block_size)
        for k in range(1, len(toks) // block_size + 1):
            caches[r].add(toks[: k * block_size])
    return hits


def _trace(rng):
    block = rng.choice([4, 8, 16])
    system = [rng.randrange(100) for _ in range(rng.randint(0, 5 * block))]
    sessions = {
        f"s{k}": system + [rng.randrange(100, 200) for _ in range(rng.randint(1, 3 * block))]
        for k in range(rng.randint(1, 6))
    }
    trace = []
    for _ in range(rng.randint(3, 25)):
        s = rng.choice(sorted(sessions))
        grow = rng.random()
        if grow < 0.6:  # a new turn
            sessions[s] = sessions[s] + [rng.randrange(200, 300) for _ in range(rng.randint(1, 3 * block))]
        elif grow < 0.85:  # a turn that ends on a block boundary
            sessions[s] = sessions[s] + [
                rng.randrange(200, 300) for _ in range(block - len(sessions[s]) % block)
            ]
        # else: the same prompt again (a retry)
        trace.append({"session": s, "tokens": list(sessions[s])})
    return trace, block


@hidden("15.session_hits")
def _(session_hits, rng, scenario):
    wrong, n = 0, 24
    for i in range(n):
        trace, block = _trace(rng)
        replicas = 1 if i < 4 else rng.choice([1, 2, 3, 4])
        policy = rng.choice(["round_robin", "session"])
        want = _ref_hits(trace, replicas, policy, block)
        try:
            got = [
                int(h)
                for h in session_hits(
                    [dict(r, tokens=list(r["tokens"])) for r in trace], replicas, policy, block
                )
            ]
        except (TypeError, ValueError):
            got = None
        wrong += got != want
    assert not wrong, f"wrong on {wrong} of {n} unseen traces"


# --------------------------------------------------------------------------- 15.session_cost


def _ref_cost(turns, prices, cached):
    total, prev = 0.0, 0
    for t in turns:
        p, o = t["prompt_tokens"], t["output_tokens"]
        total += o * prices["output"]
        if not cached:
            total += p * prices["input"]
            continue
        read = prev if prev >= prices["min_cache_tokens"] else 0
        if p >= prices["min_cache_tokens"]:
            total += read * prices["cache_read"] + (p - read) * prices["cache_write"]
        else:
            total += p * prices["input"]
        prev = p
    return total / 1e6


def _sheet(rng):
    base = rng.choice([0.15, 0.5, 1.0, 2.5, 3.0, 15.0])
    return {
        "input": base,
        "output": base * rng.choice([4.0, 5.0, 8.0]),
        "cache_read": base * rng.choice([0.1, 0.25, 0.5]),
        "cache_write": base * rng.choice([1.0, 1.25, 2.0]),
        "min_cache_tokens": rng.choice([0, 512, 1024, 2048, 4096]),
    }


@hidden("15.session_cost")
def _(session_cost, rng, scenario):
    wrong, n = 0, 30
    for _ in range(n):
        prices = _sheet(rng)
        p = rng.randint(50, 5000)
        turns = []
        for _ in range(rng.randint(0, 40)):
            turns.append({"prompt_tokens": p, "output_tokens": rng.randint(1, 800)})
            p += turns[-1]["output_tokens"] + rng.randint(0, 2500)
        cached = rng.random() < 0.7
        got = float(session_cost([dict(t) for t in turns], dict(prices), cached))
        wrong += not close(got, _ref_cost(turns, prices, cached), 1e-9, 1e-12)
    assert not wrong, f"wrong on {wrong} of {n} unseen sessions and price sheets"
