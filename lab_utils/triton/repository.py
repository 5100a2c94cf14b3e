"""Write a Triton model repository from Python: model folders, numbered versions, config.pbtxt.

    repo/
    ├── mlp/
    │   ├── config.pbtxt          optional for some backends; Triton can auto-complete the rest
    │   ├── 1/model.py            each version is a folder named by a positive integer
    │   └── 2/model.py
    └── pipeline/                 an ensemble: config only, plus an empty version folder
        ├── config.pbtxt
        └── 1/

Triton scans the repository folder by folder; a folder is a model, its numeric subfolders are
versions, and which versions it serves is the config's `version_policy` (default: latest 1).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .config import ConfigError, config_from_dict, config_problems, validate_config

TEMPLATES = Path(__file__).resolve().parent / "model_templates"
FileContent = str | bytes | Path
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def template_source(name: str) -> str:
    """The source of a shipped python-backend model (mlp, cost_stand_in, version_echo, autocomplete, course_llm)."""
    path = TEMPLATES / f"{name}.py"
    if not path.exists():
        known = sorted(p.stem for p in TEMPLATES.glob("*.py"))
        raise FileNotFoundError(f"no model template {name!r}; shipped templates: {known}")
    return path.read_text()


def write_model(
    repo: str | Path,
    name: str,
    config: str | dict | None = None,
    versions: dict[int, dict[str, FileContent]] | None = None,
    *,
    check: bool = True,
    replace: bool = False,
) -> Path:
    """Write one model folder: config.pbtxt (validated; None = no config) and version folders.

    Args:
        repo: the repository folder (created if needed).
        name: the model's folder name, which is also the name clients use.
        config: config.pbtxt text, a dict in ModelConfig's JSON shape, or None to leave it out.
        versions: {version number: {file name: text, bytes, or a Path to copy}}; an empty dict
            makes an empty version folder (what an ensemble has).
        check: also refuse configs that parse but that Triton would reject at load time.
        replace: remove an existing folder of that name first.
    Returns:
        the model folder.
    """
    if not _NAME.match(name):
        raise ValueError(f"model name {name!r}: use letters, digits, '_', '-' or '.' only")
    versions = {1: {}} if versions is None else versions
    for v in versions:
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"model {name}: version folders are positive integers, got {v!r}")
    text = None
    if config is not None:
        text = config_from_dict(config, f"{name}/config") if isinstance(config, dict) else config
        parsed = validate_config(text, f"{name}/config.pbtxt")
        problems = config_problems(parsed, folder_name=name) if check else []
        if problems:
            raise ConfigError(f"{name}/config.pbtxt: " + "; ".join(problems))
    folder = Path(repo) / name
    if folder.exists():
        if not replace:
            raise FileExistsError(f"{folder} exists; pass replace=True to rewrite it")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    if text is not None:
        (folder / "config.pbtxt").write_text(text if text.endswith("\n") else text + "\n")
    for v, files in sorted(versions.items()):
        vdir = folder / str(v)
        vdir.mkdir()
        for fname, content in files.items():
            target = vdir / fname
            if isinstance(content, Path):
                (shutil.copytree if content.is_dir() else shutil.copy2)(content, target)
            elif isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content)
    return folder


def tree(repo: str | Path, max_files: int = 6) -> str:
    """The repository layout as an indented text tree (like `tree`), at most max_files per folder."""
    root = Path(repo)
    lines = [f"{root.name}/"]

    def walk(folder: Path, prefix: str) -> None:
        entries = sorted(folder.iterdir(), key=lambda p: (p.is_file(), p.name))
        entries = [e for e in entries if e.name != "__pycache__"]
        shown = entries[:max_files]
        for i, entry in enumerate(shown):
            last = i == len(shown) - 1 and len(entries) <= max_files
            lines.append(f"{prefix}{'└── ' if last else '├── '}{entry.name}{'/' if entry.is_dir() else ''}")
            if entry.is_dir():
                walk(entry, prefix + ("    " if last else "│   "))
        if len(entries) > max_files:
            lines.append(f"{prefix}└── ... {len(entries) - max_files} more")

    walk(root, "")
    return "\n".join(lines)


def version_folders(model_folder: str | Path) -> list[int]:
    """The version numbers present on disk for one model folder, ascending."""
    return sorted(
        int(p.name)
        for p in Path(model_folder).iterdir()
        if p.is_dir() and p.name.isdigit() and int(p.name) > 0
    )
