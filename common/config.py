"""The resolved description of one run, shared by the harness and every backend's workers.

Built once by the harness from the command line, validated there (bad input never reaches a
worker), then passed to workers as JSON.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from common.errors import BadInput
from common.layout import Layout
from common.spec import DEFAULTS, BertSpec, CnnSpec, OptimSpec, model_spec

SCALING_MODES = ("weak", "strong")
# torch.compile's modes; "default" is the only one other frameworks take (their compilers have no modes).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PRECISIONS = ("fp32", "amp", "fp16")  # amp: bfloat16 autocast; fp16: float16 with loss scaling


@dataclass
class RunConfig:
    run_id: str
    backend: str
    workload: str
    devices: int
    device_kind: str
    threads_per_device: int
    scaling: str
    batch_size: int              # the --batch-size flag: per device (weak) or the global batch (strong)
    per_device_batch: int
    grad_accum: int
    data: str                    # "real" | "synthetic", resolved
    data_dir: str
    seed: int
    total_steps: int
    warmup_steps: int
    out: str
    model_size: str = "tiny"
    precision: str = "fp32"
    virtual: bool = False        # the plan's devices are slices (CPU cores, a shared GPU), not whole devices
    compile: str = ""            # --compile: "" eager, else the framework's compile mode ("default", ...)
    sync_bn: bool = False
    eval_every: int = 0          # 0: only at the end
    skip_eval: bool = False      # not even at the end
    eval_samples: int = 0        # 0: the whole split; else its first N samples
    patience: int = 0            # 0: no early stopping
    checkpoint_every: int = 0    # 0: no checkpoints
    checkpoint_dir: str = ""
    resume: bool = False
    max_restarts: int = 0        # torch_ddp: torchrun restarts the worker group this many times at most
    timeout_s: float = 3600.0
    collective_timeout_s: float = 300.0
    sweep_id: str = ""
    sweep_command: str = ""      # the bench.compare command line of the sweep this run belongs to
    # The parallel layout, validated once by bench.run (common.layout); data parallel is what tp x pp leave.
    # None: plain data parallelism over every device.
    layout: Layout | None = None
    # The options only this run's backend takes (backends.BACKENDS[...].options), e.g. tf_mode.
    backend_options: dict = field(default_factory=dict)
    # bench.parity's sensitivity probe: initial weights scaled by (1 + init_perturbation x N(0, 1)).
    init_perturbation: float = 0.0
    init_perturbation_seed: int = 1
    # Steps after the measured ones (and the evaluation) whose phases are timed apart (common.breakdown).
    breakdown_steps: int = 0
    # --profile: steps after everything else under the framework's profiler (common.profile), their traces
    # under profile_dir/<run id>/ (an absolute path).
    profile_steps: int = 0
    profile_dir: str = ""
    # --tensorboard: where rank 0 writes the run's TensorBoard log ("" none), an absolute path.
    tensorboard_dir: str = ""
    # Several hosts: `devices` above is the world size, nnodes x devices per node. Node 0 hosts the
    # rendezvous at master_addr:master_port; one node runs on loopback with a port picked free.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 0

    def __post_init__(self):
        if self.layout is None:
            self.layout = Layout(dp=self.devices)

    @property
    def devices_per_node(self) -> int:
        return self.devices // self.nnodes

    @property
    def first_rank_on_node(self) -> int:
        """Ranks are numbered node by node: this node's are first_rank_on_node onwards."""
        return self.node_rank * self.devices_per_node

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step: --grad-accum, or the pipeline's --micro-batches."""
        return self.layout.accumulation(self.grad_accum)

    @property
    def feed_steps(self) -> int:
        """Steps a backend's data feed serves: the run's, then the breakdown probe's (one untimed first), then
        the profiled ones."""
        return self.total_steps + (self.breakdown_steps + 1 if self.breakdown_steps else 0) + self.profile_steps

    @property
    def global_batch(self) -> int:
        # per_device_batch is per data-parallel replica and micro-batch: the ranks that split
        # one replica's model (tensor, pipeline) share its samples.
        return self.per_device_batch * self.layout.data * self.accumulation

    @property
    def spec(self) -> CnnSpec | BertSpec:
        return model_spec(self.workload, self.model_size)

    @property
    def optim(self) -> OptimSpec:
        return DEFAULTS[self.workload].optim

    @property
    def eval_split(self) -> str:
        return DEFAULTS[self.workload].eval_split

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    def save(self, path: Path) -> None:
        path.write_text(self.to_json())

    @classmethod
    def load(cls, path: Path) -> RunConfig:
        raw = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        loaded = {k: v for k, v in raw.items() if k in known}
        if isinstance(loaded.get("layout"), dict):
            loaded["layout"] = Layout.from_record(loaded["layout"])
        return cls(**loaded)


def per_device_batch_for(scaling: str, batch_size: int, devices: int, grad_accum: int) -> int:
    """Weak scaling keeps the per-device batch; strong scaling splits a fixed global batch.
    `devices` are the data-parallel replicas, `grad_accum` every micro-batch of a step."""
    if scaling == "weak":
        return batch_size
    if batch_size % (devices * grad_accum):
        raise BadInput(f"--scaling strong: global batch {batch_size} is not divisible by "
                       f"{devices} data-parallel replicas x {grad_accum} micro-batches")
    return batch_size // (devices * grad_accum)
