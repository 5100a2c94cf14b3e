"""The catalogue of forbidden references (lab_utils/grading/forbidden.py, issue 38 item 8).

Each family is named once and each reference is written once; questions name families; every
entry resolves to a real object; a family name that does not exist fails where it is used; the
refusal names what was called as what it is.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

from grader.library import resolve
from lab_utils.grading import forbidden
from lab_utils.grading.forbidden import FAMILIES, refs, refusal
from lab_utils.grading.registry import all_questions

QUESTIONS = Path(forbidden.__file__).parent / "questions"
SPEC = re.compile(
    r'"((?:lab_utils|numpy|torch|statistics|pydantic|openai|msgspec|prometheus_client)[\w.]*:[\w.]+)"'
)


def test_every_entry_resolves_to_a_real_object():
    missing = []
    for fam in FAMILIES.values():
        for spec in fam.refs:
            try:
                resolve(spec)
            except Exception as exc:
                missing.append(f"{fam.name}: {spec} ({type(exc).__name__}: {exc})")
    assert not missing, missing


def test_each_reference_is_written_once_in_the_catalogue():
    """A reference two families need lives in a small family both include (`+name`): the
    percentile family cannot drift into copies again."""
    written = Counter(SPEC.findall(Path(forbidden.__file__).read_text()))
    assert not [s for s, n in written.items() if n > 1]


def test_questions_name_families_and_no_inline_list_remains():
    inline = [q.id for q in all_questions() if q.forbid and not q.families]
    assert not inline, f"forbid lists not from lab_utils.grading.forbidden.refs(...): {inline}"
    for q in all_questions():
        assert tuple(q.forbid) == tuple(refs(*q.families)), q.id
    for path in sorted(QUESTIONS.glob("lab*.py")):  # and no reference spelled out in a question file
        found = [s for s in SPEC.findall(path.read_text()) if s.partition(":")[0] != "lab_utils.grading"]
        tree = ast.parse(path.read_text())
        in_lists = [
            s
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in found
            for s in [node.value]
        ]
        assert not in_lists, f"{path.name} spells out references: {sorted(set(in_lists))[:5]}"


def test_an_unknown_family_fails_where_it_is_named():
    with pytest.raises(KeyError, match="no forbidden-reference family"):
        refs("percentile")  # the family is "percentiles"


def test_the_percentile_family_is_complete():
    p = set(refs("percentiles"))
    for spec in (
        "numpy:percentile",
        "numpy:quantile",
        "numpy:nanpercentile",
        "numpy:nanquantile",
        "numpy:interp",
        "numpy:median",
        "statistics:median",
        "statistics:quantiles",
        "torch:quantile",
        "torch:Tensor.quantile",
        "torch:Tensor.nanquantile",
        "lab_utils.mathutils:percentile",
    ):
        assert spec in p, spec


def test_the_refusal_names_what_was_called():
    assert refusal("statistics:median") == (
        "`statistics.median` is not allowed here: the question asks you to write the median yourself"
    )
    msg = refusal("lab_utils.kv.workload:max_concurrent_requests")
    assert msg.startswith("the course's `max_concurrent_requests` is not allowed here")
