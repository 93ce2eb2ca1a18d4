"""python -m bench.part_check --hardware NAME|FILE --out DIR [--name TABLE] [--checks NAMES] [-- compute_table args]

A part measured in one command, for one lease of a lent GPU: its compute table (bench.compute_table, after a
sustained load, so at the clocks a run holds), then the layer checks (bench.layer_check) held against that table
and not the bundled one, nvidia-smi sampling the GPU's power and clocks throughout. Into DIR, at most seven files
(a lent machine hands back eight): `compute.json` (the measurement), `NAME.toml` (the table), `hardware.toml` (the
hardware file given, naming that table), `checks.json` (every check's record), `part-check.md` (what nvidia-smi
said, the table's headline figures and each check's error), and where nvidia-smi runs `nvidia-smi.txt` (power
limit, clocks, driver) and `nvidia-smi-trace.csv`. The same code runs on a CPU at small sizes
(tests/test_part_check.py); docs/prediction-at-scale.md says how its files are committed.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from bench import compute_table, layer_check
from common import gpu_telemetry
from common.predict import hardware as hardware_files


@dataclass(frozen=True)
class Check:
    """One bench.layer_check run: a part of one model's step on one rank."""
    name: str
    model: str
    micro_batch: int
    part: str = "layer"
    stack: str = "torch-eager"
    recompute: str = "none"
    shards: int = 8

    def argv(self, model: str, hardware: Path, device: str | None, steps: int, json_path: Path) -> list[str]:
        return ["--model", model, "--hardware", str(hardware), "--part", self.part, "--micro-batch",
                str(self.micro_batch), "--stack", self.stack, "--recompute", self.recompute, "--shards",
                str(self.shards), "--steps", str(steps), "--json", str(json_path),
                *(["--device", device] if device else [])]


# The checks the H100's table was held to (results/reference/h100x1/layers and rest): the layers of the published
# points' models as torchtitan (eager, and compiled with selective recompute) and Megatron's GPT (micro-batch 4) run
# them, the 8B's head, and AdamW over an FSDP rank's eighth of the 8B.
CHECKS = (
    Check("llama3-8b-layer", "llama3-8b", 2),
    Check("llama3-8b-layer-compiled-selective", "llama3-8b", 2, stack="torch-compile", recompute="selective"),
    Check("llama3-70b-layer", "llama3-70b", 1),
    Check("megatron-gpt-7.1b-layer", "megatron-gpt-7.1b", 4),
    Check("llama3-8b-head", "llama3-8b", 2, part="head"),
    Check("llama3-8b-optimizer", "llama3-8b", 2, part="optimizer", shards=8),
)
BY_NAME = {c.name: c for c in CHECKS}


def _checks(text: str) -> tuple[Check, ...]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown checks {unknown or text!r} (known: {', '.join(BY_NAME)})")
    return tuple(BY_NAME[n] for n in names)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench.part_check", description=__doc__.split("\n\n")[0],
                                epilog="Arguments after -- go to bench.compute_table (its --grid, --precisions, ...).")
    p.add_argument("--hardware", required=True, help="the part's hardware file (bundled name or path): the layer "
                   "checks predict with it, its compute table replaced by the one measured")
    p.add_argument("--out", required=True, type=Path, help="the folder the files go to")
    p.add_argument("--name", help="the compute table's name (default: the hardware's, less its '-N' devices a node)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where torch sees one, else cpu")
    p.add_argument("--sustain-s", type=float, default=60.0,
                   help="seconds of one GEMM before the table is measured (default: %(default)s)")
    p.add_argument("--checks", type=_checks, default=CHECKS, help=f"default: all ({', '.join(BY_NAME)})")
    p.add_argument("--model", help="every check on this decoder (a bundled name or a TOML file) instead of its own")
    p.add_argument("--steps", type=int, default=10, help="timed steps of each check (default: %(default)s)")
    return p


def with_table(hardware_text: str, table: Path) -> str:
    """The hardware file's text with its `compute` key naming `table` (a top-level key: before the first table)."""
    kept = re.sub(r"(?m)^compute\s*=.*\n", "", hardware_text)
    return f'compute = "{table.resolve()}"   # measured by bench.part_check\n{kept}'


