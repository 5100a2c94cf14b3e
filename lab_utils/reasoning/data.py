"""The course-made examples that teach the course model to think, call tools and use their results.

Every example is a chat (OpenAI message dicts, with `tools` when the prompt offers some) and the
assistant text the model must write after it. The thinking is one or a few short sentences, so
the model learns the format, not the world: its arithmetic stays as weak as it was. Four kinds:

- a question with no tools: `<think>...</think>` then the answer (some think for longer: a sum
  written out term by term, which gives a thinking budget something to cut);
- a question that needs one of the tools offered: `<think>...</think>` then a Hermes tool call,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- the same chat after the tool's result: `<think>...</think>` then an answer that uses it;
- a question the tools offered do not help with: `<think>...</think>` then the answer.

Cities and numbers are split into a training set and a held-out set, so the held-out prompts
(`held_out()`) ask about things the model never saw in training.
"""

from __future__ import annotations

import json
import random

TOOLS = {
    "get_weather": {
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
    "calculate": {
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
    "get_time": {
        "description": "Local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

CITIES = {  # city -> country
    "Paris": "France",
    "Tokyo": "Japan",
    "Madrid": "Spain",
    "Rome": "Italy",
    "Berlin": "Germany",
    "Lisbon": "Portugal",
    "Vienna": "Austria",
    "Cairo": "Egypt",
    "Lima": "Peru",
    "Oslo": "Norway",
    "Dublin": "Ireland",
    "Athens": "Greece",
    "Warsaw": "Poland",
    "Prague": "Czechia",
    "Nairobi": "Kenya",
    "Ottawa": "Canada",
    "Canberra": "Australia",
    "Seoul": "South Korea",
    "Hanoi": "Vietnam",
    "Bern": "Switzerland",
    "Helsinki": "Finland",
    "Budapest": "Hungary",
    "Santiago": "Chile",
    "Bogota": "Colombia",
}
HELD_OUT_CITIES = ("Oslo", "Lima", "Seoul", "Bern", "Hanoi", "Dublin")
SKIES = ("sunny", "cloudy", "rainy", "windy", "snowy")


def tool_spec(name: str) -> dict:
    """The OpenAI `tools` entry of one of the course's tools."""
    return {"type": "function", "function": {"name": name, **TOOLS[name]}}


def _tools(rng: random.Random, must: str | None) -> list[dict]:
    others = [n for n in TOOLS if n != must]
    rng.shuffle(others)
    chosen = [must, *others[: rng.randint(0, 1)]] if must else others[: rng.randint(1, 2)]
    rng.shuffle(chosen)
    return [tool_spec(n) for n in chosen]


def _call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _sum_trace(n: int) -> str:
    total, steps = 1, []
    for k in range(2, n + 1):
        steps.append(f"{total} + {k} = {total + k}.")
        total += k
    return " ".join(steps)


def _plain(rng: random.Random, cities: list[str], lo: int, hi: int) -> tuple[str, str]:
    kind = rng.choice(["add", "sum", "capital", "country"])
    if kind == "add":
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return f"What is {a} + {b}?", f"<think>{a} + {b} = {a + b}.</think>{a} + {b} = {a + b}."
    if kind == "sum":
        n = rng.randint(3, 12)
        total = n * (n + 1) // 2
        return (
            f"Add up the numbers from 1 to {n}.",
            f"<think>{_sum_trace(n)}</think>The sum of the numbers from 1 to {n} is {total}.",
        )
    city = rng.choice(cities)
    country = CITIES[city]
    if kind == "capital":
        return (
            f"What is the capital of {country}?",
            f"<think>The capital of {country} is {city}.</think>The capital of {country} is {city}.",
        )
    return (
        f"Which country is {city} in?",
        f"<think>{city} is a city in {country}.</think>{city} is in {country}.",
    )


def _tool_question(rng: random.Random, cities: list[str], lo: int, hi: int) -> tuple[str, str, dict, str]:
    """(question, tool name, arguments, the tool's result as JSON)."""
    name = rng.choice(list(TOOLS))
    if name == "calculate":
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(["*", "+", "-"])
        expr = f"{a} {op} {b}"
        q = rng.choice(
            [
                f"Use the calculator: what is {expr}?",
                f"Calculate {expr} with the tool.",
                f"What is {expr}? Use a tool.",
            ]
        )
        return q, name, {"expression": expr}, json.dumps({"result": eval(expr)})  # two ints and one operator
    city = rng.choice(cities)
    if name == "get_time":
        q = rng.choice([f"What time is it in {city}?", f"Tell me the local time in {city}."])
        return (
            q,
            name,
            {"city": city},
            json.dumps({"city": city, "time": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"}),
        )
    if rng.random() < 0.3:
        q = rng.choice(
            [f"What is the weather in {city} in fahrenheit?", f"How warm is {city}? Answer in fahrenheit."]
        )
        args = {"city": city, "unit": "fahrenheit"}
        temp = {"temp_f": rng.randint(20, 95)}
    else:
        q = rng.choice(
            [f"What is the weather in {city}?", f"Is it cold in {city} today?", f"Weather in {city}?"]
        )
        args = {"city": city}
        temp = {"temp_c": rng.randint(-10, 35)}
    return q, name, args, json.dumps({"city": city, **temp, "sky": rng.choice(SKIES)})


def _think_call(name: str, args: dict) -> str:
    what = {"get_weather": "the weather", "get_time": "the local time", "calculate": "an exact result"}[name]
    return f"<think>The user wants {what}, so I call {name}.</think>" + _call(name, args)


def _answer_from(name: str, args: dict, result: str) -> str:
    r = json.loads(result)
    if name == "calculate":
        return f"<think>The calculator returned {r['result']}.</think>{args['expression']} = {r['result']}."
    if name == "get_time":
        return (
            f"<think>The tool says it is {r['time']} in {r['city']}.</think>It is {r['time']} in {r['city']}."
        )
    temp = f"{r['temp_f']} °F" if "temp_f" in r else f"{r['temp_c']} °C"
    return f"<think>The tool says {temp} and {r['sky']} in {r['city']}.</think>It is {temp} and {r['sky']} in {r['city']}."


def examples(
    n: int, seed: int = 0, held_out: bool = False, kinds: tuple[int, ...] = (0, 1, 2, 3)
) -> list[dict]:
    """`n` examples: {"messages", "tools", "target"} (target: the assistant's text), cycling through
    `kinds`: 0 no tools, 1 a tool call, 2 an answer from a tool's result, 3 tools not needed."""
    rng = random.Random(seed)
    cities = [c for c in CITIES if (c in HELD_OUT_CITIES) == held_out]
    lo, hi = (100, 999) if held_out else (2, 99)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if kind == 0:  # no tools
            q, target = _plain(rng, cities, lo, hi)
            out.append({"messages": [{"role": "user", "content": q}], "tools": None, "target": target})
        elif kind == 3:  # tools offered, none needed
            q, target = _plain(rng, cities, lo, hi)
            out.append(
                {"messages": [{"role": "user", "content": q}], "tools": _tools(rng, None), "target": target}
            )
        else:
            q, name, args, result = _tool_question(rng, cities, lo, hi)
            tools = _tools(rng, name)
            chat = [{"role": "user", "content": q}]
            if kind == 1:
                out.append(
                    {
                        "messages": chat,
                        "tools": tools,
                        "target": _think_call(name, args),
                        "call": [name, args],
                    }
                )
            else:
                call = {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                chat = chat + [
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"call_{i}", "content": result},
                ]
                out.append({"messages": chat, "tools": tools, "target": _answer_from(name, args, result)})
    return out


def held_out(n: int = 20, seed: int = 1, kinds: tuple[int, ...] = (0, 1, 2, 3)) -> list[dict]:
    """Prompts about cities and numbers the training never used."""
    return examples(n, seed=seed, held_out=True, kinds=kinds)
