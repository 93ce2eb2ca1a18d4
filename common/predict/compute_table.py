"""A device's compute table (hardware/compute/<name>.toml) written from bench.compute_table's measurement (JSON,
kept as the record beside it); SDPA attention is measured in the FlashAttention-3 paper's setting."""
from __future__ import annotations

import json

GRID = (256, 512, 1024, 2048, 4096, 8192, 16384)
ATTENTION_SEQS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
ATTENTION_TOKENS, ATTENTION_HEADS, ATTENTION_HEAD_DIM = 16384, 16, 128
COPY_BYTES = (64 << 20, 256 << 20, 1 << 30)


def _q(text: str) -> str:
    return json.dumps(text)  # a TOML basic string is a JSON string for the characters used here


def _rows(points: list[list[float]]) -> str:
    body = ",\n".join("  [" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in p) + "]"
                      for p in points)
    return "[\n" + body + ",\n]" if points else "[]"


def _sustained_note(run: dict | None) -> list[str]:
    if not run:
        return ["# Measured without a sustained load first (no --sustain-s): a long run's clocks may be lower."]
    shape = "x".join(map(str, run["shape"]))
    return [f"# Measured straight after {run['seconds']:g} s of one {run['precision']} {shape} GEMM back to back, at "
            "the clocks a long run holds: that GEMM",
            f"# ran at {run['first_tflops']:g} TFLOP/s in its first half second, {run['steady_tflops']:g} in its "
            f"last third (x{run['steady_over_first']:.3f})."]


def toml_text(measured: dict, name: str, record: str) -> str:
    """The compute table of a measurement; `record` names the JSON it was written from (each section's source)."""
    where = f"parbench's probe (python -m bench.compute_table), {measured['device']}, {measured['software']}, " \
            f"{measured['date']}: {record}"
    launch = measured["launch_us"]
    floor, how = (launch["graph"], "from a CUDA graph") if launch.get("graph") else (launch["eager"], "from Python")
    attention_what = f"SDPA causal, {ATTENTION_TOKENS} tokens, {ATTENTION_HEADS} heads of {ATTENTION_HEAD_DIM}"
    lines = [f"# How fast {measured['device']} computes, measured by parbench (python -m bench.compute_table);",
             "# bench.predict's first-principles compute (common/predict/gpu_compute.py) reads it.",
             *_sustained_note(measured.get("sustained")),
             f"name = {_q(name)}", f"device = {_q(measured['device'])}", "",
             f"launch_floor_us = {floor:.3g}",
             f"launch_floor_source = {_q(f'{where}: back-to-back one-element adds {how}')}",
             f"eager_launch_us = {launch['eager']:.3g}   # the same adds issued one by one from Python", ""]
    if measured.get("copy_GBps"):
        largest = max(measured["copy_GBps"], key=int)
        copy = f"{where}: a {int(largest) >> 20} MiB device-to-device copy, bytes read and written"
        lines += ["[memory]", f"GBps = {measured['copy_GBps'][largest]:.4g}", f"source = {_q(copy)}", ""]
    for precision, table in measured["matmul"].items():
        lines += [f"[matmul.{precision}]",
                  f"source = {_q(where + ': C[m, n] = A[m, k] B[k, n], row-major operands, median of 5 batches')}",
                  f"points = {_rows(table['grid'])}"]
        if table.get("shapes"):
            lines.append(f"shapes = {_rows(table['shapes'])}")
        lines.append("")
    for kernel, rates in measured["attention"].items():
        lines += [f"[attention.{kernel}]",
                  f"source = {_q(where + ': ' + attention_what)}",
                  f"forward_causal = {json.dumps(rates['forward_causal'])}",
                  f"backward = {json.dumps(rates['backward'])}", ""]
    return "\n".join(lines)
