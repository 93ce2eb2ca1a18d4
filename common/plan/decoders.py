"""bench.plan --model: which layout to train a decoder LLM with on a GPU cluster, from the step model and a device's
compute table, without a run: every layout of common.layout's grammar within a cluster's practice (tp and cp
within a node, each bound below a constant), validated, refused by the stack where it does not run it,
predicted, held against memory and ranked (common.plan.rank). docs/plan.md, "Decoder LLMs on GPU clusters"."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import product

from common.errors import BadInput
from common.layout import Layout
from common.plan.fit import GIB, verdict
from common.plan.rank import Ranked, explain, rank
from common.predict import decoder, stacks
from common.predict import hardware as hardware_files
from common.predict import published as published_points
from common.predict.basis import Basis
from common.predict.decoder import DecoderSpec
from common.predict.gpu_compute import DeviceCompute
from common.predict.hardware import Hardware
from common.predict.kernels import compute_label, device_compute
from common.predict.stacks import Stack
from common.predict.step import predict

MAX_MBS = 16
MAX_VIRTUAL = 8


@dataclass
class DecoderSpace:
    candidates: int = 0
    refused: dict[str, int] = field(default_factory=dict)   # reason -> count


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int, divides: int) -> list[int]:
    return [b for b in (1 << k for k in range(MAX_MBS.bit_length())) if b <= limit and divides % b == 0]


def candidates(spec: DecoderSpec, devices: int, global_batch: int, stack: Stack, devices_per_node: int
               ) -> Iterator[Layout]:
    """Every layout of the space (module doc), before validation."""
    node = _divisors(min(devices_per_node, devices))
    for tp, cp in product(node, node):
        if devices % (tp * cp):
            continue
        for pp in (p for p in _divisors(devices // (tp * cp)) if p <= spec.layers):
            data = devices // (tp * cp * pp)
            if data == 0 or global_batch % data:
                continue
            schedules = [("gpipe", 1), ("1f1b", 1)] if pp > 1 else [("gpipe", 1)]
            schedules += [("interleaved", v) for v in range(2, MAX_VIRTUAL + 1)
                          if pp > 1 and spec.layers % (pp * v) == 0]
            on_off = (False, True) if tp > 1 else (False,)
            overlap = on_off if stack.tp_overlap_split else (False,)
            for fsdp, mbs, (schedule, virtual), recompute, sp, vocab, tpo in product(
                    _divisors(data), _powers_of_two(MAX_MBS, global_batch // data), schedules,
                    ("none", "selective", "full"), on_off, on_off, overlap):
                for zero1 in ((False, True) if fsdp == 1 and data > 1 else (False,)):
                    yield Layout(dp=data // fsdp, fsdp=fsdp, tp=tp, pp=pp, cp=cp, micro_batch_size=mbs,
                                 schedule=schedule, virtual_stages=virtual, recompute=recompute, sp=sp, zero1=zero1,
                                 tp_overlap=tpo, vocab_split=vocab)


def plan(spec: DecoderSpec, devices: int, global_batch: int, hardware: Hardware, stack: Stack,
         compute: DeviceCompute | Basis, available: float) -> tuple[list[Ranked], DecoderSpace]:
    """Every candidate predicted; those that fit `available` bytes ranked (common.plan.rank), the rest after."""
    space, rows = DecoderSpace(), []
    for layout in candidates(spec, devices, global_batch, stack, hardware.devices_per_node):
        space.candidates += 1
        try:
            layout.validate(spec, global_batch)
            stack.check(layout)
        except (BadInput, ValueError) as exc:
            why = str(exc).split(": ", 1)[-1]
            space.refused[why] = space.refused.get(why, 0) + 1
            continue
        rows.append(plan_one(spec, layout, global_batch, hardware, stack, compute, available))
    return rank(rows, None), space


def rank_of(rows: list[Ranked], layout: Layout) -> Ranked | None:
    """The row of `layout` among a plan's rows (None: not in the space)."""
    return next((r for r in rows if r.layout == layout), None)


def plan_one(spec: DecoderSpec, layout: Layout, global_batch: int, hardware: Hardware, stack: Stack,
             compute: DeviceCompute | Basis, available: float) -> Ranked:
    """One layout predicted and held against the memory, unranked."""
    p = predict(spec, layout, global_batch, hardware, compute, stack=stack)
    return Ranked(layout, p, p.memory_max, verdict(p.memory_max, available, None))


