"""The course MoE: the course model sparse-upcycled into a Mixtral-format mixture of experts.

Each layer's MLP (gate, up, down) is copied into `num_experts` experts with a little noise (so the
experts are not exactly equal), and a router (hidden -> experts) is added; each token goes through
the top `top_k` experts, their outputs weighted by the renormalised router probabilities. Because
every expert starts as a copy of the same MLP, any weighting of them gives almost the dense MLP's
output: the MoE answers like the dense model while holding `num_experts` times the MLP weights.
That is how sparse upcycling starts training an MoE from a dense checkpoint.

    python -m lab_utils.moe        # build it once into $COURSE_CACHE/models/SmolLM2-MoE-4x (bf16)

Saved in Mixtral's checkpoint layout (`block_sparse_moe.gate`, `experts.N.w1/w2/w3`), which
transformers (MixtralForCausalLM) and vLLM both load. The lm_head is written out (untied).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

MOE_EXPERTS = 4
MOE_TOP_K = 2
NOISE = 0.01  # noise added to each expert copy, relative to the weight's standard deviation
FORMAT_VERSION = 1
MARKER = ".course-moe.json"


def course_moe_dir(num_experts: int = MOE_EXPERTS) -> Path:
    """Where the course MoE with `num_experts` experts is cached."""
    from lab_utils.models import cache_dir

    return cache_dir() / "models" / f"SmolLM2-MoE-{num_experts}x"


def moe_ready(num_experts: int = MOE_EXPERTS) -> bool:
    """True when the course MoE is built in the current format."""
    try:
        info = json.loads((course_moe_dir(num_experts) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return info.get("format") == FORMAT_VERSION


def course_moe_path(num_experts: int = MOE_EXPERTS) -> Path:
    """The course MoE's folder, built on first use (about 20 s)."""
    folder = course_moe_dir(num_experts)
    if not moe_ready(num_experts):
        build_moe(folder, num_experts=num_experts)
    return folder


def build_moe(
    out: Path,
    num_experts: int = MOE_EXPERTS,
    top_k: int = MOE_TOP_K,
    noise: float = NOISE,
    seed: int = 0,
    dense: Path | None = None,
) -> Path:
    """Upcycle the dense course model (or `dense`) into a Mixtral-format MoE saved in `out` (bf16)."""
    import torch
    from safetensors.torch import load_file, save_file

    from lab_utils.models import course_model_path

    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k ({top_k}) must be between 1 and num_experts ({num_experts})")
    t0 = time.monotonic()
    dense = Path(dense) if dense else course_model_path()
    cfg = json.loads((dense / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise ValueError(f"upcycling expects a Llama-style dense model, got {cfg.get('model_type')!r}")
    weights = load_file(str(dense / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    moe: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        if ".mlp." not in name:
            moe[name] = w.to(torch.bfloat16)
    if "lm_head.weight" not in moe:  # the course model ties it to the embedding
        moe["lm_head.weight"] = moe["model.embed_tokens.weight"].clone()
    # Mixtral's expert names: w1 = gate_proj, w3 = up_proj, w2 = down_proj
    names = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    for i in range(layers):
        prefix = f"model.layers.{i}"
        for e in range(num_experts):
            for mixtral, llama in names.items():
                w = weights[f"{prefix}.mlp.{llama}.weight"].float()
                jitter = torch.randn(w.shape, generator=gen) * (noise * float(w.std()))
                moe[f"{prefix}.block_sparse_moe.experts.{e}.{mixtral}.weight"] = (w + jitter).to(
                    torch.bfloat16
                )
        router = torch.randn((num_experts, hidden), generator=gen) * 0.02  # (experts, hidden)
        moe[f"{prefix}.block_sparse_moe.gate.weight"] = router.to(torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in moe.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"}
    )
    mixtral = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": hidden,
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg.get("head_dim") or hidden // cfg["num_attention_heads"],
        "hidden_act": cfg.get("hidden_act", "silu"),
        "max_position_embeddings": cfg["max_position_embeddings"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)),
        "vocab_size": cfg["vocab_size"],
        "bos_token_id": cfg.get("bos_token_id"),
        "eos_token_id": cfg.get("eos_token_id"),
        "pad_token_id": cfg.get("pad_token_id"),
        "tie_word_embeddings": False,
        "num_local_experts": num_experts,
        "num_experts_per_tok": top_k,
        "router_aux_loss_coef": 0.0,
        "output_router_logits": False,
        "sliding_window": None,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }
    (tmp / "config.json").write_text(json.dumps(mixtral, indent=2))
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (dense / extra).exists():
            shutil.copy(dense / extra, tmp / extra)
    params = sum(v.numel() for v in moe.values())
    (tmp / MARKER).write_text(
        json.dumps({"format": FORMAT_VERSION, "experts": num_experts, "top_k": top_k, "params": params})
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(
        f"course MoE: {num_experts} experts, top-{top_k}, {params / 1e6:.0f} M parameters, "
        f"bf16, in {out} ({time.monotonic() - t0:.0f} s)",
        flush=True,
    )
    return out
