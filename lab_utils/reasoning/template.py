"""The chat template of the course's reasoning model: ChatML, with tools and tool results.

Rendered by transformers when the build makes its examples and by vLLM when it serves them, so
the model sees the same text both ways:

    <|im_start|>system
    Think first, then answer.
    Tools:
    <tools>
    get_weather(city: string, unit?: celsius|fahrenheit): Current weather in a city
    </tools>
    Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>
    <|im_start|>user
    What is the weather in Paris?<|im_end|>
    <|im_start|>assistant
    <think>The user wants the weather in Paris: I call get_weather.</think><tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    {"temp_c": 18}
    </tool_response><|im_end|>
    <|im_start|>assistant

The generation prompt ends at `<|im_start|>assistant\n`: the model writes `<think>` itself, so the
tag is among the output tokens (vLLM counts reasoning tokens from there). Earlier assistant turns
are rendered without their thinking, as most reasoning models' templates do: a turn's prompt is
then the previous turn's prompt plus the visible reply and the new message, which is what lets the
prefix cache serve a session.
"""

from __future__ import annotations

SYSTEM = "Think first, then answer."

CHAT_TEMPLATE = (
    # transformers and vLLM render with trim_blocks: a newline right after a tag is dropped, so the
    # newlines that must follow one are written as {{ nl }}
    "{% set nl = '\\n' %}"
    "{% if messages and messages[0].role == 'system' %}{% set sys = messages[0].content %}"
    "{% else %}{% set sys = '" + SYSTEM + "' %}{% endif %}"
    "<|im_start|>system{{ nl }}{{ sys }}"
    "{% if tools %}{{ nl }}Tools:{{ nl }}<tools>{{ nl }}"
    # one line a tool, as a signature: get_weather(city: string, unit?: celsius|fahrenheit): what it does
    "{% for t in tools %}{% set f = t.function if t.function is defined else t %}{{ f.name }}("
    "{% set req = f.parameters.required or [] %}"
    "{% for k, v in f.parameters.properties.items() %}{{ k }}{% if k not in req %}?{% endif %}: "
    "{% if v.enum %}{{ v.enum | join('|') }}{% else %}{{ v.type }}{% endif %}{% if not loop.last %}, {% endif %}"
    "{% endfor %}): {{ f.description }}{{ nl }}{% endfor %}"
    '</tools>{{ nl }}Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
    "{% endif %}<|im_end|>{{ nl }}"
    "{% for m in messages %}"
    "{% if m.role == 'user' %}<|im_start|>user{{ nl }}{{ m.content }}<|im_end|>{{ nl }}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant{{ nl }}"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{% for tc in m.tool_calls or [] %}"
    "{% set f = tc.function if tc.function is defined else tc %}"
    '<tool_call>{{ nl }}{"name": "{{ f.name }}", "arguments": '
    "{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}}"
    "{{ nl }}</tool_call>"
    "{% endfor %}<|im_end|>{{ nl }}"
    "{% elif m.role == 'tool' %}<|im_start|>user{{ nl }}<tool_response>{{ nl }}{{ m.content }}{{ nl }}"
    "</tool_response><|im_end|>{{ nl }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ nl }}{% endif %}"
)
