"""python -m bench.layer_check --model NAME|FILE --hardware NAME|FILE [--part layer|head|optimizer] [--micro-batch B]

One decoder layer of a bench.predict model (or `--part` its head or optimizer step), built in torch as torchtitan
builds it (backends/torch_common/decoder_layer.py) and timed on this machine's device, beside what the compute
table predicts: the compute model checked where no published point separates compute from communication.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from bench.cli import console_table
from common.predict import decoder, stacks
from common.predict import hardware as hardware_files
from common.predict.gpu_compute import compute_for
from common.predict.kernels import Timer, head, one_layer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench.layer_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a bundled decoder (common/predict/models) or a TOML file")
    p.add_argument("--hardware", required=True, help="the hardware whose compute table predicts the layer")
    p.add_argument("--stack", default="torch-eager", choices=("torch-eager", "torch-compile"),
                   help="the software the layer runs as: torch eager, or through torch.compile (default: %(default)s)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, help="instead of the model's sequence length")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where torch sees one, else cpu")
    p.add_argument("--precision", choices=("bf16", "fp32"), help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--attention", help="the SDPA kernel the layer runs and the compute table's rates for it "
                   "(default: torch_flash on cuda, torch_math on cpu)")
    p.add_argument("--part", choices=("layer", "head", "optimizer"), default="layer",
                   help="one decoder layer, the final norm + output layer + loss, or the optimizer's step over "
                        "a shard (default: %(default)s)")
    p.add_argument("--shards", type=int, default=8,
                   help="--part optimizer: the FSDP degree whose 1/N of the parameters a rank updates")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                   help="activation recomputation: selective is torchtitan's op policy (default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="timed steps after one untimed (default: %(default)s)")
    p.add_argument("--json", help="write the measurement and the prediction here")
    return p


def compared(part: str, measured: dict, predicted: dict) -> list[tuple[str, float, float]]:
    """(name, measured s, predicted s) of each time a check of `part` holds to the model: its table's rows, its
    record's errors."""
    if part == "layer":
        m_fwd, m_bwd, p_fwd, p_bwd = measured["forward_s"], measured["backward_s"], predicted["fwd"], predicted["bwd"]
        return [("forward", m_fwd, p_fwd), ("backward", m_bwd, p_bwd), ("layer", m_fwd + m_bwd, p_fwd + p_bwd)]
    if part == "head":
        return [("head", measured["forward_s"] + measured["backward_s"], sum(predicted.values()))]
    return [("optimizer", measured["step_s"], predicted["optimizer"])]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        spec = decoder.load(args.model, args.seq_len)
        hardware = hardware_files.load(args.hardware)
        stack = stacks.load(args.stack)
        compute = compute_for(hardware)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    from backends.probes import load_probes

    probes = load_probes(args.device)
    cuda = probes.kind == "cuda"
    precision = args.precision or ("bf16" if cuda else "fp32")
    kernel = args.attention or ("torch_flash" if cuda else "torch_math")
    if kernel not in compute.attention:
        console.print(f"[red]--attention {kernel}: {compute.path} has no rates for it "
                      f"(has {', '.join(compute.attention) or 'none'})[/red]")
        return 2
    out = {"model": spec.name, "seq_len": spec.seq_len, "micro_batch": args.micro_batch, "stack": stack.name,
           "part": args.part, "recompute": args.recompute, "hardware": hardware.name, "compute_table": compute.path,
           "device": probes.device_name, "software": probes.software, "precision": precision,
           "sdpa_kernel": kernel}
    tokens = f"{args.micro_batch} x {spec.seq_len} tokens"
    if args.part == "layer":
        measured = probes.layers.time_layer(spec, probes.device, precision, args.micro_batch, kernel, args.steps,
                                            compile=stack.name == "torch-compile", recompute=args.recompute)
        # The model times the attention at the measured rates of the kernel the layer runs.
        predicted = one_layer(spec, replace(stack, attention_kernel=kernel), compute, hardware, args.micro_batch,
                              precision, args.recompute)
        title = f"one {spec.name} layer, {tokens}, SDPA {kernel}, recompute {args.recompute}"
        parts = {k: predicted[k] for k in ("gemm", "attention", "elementwise", "recompute")}
    elif args.part == "head":
        measured = probes.layers.time_head(spec, probes.device, precision, args.micro_batch, args.steps)
        parts = predicted = head(spec, 1, stack, Timer(compute, precision), args.micro_batch * spec.seq_len)
        title = f"{spec.name}'s final norm, output layer and loss, {tokens}"
    else:
        measured = probes.layers.time_optimizer(spec, probes.device, args.shards, args.steps)
        parts = predicted = {"optimizer": Timer(compute).optimizer(spec.param_count() / args.shards, stack)}
        title = (f"{spec.name}'s clipping and AdamW over 1/{args.shards} of its parameters "
                 f"({measured['elements'] / 1e6:,.0f} M elements)")
    rows = compared(args.part, measured, predicted)
    shards = {"shards": args.shards} if args.part == "optimizer" else {}
    out.update(measured=measured, predicted=predicted, **shards, error={name: p / m - 1 for name, m, p in rows})
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    cells = [(name, f"{m * 1e3:.3f}", f"{p * 1e3:.3f}", f"{p / m - 1:+.1%}") for name, m, p in rows]
    console.print(console_table(f"{title}, {out['device']} ({out['software']}, {stack.name}, {precision})",
                                ("", "measured (ms)", "predicted (ms)", "error"), cells))
    console.print("predicted parts (ms): " + ", ".join(f"{part} {v * 1e3:.3f}" for part, v in parts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
