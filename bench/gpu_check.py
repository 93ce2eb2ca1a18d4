"""python -m bench.gpu_check --out DIR [--model-size base] [--batch-size 256] [--groups mlm,mlm-compiled,cnn,lm]

The device check of every framework at its best on one GPU, prepared to fit one lease (docs/profiling.md, "On a
GPU"): the BERT MLM at bf16 autocast in torch_3d, torch_ddp and keras_jax (XLA), torch_ddp again under torch.compile
(torch_3d refuses --compile), the CNN in torch_ddp and torch_dp, the decoder LM in torch_3d and torch_ddp, each with
--profile and beside its framework's bare loop (bench.calibrate: the suite run and the bare idiom alternated), all
on 1 device and synthetic data (the GPU machine holds no data). Then DIR/report.md (bench.report: every run's
attribution table) and DIR/gpu-check.json and .md: per run its step, MFU, its ratio to the bare loop and to
torch_3d's step of the same group, and where nvidia-smi runs the SM clock and power each run held (its trace beside
the records: runs one after another on one GPU compare fairly only at the same clocks). On a CPU (--device-kind cpu,
a tiny model, a few steps) the same code runs in the tests.
"""
from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console

from bench.cli import OneLineParser, name_list, positive_int
from common import gpu_telemetry
from common.results import load_records, write_atomic, write_json_atomic

