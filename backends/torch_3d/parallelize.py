"""How torch_3d lays a model out on its ("pp", "dp", "tp") DeviceMesh, in torchtitan's order:
cut to the pipeline stage, tensor parallel, activation recompute, then FSDP over dp.

The tensor-parallel plan is Megatron's, as mindspore_auto's strategy table: query, key, value and
the first FFN matmul split by output columns, the attention output and the second FFN matmul by
input rows (one all-reduce forward and one backward per pair); each rank runs heads / tp heads.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)
from torch.utils.checkpoint import checkpoint

from backends.torch_3d.vocab import split_vocabulary
from common.layout import Layout

# Canonical weight (common.initial_weights, per layer) -> the module that holds it and its split: the BERT
# encoder's and the decoder LM's.
LAYER_PLAN = {"attention.query": ("attention.query", "colwise"), "attention.key": ("attention.key", "colwise"),
              "attention.value": ("attention.value", "colwise"), "attention.output": ("attention.output", "rowwise"),
              "ffn.in": ("ffn_in", "colwise"), "ffn.out": ("ffn_out", "rowwise")}
DECODER_LAYER_PLAN = {**{f"attention.{w}": (f"attention.{w}", "colwise") for w in ("wq", "wk", "wv")},
                      "attention.wo": ("attention.wo", "rowwise"),
                      **{f"ffn.{w}": (f"ffn.{w}", "colwise") for w in ("w1", "w3")}, "ffn.w2": ("ffn.w2", "rowwise")}
# The submodules whose input several column-split projections share, and the layouts of their inputs: that input
# becomes one replicated DTensor there (torchtitan's plan), so the projections' partial input gradients add up
# locally and are all-reduced once, where the gradient leaves the DTensor, not once per projection. The other
# inputs (the mask, the rotary tables) stay plain tensors.
PREPARED_INPUTS = {"mlm": {"attention": (Replicate(), None)},
                   "lm": {"attention": (Replicate(), None, None), "ffn": (Replicate(),)}}
PLANS = {"mlm": LAYER_PLAN, "lm": DECODER_LAYER_PLAN}
STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
# Which dimension of a [out, in] dense weight each style splits.
WEIGHT_DIM = {"colwise": 0, "rowwise": 1}


def tensor_parallel_splits(layers: int, workload: str = "mlm") -> dict[str, int]:
    """Canonical weight name -> the dimension torch_3d's tensor parallelism splits (for the tests
    that hold it against mindspore_auto's strategy table)."""
    return {f"layers.{i}.{canon}.weight": WEIGHT_DIM[split]
            for i in range(layers) for canon, (_, split) in PLANS[workload].items()}


# The data ranks (dp replicas or fsdp shards: torch_3d runs one or the other) are one mesh dimension.
MESH_DIMS = ("pp", "dp", "tp")


def build_mesh(layout: Layout, device_type: str, backend: str, timeout_s: float) -> DeviceMesh:
    """The world as a (pp, dp, tp) mesh whose every sub-group keeps --collective-timeout (a sub-group would
    otherwise get the backend's 30-minute default): the groups along each dimension are made with
    new_subgroups_by_enumeration(timeout=...), and the mesh from them (DeviceMesh.from_group)."""
    ranks = torch.arange(layout.devices).reshape(layout.pp, layout.data, layout.tp)
    groups = []
    for axis in range(ranks.dim()):
        along = ranks.movedim(axis, -1).reshape(-1, ranks.shape[axis]).tolist()
        mine, _ = dist.new_subgroups_by_enumeration(along, timeout=timedelta(seconds=timeout_s), backend=backend)
        groups.append(mine)
    return DeviceMesh.from_group(groups, device_type, mesh=ranks, mesh_dim_names=MESH_DIMS)


def layer_modules(stage: nn.Module) -> nn.ModuleDict | None:
    model = getattr(stage, "model", None)
    return getattr(model, "layers", None) if isinstance(getattr(model, "layers", None), nn.ModuleDict) else None


def apply_tensor_parallel(stage: nn.Module, mesh: DeviceMesh, tp: int, workload: str) -> None:
    for layer in layer_modules(stage).values():
        if workload == "mlm":
            layer.attention.heads //= tp  # the heads this rank computes; view() then sees local widths
        plan: dict[str, ParallelStyle] = {module: STYLES[split]() for module, split in PLANS[workload].values()}
        for module, layouts in PREPARED_INPUTS[workload].items():
            plan[module] = PrepareModuleInput(input_layouts=layouts, desired_input_layouts=layouts)
        parallelize_module(layer, mesh["tp"], plan)


class Recomputed(nn.Module):
    """A layer whose activations are recomputed in the backward pass instead of kept (torch.utils.checkpoint,
    non-reentrant: it takes keyword arguments and DTensor parameters)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.recomputed = layer

    def forward(self, *args, **kwargs):
        return checkpoint(self.recomputed, *args, use_reentrant=False, **kwargs)


def apply_recompute(stage: nn.Module) -> None:
    layers = layer_modules(stage)
    for name in list(layers):
        layers[name] = Recomputed(layers[name])


def apply_fsdp(stage: nn.Module, mesh: DeviceMesh, zero2: bool) -> None:
    """Each layer its own FSDP unit (all-gathered just before it runs), the rest in the root's (which FSDP keeps
    gathered through the backward). ZeRO-2 keeps each layer gathered from its forward through its backward too."""
    for layer in (layer_modules(stage) or {}).values():
        fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=not zero2)
    fully_shard(stage, mesh=mesh["dp"])


def parallelize(stage: nn.Module, layout: Layout, mesh: DeviceMesh, workload: str) -> nn.Module:
    if layout.tp > 1:
        apply_tensor_parallel(stage, mesh, layout.tp, workload)
    if layout.vocab_split:
        split_vocabulary(stage.model, mesh)
        stage.vocab_group = mesh["tp"].get_group()
    if layout.recomputes:
        apply_recompute(stage)
    if layout.sharded:
        apply_fsdp(stage, mesh, layout.zero2)
    return stage
