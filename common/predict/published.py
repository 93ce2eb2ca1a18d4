"""Published training results as checked data (published/*.toml, format in its README), and bench.predict's
predictions of them, each figure counted as its publisher counts it (docs/prediction-at-scale.md)."""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from common.layout import Layout
from common.predict import decoder, stacks
from common.predict import hardware as hardware_files
from common.predict.compute_table import toml_text
from common.predict.gpu_compute import DeviceCompute, arguments_of, compute_for, table_from
from common.predict.hardware import Hardware, tomllib
from common.predict.step import predict
from common.stats import spearman

PUBLISHED_DIR = Path(__file__).parent / "published"
REFERENCE_DIR = Path(__file__).resolve().parents[2] / "results" / "reference"   # a checkout's committed records
METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")
MEGATRON_PEAK = 989.5e12     # H100 SXM dense bf16 (common.peak_flops): Megatron's MFU is of it (408.8 / 989.5 = 41%)
ORDER_MARGIN = 0.10
FLOP_COUNTS = ("megatron", "megatron-2021")   # the publishers' own FLOP counts metric_of knows (`flops`)
GENERATION = re.compile(r"\b([A-Z]\d{3})\b")   # a device name's part number: A100, H100, H200, B200


@dataclass(frozen=True)
class Point:
    name: str
    model: str
    devices: int
    layout: str
    global_batch: int
    metric: str
    published: float
    quote: str
    hardware: str
    stack: str
    flops: str
    source: str
    seq_len: int | None = None
    assumed: str = ""


def load(path: Path) -> list[Point]:
    raw = tomllib.loads(path.read_text())
    src = raw["source"]
    where = f"{src['publisher']}: {src['where']}"
    points = []
    for p in raw["point"]:
        if p["metric"] not in METRICS:
            raise ValueError(f"{path}: {p['name']}: metric {p['metric']!r} is not one of {', '.join(METRICS)}")
        points.append(Point(name=p["name"], model=p["model"], devices=int(p["devices"]), layout=p["layout"],
                            global_batch=int(p["global_batch"]), metric=p["metric"], published=float(p["published"]),
                            quote=p["quote"], hardware=p.get("hardware", src["hardware"]),
                            stack=p.get("stack", src["stack"]), flops=p.get("flops", src.get("flops", "")),
                            source=where, seq_len=p.get("seq_len"), assumed=p.get("assumed", "")))
    return points


def all_points() -> list[Point]:
    return [p for path in sorted(PUBLISHED_DIR.glob("*.toml")) for p in load(path)]


def megatron_flops(spec: decoder.DecoderSpec, batch: int) -> float:
    """FLOPs of one step as Megatron counts them (training.py num_floating_point_operations, core_r0.8.0)."""
    s, h, L = spec.seq_len, spec.hidden, spec.layers
    gated = 1.5 if spec.ffn_kind == "swiglu" else 1.0
    return 12.0 * batch * s * L * h * h * ((1 + spec.kv_heads / spec.heads + s / h) * spec.q_width / h
                                           + spec.ffn / h * gated + spec.vocab / (2 * L * h))


def megatron_2021_flops(spec: decoder.DecoderSpec, batch: int, recomputed: bool) -> float:
    """FLOPs of one step as Narayanan et al. 2021 count them (their Equation 3, written out in bigscience-workshop/
    Megatron-DeepSpeed megatron/training.py since ae6277f5, as BLOOM's logs count): 24 c B s l h^2 (1 + s/(6h) +
    V/(16 l h)), c = 4 with activation recomputation (the forward again) else 3; 32 instead of 24 for a GLU."""
    s, h, L = spec.seq_len, spec.hidden, spec.layers
    coefficient = 32 if spec.ffn_kind == "swiglu" else 24
    return (coefficient * (4 if recomputed else 3) * batch * s * L * h * h
            * (1 + s / (6 * h) + spec.vocab / (16 * L * h)))


def metric_of(point: Point, spec: decoder.DecoderSpec, step_s: float) -> float:
    """The point's figure had its step taken `step_s` seconds, counted as its publisher counts."""
    if point.metric == "tokens_per_s_per_gpu":
        return point.global_batch * spec.seq_len / step_s / point.devices
    if point.flops not in FLOP_COUNTS:
        raise ValueError(f"{point.name}: {point.metric} needs the publisher's FLOP formula "
                         f"(flops = {' or '.join(map(repr, FLOP_COUNTS))})")
    if point.flops == "megatron":
        flops = megatron_flops(spec, point.global_batch)
    else:
        recomputed = Layout.parse(point.layout, point.devices).recompute == "full"
        flops = megatron_2021_flops(spec, point.global_batch, recomputed)
    per_gpu = flops / step_s / point.devices
    return per_gpu / 1e12 if point.metric == "tflops_per_gpu" else per_gpu / MEGATRON_PEAK


