"""The mutation score of `nox -s mutation`, from what mutmut left in mutants/: mutation.json and a plain table.

Per module (the mutated file's path) and overall: killed (a test failed, or timed out), survived (every test
passed), no_tests (no fast test reaches the mutated function), equivalent (listed in
tests/mutation_equivalents.toml, each with why no test can tell it from the original) and
score = killed / (killed + survived + no_tests - equivalent): a mutant that no test runs is not killed.

    python tests/mutation_score.py [--out mutation.json] [--equivalents tests/mutation_equivalents.toml]
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (pyproject's tomli)
    import tomli as tomllib
from mutmut.stats import status_by_exit_code  # mutmut's own reading of its exit codes

MUTANTS = Path("mutants")
EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.toml")
COUNTED = ("killed", "survived", "no_tests", "equivalent")
# mutmut's statuses as this score counts them; anything else (not checked, interrupted) stops the report.
STATUS = {"killed": "killed", "timeout": "killed", "survived": "survived", "suspicious": "survived",
          "segfault": "killed", "no tests": "no_tests"}


def statuses(root: Path = MUTANTS) -> dict[str, dict[str, str]]:
    """{module path: {mutant name: status}} from mutmut's .meta files."""
    found: dict[str, dict[str, str]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        module = meta.relative_to(root).as_posix().removesuffix(".meta")
        found[module] = {name: status_by_exit_code[code] for name, code in codes.items()}
    return found


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, str]:
    """{mutant name: why it is equivalent}; every entry needs both."""
    entries = tomllib.loads(path.read_text()).get("equivalent", [])
    bad = [e for e in entries if not e.get("mutant") or not e.get("why")]
    if bad:
        raise SystemExit(f"{path}: an entry without a mutant or a why: {bad[0]}")
    return {e["mutant"]: e["why"] for e in entries}


def score(found: dict[str, dict[str, str]], equivalents: dict[str, str]) -> tuple[dict, list[str]]:
    """mutation.json's content, and the problems with the equivalents list (stale or killed entries)."""
    problems, modules, unchecked = [], {}, []
    seen = {name for mutants in found.values() for name in mutants}
    problems += [f"{name}: listed as equivalent but mutmut made no such mutant" for name in equivalents
                 if name not in seen]
    for module, mutants in found.items():
        counts = dict.fromkeys(COUNTED, 0)
        for name, status in mutants.items():
            if status == "not checked":  # outside the mutant names `mutmut run` was given
                unchecked.append(name)
                continue
            if status not in STATUS:
                raise SystemExit(f"{name}: {status}; run `mutmut run` to the end first")
            counts[STATUS[status]] += 1
            if name in equivalents:
                if STATUS[status] == "killed":
                    problems.append(f"{name}: listed as equivalent but a test kills it")
                else:
                    counts["equivalent"] += 1
        if sum(counts.values()):
            modules[module] = {**counts, "score": _ratio(counts)}
    if unchecked:
        problems.append(f"{len(unchecked)} mutants not checked (a `mutmut run` limited to some names): the score "
                        "is of the others")
    total = {k: sum(m[k] for m in modules.values()) for k in COUNTED}
    return {"date": date.today().isoformat(), "modules": modules, **total, "score": _ratio(total)}, problems


def _ratio(c: dict) -> float | None:
    denominator = c["killed"] + c["survived"] + c["no_tests"] - c["equivalent"]
    return round(c["killed"] / denominator, 4) if denominator else None


def table(result: dict) -> str:
    rows = [f"{'module':40} {'killed':>7} {'survived':>8} {'no tests':>8} {'equiv.':>6} {'score':>6}"]
    for module, m in sorted(result["modules"].items(), key=lambda kv: kv[1]["score"] or 0):
        rows.append(f"{module:40} {m['killed']:7} {m['survived']:8} {m['no_tests']:8} {m['equivalent']:6} "
                    f"{_percent(m['score']):>6}")
    rows.append(f"{'all':40} {result['killed']:7} {result['survived']:8} {result['no_tests']:8} "
                f"{result['equivalent']:6} {_percent(result['score']):>6}")
    return "\n".join(rows)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("mutation.json"))
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS)
    args = parser.parse_args(argv)
    found = statuses()
    if not found:
        print("no mutants/ here: run `mutmut run` first", file=sys.stderr)
        return 2
    result, problems = score(found, load_equivalents(args.equivalents))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    for problem in problems:
        print(f"equivalents: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
