"""tests/mutation_score.py: an equivalent is credited only while its name holds the mutant its entry describes, a
listed mutant no test runs is not killed, and a row is kept from an earlier run only while its module is unchanged."""
from __future__ import annotations

import pytest

from tests.mutation_score import (
    DOCS_END,
    DOCS_START,
    keep,
    load_equivalents,
    markdown,
    mutated_globs,
    score,
    write_docs,
)

DIFF = " def f(x):\n-    return x > 1\n+    return x >= 1"
FOUND = {"common/a.py": {"common.a.x_f__mutmut_1": "survived", "common.a.x_f__mutmut_2": "killed",
                         "common.a.x_f__mutmut_3": "no tests", "common.a.x_f__mutmut_4": "survived"},
         "common/b.py": {"common.b.x_g__mutmut_1": "not checked"}}


def _diffs(by_name):
    return lambda name, module: by_name.get(name, "")


def test_an_equivalent_is_credited_while_its_diff_is_the_entry_s():
    listed = {"common.a.x_f__mutmut_1": {"why": "x is never 1", "diff": DIFF}}
    result, problems = score(FOUND, listed, _diffs({"common.a.x_f__mutmut_1": DIFF}), "abc", {"common/a.py": "h"})
    a = result["modules"]["common/a.py"]
    assert (a["killed"], a["survived"], a["no_tests"], a["equivalent"]) == (1, 2, 1, 1)
    assert a["score"] == pytest.approx(1 / 3, abs=1e-4) and (a["commit"], a["sha256"]) == ("abc", "h")
    assert "common/b.py" not in result["modules"]              # nothing of it checked: not scored by this run
    assert problems == ["1 mutants not checked (a `mutmut run` limited to some names, or stopped): their modules "
                        "are not scored by this run"]
    # a module partly checked (a run stopped in it) gets no row from that part
    partly = {**FOUND, "common/b.py": {"common.b.x_g__mutmut_1": "not checked", "common.b.x_g__mutmut_2": "killed"}}
    assert "common/b.py" not in score(partly, listed, _diffs({"common.a.x_f__mutmut_1": DIFF}))[0]["modules"]
    # the function changed above the mutant: mutmut gave its name to another change
    moved = " def f(x):\n-    return x + 1\n+    return x - 1"
    result, problems = score(FOUND, listed, _diffs({"common.a.x_f__mutmut_1": moved}))
    assert result["modules"]["common/a.py"]["equivalent"] == 0
    assert any("its diff is not the entry's" in p and moved in p for p in problems)


def test_an_entry_whose_hunk_begins_or_ends_with_a_blank_line_is_credited(tmp_path):
    # mutant_diff right-strips every line, so a blank context line at either end of the hunk is an empty line,
    # which the entry's text loses when it is read back.
    blank = "\n def f(x):\n-    return x > 1\n+    return x >= 1\n"
    path = tmp_path / "eq.toml"
    path.write_text(f"[[equivalent]]\nmutant = \"common.a.x_f__mutmut_1\"\nwhy = \"w\"\ndiff = '''\n{blank}\n'''\n")
    result, problems = score(FOUND, load_equivalents(path), _diffs({"common.a.x_f__mutmut_1": blank}))
    assert result["modules"]["common/a.py"]["equivalent"] == 1
    assert not [p for p in problems if "diff is not the entry's" in p]


def test_a_listed_mutant_that_is_killed_untested_or_gone_is_refused_and_not_credited():
    listed = {name: {"why": "w", "diff": DIFF} for name in
              ("common.a.x_f__mutmut_2", "common.a.x_f__mutmut_3", "common.a.x_f__mutmut_9")}
    result, problems = score(FOUND, listed, _diffs(dict.fromkeys(listed, DIFF)))
    assert result["modules"]["common/a.py"]["equivalent"] == 0 and result["equivalent"] == 0
    assert [p.split(": ", 1)[1] for p in problems[:1]] == ["listed as equivalent but mutmut made no such mutant"]
    assert any(p.startswith("common.a.x_f__mutmut_2: listed as equivalent but a test kills it") for p in problems)
    assert any(p.startswith("common.a.x_f__mutmut_3: listed as equivalent but no test runs it") for p in problems)