def standing(rows: list[Ranked], row: Ranked) -> Ranked:
    """Where a layout outside the space would rank among the plan's rows (0: it does not fit)."""
    if row.fit != "does not fit":
        row.rank = 1 + sum(1 for r in rows if r.rank and r.step_s < row.step_s)
    return row


def decoder_plan(model: str, devices: int, batch: int, hardware_name: str, stack_name: str, seq_len: int | None,
                 memory_gib: float | None, mfu: float | None, top: int, asked: str | None = None) -> dict:
    """The plan document of a decoder on `devices` GPUs: the top rows, the counts, and the asked layout's row."""
    hardware, stack = hardware_files.load(hardware_name), stacks.load(stack_name)
    spec = decoder.load(model)
    spec = replace(spec, seq_len=seq_len) if seq_len else spec
    compute = device_compute(hardware, mfu)
    layout = None
    if asked:   # what no plan can change is refused before the search
        layout = Layout.parse(asked, devices)
        layout.validate(spec, batch)
        stack.check(layout)
    available = memory_gib * GIB if memory_gib else hardware.memory_bytes
    rows, space = plan(spec, devices, batch, hardware, stack, compute, available)
    ranked = [r for r in rows if r.rank]
    pick = ranked[0] if ranked else None
    explained = [(r, explain(r, pick, None, ranked[i - 1] if i else None)) for i, r in enumerate(ranked[:top])]
    c = {"enumerated": space.candidates, "valid": len(rows), "fit": len(ranked), "refused": space.refused}
    refused = sorted(space.refused.items(), key=lambda kv: -kv[1])[:3]
    summary = [f"space: {c['enumerated']:,} layouts enumerated, {c['valid']:,} valid for the model and batch, "
               f"{c['fit']:,} predicted to fit {available / GIB:,.1f} GiB per device (a point comparison: the "
               "decoders' memory model is checked against no measurement); refused: "
               + ("; ".join(f"{n:,} x {why}" for why, n in refused) or "none"),
               f"pick: {pick.layout.name}" if pick else "no layout is predicted to fit"]
    doc = {"title": f"{spec.name} on {devices} x {hardware.name} ({stack.name}), global batch {batch}, sequence "
                    f"{spec.seq_len}", "model": spec.name, "devices": devices, "hardware": hardware.name,
           "stack": stack.name, "global_batch": batch, "seq_len": spec.seq_len, "available_bytes": available,
           "basis": compute_label(compute), "candidates": c, "summary": summary,
           "pick": pick.layout.name if pick else None,
           "rows": [_decoder_row(r, text) for r, text in explained]}
    if layout is not None:
        row = rank_of(rows, layout) or standing(rows, plan_one(
            spec, layout, batch, hardware, stack, compute, available))
        doc["asked"] = _decoder_row(row, explain(row, pick, None) if pick and row.rank else "")
    return doc


def _decoder_row(r: Ranked, explanation: str) -> dict:
    return {"rank": r.rank, "layout": r.layout.name, "step_s": r.step_s,
            "tokens_per_s_per_device": r.prediction.tokens_per_s / r.prediction.devices,
            "memory_per_rank_max": r.memory, "fit": r.fit, "parts_s": r.parts, "explanation": explanation}


def published_ranking(points: list | None = None) -> dict:
    """Each published point the model predicts (all of them, or `points`): where its publisher's layout ranks in the
    plan for the same model, devices, batch, hardware and stack, and how much faster the plan predicts its pick."""
    out = []
    for point in published_points.all_points() if points is None else points:
        try:
            Layout.parse(point.layout, point.devices)
        except ValueError:
            continue   # refused by the model (fp8): --published says why
        plan = decoder_plan(point.model, point.devices, point.global_batch, point.hardware, point.stack,
                            point.seq_len, None, None, 1, point.layout)
        asked, pick = plan["asked"], plan["rows"][0] if plan["rows"] else None
        out.append({"point": point.name, "published_layout": asked["layout"], "rank": asked["rank"],
                    "fit": asked["fit"], "fitting": plan["candidates"]["fit"], "pick": pick and pick["layout"],
                    "pick_faster": pick and asked["step_s"] / pick["step_s"] - 1,
                    "published_memory_gib": asked["memory_per_rank_max"] / GIB})
    return {"points": out}
