"""Reading the router's decisions out of a model vLLM serves.

vLLM's own switch for this (`enable_return_routed_experts`) needs Triton and fails on CPU, so the
lab installs a forward hook on each MoE layer's router (`block_sparse_moe.gate`, a linear layer
hidden -> experts) through `LLM.apply_model`, which runs a function on the model inside the
engine. The hooks keep each forward pass's raw router logits (tokens x experts) on the layer; a
second function reads them back and clears them. Both must be importable module-level functions:
apply_model may pickle them to a worker process.

    llm.apply_model(install_router_hooks)      # once, after the engine is up
    llm.apply_model(clear_router_logits)       # before a workload
    llm.generate(prompts, params)
    logits = llm.apply_model(read_router_logits)[0]   # {layer: [[logit per expert] per token]}
"""

from __future__ import annotations

_STORE = "_course_router_logits"


def _routers(model) -> list:
    """(layer index, router module) of every MoE layer of a Mixtral-style model."""
    found = []
    for name, module in model.named_modules():
        if name.endswith("block_sparse_moe.gate"):
            layer = int(name.split("layers.")[1].split(".")[0])
            found.append((layer, module))
    return sorted(found, key=lambda pair: pair[0])


def _keep_logits(module, inputs, output) -> None:
    logits = output[0] if isinstance(output, tuple) else output  # vLLM linears return (out, bias)
    getattr(module, _STORE).append(logits.detach().float().cpu())


def install_router_hooks(model) -> int:
    """Hook every router of `model` (once); returns how many routers are hooked."""
    routers = _routers(model)
    for _, router in routers:
        if not hasattr(router, _STORE):
            setattr(router, _STORE, [])
            router.register_forward_hook(_keep_logits)
    return len(routers)


def clear_router_logits(model) -> int:
    """Forget the logits kept so far; returns the number of routers."""
    routers = _routers(model)
    for _, router in routers:
        getattr(router, _STORE, []).clear()
    return len(routers)


def read_router_logits(model) -> dict[int, list[list[float]]]:
    """{layer: raw router logits, one row of `num_experts` floats per token routed}, then clear."""
    import torch

    out: dict[int, list[list[float]]] = {}
    for layer, router in _routers(model):
        kept = getattr(router, _STORE, [])
        out[layer] = torch.cat(kept).tolist() if kept else []
        kept.clear()
    return out
