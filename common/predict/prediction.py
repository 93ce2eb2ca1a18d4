"""What common.predict.step's one step function works with and returns: the stages of a layout as a workload's
work is timed (Stages) and the predicted step (Prediction)."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.layout import Layout
from common.predict.collectives import Collective
from common.sections import StateBytes


@dataclass
class Prediction:
    layout: Layout
    devices: int
    global_batch: int
    step_s: float
    compute_s: float            # forward+backward on the busiest rank (a pipeline: its pipelined time)
    comm_exposed_s: float
    bubble_s: float
    optimizer_s: float
    overhead_s: float = 0.0
    sync_wait_s: float = 0.0    # waiting for other ranks' interruptions (CPU hosts: step.sync_factor)
    idle_per_stage: list[float] | None = None
    state_per_rank: list[StateBytes] = field(default_factory=list)
    # The process's peak per rank, predicted from the measured overhead (None where there is none).
    memory_per_rank: list[float] | None = None
    training_per_rank: list[float] | None = None    # the training's growth: grads + optimizer + live values
    # State + activations + buffers, no overhead (a decoder's: one rank of each pipeline stage, its ranks alike).
    model_per_rank: list[float] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)   # every stage's, one rank of each
    collectives_of_rank0: list[Collective] = field(default_factory=list)
    training_model_per_rank: list[float] = field(default_factory=list)   # gradients + optimizer + live values
    memory_overhead: float | None = None      # the framework's, once per process (the basis's)
    training_overhead: float | None = None
    contention: float = 1.0
    notes: list[str] = field(default_factory=list)
    recompute_s: float = 0.0    # of compute_s: the recomputed forward
    parts: dict[str, float] = field(default_factory=dict)   # finer parts, where the model has them
    seq_len: int = 0            # a decoder's sequence (tokens_per_s)

    @property
    def parts_s(self) -> dict[str, float]:
        """The step's parts (s), as tables and validation.json show them."""
        return {"compute": self.compute_s, "comm_exposed": self.comm_exposed_s, "bubble": self.bubble_s,
                "optimizer": self.optimizer_s, "overhead": self.overhead_s, "sync_wait": self.sync_wait_s,
                **self.parts}

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.step_s

    @property
    def tokens_per_s(self) -> float:
        return self.global_batch * self.seq_len / self.step_s

    @property
    def memory_max(self) -> float:
        """The fullest rank's bytes: its predicted peak where the model has the framework's overhead."""
        return max(self.memory_per_rank or self.model_per_rank)

    def fits(self, memory_bytes: float) -> bool:
        return self.memory_max <= memory_bytes


@dataclass
class Stages:
    """One rank of each pipeline stage, as its work is timed: per micro-batch (compute, inside: the communication
    in the micro-batch loop left exposed) and once a step after the pipeline (after_comm, after_other, optimizer)."""
    micro_batches: int
    compute: list[float] = field(default_factory=list)
    inside: list[float] = field(default_factory=list)
    recompute: list[float] = field(default_factory=list)
    after_comm: list[float] = field(default_factory=list)
    after_other: list[float] = field(default_factory=list)
    optimizer: list[float] = field(default_factory=list)
    collectives: list[list[Collective]] = field(default_factory=list)
    parts: list[dict[str, float]] = field(default_factory=list)
    overhead: float = 0.0             # per step: data, Python (a measured 1-device run's rest)
    interruption_share: float = 0.0   # of a step, lost to a CPU host's interruptions (step.sync_factor)
    contention: float = 1.0
    notes: list[str] = field(default_factory=list)
    memory: dict = field(default_factory=dict)    # Prediction's memory fields (a decoder's: model_per_rank, by add)
    seq_len: int = 0

    def add(self, *, compute: float, inside: float, recompute: float = 0.0, after_comm: float = 0.0,
            after_other: float = 0.0, optimizer: float = 0.0, collectives: list[Collective] = (),
            parts: dict[str, float] | None = None, model_bytes: float | None = None) -> None:
        """The next stage."""
        self.compute.append(compute)
        self.inside.append(inside)
        self.recompute.append(recompute)
        self.after_comm.append(after_comm)
        self.after_other.append(after_other)
        self.optimizer.append(optimizer)
        self.collectives.append(list(collectives))
        self.parts.append(parts or {})
        if model_bytes is not None:
            self.memory.setdefault("model_per_rank", []).append(model_bytes)
