"""One predicted training step, whichever model made it: the executed workloads' (common.predict.step, from a
measured 1-device run) or the decoders' (common.predict.llm_step, from a device's compute table). The fields after
`optimizer_s` that a model does not compute keep their defaults (the decoders' host has no measured overhead,
sync wait or framework memory overhead)."""
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
    # The process's peak per rank, predicted from the measured overhead (the decoders': one rank of each pipeline
    # stage, the ranks of a stage holding alike; no framework overhead).
    memory_per_rank: list[float] | None = None
    training_per_rank: list[float] | None = None    # the training's growth: grads + optimizer + live values
    model_per_rank: list[float] = field(default_factory=list)   # state + activations + buffers, no overhead
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
