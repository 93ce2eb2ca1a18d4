"""Compile time kept apart from throughput, for frameworks that compile lazily inside their first steps.

torch.compile and TensorFlow's tf.function/XLA compile when a step first meets a new graph. Each step
is run through CompileLog.run, which reads the framework's own count of compiled graphs before and
after it: a step that raised the count compiled, and its wall time is compile time
(`backend_metrics.compile_s`). A compile inside the measured window (step index >= warm-up) is named
in `recompiled_in_measured_window`, and common.loop leaves that step out of the measured steps
(compiled_last_step), as it does the warm-up.
"""
from __future__ import annotations

import time
from collections.abc import Callable


class CompileLog:
    def __init__(self, mode: str, warmup_steps: int, detection: str, graphs_so_far: Callable[[], int]):
        self.mode, self.warmup_steps, self.detection = mode, warmup_steps, detection
        self._graphs_so_far = graphs_so_far
        self._step = 0  # steps run in this process: the loop's step index less its start step
        self.steps: list[dict] = []  # the steps in which graphs were compiled, with their wall time

    def run(self, step: Callable[[], float]) -> float:
        """Runs one training step (which must return only once the device is done) and logs its compiles."""
        graphs, t0 = self._graphs_so_far(), time.perf_counter()
        loss = step()
        new = self._graphs_so_far() - graphs
        if new:
            self.steps.append({"step": self._step, "graphs": new, "wall_s": time.perf_counter() - t0})
        self._step += 1
        return loss

    def compiled_last_step(self) -> bool:
        """Whether the step run last compiled graphs."""
        return bool(self.steps) and self.steps[-1]["step"] == self._step - 1

    def metrics(self) -> dict:
        late = [c["step"] for c in self.steps if c["step"] >= self.warmup_steps]
        return {"compile_mode": self.mode, "compile_s": sum(c["wall_s"] for c in self.steps),
                "compile_steps": self.steps, "recompiled_in_measured_window": late,
                "compile_detection": self.detection}
