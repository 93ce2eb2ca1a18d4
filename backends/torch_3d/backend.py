"""PyTorch's native layouts: FSDP2 x DTensor tensor parallel x torch.distributed.pipelining on a DeviceMesh.

One process per device, launched, rendezvoused, supervised and reported exactly as torch_ddp's
(backends.torch_common's torchrun launch, with its own worker)."""
from __future__ import annotations

from pathlib import Path

from backends.torch_common.backend import TorchrunBackend
from common.config import RunConfig
from common.devices import DevicePlan
from common.errors import Unsupported


class Torch3D(TorchrunBackend):
    name = "torch_3d"
    strategy = "DeviceMesh layout (FSDP2 x DTensor TP x pipelining)"
    worker_module = "backends.torch_3d.worker"

    def strategy_name(self, cfg: RunConfig) -> str:
        lay = cfg.layout
        parts = [f"dp{lay.data}" + (" FSDP2" if lay.sharded else ""), f"tp{lay.tp}",
                 f"pp{lay.pp}" + (f" {lay.schedule} x{lay.micro_batches}" if lay.pp > 1 else "")]
        return f"torch_3d {' x '.join(parts)}"

    def mode_name(self, cfg: RunConfig) -> str:
        return "DeviceMesh"  # the strategy name is the layout's, which the configuration key holds apart

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        lay = cfg.layout
        if cfg.workload == "cnn":
            if lay.tp > 1 or lay.pp > 1:
                raise Unsupported(f"torch_3d cnn: {'--model-parallel' if lay.tp > 1 else '--pipeline-stages'}: the "
                                  "CNN runs data parallel and FSDP only here; its convolutions dominate and do not "
                                  "split by tensor, and a 2-stage cut of a 4-conv net leaves nothing to overlap")
            if lay.recomputes:
                raise Unsupported("torch_3d cnn --recompute: recomputing a BatchNorm forward would update its "
                                  "running statistics twice")
        if cfg.workload == "lm":
            spec = cfg.spec
            if spec.kv_heads % lay.tp:
                raise Unsupported(f"torch_3d lm --model-parallel {lay.tp}: {spec.name}'s {spec.kv_heads} key/value "
                                  "heads do not split over it (torch_3d splits wk and wv by heads, replicating none)")
        if cfg.sync_bn:
            raise Unsupported("--sync-bn: torch_3d keeps BatchNorm statistics per rank")
        if cfg.checkpoint_every or cfg.resume:
            raise Unsupported("--checkpoint-every/--resume: torch_3d writes no checkpoints (sharded state "
                              "would need torch.distributed.checkpoint)")
        if cfg.compile:
            raise Unsupported("--compile: torch_3d does not compile its FSDP2 / DTensor / pipeline stages yet; "
                              "torch_ddp and torch_dp do")
        if cfg.precision == "fp16":
            raise Unsupported("--precision fp16: torch_3d has no loss scaling over sharded gradients (FSDP2 and "
                              "DTensor need a sharded GradScaler); --precision amp (bf16) needs none")

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        lay = cfg.layout
        notes = [f"layout dp {lay.data} x tp {lay.tp} x pp {lay.pp} on a (pp, dp, tp) DeviceMesh; every rank of a "
                 "data-parallel replica is dealt the replica's samples"]
        if lay.dp > 1 and not lay.sharded:
            notes.append("data parallel: one flat all-reduce of all gradients per step over dp (no DDP: it takes "
                         "neither DTensor parameters nor pipeline micro-batches)")
        if lay.pp > 1:
            notes.append("the last pipeline stage holds a copy of the tied token embedding; the first and last "
                         "stage sum its gradient every step")
        if lay.vocab_split:
            notes.append("--vocab-split: the token table and the decoder bias split by vocabulary rows over tp "
                         "(DTensor Shard(0)); each rank computes its slice of the tied decoder's logits, and the "
                         "cross-entropy all-reduces a max and a sum of exponentials over tp (Megatron's)")
        notes.append("backend_metrics.final_params: per canonical weight, the norm and sum of the whole weight "
                     "gathered from its shards after the last step")
        notes.append("backend_metrics.comm_per_step and bubble come from one warm-up probe step outside the "
                     "measured window, collectives timed by waiting on each")
        if cfg.breakdown_steps:
            notes.append("--breakdown-steps: 'gradient comm' is every collective of the step (tensor-parallel "
                         "all-reduces, FSDP all-gathers and reduce-scatters, the dp all-reduce, the tied embedding's "
                         "sum), each waited for; a pipeline's sends and receives are counted, not timed, so its "
                         "waits stay in forward+backward")
        if cfg.workload == "cnn" and lay.data > 1:
            notes.append("BatchNorm statistics are per rank (no SyncBatchNorm), as torch_ddp by default")
        if plan.kind == "cpu":
            notes.append("gloo collectives and send/recv over loopback between CPU processes")
        return notes

    def run_bare(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        # torch_ddp's bare DDP loop calibrates the data-parallel path; a layout has no one-loop idiom to match.
        raise Unsupported("torch_3d has no bare loop to calibrate against: a tensor or pipeline layout has no "
                          "minimal torch idiom; torch_ddp's bare DDP loop calibrates the shared launch and loop")
