"""python -m bench.slurm --nodes 2 [--time T] [--partition P] [--account A] [--submit] [bench.compare options]

An sbatch script for a sweep on a SLURM cluster: printed, or submitted with --submit (the job id is printed).
The script runs bench.compare --srun in the job: every run of the sweep is one job step (srun, one bench.run per
node, each taking the world from the allocation: common.scheduler), all records go into one --out, and the
summary is written at the end. At the time limit SLURM sends SIGTERM: the running step stops and leaves no
record, the finished runs' records stay and the summary is rewritten from them (bench.compare's cancel path).
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from bench import compare
from bench.cli import OneLineParser
from common.errors import EXIT_FAILED, EXIT_OK
from common.launch import REPO_ROOT

SUBMIT_TIMEOUT_S = 60.0
# bench.slurm's own options, as sbatch spells them: passed through untouched (sbatch checks their values).
SBATCH_OPTIONS = ("nodes", "time", "partition", "account")


def build_parser() -> OneLineParser:
    # The rest of the command line is bench.compare's, checked by bench.compare's own parser; no abbreviations
    # here, so that bench.compare's options (--timeout) never read as one of these (--time).
    p = OneLineParser(prog="bench.slurm", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                      epilog="Every other option is bench.compare's (python -m bench.compare --help).")
    p.add_argument("--nodes", required=True, help="sbatch --nodes: every run spans them (e.g. 2)")
    p.add_argument("--time", help="sbatch --time: the job's time limit (e.g. 01:00:00)")
    p.add_argument("--partition", help="sbatch --partition")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument("--job-name", default="parbench", help="sbatch --job-name (default parbench)")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter on the nodes (default: this one, %(default)s)")
    p.add_argument("--submit", action="store_true", help="submit with sbatch --parsable and print the job id")
    return p


def compare_argv(rest: list[str]) -> list[str]:
    """bench.compare's part of the command line, checked by its own parser now (bad input: one line, exit 2)
    rather than in the job after it waited in the queue."""
    parser = compare.build_parser()
    parser.prog = "bench.slurm"
    if parser.parse_args(rest).srun:
        parser.error("--srun is set by the script itself")
    return rest


def script(args: argparse.Namespace, compare_args: list[str], cwd: Path) -> str:
    sbatch = [f"--{o.replace('_', '-')}={getattr(args, o)}" for o in (*SBATCH_OPTIONS, "job_name")
              if getattr(args, o)]
    lines = ["#!/bin/bash", *(f"#SBATCH {shlex.quote(o)}" for o in sbatch),
             # One bench.run per node starts that node's per-device processes: one task per node, whole nodes.
             "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive",
             "# Written by python -m bench.slurm: the sweep below runs every run as one job step (srun) over all",
             "# nodes; SIGTERM at the time limit stops the running step (no record) and keeps the finished runs.",
             "set -euo pipefail",
             f"cd {shlex.quote(str(cwd))}",  # relative paths (--out, --data-dir) mean what they meant here
             f"export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
             # exec: the time limit's SIGTERM reaches bench.compare itself, not a shell that would not pass it on.
             f"exec {shlex.join([args.python, '-m', 'bench.compare', '--srun', *compare_args])}"]
    return "\n".join(lines) + "\n"


def submit(text: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """sbatch --parsable from stdin: (exit status, the job id or sbatch's one-line complaint)."""
    try:
        done = subprocess.run(["sbatch", "--parsable"], input=text, capture_output=True, text=True,
                              timeout=SUBMIT_TIMEOUT_S, env=env)
    except FileNotFoundError:
        return EXIT_FAILED, "sbatch is not on PATH"
    except subprocess.TimeoutExpired:
        return EXIT_FAILED, f"sbatch did not answer within {SUBMIT_TIMEOUT_S:.0f} s"
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return EXIT_FAILED, lines[-1] if lines else f"sbatch exited {done.returncode}"
    return EXIT_OK, done.stdout.strip().split(";")[0]  # --parsable: "ID" or "ID;CLUSTER"


def main(argv: list[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(argv)
    text = script(args, compare_argv(rest), Path.cwd())
    if not args.submit:
        print(text, end="")
        return EXIT_OK
    rc, said = submit(text, dict(os.environ))
    print(said if rc == EXIT_OK else f"bench.slurm: sbatch: {said}", file=sys.stdout if rc == EXIT_OK else sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