def generation(hardware: str) -> str:
    """The GPU generation of a hardware description's device ("A100", "H100"), read off its device name; the
    description's name where the device name has no part number (a CPU)."""
    hw = hardware_files.load(hardware)
    found = GENERATION.search(hw.device_name)
    return found.group(1) if found else hw.name


def refusal(point: Point, compute_of=compute_for) -> str:
    """Why the model cannot predict `point`, every reason in one line ("" where it can): a layout the grammar
    refuses, a stack not described in common.predict.stacks or one that does not run the layout, a device without
    a compute table or whose table has no rate of the stack's attention kernel, a FLOP count its publisher does not
    give."""
    why, layout = [], None
    try:
        layout = Layout.parse(point.layout, point.devices)
    except ValueError as exc:
        why.append(str(exc))
    if point.stack not in stacks.STACKS:
        why.append(f"stack {point.stack!r} is not described (common/predict/stacks.py describes "
                   f"{', '.join(stacks.STACKS)})")
    elif layout is not None:
        try:
            stacks.load(point.stack).check(layout)
        except ValueError as exc:
            why.append(str(exc))
    try:
        compute = compute_of(hardware_files.load(point.hardware))
    except ValueError as exc:
        why.append(str(exc).split(" (")[0])   # what follows is the command line's advice
    else:
        kernel = stacks.STACKS[point.stack].attention_kernel if point.stack in stacks.STACKS else None
        if kernel is not None and kernel not in compute.attention:
            why.append(f"{compute.name}: no rate of the attention kernel {point.stack} runs ({kernel!r}; the table "
                       f"has {', '.join(compute.attention)})")
    if point.metric != "tokens_per_s_per_gpu" and point.flops not in FLOP_COUNTS:
        why.append(f"{point.metric}: its publisher's FLOP count is not known (flops = {point.flops!r})")
    return "; ".join(why)


def predict_point(point: Point, compute_of=compute_for) -> dict:
    """One row: the point (with its GPU generation and publisher), the prediction of its figure, the error, and the
    step's parts; `refused` instead, in one line, where the model cannot predict it (refusal(), or the step model's
    own refusal). `compute_of(hardware)` gives the device's compute (its table)."""
    row = {"name": point.name, "source": point.source, "metric": point.metric, "published": point.published,
           "model": point.model, "devices": point.devices, "layout": point.layout, "hardware": point.hardware,
           "stack": point.stack, "global_batch": point.global_batch, "quote": point.quote, "assumed": point.assumed,
           "generation": generation(point.hardware), "publisher": point.source.split(": ", 1)[0]}
    spec = decoder.load(point.model, point.seq_len)
    refused = refusal(point, compute_of)
    if not refused:
        layout, hardware = Layout.parse(point.layout, point.devices), hardware_files.load(point.hardware)
        try:
            p = predict(spec, layout, point.global_batch, hardware, compute_of(hardware),
                        stack=stacks.load(point.stack))
        except ValueError as exc:   # what the step model itself refuses
            refused = str(exc)
    if refused:
        return {**row, "predicted": None, "error": None, "refused": refused}
    predicted = metric_of(point, spec, p.step_s)
    return {**row, "layout_full": layout.name, "predicted": predicted, "error": predicted / point.published - 1,
            "step_s": p.step_s, "parts_s": p.parts_s, "memory_per_rank": p.memory_max}


def gemm_shapes(points: list[Point] | None = None) -> list[tuple[int, int, int]]:
    """Every (m, n, k) the predictions of the points time, sorted: the shapes a device's probe measures exactly
    (bench.compute_table), so that no published point's GEMM is read off the grid by interpolation."""
    shapes: set[tuple[int, int, int]] = set()

    class Recording(DeviceCompute):
        def gemm_s(self, gemm, precision="bf16"):
            shapes.add((gemm.m, gemm.n, gemm.k))
            return super().gemm_s(gemm, precision)

    def recording(hardware: Hardware) -> Recording:
        return Recording(**arguments_of(compute_for(hardware)))

    for p in points if points is not None else all_points():
        predict_point(p, recording)
    return sorted(s for s in shapes if min(s) > 0)


