"""The parallel layout of a MindSpore run, after the seed tutorial's TransformerOpParallelConfig.

Framework-neutral on purpose: the harness validates a layout before any worker starts, and the
tests check it without MindSpore installed. Every bad combination is BadInput with one line
that names it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from common.errors import BadInput
from common.spec import BertSpec, CnnSpec

PARALLEL_MODES = ("data", "semi_auto", "auto")


@dataclass(frozen=True)
class ParallelConfig:
    mode: str = "data"
    data_parallel: int = 1
    model_parallel: int = 1
    pipeline_stage: int = 1
    micro_batch_num: int = 1
    optimizer_shard: bool = False
    # How many communication-fusion groups the gradients of the layers are split into.
    gradient_aggregation_group: int = 4
    recompute: bool = False
    # True: the embedding table is replicated and only the batch is split; False: its rows
    # (the vocabulary) are split over the model-parallel devices.
    vocab_emb_dp: bool = True

    @property
    def devices(self) -> int:
        return self.data_parallel * self.model_parallel * self.pipeline_stage

    @property
    def splits_model(self) -> bool:
        return self.model_parallel > 1 or self.pipeline_stage > 1

    def as_dict(self) -> dict:
        return asdict(self)

    def validate(self, devices: int, spec: CnnSpec | BertSpec, global_batch: int, grad_accum: int = 1) -> None:
        """Raise BadInput naming the first combination that cannot be laid out on `devices`."""
        dp, mp, pp, k = self.data_parallel, self.model_parallel, self.pipeline_stage, self.micro_batch_num
        if self.mode not in PARALLEL_MODES:
            raise BadInput(f"--parallel-mode {self.mode}: choose from {', '.join(PARALLEL_MODES)}")
        if min(dp, mp, pp, k, self.gradient_aggregation_group) < 1:
            raise BadInput(f"parallel sizes must be >= 1: data {dp}, model {mp}, pipeline {pp}, micro-batches {k}")
        if dp * mp * pp != devices:
            raise BadInput(f"data parallel {dp} x model parallel {mp} x pipeline stages {pp} = {dp * mp * pp}, "
                           f"not the {devices} devices")
        if self.mode == "data" and self.splits_model:
            raise BadInput(f"--parallel-mode data with --model-parallel {mp} --pipeline-stages {pp}: "
                           "splitting the model needs semi_auto or auto")
        if self.mode == "data" and self.optimizer_shard:
            raise BadInput("--optimizer-shard needs --parallel-mode semi_auto or auto")
        if k > 1 and pp == 1:
            raise BadInput(f"--micro-batches {k} with 1 pipeline stage: micro-batches feed a pipeline; "
                           "use --grad-accum to accumulate without one")
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
        mp, pp = self.model_parallel, self.pipeline_stage
        sizes = {"attention heads": spec.heads, "hidden size": spec.hidden,
                 "intermediate size": spec.intermediate}
        if not self.vocab_emb_dp:
            sizes["vocabulary"] = spec.vocab_size
        for what, size in sizes.items():
            if size % mp:
                raise BadInput(f"{what} {size} is not divisible by model parallel {mp}")
        if spec.layers < pp:
            raise BadInput(f"{spec.layers} layers cannot fill {pp} pipeline stages")

    def _validate_cnn(self, spec: CnnSpec) -> None:
        mp, pp = self.model_parallel, self.pipeline_stage
        # Only the first two fully connected layers are split (column then row), see strategies.py.
        if spec.fc_sizes[0] % mp:
            raise BadInput(f"fc size {spec.fc_sizes[0]} is not divisible by model parallel {mp}")
        if cnn_layers(spec) < pp:
            raise BadInput(f"the CNN's {cnn_layers(spec)} layers cannot fill {pp} pipeline stages")


def cnn_layers(spec: CnnSpec) -> int:
    """The units a CNN pipeline is cut between: each conv block and each fully connected layer."""
    return len(spec.conv_channels) + len(spec.fc_sizes) + 1


def parallel_config_from(options: dict, devices: int) -> ParallelConfig:
    """The layout asked for on the command line; data parallel takes the devices mp x pp leaves."""
    mp, pp = options.get("model_parallel", 1), options.get("pipeline_stages", 1)
    if devices % (mp * pp):
        raise BadInput(f"{devices} devices are not divisible by model parallel {mp} x pipeline stages {pp}")
    return ParallelConfig(
        mode=options.get("parallel_mode", "data"), data_parallel=devices // (mp * pp), model_parallel=mp,
        pipeline_stage=pp, micro_batch_num=options.get("micro_batches", 1),
        optimizer_shard=options.get("optimizer_shard", False), recompute=options.get("recompute", False),
        vocab_emb_dp=options.get("vocab_emb_dp", True),
    )
