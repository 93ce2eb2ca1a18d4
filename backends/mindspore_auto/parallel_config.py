"""The parallel layout of a MindSpore run, after the seed tutorial's TransformerOpParallelConfig.

Derived from common.layout.Layout (validated there, the same for every backend) plus what only
MindSpore has: its parallel mode and the gradient fusion groups. Framework-neutral on purpose:
the tests check it without MindSpore installed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from common.errors import BadInput
from common.layout import Layout

PARALLEL_MODES = ("data", "semi_auto", "auto")


@dataclass(frozen=True)
class ParallelConfig:
    mode: str = "data"
    data_parallel: int = 1
    model_parallel: int = 1
    pipeline_stage: int = 1
    micro_batch_num: int = 1
    pipeline_scheduler: str = "gpipe"   # MindSpore's pipeline_config names them as common.layout does
    optimizer_shard: bool = False
    # How many communication-fusion groups the gradients of the layers are split into.
    gradient_aggregation_group: int = 4
    recompute: bool = False             # every layer's activations recomputed (cell.recompute())
    # True: the embedding table is replicated and only the batch is split; False: its rows
    # (the vocabulary) are split over the model-parallel devices.
    vocab_emb_dp: bool = True

    @classmethod
    def from_layout(cls, layout: Layout, mode: str = "data") -> ParallelConfig:
        """MindSpore's names for the layout's: HSDP, context parallelism and the predictor-only options are
        refused before (the registry's `layouts`), so the data ranks are all replicas or all shards."""
        return cls(mode=mode, data_parallel=layout.data, model_parallel=layout.tp, pipeline_stage=layout.pp,
                   micro_batch_num=layout.micro_batches, pipeline_scheduler=layout.schedule,
                   optimizer_shard=layout.sharded,
                   recompute=layout.recompute == "full", vocab_emb_dp=not layout.vocab_split)

    @property
    def layout(self) -> Layout:
        shards = self.data_parallel if self.optimizer_shard else 1
        return Layout(dp=self.data_parallel // shards, fsdp=shards, tp=self.model_parallel, pp=self.pipeline_stage,
                      micro_batches=self.micro_batch_num, schedule=self.pipeline_scheduler,
                      recompute="full" if self.recompute else "none", vocab_split=not self.vocab_emb_dp)

    @property
    def devices(self) -> int:
        return self.layout.devices

    @property
    def splits_model(self) -> bool:
        return self.layout.splits_model

    def as_dict(self) -> dict:
        return asdict(self)

    def validate(self, devices: int, spec, global_batch: int, grad_accum: int = 1) -> None:
        """Raise BadInput naming the first combination that cannot be laid out on `devices` for `spec` (common.spec's
        CNN or BERT, or the decoder LM's common.predict.decoder.DecoderSpec)."""
        dp, mp, pp = self.data_parallel, self.model_parallel, self.pipeline_stage
        if self.mode not in PARALLEL_MODES:
            raise BadInput(f"--parallel-mode {self.mode}: choose from {', '.join(PARALLEL_MODES)}")
        if self.gradient_aggregation_group < 1:
            raise BadInput(f"gradient aggregation groups must be >= 1, got {self.gradient_aggregation_group}")
        if dp * mp * pp != devices:
            raise BadInput(f"data parallel {dp} x model parallel {mp} x pipeline stages {pp} = {dp * mp * pp}, "
                           f"not the {devices} devices")
        if self.mode == "data" and self.splits_model:
            raise BadInput(f"--parallel-mode data with --model-parallel {mp} --pipeline-stages {pp}: "
                           "splitting the model needs semi_auto or auto")
        if self.mode == "data" and self.optimizer_shard:
            raise BadInput(f"--fsdp {dp}: MindSpore's optimizer shard needs --parallel-mode semi_auto or auto")
        # common.layout lets a decoder's layout accumulate micro-batches without a pipeline (the predictor's
        # reading); the train step here feeds micro-batches to a pipeline only and accumulates --grad-accum's.
        if self.micro_batch_num > 1 and pp == 1:
            raise BadInput(f"--micro-batches {self.micro_batch_num} with 1 pipeline stage: mindspore_auto feeds "
                           "micro-batches to a pipeline only; use --grad-accum to accumulate without one")
        self.layout.validate(spec, global_batch, grad_accum)


def parallel_config_of(cfg) -> ParallelConfig:
    """A run's layout (RunConfig.layout) with MindSpore's parallel mode (its own --parallel-mode)."""
    return ParallelConfig.from_layout(cfg.layout, cfg.backend_options.get("parallel_mode", "data"))
