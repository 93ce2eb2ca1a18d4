"""The one step model: a training step of a layout put together from its stages, whichever workload and whatever
its compute rests on. docs/prediction.md's "The model" and docs/prediction-at-scale.md's layouts table."""
from __future__ import annotations

from common.layout import Layout
from common.predict.basis import Basis
from common.predict.collectives import Collective
from common.predict.decoder import DecoderSpec
from common.predict.executed import executed_stages
from common.predict.gpu_compute import DeviceCompute
from common.predict.hardware import Hardware
from common.predict.kernels import decoder_stages
from common.predict.prediction import Prediction, Stages
from common.predict.stacks import Stack
from common.spec import BertSpec, CnnSpec


def sync_factor(layout: Layout) -> float:
    """How many ranks' interruptions a rank of the layout waits for, in units of its own (docs/prediction.md,
    "Synchronisation on a CPU host"). Pipeline stages wait for each other through point-to-point sends with the
    bubble's slack: not counted."""
    harmonic = sum(1 / k for k in range(1, layout.data + 1))
    return layout.tp * (layout.data if layout.sharded else harmonic)


def pipeline_s(per_micro_batch: list[float], micro_batches: int, virtual: int = 1) -> float:
    """Forward+backward of m micro-batches through stages taking e_s each, interleaved 1F1B over `virtual` chunks
    (docs/prediction-at-scale.md's layouts table)."""
    return sum(per_micro_batch) / virtual + (micro_batches - 1 / virtual) * max(per_micro_batch)


def predict(model: BertSpec | CnnSpec | DecoderSpec, layout: Layout, global_batch: int, hardware: Hardware,
            compute: Basis | DeviceCompute, backend: str = "torch_3d", background: float | None = None,
            eval_batch: int | None = None, counted: list[Collective] | None = None, stack: Stack | None = None
            ) -> Prediction:
    """The step of `layout` at `global_batch` samples (a decoder's: sequences) on `hardware`. `compute`: a Basis (a
    measured 1-device run, or basis.from_mfu's assumed MFU) or a device's compute table (gpu_compute). The
    executed workloads run as `backend` runs them, --stage-split auto placed (`background`, `eval_batch`, `counted`:
    executed.executed_stages); a decoder as its software `stack` runs it (common.predict.stacks). ValueError in
    one line for what the model cannot predict."""
    if isinstance(model, DecoderSpec) and not measured(compute):
        stages = decoder_stages(model, layout, global_batch, hardware, stack, compute)
    else:
        layout = layout.placed(model, global_batch)
        stages = executed_stages(model, layout, global_batch, hardware, compute, backend, background, eval_batch,
                                 counted)
    return _step(stages, layout, global_batch)


def measured(compute: Basis | DeviceCompute) -> bool:
    """A measured 1-device run's basis: a decoder timed from one is the lm workload as parbench's backends run it
    (executed.executed_stages), not a cluster's software stack."""
    return isinstance(compute, Basis) and not compute.flops_per_s


def _step(stages: Stages, layout: Layout, global_batch: int) -> Prediction:
    m = stages.micro_batches
    e = [c + i for c, i in zip(stages.compute, stages.inside)]
    pipe = pipeline_s(e, m, layout.virtual_stages if layout.schedule == "interleaved" else 1)
    busiest = max(range(layout.pp), key=lambda s: e[s])
    tails = [c + o + opt for c, o, opt in zip(stages.after_comm, stages.after_other, stages.optimizer)]
    alone = stages.overhead + pipe + max(tails)
    sync_wait = stages.interruption_share * alone * (sync_factor(layout) - 1)
    after = max(stages.after_comm)
    idle = [(pipe - m * e[s]) / (pipe + after) for s in range(layout.pp)] if layout.pp > 1 else None
    return Prediction(layout=layout, devices=layout.devices, global_batch=global_batch, step_s=alone + sync_wait,
                      compute_s=m * stages.compute[busiest], comm_exposed_s=m * stages.inside[busiest] + after,
                      bubble_s=pipe - m * e[busiest] if layout.pp > 1 else 0.0, optimizer_s=max(stages.optimizer),
                      overhead_s=stages.overhead, sync_wait_s=sync_wait, idle_per_stage=idle,
                      collectives=[c for comms in stages.collectives for c in comms],
                      collectives_of_rank0=stages.collectives[0], contention=stages.contention, notes=stages.notes,
                      recompute_s=m * stages.recompute[busiest], parts=stages.parts[busiest],
                      seq_len=stages.seq_len, **stages.memory)
