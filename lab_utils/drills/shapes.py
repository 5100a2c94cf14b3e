"""Real model shapes for the drills, copied from each model's config.json on the Hugging Face Hub.

Checked 2026-12-01 against the configs of meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B,
mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-7B, Qwen2.5-14B and Qwen2.5-72B (the first four are also
in tests/data/configs). head_dim is 128 for all of them.
"""

from __future__ import annotations

from lab_utils.memory import ModelSpec

MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        ModelSpec("Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, max_position_embeddings=8192),
        ModelSpec("Llama-3-70B", 80, 8192, 64, 8, 128, 28672, 128256, max_position_embeddings=8192),
        ModelSpec("Mistral-7B-v0.1", 32, 4096, 32, 8, 128, 14336, 32000, max_position_embeddings=32768),
        ModelSpec(
            "Qwen2.5-7B",
            28,
            3584,
            28,
            4,
            128,
            18944,
            152064,
            max_position_embeddings=131072,
            attention_bias=True,
        ),
        ModelSpec(
            "Qwen2.5-14B",
            48,
            5120,
            40,
            8,
            128,
            13824,
            152064,
            max_position_embeddings=131072,
            attention_bias=True,
        ),
        ModelSpec(
            "Qwen2.5-72B",
            80,
            8192,
            64,
            8,
            128,
            29568,
            152064,
            max_position_embeddings=131072,
            attention_bias=True,
        ),
    ]
}

SMALL = ["Llama-3-8B", "Mistral-7B-v0.1", "Qwen2.5-7B", "Qwen2.5-14B"]
LARGE = ["Llama-3-70B", "Qwen2.5-72B"]
