"""bench.plan --model: which layout to train a decoder LLM with on a GPU cluster, from the step model and a device's
compute table, without a run (docs/plan.md, "Decoder LLMs on GPU clusters")."""
from __future__ import annotations

from collections.abc import Iterator
from itertools import product

from common.errors import BadInput
from common.layout import Layout
from common.plan.fit import GIB, memory_limit
from common.plan.rank import Ranked, document, explain, predicted, rank, row
from common.plan.space import Space, divisors
from common.predict import decoder, stacks
from common.predict import hardware as hardware_files
from common.predict import published as published_points
from common.predict.basis import Basis
from common.predict.decoder import DecoderSpec
from common.predict.gpu_compute import DeviceCompute
from common.predict.hardware import Hardware
from common.predict.kernels import compute_label, device_compute
from common.predict.stacks import Stack

MAX_MBS = 16
MAX_VIRTUAL = 8


def candidates(spec: DecoderSpec, devices: int, global_batch: int, stack: Stack, devices_per_node: int
               ) -> Iterator[Layout]:
    """Every layout of common.layout's grammar within a cluster's practice (tp and cp within a node, each bound
    below a constant), before validation and the stack's refusals."""
    node = divisors(min(devices_per_node, devices))
    for tp, cp in product(node, node):
        if devices % (tp * cp):
            continue
        for pp in (p for p in divisors(devices // (tp * cp)) if p <= spec.layers):
            data = devices // (tp * cp * pp)
            if data == 0 or global_batch % data:
                continue
            schedules = [("gpipe", 1), ("1f1b", 1)] if pp > 1 else [("gpipe", 1)]
            schedules += [("interleaved", v) for v in range(2, MAX_VIRTUAL + 1)
                          if pp > 1 and spec.layers % (pp * v) == 0]
            on_off = (False, True) if tp > 1 else (False,)
            overlap = on_off if stack.tp_overlap_split else (False,)
            sizes = [b for b in (1 << k for k in range(MAX_MBS.bit_length())) if global_batch // data % b == 0]
            for fsdp, mbs, (schedule, virtual), recompute, sp, vocab, tpo in product(
                    divisors(data), sizes, schedules, ("none", "selective", "full"), on_off, on_off, overlap):
                # the data ranks' state: replicated, its optimizer sharded (ZeRO-1), or FSDP's (ZeRO-3, ZeRO-2)
                zeros = [(False, False), (True, False)] if fsdp == 1 and data > 1 else \
                    [(False, False), (False, True)] if fsdp > 1 else [(False, False)]
                for zero1, zero2 in zeros:
                    yield Layout(dp=data // fsdp, fsdp=fsdp, tp=tp, pp=pp, cp=cp, micro_batch_size=mbs,
                                 schedule=schedule, virtual_stages=virtual, recompute=recompute, sp=sp, zero1=zero1,
                                 zero2=zero2, tp_overlap=tpo, vocab_split=vocab)


def plan(spec: DecoderSpec, devices: int, global_batch: int, hardware: Hardware, stack: Stack,
         compute: DeviceCompute | Basis, available: float) -> tuple[list[Ranked], Space]:
    """Every candidate the model and the stack take, predicted; those that fit `available` bytes ranked."""
    space = Space()
    for candidate in candidates(spec, devices, global_batch, stack, devices_per_node=hardware.devices_per_node):
        try:
            candidate.validate(spec, global_batch)
        except BadInput as exc:
            space.refuse(str(exc).split(": ", 1)[-1])
            continue
        why = stack.refusal(candidate)   # the reason alone: most candidates a stack refuses are never named
        if why:
            space.refuse(why)
        else:
            space.valid.append(candidate)
    return rank(predicted(spec, space.valid, global_batch, hardware, compute, available, None, stack=stack),
                None), space


def decoder_plan(model: str, devices: int, batch: int, hardware_name: str, stack_name: str, seq_len: int | None,
                 memory_gib: float | None, mfu: float | None, top: int, asked: str | None = None) -> dict:
    """The plan document of a decoder on `devices` GPUs (common.plan.rank.document): its top rows, and where the
    `asked` layout stands among them."""
    hardware, stack = hardware_files.load(hardware_name), stacks.load(stack_name)
    spec = decoder.load(model, seq_len)
    compute = device_compute(hardware, mfu)
    layout = None
    if asked:   # what no plan can change is refused before the search
        layout = Layout.parse(asked, devices)
        layout.validate(spec, batch)
        stack.check(layout)
    available, limit = memory_limit(hardware, memory_gib)
    rows, space = plan(spec, devices, batch, hardware, stack, compute, available)
    doc = document(f"{spec.name} on {devices} x {hardware.name} ({stack.name}), global batch {batch}, sequence "
                   f"{spec.seq_len}", {"model": spec.name, "devices": devices, "hardware": hardware.name,
                                       "stack": stack.name, "global_batch": batch, "seq_len": spec.seq_len},
                   rows, space, compute_label(compute), available, limit, None, None, top)
    if layout is not None:
        ranked = [r for r in rows if r.rank]
        found = next((r for r in rows if r.layout == layout), None)
        if found is None:   # outside the space: where it would rank (0: it does not fit)
            found = predicted(spec, [layout], batch, hardware, compute, available, None, stack=stack)[0]
            if found.fit != "does not fit":
                found.rank = 1 + sum(1 for r in ranked if r.step_s < found.step_s)
        doc["asked"] = row(found, explain(found, ranked[0], None) if ranked and found.rank else "")
    return doc


def published_ranking(points: list | None = None) -> dict:
    """Each published point the model predicts (all of them, or `points`): where its publisher's layout ranks in the
    plan for the same model, devices, batch, hardware and stack, and how much faster the plan predicts its pick."""
    out = []
    for point in published_points.all_points() if points is None else points:
        if published_points.refusal(point):
            continue   # refused by the model (a stack, a layout or a device it does not know): --published says why
        plan = decoder_plan(point.model, point.devices, point.global_batch, point.hardware, point.stack,
                            point.seq_len, None, None, 1, point.layout)
        asked, pick = plan["asked"], plan["rows"][0] if plan["rows"] else None
        out.append({"point": point.name, "published_layout": asked["layout"], "rank": asked["rank"],
                    "fit": asked["fit"], "fitting": plan["candidates"]["fit"], "pick": pick and pick["layout"],
                    "pick_faster": pick and asked["step_s"] / pick["step_s"] - 1,
                    "published_memory_gib": asked["memory_per_rank_max"] / GIB})
    return {"points": out}