def test_an_entry_needs_its_reason_and_its_diff(tmp_path):
    path = tmp_path / "eq.toml"
    path.write_text("[[equivalent]]\nmutant = \"m\"\nwhy = \"w\"\ndiff = '''\n" + DIFF + "\n'''\n")
    assert load_equivalents(path) == {"m": {"why": "w", "diff": DIFF}}
    path.write_text('[[equivalent]]\nmutant = "m"\nwhy = "w"\n')
    with pytest.raises(SystemExit, match="without a mutant, a why or a diff"):
        load_equivalents(path)


def test_rows_of_an_earlier_run_are_kept_only_for_unchanged_modules():
    now, _ = score({"common/a.py": {"common.a.x_f__mutmut_2": "killed"}}, {}, commit="new",
                   sources={"common/a.py": "a2"})
    earlier = {"modules": {"common/a.py": {"killed": 0, "survived": 1, "no_tests": 0, "equivalent": 0, "score": 0.0,
                                           "commit": "old", "sha256": "a1"},
                           "common/b.py": {"killed": 3, "survived": 1, "no_tests": 0, "equivalent": 0, "score": 0.75,
                                           "commit": "old", "sha256": "b1"},
                           "common/c.py": {"killed": 5, "survived": 0, "no_tests": 0, "equivalent": 0, "score": 1.0,
                                           "commit": "old", "sha256": "c1"}}}
    merged, dropped = keep(now, earlier, {"common/a.py": "a2", "common/b.py": "b1", "common/c.py": "c2"})
    assert sorted(merged["modules"]) == ["common/a.py", "common/b.py"] and dropped == ["common/c.py"]
    assert merged["modules"]["common/a.py"]["commit"] == "new"          # this run's row, not the earlier one
    assert (merged["killed"], merged["survived"], merged["score"]) == (4, 1, 0.8)


def test_the_docs_section_is_generated_between_its_markers(tmp_path):
    result, _ = score({"common/a.py": {"common.a.x_f__mutmut_1": "survived", "common.a.x_f__mutmut_2": "killed"}},
                      {"common.a.x_f__mutmut_1": {"why": "x is never 1", "diff": DIFF}},
                      _diffs({"common.a.x_f__mutmut_1": DIFF}), "0123456789abcdef")
    doc = tmp_path / "testing.md"
    doc.write_text(f"before\n{DOCS_START}\nold rows\n{DOCS_END}\nafter\n")
    write_docs(doc, markdown(result, {"common.a.x_f__mutmut_1": {"why": "x is never 1", "diff": DIFF}}))
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old rows" not in text
    assert "| `common/a.py` | 1 | 1 | 0 | 1 | 100.0% | `0123456789` |" in text
    assert "- `common.a.x_f__mutmut_1`: x is never 1" in text and "commit `0123456789`" in text
    doc.write_text("no markers")
    with pytest.raises(SystemExit, match="no generated section"):
        write_docs(doc, "x")


def test_a_changed_run_mutates_the_changed_modules_that_exist_and_are_in_the_globs(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.mutmut]\nonly_mutate = ["common/predict/*", "bench/plan*"]\n')
    for path in ("common/predict/step.py", "bench/plan.py", "bench/run.py", "common/predict/README.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    changed = ["common/predict/step.py", "bench/plan.py", "bench/run.py", "common/predict/README.md",
               "common/predict/gone.py", "common/predict/step.py"]
    assert mutated_globs(changed, tmp_path / "pyproject.toml") == ["bench.plan.*", "common.predict.step.*"]
