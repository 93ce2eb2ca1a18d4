"""The resolved description of one run, shared by the harness and every backend's workers.

Built once by the harness from the command line, validated there (bad input never reaches a
worker), then passed to workers as JSON.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from common.errors import BadInput
from common.spec import DEFAULTS, BertSpec, CnnSpec, OptimSpec, model_spec

SCALING_MODES = ("weak", "strong")
PRECISIONS = ("fp32", "amp")


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
    sync_bn: bool = False
    eval_every: int = 0          # 0: only at the end
    skip_eval: bool = False      # not even at the end
    patience: int = 0            # 0: no early stopping
    checkpoint_every: int = 0    # 0: no checkpoints
    checkpoint_dir: str = ""
    resume: bool = False
    max_restarts: int = 0        # torch_ddp: torchrun restarts the worker group this many times at most
    timeout_s: float = 3600.0
    collective_timeout_s: float = 300.0
    sweep_id: str = ""
    backend_options: dict = field(default_factory=dict)
    # bench.parity's sensitivity probe: initial weights scaled by (1 + init_perturbation x N(0, 1)).
    init_perturbation: float = 0.0
    init_perturbation_seed: int = 1
    # Several hosts: `devices` above is the world size, nnodes x devices per node. Node 0 hosts the
    # rendezvous at master_addr:master_port; one node runs on loopback with a port picked free.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 0

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
    def global_batch(self) -> int:
        return self.per_device_batch * self.devices * self.grad_accum

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
        return cls(**{k: v for k, v in raw.items() if k in known})


def per_device_batch_for(scaling: str, batch_size: int, devices: int, grad_accum: int) -> int:
    """Weak scaling keeps the per-device batch; strong scaling splits a fixed global batch."""
    if scaling == "weak":
        return batch_size
    if batch_size % (devices * grad_accum):
        raise BadInput(f"--scaling strong: global batch {batch_size} is not divisible by "
                       f"{devices} devices x {grad_accum} accumulation steps")
    return batch_size // (devices * grad_accum)