# (group, workload, backends, flags): what the check runs, 1 device each.
GROUPS = {
    "mlm": ("mlm", ("torch_3d", "torch_ddp", "keras_jax"), ()),
    # torch_ddp only: torch_3d refuses --compile (its FSDP2 / DTensor / pipeline stages are not compiled yet)
    "mlm-compiled": ("mlm", ("torch_ddp",), ("--compile",)),
    "cnn": ("cnn", ("torch_ddp", "torch_dp"), ()),
    # The decoder LM (issue #49): the backends that train it.
    "lm": ("lm", ("torch_3d", "torch_ddp"), ()),
}
REFERENCE = "torch_3d"
# torch_3d has no bare loop of its own (a layout has no minimal torch idiom); on 1 device torch's is torch_ddp's.
BARE_OF = {"torch_3d": "torch_ddp"}
SUMMARY = "gpu-check"


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/gpu-check",
                   help="the check's results folder (commit a GPU's under results/reference/<gpu>/)")
    p.add_argument("--groups", type=name_list(tuple(GROUPS)), default=list(GROUPS))
    p.add_argument("--model-size", default="base", choices=("tiny", "mini", "base"),
                   help="the MLM's and the decoder LM's size (both have these)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="the MLM's batch per device")
    p.add_argument("--cnn-batch-size", type=positive_int, default=512)
    p.add_argument("--lm-batch-size", type=positive_int, default=64,
                   help="the decoder LM's sequences per device (64 of base's 512 tokens: the MLM's 256 x 128 tokens)")
    p.add_argument("--steps", type=positive_int, default=30)
    p.add_argument("--warmup-steps", type=positive_int, default=5)
    p.add_argument("--profile", type=positive_int, default=3, metavar="STEPS", help="profiled steps per suite run")
    p.add_argument("--repeats", type=positive_int, default=1, help="suite and bare runs alternated R times each")
    p.add_argument("--device-kind", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--timeout", type=positive_int, default=300, help="seconds per run")
    return p


def calibrate_command(args, group: str) -> list[str]:
    workload, backends, flags = GROUPS[group]
    batch = {"mlm": args.batch_size, "lm": args.lm_batch_size, "cnn": args.cnn_batch_size}[workload]
    return [sys.executable, "-m", "bench.calibrate", "--gpus", "1", "--backends", ",".join(backends),
            "--workloads", workload, "--model-size", args.model_size, "--batch-size", str(batch),
            "--precision", "amp", "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
            "--profile", str(args.profile), "--repeats", str(args.repeats), "--data", "synthetic", "--skip-eval",
            "--device-kind", args.device_kind, "--timeout", str(args.timeout), "--out", args.out, *flags]


def group_of(record: dict) -> str:
    compiled = bool((record.get("config") or {}).get("compile")) and record["backend"] != "keras_jax"
    return f"{record['workload']}{'-compiled' if compiled else ''}"


def summary(records: list[dict]) -> list[dict]:
    """One row per ok suite run: its step, MFU, its samples/s over its framework's bare loop's (bench.calibrate's,
    BARE_OF's for a backend without one) and its step over torch_3d's in its group."""
    ok = [r for r in records if r.get("status") == "ok"]
    reference = {group_of(r): r["step_time_s"]["p50"] for r in ok if r["backend"] == REFERENCE}
    bare = {(group_of(r), r["backend"]): r["calibration"]["bare_samples_per_s"] for r in ok if r.get("calibration")}
    rows = []
    for r in sorted(ok, key=lambda r: (group_of(r), r["backend"])):
        step, group = r["step_time_s"]["p50"], group_of(r)
        loop = r["backend"] if (group, r["backend"]) in bare else BARE_OF.get(r["backend"])
        rows.append({"group": group, "backend": r["backend"], "run_id": r["run_id"], "step_s": step,
                     "samples_per_s": r["samples_per_s"], "mfu": r.get("mfu"), "bare_loop": loop,
                     "bare_ratio": r["samples_per_s"] / bare[group, loop] if (group, loop) in bare else None,
                     "step_over_torch_3d": step / reference[group] if group in reference else None,
                     "device": r.get("devices_description") or r.get("device_kind")})
    return rows


def with_clocks(rows: list[dict], records: list[dict], trace: list[tuple[float, float, float]]) -> list[dict]:
    """Each row with the median SM clock and power nvidia-smi sampled while its run ran (from its start for its
    duration), None where no sample fell inside."""
    spans = {r["run_id"]: (datetime.fromisoformat(r["started_at"]).timestamp(), r["duration_s"]) for r in records}
    out = []
    for row in rows:
        start, duration = spans[row["run_id"]]
        held = gpu_telemetry.during(trace, start, start + duration)
        out.append({**row, "sm_clock_mhz": held and held["sm_clock_mhz"], "power_w": held and held["power_w"]})
    return out


def markdown(rows: list[dict], failed: list[str], gpu: str | None = None) -> str:
    """gpu-check.md: the table, the groups that failed, and the GPU as nvidia-smi gives it (`gpu`, its CSV)."""
    def fmt(value, pattern):
        return "-" if value is None else pattern.format(value)
    lines = ["| group | backend | step (ms) | samples/s | MFU | suite / bare loop | step / torch_3d's | SM clock (MHz) "
             "| power (W) |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['group']} | {r['backend']} | {r['step_s'] * 1e3:,.1f} | {r['samples_per_s']:,.1f} | "
              f"{fmt(r['mfu'], '{:.1%}')} | {fmt(r['bare_ratio'], '{:.2f}')} | "
              f"{fmt(r['step_over_torch_3d'], '{:.2f}x')} | {fmt(r.get('sm_clock_mhz'), '{:,.0f}')} | "
              f"{fmt(r.get('power_w'), '{:,.0f}')} |" for r in rows]
    device = rows[0]["device"] if rows else "no run ok"
    told = ["```", gpu.strip(), "```"] if gpu else ["nvidia-smi: not on this machine (no clocks or power)"]
    return "\n".join([f"# bench.gpu_check on {device}", "", *lines, "",
                      *(f"- {group}: bench.calibrate failed (its log under the folder's logs/)" for group in failed),
                      "Attribution tables: report.md (bench.report).", "", *told]) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console, out = Console(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    smi = gpu_telemetry.state()
    if smi is not None:
        (out / "nvidia-smi.txt").write_text(smi)
    trace = out / "nvidia-smi-trace.csv"
    with gpu_telemetry.trace(trace) as tracing:
        for group in args.groups:
            console.print(f"gpu_check {group}: {' '.join(calibrate_command(args, group)[1:])}")
            # bench.calibrate bounds each run by --timeout and reaps it; this bound covers its own start and the report.
            runs = len(GROUPS[group][1]) * 2 * args.repeats
            done = subprocess.run(calibrate_command(args, group), timeout=runs * (args.timeout + 120))
            if done.returncode:
                failed.append(group)
    subprocess.run([sys.executable, "-m", "bench.report", "--results", str(out)], timeout=600)
    records = load_records(out)
    rows = with_clocks(summary(records), records, gpu_telemetry.samples(trace) if tracing else [])
    write_json_atomic(out / f"{SUMMARY}.json", {"rows": rows, "failed_groups": failed})
    text = markdown(rows, failed, smi)
    write_atomic(out / f"{SUMMARY}.md", text.encode())
    console.print(text)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
