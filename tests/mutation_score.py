"""The mutation score of `nox -s mutation`, from what mutmut left in mutants/: mutation.json, a plain table and,
with --docs, the generated section of docs/testing.md.

Per module (the mutated file's path) and overall: killed (a test failed, or timed out), survived (every test
passed), no_tests (no fast test reaches the mutated function), equivalent (listed in
tests/mutation_equivalents.toml, each with why no test can tell it from the original) and
score = killed / (killed + survived + no_tests - equivalent).

An equivalent is credited only while the mutant mutmut makes under its name is the one its entry describes. mutmut
names a mutant by its position in its function, so an edit above it gives the name to another mutant: each entry
holds its mutant's diff (the hunk, context lines included, without line numbers), and an entry whose mutant's diff
is another, or that names no mutant, is refused (not credited, and the run fails). A listed mutant that no test
runs is not killed, whatever its reason says.

Each module's row carries the commit it was scored on and its source's SHA-256. `--keep FILE` keeps the rows of an
earlier mutation.json whose module this run did not score (a `--changed` run scores only what changed) and whose
source is byte for byte the file as it is now; a row whose module changed since is dropped, never carried.

    python tests/mutation_score.py [--out mutation.json] [--keep mutation.json] [--docs docs/testing.md]
    python tests/mutation_score.py --diff NAME [NAME ...]   # entries to fill in: each mutant's name and diff
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (pyproject's tomli)
    import tomli as tomllib

MUTANTS = Path("mutants")
EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.toml")
COUNTED = ("killed", "survived", "no_tests", "equivalent")
# mutmut's statuses as this score counts them; anything else (not checked, interrupted) stops the report.
STATUS = {"killed": "killed", "timeout": "killed", "survived": "survived", "suspicious": "survived",
          "segfault": "killed", "no tests": "no_tests"}
DOCS_START, DOCS_END = "<!-- mutation-score: start (tests/mutation_score.py --docs) -->", "<!-- mutation-score: end -->"


def statuses(root: Path = MUTANTS) -> dict[str, dict[str, str]]:
    """{module path: {mutant name: status}} from mutmut's .meta files."""
    from mutmut.stats import status_by_exit_code  # mutmut's own reading of its exit codes

    found: dict[str, dict[str, str]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        module = meta.relative_to(root).as_posix().removesuffix(".meta")
        found[module] = {name: status_by_exit_code[code] for name, code in codes.items()}
    return found


def mutant_diff(name: str, module: str) -> str:
    """The hunk mutmut's `show NAME` prints, without its file and line-number headers (the lines of the function
    above the hunk may move; the mutated line and its context may not). mutmut's diff reader is internal: this is
    the one place that reads it."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    lines = get_diff_for_mutant(name, path=module).splitlines()
    return "\n".join(line.rstrip() for line in lines if not line.startswith(("---", "+++", "@@")))


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, dict]:
    """{mutant name: {why, diff}}; every entry needs all three."""
    entries = tomllib.loads(path.read_text()).get("equivalent", [])
    bad = [e for e in entries if not (e.get("mutant") and e.get("why") and e.get("diff"))]
    if bad:
        raise SystemExit(f"{path}: an entry without a mutant, a why or a diff: {bad[0]}")
    return {e["mutant"]: {"why": e["why"], "diff": e["diff"].strip("\n")} for e in entries}


def score(found: dict[str, dict[str, str]], equivalents: dict[str, dict], diff_of=mutant_diff,
          commit: str = "", sources: dict[str, str] | None = None) -> tuple[dict, list[str]]:
    """mutation.json's content, and what is wrong with the equivalents list (stale, killed, untested entries).
    `diff_of(name, module)`: a mutant's diff as mutant_diff gives it; `sources`: module -> its SHA-256."""
    problems, modules, unchecked = [], {}, []
    seen = {name for mutants in found.values() for name in mutants}
    problems += [f"{name}: listed as equivalent but mutmut made no such mutant" for name in equivalents
                 if name not in seen]
    for module, mutants in found.items():
        counts = dict.fromkeys(COUNTED, 0)
        pending = [name for name, status in mutants.items() if status == "not checked"]
        if pending:  # outside the names `mutmut run` was given, or not reached yet: no row from a part of a module
            unchecked += pending
            continue
        for name, status in mutants.items():
            if status not in STATUS:
                raise SystemExit(f"{name}: {status}; run `mutmut run` to the end first")
            counts[STATUS[status]] += 1
            if name not in equivalents:
                continue
            if STATUS[status] == "killed":
                problems.append(f"{name}: listed as equivalent but a test kills it")
            elif STATUS[status] == "no_tests":
                problems.append(f"{name}: listed as equivalent but no test runs it: not killed, whatever its reason")
            elif diff_of(name, module).strip("\n") != equivalents[name]["diff"]:  # as load_equivalents reads it
                problems.append(f"{name}: listed as equivalent, but its diff is not the entry's (mutmut names "
                                f"mutants by position: the function changed); now:\n{diff_of(name, module)}")
            else:
                counts["equivalent"] += 1
        if sum(counts.values()):
            modules[module] = {**counts, "score": _ratio(counts), "commit": commit,
                               "sha256": (sources or {}).get(module, "")}
    if unchecked:
        problems.append(f"{len(unchecked)} mutants not checked (a `mutmut run` limited to some names, or stopped): "
                        "their modules are not scored by this run")
    return _totals({"date": date.today().isoformat(), "commit": commit, "modules": modules}), problems


def _totals(result: dict) -> dict:
    total = {k: sum(m[k] for m in result["modules"].values()) for k in COUNTED}
    return {**result, **total, "score": _ratio(total)}


def keep(result: dict, earlier: dict, sources: dict[str, str]) -> tuple[dict, list[str]]:
    """`result` with the rows of `earlier` for the modules it did not score whose source is unchanged (same SHA-256
    as the file now); the others are named, not carried."""
    kept, dropped = dict(result["modules"]), []
    for module, row in earlier.get("modules", {}).items():
        if module in kept:
            continue
        if row.get("sha256") and row["sha256"] == sources.get(module):
            kept[module] = row
        else:
            dropped.append(module)
    return _totals({**result, "modules": kept}), dropped


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


def markdown(result: dict, equivalents: dict[str, dict]) -> str:
    """The generated section of docs/testing.md: the table of `result` and the listed equivalents."""
    lines = [f"Generated by `python tests/mutation_score.py --docs docs/testing.md` from `mutation.json` of commit "
             f"`{_short(result['commit'])}`; each row says the commit it was scored on (an earlier one only where the "
             "module's source is byte for byte the same; +uncommitted: with changes not committed there).", "",
             "| module | killed | survived | no tests | equivalent | score | scored on |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for module, m in sorted(result["modules"].items()):
        lines.append(f"| `{module}` | {m['killed']} | {m['survived']} | {m['no_tests']} | {m['equivalent']} | "
                     f"{_percent(m['score'])} | `{_short(m['commit'])}` |")
    lines += [f"| **all** | {result['killed']} | {result['survived']} | {result['no_tests']} | "
              f"{result['equivalent']} | **{_percent(result['score'])}** | |", "",
              f"Listed as equivalent ({len(equivalents)}, `tests/mutation_equivalents.toml`, each with its diff):", ""]
    lines += [f"- `{name}`: {e['why']}" for name, e in sorted(equivalents.items())]
    return "\n".join(lines)


def _short(commit: str) -> str:
    return commit[:10] + ("+uncommitted" if commit.endswith("+uncommitted") else "")


def write_docs(path: Path, section: str) -> None:
    text = path.read_text()
    if DOCS_START not in text or DOCS_END not in text:
        raise SystemExit(f"{path}: no generated section ({DOCS_START} ... {DOCS_END})")
    head, rest = text.split(DOCS_START, 1)
    path.write_text(f"{head}{DOCS_START}\n{section}\n{DOCS_END}{rest.split(DOCS_END, 1)[1]}")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def mutated_globs(paths: list[str], pyproject: Path = Path("pyproject.toml")) -> list[str]:
    """Of `paths` (files, relative to the checkout), those that exist and [tool.mutmut]'s only_mutate mutates, as the
    globs of their mutants' names ("common/predict/step.py" -> "common.predict.step.*"), for `mutmut run`."""
    globs = tomllib.loads(pyproject.read_text())["tool"]["mutmut"]["only_mutate"]
    return [path.removesuffix(".py").replace("/", ".") + ".*" for path in sorted(set(paths))
            if path.endswith(".py") and (pyproject.parent / path).is_file()
            and any(fnmatch.fnmatch(path, g) for g in globs)]


def changed_since(ref: str) -> list[str]:
    """The files that differ between `ref` and the working tree (committed or not)."""
    done = subprocess.run(["git", "diff", "--name-only", ref, "--"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"--changed {ref}: {done.stderr.strip()}")
    return done.stdout.split()


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    return head + ("+uncommitted" if dirty else "") if head else "unknown"


def sha256(module: str) -> str:
    path = Path(module)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def entry(name: str, module: str) -> str:
    """A TOML entry to fill in: the mutant's name and diff (a literal string: no escapes), its reason left for a
    person to write."""
    return f"[[equivalent]]\nmutant = \"{name}\"\nwhy = \"\"\ndiff = '''\n{mutant_diff(name, module)}\n'''\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("mutation.json"))
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS)
    parser.add_argument("--keep", type=Path, help="an earlier mutation.json whose unchanged modules' rows to keep")
    parser.add_argument("--docs", type=Path, help="rewrite the generated section of this file (docs/testing.md)")
    parser.add_argument("--diff", nargs="+", metavar="NAME", help="print these mutants as entries to fill in")
    args = parser.parse_args(argv)
    found = statuses()
    if not found:
        print("no mutants/ here: run `mutmut run` first", file=sys.stderr)
        return 2
    if args.diff:
        where = {name: module for module, mutants in found.items() for name in mutants}
        print("\n".join(entry(name, where[name]) for name in args.diff))
        return 0
    equivalents = load_equivalents(args.equivalents)
    sources = {module: sha256(module) for module in found}
    result, problems = score(found, equivalents, commit=commit(), sources=sources)
    if args.keep and args.keep.is_file():
        earlier = json.loads(args.keep.read_text())
        sources |= {module: sha256(module) for module in earlier.get("modules", {})}
        result, dropped = keep(result, earlier, sources)
        problems += [f"{module}: changed since {args.keep} scored it, and not scored now: left out" for module in
                     dropped]
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    if args.docs:
        write_docs(args.docs, markdown(result, equivalents))
    for problem in problems:
        print(f"equivalents: {problem}", file=sys.stderr)
    return 1 if any("listed as equivalent" in p for p in problems) else 0


if __name__ == "__main__":
    sys.exit(main())