def summary(measured: dict, records: list[dict], hardware: str, table: Path, telemetry: list[str]) -> str:
    """part-check.md: what nvidia-smi said, the table's headline figures, then each check's measured and predicted
    times and error."""
    lines = [f"# {measured['device']}: compute table `{table.name}` and its layer checks", "",
             f"{measured['software']}, {measured['date']}; measured in {measured['seconds']} s; hardware {hardware}.",
             "", "```", *telemetry, "```", ""]
    sustained = measured.get("sustained")
    if sustained:
        m, n, k = sustained["shape"]
        lines.append(f"- sustained {m}x{n}x{k} GEMM: {sustained['first_tflops']:g} TFLOP/s first, "
                     f"{sustained['steady_tflops']:g} steady")
    for precision, rates in measured["matmul"].items():
        best = max(rates["grid"], key=lambda row: row[3])
        lines.append(f"- {precision} GEMM, best of the grid: {best[3]:g} TFLOP/s at {best[0]}x{best[1]}x{best[2]}")
    if measured["copy_GBps"]:
        size, rate = max(measured["copy_GBps"].items(), key=lambda kv: int(kv[0]))
        lines.append(f"- copy of {int(size):,} B: {rate:.0f} GB/s")
    lines += ["", "| check | model | part | measured (ms) | predicted (ms) | error |", "|---|---|---|---:|---:|---:|"]
    for r in records:
        for part, measured_s, predicted_s in layer_check.compared(r["part"], r["measured"], r["predicted"]):
            lines.append(f"| {r['check']} | {r['model']} | {part} | {measured_s * 1e3:.3f} | "
                         f"{predicted_s * 1e3:.3f} | {r['error'][part]:+.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    table_args = []
    if "--" in argv:
        at = argv.index("--")
        argv, table_args = argv[:at], argv[at + 1:]
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        hardware = hardware_files.load(args.hardware)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    name = args.name or re.sub(r"-\d+$", "", hardware.name)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    smi = gpu_telemetry.state()
    if smi is not None:
        (out / "nvidia-smi.txt").write_text(smi)
    with gpu_telemetry.trace(out / "nvidia-smi-trace.csv") as tracing:
        code, measured, records = measure(args, hardware, name, table_args, console)
    if code:
        return code
    telemetry = [smi.strip() if smi else "nvidia-smi: not on this machine (no power limit, clocks or trace)"]
    if tracing:
        telemetry.append(gpu_telemetry.trace_summary(out / "nvidia-smi-trace.csv"))
    (out / "checks.json").write_text(json.dumps(records, indent=1) + "\n")
    (out / "part-check.md").write_text(summary(measured, records, hardware.name, out / f"{name}.toml", telemetry))
    console.print(f"{len(records)} checks against {out / f'{name}.toml'}: {out / 'part-check.md'}")
    return 0


def measure(args, hardware, name: str, table_args: list[str], console: Console) -> tuple[int, dict, list[dict]]:
    """The table, then each check against it: (exit code, the table's measurement, the checks' records)."""
    out = args.out
    table, measured_json = out / f"{name}.toml", out / "compute.json"
    device = ["--device", args.device] if args.device else []
    code = compute_table.main(["--json", str(measured_json), "--toml", str(table), "--name", name, *device,
                               "--sustain-s", str(args.sustain_s), *table_args])
    if code:
        return code, {}, []
    measured = json.loads(measured_json.read_text())
    part = out / "hardware.toml"
    part.write_text(with_table(Path(hardware.path).read_text(), table))
    hardware_files.load(str(part))  # the file every check reads: a broken one fails here, once
    if measured["device"] != hardware.device_name:
        console.print(f"[yellow]{hardware.name} names its device {hardware.device_name!r}; this one is "
                      f"{measured['device']!r}: its memory-bound work is predicted at its datasheet bandwidth[/yellow]")
    records = []
    for check in args.checks:
        one = out / f".{check.name}.json"
        code = layer_check.main(check.argv(args.model or check.model, part, args.device, args.steps, one))
        if code:
            return code, measured, records
        records.append({"check": check.name, **json.loads(one.read_text())})
        one.unlink()
    return 0, measured, records

if __name__ == "__main__":
    sys.exit(main())
