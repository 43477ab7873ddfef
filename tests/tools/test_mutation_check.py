"""tools/mutation_check.py's mechanics (the mutation runs themselves are by hand, outside CI): every mutation's
text is still in the compiler exactly once, so the list does not rot as the compiler changes, and applying one
edits a copy, never the working tree."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("mutation_check", REPO / "tools" / "mutation_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutation_check", module)
    spec.loader.exec_module(module)
    return module


MC = _load()
NAMED = {"alpha_on_left", "index_select_off_by_one", "embedding_off_by_one", "advanced_index_off_by_one",
         "illegal_reduction_fusion", "permute_inverse"}


def test_the_list():
    names = [m.name for m in MC.MUTATIONS]
    assert len(names) == len(set(names)), "mutation names repeat"
    assert NAMED <= set(names), f"missing the issue's mutations: {NAMED - set(names)}"
    assert len(names) >= len(NAMED) + 20
    for m in MC.MUTATIONS:
        assert m.old != m.new, m.name
        assert m.file.startswith("tilefuse/compiler/"), m.name
        assert m.description, m.name


@pytest.mark.parametrize("mutation", MC.MUTATIONS, ids=lambda m: m.name)
def test_text_found_exactly_once(mutation):
    n = MC.occurrences(mutation)
    assert n == 1, f"{mutation.name}: {mutation.old!r} occurs {n} times in {mutation.file}: update the mutation " \
                   "to the compiler's current text (keep it on a stable, central line)"


def test_apply_edits_the_copy_only(tmp_path):
    m = next(m for m in MC.MUTATIONS if m.name == "alpha_on_left")
    original = (REPO / m.file).read_text()
    copy = tmp_path / m.file
    copy.parent.mkdir(parents=True)
    copy.write_text(original)
    MC.apply(m, tmp_path)
    mutated = copy.read_text()
    assert m.new in mutated and mutated.count(m.old) == 0
    assert len(mutated) == len(original) - len(m.old) + len(m.new)
    assert (REPO / m.file).read_text() == original, "the working tree was edited"
    with pytest.raises(ValueError, match="occurs 0 times"):
        MC.apply(m, tmp_path)  # already applied: the old text is gone


def test_copy_lists_the_package_and_the_tests():
    files = set(MC.tracked_files())
    assert {"tilefuse/compiler/scheduler.py", "tests/conftest.py", "pyproject.toml"} <= files
    assert not any(f.startswith(MC.SKIP_DIRS) for f in files)


def test_report_table():
    outcomes = [MC.Outcome("a", "caught", "1: tests/x.py", "tests/x.py::t", 3.0),
                MC.Outcome("b", "survived", "", "", 9.0)]
    text = MC.table(outcomes)
    assert "caught 1 of 2; survived 1" in text and "tests/x.py::t" in text
