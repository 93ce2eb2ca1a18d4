"""The one step model: a training step of a layout put together from its stages, whichever workload and whatever
its compute rests on (a measured 1-device run, a device's compute table, an assumed MFU). The pipeline formula
(GPipe, 1F1B, interleaved), the once-a-step tail and a CPU host's synchronisation wait are docs/prediction.md's
"The model" and docs/prediction-at-scale.md's layouts table."""
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
    """How many ranks' interruptions a rank of the layout waits for, in units of its own. Ranks that synchronise
    many times a step (tensor parallel's all-reduces and FSDP's gathers, every layer) wait for each of their
    group's interruptions in turn: the group size. Ranks that meet once a step (a data-parallel all-reduce)
    wait for the longest of theirs: for exponentially distributed interruptions E[max of n] / E[one] = H_n, the
    n-th harmonic number. Pipeline stages wait for each other through point-to-point sends with the bubble's
    slack: not counted."""
    harmonic = sum(1 / k for k in range(1, layout.data + 1))
    return layout.tp * (layout.data if layout.sharded else harmonic)


def pipeline_s(per_micro_batch: list[float], micro_batches: int, virtual: int = 1) -> float:
    """Forward+backward of m micro-batches through stages taking e_s each: GPipe and 1F1B (virtual 1)
    sum_s e_s + (m - 1) max_s e_s; interleaved 1F1B, each stage's work v chunks whose warm-up and cool-down take
    a chunk each per stage, sum_s e_s / v + (m - 1/v) max_s e_s."""
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
    if isinstance(model, DecoderSpec):
        stages = decoder_stages(model, layout, global_batch, hardware, stack, compute)
    else:
        layout = layout.placed(model, global_batch)
        stages = executed_stages(model, layout, global_batch, hardware, compute, backend, background, eval_batch,
                                 counted)
    return _step(stages, layout, global_batch)


def _step(stages: Stages, layout: Layout, global_batch: int) -> Prediction:
    m = stages.micro_batches
    e = [c + i for c, i in zip(stages.compute, stages.inside)]
    pipe = pipeline_s(e, m, layout.virtual_stages if layout.schedule == "interleaved" else 1)
    busiest = max(range(layout.pp), key=lambda s: e[s])
    tails = [c + o + opt for c, o, opt in zip(stages.after_comm, stages.after_other, stages.optimizer)]
    last = max(range(layout.pp), key=lambda s: tails[s])
    alone = stages.overhead + pipe + tails[last]
    sync_wait = stages.interruption_share * alone * (sync_factor(layout) - 1)
    after = max(stages.after_comm)
    idle = [(pipe - m * e[s]) / (pipe + after) for s in range(layout.pp)] if layout.pp > 1 else None
    memory = stages.memory or {"model_per_rank": stages.model_bytes}
    return Prediction(layout=layout, devices=layout.devices, global_batch=global_batch, step_s=alone + sync_wait,
                      compute_s=m * stages.compute[busiest], comm_exposed_s=m * stages.inside[busiest] + after,
                      bubble_s=pipe - m * e[busiest] if layout.pp > 1 else 0.0, optimizer_s=max(stages.optimizer),
                      overhead_s=stages.overhead, sync_wait_s=sync_wait, idle_per_stage=idle,
                      collectives=[c for comms in stages.collectives for c in comms],
                      collectives_of_rank0=stages.collectives[0], contention=stages.contention, notes=stages.notes,
                      recompute_s=m * stages.recompute[busiest], parts=stages.parts[busiest],
                      seq_len=stages.seq_len, **memory)