def rankings(rows: list[dict]) -> list[dict]:
    """Per group of predicted points on one model, hardware and device count: Spearman of predicted against
    published, and whether each pair whose published figures differ by more than ORDER_MARGIN is ordered alike."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("predicted") is not None:
            groups.setdefault((r["model"], r["hardware"], r["devices"], r["metric"]), []).append(r)
    out = []
    for (model, hw, devices, _metric), members in groups.items():
        if len(members) < 2:
            continue
        pairs = [{"a": a["name"], "b": b["name"], "apart": abs(a["published"] / b["published"] - 1) > ORDER_MARGIN,
                  "agrees": (a["published"] - b["published"]) * (a["predicted"] - b["predicted"]) > 0}
                 for a, b in combinations(members, 2)]
        out.append({"model": model, "hardware": hw, "devices": devices, "points": [m["name"] for m in members],
                    "spearman": spearman([m["predicted"] for m in members], [m["published"] for m in members]),
                    "pairs": pairs, "order_holds": all(p["agrees"] for p in pairs if p["apart"])})
    return out


def measured_tables(hardware: Hardware, reference: Path = REFERENCE_DIR) -> dict[str, DeviceCompute]:
    """Every compute table measured of the part `hardware`'s table describes (bench.compute_table's records under
    `reference`/*/compute/ with bf16 GEMMs), by record: the bundled table with what the record measured in its
    place (the published rates it holds beside, e.g. the cuDNN attention Megatron's stack takes, stay)."""
    bundled = compute_for(hardware)
    raw = tomllib.loads(Path(bundled.path).read_text())
    tables = {}
    for path in sorted(reference.glob("*/compute/*.json")):
        measured = json.loads(path.read_text())
        if measured.get("device") == raw.get("device") and "bf16" in (measured.get("matmul") or {}):
            label = path.relative_to(reference).as_posix()
            again = tomllib.loads(toml_text(measured, bundled.name, label))
            merged = {**raw, **again, "matmul": {**raw.get("matmul", {}), **again.get("matmul", {})},
                      "attention": {**raw.get("attention", {}), **again.get("attention", {})}}
            tables[label] = table_from(merged, hardware, label)
    return tables


def error_line(result: dict) -> str:
    """check()'s errors in one line, on the bundled tables and on the worst table measured of each point's part."""
    return (f"median |error| {result['median_abs_error']:.1%}, largest {result['max_abs_error']:.1%} on the bundled "
            f"tables; each point's worst over every table measured of its part: median "
            f"{result['worst_median_abs_error']:.1%}, largest {result['worst_max_abs_error']:.1%}")


def check(points: list[Point] | None = None, reference: Path = REFERENCE_DIR) -> dict:
    """Every published point predicted, from its hardware's bundled table and again from every table measured of
    the same part (`worst_error`: the largest |error| of them), and the errors by GPU generation and by publisher
    (`groups`): the JSON bench.predict --published writes."""
    points = all_points() if points is None else points
    rows = [predict_point(p) for p in points]
    predicted = [(point, row) for point, row in zip(points, rows) if row["error"] is not None]
    tables = {hw: measured_tables(hardware_files.load(hw), reference)
              for hw in dict.fromkeys(point.hardware for point, _ in predicted)}
    for point, row in predicted:
        row["error_by_table"] = {label: predict_point(point, lambda _hw, t=table: t)["error"]
                                 for label, table in tables[point.hardware].items()}
        row["worst_error"] = max([row["error"], *row["error_by_table"].values()], key=abs)
    return {"points": rows, **error_summary(rows), "tables": {hw: sorted(t) for hw, t in tables.items()},
            "rankings": rankings(rows), "groups": groups(rows)}


def error_summary(rows: list[dict]) -> dict:
    """How many of `rows` are predicted and refused, and the median and largest |error| of the predicted: on the
    bundled tables, and each point's worst over every table measured of its part (`worst_error` where known)."""
    errors = [abs(r["error"]) for r in rows if r.get("error") is not None]
    worst = [abs(r.get("worst_error", r["error"])) for r in rows if r.get("error") is not None]
    return {"median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "worst_median_abs_error": statistics.median(worst) if worst else None,
            "worst_max_abs_error": max(worst) if worst else None,
            "predicted": len(errors), "refused": sum(1 for r in rows if r.get("refused"))}


def groups(rows: list[dict]) -> list[dict]:
    """The rows by GPU generation, then by publisher (each in sorted order): each group's error_summary."""
    return [{"by": by, "group": key, **error_summary([r for r in rows if r[by] == key])}
            for by in ("generation", "publisher") for key in sorted({r[by] for r in rows})]
