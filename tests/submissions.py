"""Build class submissions for the grading tests: a notebook from code cells, saved under a student."""

from __future__ import annotations

from pathlib import Path

import nbformat


def notebook(*sources: str, parameters: str = "SEED = 0  # the grader sets its own seed"):
    """A notebook whose first cell is tagged `parameters` (as papermill expects), then one cell a source."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(parameters)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params] + [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def put(folder: Path, student: str, content, name: str = "07_triton.ipynb") -> Path:
    """Save `content` (a notebook, or raw text for a malformed one) as folder/student/name."""
    path = folder / student / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    else:
        nbformat.write(content, str(path))
    return path


# Lab 07's three function answers that need no server: right ones, for the class-grading tests.
SERVED = (
    "def served_versions(on_disk, policy):\n"
    "    versions = sorted(on_disk)\n"
    "    if 'all' in policy:\n        return versions\n"
    "    if 'specific' in policy:\n"
    "        return [v for v in versions if v in set(policy['specific']['versions'])]\n"
    "    return versions[-int(policy.get('latest', {}).get('num_versions', 1)):]\n"
)
BYTES = "def extra_tensor_bytes(prompt, new, width=8):\n    return 2 * width * (prompt + new)\n"
KV = (  # the llmapi model.yaml's KV pool, as TensorRT-LLM's PyTorch backend sizes it
    "def trtllm_kv_tokens(model_yaml, gpu_gib, weights_gib, activations_gib, kv_bytes_per_token):\n"
    "    import yaml\n"
    "    from lab_utils.facts import fact\n"
    "    args = yaml.safe_load(model_yaml)\n"
    "    kv = args.get('kv_cache_config') or {}\n"
    "    tp = int(args.get('tensor_parallel_size', 1))\n"
    "    per_token = kv_bytes_per_token / tp / (2 if kv.get('dtype') == 'fp8' else 1)\n"
    "    free = max(gpu_gib - weights_gib / tp - activations_gib, 0) * 2**30\n"
    "    budget = free * kv.get('free_gpu_memory_fraction', fact('trtllm.free_gpu_memory_fraction'))\n"
    "    if kv.get('max_gpu_total_bytes', 0) > 0:\n"
    "        budget = min(budget, kv['max_gpu_total_bytes'])\n"
    "    tokens = int(budget // per_token)\n"
    "    return tokens if kv.get('max_tokens') is None else min(tokens, int(kv['max_tokens']))\n"
)


def notebook_namespace(source: str) -> dict:
    """Run `source` as one notebook cell would (module `__main__`) and return its globals."""
    ns = {"__name__": "__main__"}
    exec(compile(source, "<notebook>", "exec"), ns)
    return ns


def judge_in_sandbox(lab: str, answers: dict, tmp_path: Path, seed: int = 5) -> dict:
    """Save `answers` as a submission's and judge them in the sandbox: question id -> result."""
    from grader.grader import Grader
    from grader.memorise import save_answers

    save_answers(answers, tmp_path / "answers")
    grader = Grader(tmp_path / "out", seed=seed, copies="off")
    try:
        return {r.id: r for r in grader.judge_saved(lab, tmp_path / "answers")}
    finally:
        grader.close()
