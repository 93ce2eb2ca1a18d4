"""--vocab-split: the token embedding and the output layer split over the vocabulary: the MLM's decoder, tied to
the embedding, with its bias; the decoder LM's untied output layer.

Each tensor-parallel rank holds vocabulary rows [lo, lo + V/tp) of the table, of the MLM decoder's bias and of the
decoder LM's output layer.
The embedding is DTensor's row-wise split (look-up in the local rows, all-reduce of the partial sums).
The decoder computes its slice of the logits, and the cross-entropy over the split vocabulary is
Megatron's: a max and a sum of exponentials all-reduced over tp, never the whole logits on one rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module


class _SumOverRanks(torch.autograd.Function):
    """Forward: sum over the group. Backward: identity, because every rank then computes the same loss
    from the sum and holds the whole gradient of it."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _SameOnEveryRank(torch.autograd.Function):
    """Forward: identity on a tensor every rank holds. Backward: sum the gradients, each rank's covering
    only its slice of the vocabulary."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def split_vocabulary(model: nn.Module, mesh: DeviceMesh) -> None:
    """Shard the token table's rows, and the MLM decoder's bias or the decoder LM's output layer, over tp
    (DTensors: FSDP shards them further over dp, and the final parameters gather from them as from every other
    weight)."""
    tp_mesh = mesh["tp"]
    if model.token_embedding is not None:
        # every rank looks up all of the token ids, in its own rows
        parallelize_module(model, tp_mesh, {"token_embedding": RowwiseParallel(input_layouts=Replicate())})
    if getattr(model, "head_bias", None) is not None:
        model.head_bias = nn.Parameter(distribute_tensor(model.head_bias.detach(), tp_mesh, [Shard(0)]))
    if getattr(model, "output", None) is not None:   # the decoder LM's last stage: its logits are split_loss's
        model.output.weight = nn.Parameter(distribute_tensor(model.output.weight.detach(), tp_mesh, [Shard(0)]))


def split_loss_and_correct(picked: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           labels: torch.Tensor, weights: torch.Tensor, group: dist.ProcessGroup):
    """(loss sum, correct) of the labelled tokens (the MLM's masked ones, the decoder LM's every position) with the
    logits split by vocabulary; `weight` and `bias` (None: no bias) are this rank's rows. A prediction is the first
    index of the global maximum, as argmax picks."""
    rows = weight.shape[0]
    lo = dist.get_group_rank(group, dist.get_rank()) * rows
    logits = _SameOnEveryRank.apply(picked, group) @ weight.T
    logits = (logits if bias is None else logits + bias).float()  # [B, P, V/tp]
    local_max, local_arg = logits.detach().max(-1)
    global_max = local_max.clone()
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - global_max.unsqueeze(-1)
    sum_exp = _SumOverRanks.apply(shifted.exp().sum(-1), group)
    labels = labels.long()
    mine = (labels >= lo) & (labels < lo + rows)
    label_logit = shifted.gather(-1, (labels - lo).clamp(0, rows - 1).unsqueeze(-1)).squeeze(-1) * mine
    label_logit = _SumOverRanks.apply(label_logit, group)
    loss = ((torch.log(sum_exp) - label_logit) * weights).sum()
    with torch.no_grad():
        # The first rank holding the global maximum holds the lowest index of it.
        candidate = torch.where(local_max == global_max, local_arg + lo, torch.full_like(local_arg, 2 ** 62))
        dist.all_reduce(candidate, op=dist.ReduceOp.MIN, group=group)
        correct = ((candidate == labels).float() * weights).sum()
    return loss, correct
