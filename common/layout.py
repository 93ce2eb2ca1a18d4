"""The parallel layout of a run: data x tensor x pipeline parallelism, one object for every backend.

The harness builds it once from the command line and validates it before any worker starts;
a backend translates it in one place (mindspore_auto's ParallelConfig, torch_3d's mesh) or,
when it cannot honour a part of it, refuses that part by flag name. Ranks are laid out on a
("pp", "dp", "tp") grid, tensor parallel innermost: rank = (stage x dp + dp index) x tp + tp index.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from common.errors import BadInput, Unsupported
from common.spec import BertSpec, CnnSpec

SCHEDULES = ("gpipe", "1f1b")
MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class Layout:
    dp: int = 1                  # data-parallel replicas: what the devices leave
    tp: int = 1                  # --model-parallel: devices each layer is split over
    pp: int = 1                  # --pipeline-stages
    micro_batches: int = 1       # --micro-batches per pipeline step
    schedule: str = "gpipe"      # --pipeline-schedule
    optimizer_shard: bool = False  # parameters, gradients and optimizer state sharded over dp
    recompute: bool = False      # layer activations recomputed in the backward pass
    # True: the token embedding (and the MLM head tied to it) is replicated; False: its
    # vocabulary is split over the tensor-parallel devices.
    vocab_emb_dp: bool = True

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def splits_model(self) -> bool:
        return self.tp > 1 or self.pp > 1

    def non_default_flags(self) -> list[str]:
        """The layout flags beyond plain data parallelism, as the user typed them."""
        flags = [(self.tp > 1, f"--model-parallel {self.tp}"), (self.pp > 1, f"--pipeline-stages {self.pp}"),
                 (self.micro_batches > 1, f"--micro-batches {self.micro_batches}"),
                 (self.schedule != "gpipe", f"--pipeline-schedule {self.schedule}"),
                 (self.optimizer_shard, "--optimizer-shard"), (self.recompute, "--recompute"),
                 (not self.vocab_emb_dp, "--no-vocab-emb-dp")]
        return [flag for asked, flag in flags if asked]

    def validate(self, spec: CnnSpec | BertSpec, global_batch: int, grad_accum: int = 1) -> None:
        """Raise BadInput naming the first combination that cannot be laid out."""
        dp, tp, pp, k = self.dp, self.tp, self.pp, self.micro_batches
        if min(dp, tp, pp, k) < 1:
            raise BadInput(f"parallel sizes must be >= 1: data {dp}, model {tp}, pipeline {pp}, micro-batches {k}")
        if self.schedule not in SCHEDULES:
            raise BadInput(f"--pipeline-schedule {self.schedule}: choose from {', '.join(SCHEDULES)}")
        if k > 1 and pp == 1:
            raise BadInput(f"--micro-batches {k} with 1 pipeline stage: micro-batches feed a pipeline; "
                           "use --grad-accum to accumulate without one")
        if self.schedule != "gpipe" and pp == 1:
            raise BadInput(f"--pipeline-schedule {self.schedule} with 1 pipeline stage: there is no pipeline")
        if pp > 1 and k < pp:
            raise BadInput(f"--micro-batches {k} is fewer than the {pp} pipeline stages")
        if pp > 1 and grad_accum > 1:
            raise BadInput(f"--grad-accum {grad_accum} with {pp} pipeline stages: the pipeline's "
                           "--micro-batches already accumulate")
        if global_batch % (dp * k):
            raise BadInput(f"global batch {global_batch} is not divisible by data parallel {dp} x "
                           f"micro-batches {k}")
        if isinstance(spec, BertSpec):
            self._validate_bert(spec)
        else:
            self._validate_cnn(spec)

    def _validate_bert(self, spec: BertSpec) -> None:
        tp, pp = self.tp, self.pp
        sizes = {"attention heads": spec.heads, "hidden size": spec.hidden, "intermediate size": spec.intermediate}
        if not self.vocab_emb_dp:
            sizes["vocabulary"] = spec.vocab_size
        for what, size in sizes.items():
            if size % tp:
                raise BadInput(f"{what} {size} is not divisible by model parallel {tp}")
        if spec.layers < pp:
            raise BadInput(f"{spec.layers} layers cannot fill {pp} pipeline stages")

    def _validate_cnn(self, spec: CnnSpec) -> None:
        tp, pp = self.tp, self.pp
        # Only the first two fully connected layers are split (column then row).
        if spec.fc_sizes[0] % tp:
            raise BadInput(f"fc size {spec.fc_sizes[0]} is not divisible by model parallel {tp}")
        if cnn_layers(spec) < pp:
            raise BadInput(f"the CNN's {cnn_layers(spec)} layers cannot fill {pp} pipeline stages")
        if not self.vocab_emb_dp:
            raise BadInput("--no-vocab-emb-dp: the CNN has no embedding table")

    def bubble(self) -> float:
        """The analytic idle share of a GPipe/1F1B pipeline step: (pp - 1) / (micro-batches + pp - 1)."""
        return (self.pp - 1) / (self.micro_batches + self.pp - 1)

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each mesh dimension."""
        stage, rest = divmod(rank, self.dp * self.tp)
        return {"pp": stage, "dp": rest // self.tp, "tp": rest % self.tp}

    def stage_of_layer(self, layer: int, layers: int) -> int:
        """Contiguous layers per stage, the last stage taking any remainder (the MindSpore tutorial's rule)."""
        per_stage = max((layers + 1) // self.pp, 1)
        return min(layer // per_stage, self.pp - 1)

    def stage_layers(self, stage: int, layers: int) -> list[int]:
        return [i for i in range(layers) if self.stage_of_layer(i, layers) == stage]

    def holds(self, rank: int, spec: CnnSpec | BertSpec) -> str:
        """What one rank holds, in words: its stage's parts and the share of them."""
        c = self.coordinates(rank)
        if isinstance(spec, BertSpec):
            layers = self.stage_layers(c["pp"], spec.layers)
            parts = [f"layers {layers[0]}-{layers[-1]}"]
            if c["pp"] == 0:
                parts.insert(0, "embeddings")
            if c["pp"] == self.pp - 1:
                parts.append("MLM head")
            what = " + ".join(parts)
            split = "heads, FFN" + ("" if self.vocab_emb_dp else " and vocabulary")
        else:
            what, split = "the whole CNN", "fc0/fc1"
        if self.tp > 1:
            what += f", {split} shard {c['tp'] + 1}/{self.tp}"
        if self.optimizer_shard:
            what += f", parameters and optimizer state shard {c['dp'] + 1}/{self.dp}"
        return what

    def as_record(self, spec: CnnSpec | BertSpec) -> dict:
        per_rank = [{"rank": r, "dp": c["dp"], "tp": c["tp"], "pp": c["pp"], "holds": self.holds(r, spec)}
                    for r in range(self.devices) for c in [self.coordinates(r)]]
        return {**asdict(self), "per_rank": per_rank}

    @classmethod
    def from_options(cls, options: dict, devices: int) -> Layout:
        """The layout asked for on the command line; data parallel takes the devices tp x pp leaves."""
        tp, pp = options.get("model_parallel", 1), options.get("pipeline_stages", 1)
        if devices % (tp * pp):
            raise BadInput(f"{devices} devices are not divisible by model parallel {tp} x pipeline stages {pp}")
        return cls(dp=devices // (tp * pp), tp=tp, pp=pp, micro_batches=options.get("micro_batches", 1),
                   schedule=options.get("pipeline_schedule", "gpipe"),
                   optimizer_shard=options.get("optimizer_shard", False), recompute=options.get("recompute", False),
                   vocab_emb_dp=options.get("vocab_emb_dp", True))


def cnn_layers(spec: CnnSpec) -> int:
    """The units a CNN pipeline is cut between: each conv block and each fully connected layer."""
    return len(spec.conv_channels) + len(spec.fc_sizes) + 1


def refuse_layout(layout: Layout, backend: str) -> None:
    """For a data-parallel-only backend: Unsupported naming the first layout flag it cannot honour."""
    asked = layout.non_default_flags()
    if asked:
        raise Unsupported(f"{asked[0]}: {backend} is data parallel only; torch_3d runs this layout "
                          "(mindspore_auto too, on Ascend/GPU)")
