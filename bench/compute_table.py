"""python -m bench.compute_table --json FILE [--toml FILE --name NAME] [--device cuda|cpu] [--precisions bf16,fp8]

Measures one device's compute table for bench.predict's first-principles model (common/predict/gpu_compute.py;
docs/prediction-at-scale.md, "Measured on a lent H100"), as JSON and, with --toml, as the table. Takes a few
minutes on a GPU; on a CPU the same code runs on small sizes (the tests).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from itertools import product
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.cli import console_table
from common.predict import compute_table as table_format


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def _names(text: str) -> tuple[str, ...]:
    return tuple(v for v in text.split(",") if v)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench.compute_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True, help="the measurement, written as JSON")
    p.add_argument("--toml", help="also write the compute table (hardware/compute/NAME.toml's format)")
    p.add_argument("--name", default="measured", help="the compute table's name (default: %(default)s)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where torch sees one, else cpu")
    p.add_argument("--precisions", type=_names, help="matmul precisions (bf16, fp16, fp32, fp8); "
                   "default bf16,fp8 on cuda, fp32 on cpu")
    p.add_argument("--grid", type=_ints, default=table_format.GRID,
                   help="each of m, n, k over these (default: 256 ... 16384)")
    p.add_argument("--published-shapes", action=argparse.BooleanOptionalAction,
                   help="also the exact GEMM shapes of bench.predict --published's points (default: on cuda)")
    p.add_argument("--attention", type=_names, help="SDPA kernels: torch_flash, torch_cudnn, torch_efficient, "
                   "torch_math (default: torch_flash,torch_cudnn on cuda, torch_math on cpu)")
    p.add_argument("--attention-seqs", type=_ints, default=table_format.ATTENTION_SEQS, help="default: 512 ... 32768")
    p.add_argument("--attention-tokens", type=int, default=table_format.ATTENTION_TOKENS)
    p.add_argument("--attention-heads", type=int, default=table_format.ATTENTION_HEADS)
    p.add_argument("--copy-bytes", type=_ints, default=table_format.COPY_BYTES)
    p.add_argument("--target-ms", type=float, default=2.0, help="each timed batch lasts about this long")
    p.add_argument("--sustain-s", type=float, default=0.0,
                   help="first run one bf16 GEMM back to back this long, its rate sampled every half second, so "
                   "that the table after it is measured at the clocks a long run holds (default: 0, off)")
    p.add_argument("--sustain-shape", type=_ints, default=(8192, 8192, 8192), help="m,n,k of that GEMM "
                   "(default: 8192,8192,8192)")
    return p


def measure(args, console: Console) -> dict:
    from backends.probes import load_probes
    from common.predict.published import gemm_shapes

    probes = load_probes(args.device)
    probe, device, cuda = probes.rates, probes.device, probes.kind == "cuda"
    precisions = args.precisions or (("bf16", "fp8") if cuda else ("fp32",))
    kernels = args.attention or (("torch_flash", "torch_cudnn") if cuda else ("torch_math",))
    target = args.target_ms / 1e3
    # The sustained run goes first: what follows it is measured at the clocks it leaves.
    run = sustained(probe, device, "bf16" if cuda else "fp32", args.sustain_shape, args.sustain_s) \
        if args.sustain_s > 0 else None
    out = {"device": probes.device_name, "device_kind": probes.kind, "software": probes.software,
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
           "launch_us": probe.launch_us(device),
           "copy_GBps": {str(nbytes): probe.copy_GBps(device, nbytes, target) for nbytes in args.copy_bytes},
           "matmul": {}, "attention": {}, "failed": {}, **({"sustained": run} if run else {})}
    exact = gemm_shapes() if (cuda if args.published_shapes is None else args.published_shapes) else []
    for precision in precisions:
        table = {"grid": [], "shapes": []}
        try:
            for part, shapes in (("grid", list(product(args.grid, repeat=3))), ("shapes", exact)):
                rates = probe.gemm_tflops(device, precision, list(shapes), target)
                table[part] = [[m, n, k, _sig(rate)] for (m, n, k), rate in zip(shapes, rates)]
            out["matmul"][precision] = table
        except Exception as exc:  # noqa: BLE001 - a precision the device lacks (fp8 before Hopper) is noted, not fatal
            out["failed"][f"matmul.{precision}"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        console.print(f"matmul {precision}: {len(table['grid'])} grid shapes, {len(table['shapes'])} exact")
    for kernel in kernels:
        try:
            rates = [(seq, *probe.attention_tflops(device, kernel, "bf16" if cuda else "fp32", seq,
                                                   args.attention_tokens, args.attention_heads,
                                                   table_format.ATTENTION_HEAD_DIM, target))
                     for seq in args.attention_seqs]
            out["attention"][kernel] = {"forward_causal": [[seq, _sig(fwd)] for seq, fwd, _ in rates],
                                        "backward": [[seq, _sig(bwd)] for seq, _, bwd in rates]}
        except Exception as exc:  # noqa: BLE001 - a kernel this torch or device cannot run is noted, not fatal
            out["failed"][f"attention.{kernel}"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return out


def sustained(probe, device, precision: str, shape: tuple[int, ...], seconds: float) -> dict:
    """One GEMM's rate over a long run: its first half second against the median of its last third."""
    series = probe.sustained_gemm(device, precision, *shape, seconds, 0.5)
    steady = statistics.median(r for _, r in series[-max(1, len(series) // 3):])
    return {"precision": precision, "shape": list(shape), "seconds": seconds, "first_tflops": _sig(series[0][1]),
            "steady_tflops": _sig(steady), "steady_over_first": round(steady / series[0][1], 4),
            "series": [[t, _sig(r)] for t, r in series]}


def summary(measured: dict) -> Table:
    launch = measured["launch_us"]
    rows = [("shortest kernel from Python (us)", f"{launch['eager']:.2f}")]
    if launch.get("graph"):
        rows.append(("shortest kernel from a CUDA graph (us)", f"{launch['graph']:.2f}"))
    for nbytes, rate in measured["copy_GBps"].items():
        rows.append((f"copy {int(nbytes) >> 20} MiB (GB/s, read + written)", f"{rate:,.0f}"))
    if "sustained" in measured:
        run = measured["sustained"]
        rows.append((f"matmul {run['precision']} {'x'.join(map(str, run['shape']))} run {run['seconds']:g} s: first "
                     "half second / last third (TFLOP/s)", f"{run['first_tflops']:,.1f} / {run['steady_tflops']:,.1f} "
                     f"(x{run['steady_over_first']:.3f})"))
    for precision, table in measured["matmul"].items():
        best = max(table["grid"], key=lambda r: r[3])
        rows.append((f"matmul {precision}: best of the grid (TFLOP/s)",
                     f"{best[3]:,.1f} at {best[0]}x{best[1]}x{best[2]}"))
        if table["shapes"]:
            rates = sorted(r[3] for r in table["shapes"])
            rows.append((f"matmul {precision}: published points' {len(rates)} shapes (TFLOP/s, min / median / max)",
                         f"{rates[0]:,.0f} / {rates[len(rates) // 2]:,.0f} / {rates[-1]:,.0f}"))
    for kernel, rates in measured["attention"].items():
        fwd = ", ".join(f"{s}: {r:.0f}" for s, r in rates["forward_causal"])
        rows.append((f"attention {kernel} forward (TFLOP/s by sequence)", fwd))
    rows += [(f"failed: {what}", why) for what, why in measured["failed"].items()]
    return console_table(f"{measured['device']} ({measured['software']})", ("what", "measured"), rows)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.sustain_shape) != 3:
        parser.error(f"--sustain-shape takes m,n,k, got {','.join(map(str, args.sustain_shape))}")
    console = Console()
    started = time.perf_counter()
    measured = measure(args, console)
    measured["seconds"] = round(time.perf_counter() - started, 1)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(measured, indent=1) + "\n")
    if args.toml:
        Path(args.toml).write_text(table_format.toml_text(measured, args.name, Path(args.json).name))
    console.print(summary(measured))
    console.print(f"measured in {measured['seconds']} s: {args.json}" + (f", {args.toml}" if args.toml else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
