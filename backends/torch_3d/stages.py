"""The modules torch_3d trains: a model cut to one pipeline stage, ending in its own loss.

Every stage takes the micro-batch's tensors as keyword arguments (torch.distributed.pipelining
hands keyword arguments to every stage), so only the activations travel between stages; the last
stage returns [loss sum, correct] of its micro-batch, unreduced like the other torch backends.
With one stage the module is the whole model.
"""
from __future__ import annotations

import torch
from torch import nn

from backends.torch_3d.vocab import split_loss_and_correct
from backends.torch_common.models import BertMLM, DecoderLM, SimpleCNN, attention_mask
from backends.torch_common.trainer import cnn_loss_and_correct, lm_loss_and_correct, mlm_loss_and_correct
from common.layout import Layout

# The first stage's positional input; everything else in a batch goes to every stage by name.
FIRST_INPUT = {"mlm": "input_ids", "lm": "input_ids", "cnn": "image"}


class _Stage(nn.Module):
    """A model cut to `layers`, the first and/or last stage of the pipeline or neither; each workload's stage
    drops the parts of the model the stage does not hold."""

    def __init__(self, model: nn.Module, layers: list[int], first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.vocab_group = None  # the tensor-parallel group, once the vocabulary is split over it
        # A dict keeps the layers' names (layers.<i>) whichever stage holds them.
        model.layers = nn.ModuleDict({str(i): model.layers[i] for i in layers})
        self.model = model


class BertStage(_Stage):
    """The embeddings on the first stage, this stage's encoder layers, the MLM head on the last.
    The last stage holds its own copy of the token embedding for the tied decoder; the trainer
    sums the two copies' gradients so they stay equal."""

    def __init__(self, model: BertMLM, layers: list[int], first: bool, last: bool):
        super().__init__(model, layers, first, last)
        if not first:
            model.position_embedding = model.segment_embedding = model.embeddings_norm = None
        if not last:
            model.head_dense = model.head_norm = model.head_bias = None
        if not (first or last):
            model.token_embedding = None

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor, mask_positions: torch.Tensor,
                mask_ids: torch.Tensor, mask_weights: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.model.embed(x)
        attend = attention_mask(padding_mask)
        for layer in self.model.layers.values():
            x = layer(x, attend)
        if not self.last:
            return x
        if self.vocab_group is not None:
            picked = self.model.head_transform(x, mask_positions)
            model = self.model
            loss, correct = split_loss_and_correct(picked, model.token_embedding.weight.to_local(),
                                                   model.head_bias.to_local(), mask_ids, mask_weights, self.vocab_group)
        else:
            logits = self.model.head(x, mask_positions).float()
            loss, correct = mlm_loss_and_correct(logits, {"mask_ids": mask_ids, "mask_weights": mask_weights})
        return torch.stack([loss, correct])


class DecoderStage(_Stage):
    """The token embedding on the first stage, this stage's decoder blocks, the final norm, output layer and
    next-token loss on the last (the output layer is untied: no copy to keep equal)."""

    def __init__(self, model: DecoderLM, layers: list[int], first: bool, last: bool):
        super().__init__(model, layers, first, last)
        if not first:
            model.token_embedding = None
        if not last:
            model.norm = model.output = None

    def forward(self, x: torch.Tensor, labels: torch.Tensor, label_weights: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.model.token_embedding(x)
        cos, sin = self.model.rotary(x.shape[1])
        for layer in self.model.layers.values():
            x = layer(x, cos, sin)
        if not self.last:
            return x
        if self.vocab_group is not None:
            loss, correct = split_loss_and_correct(self.model.norm(x), self.model.output.weight.to_local(), None,
                                                   labels, label_weights, self.vocab_group)
        else:
            logits = self.model.output(self.model.norm(x)).float()
            loss, correct = lm_loss_and_correct(logits, {"labels": labels, "label_weights": label_weights})
        return torch.stack([loss, correct])


class CnnWithLoss(nn.Module):
    """The whole CNN (it is not cut into stages) ending in its loss."""

    def __init__(self, model: SimpleCNN):
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        loss, correct = cnn_loss_and_correct(self.model(image).float(), {"label": label})
        return torch.stack([loss, correct.float()])


def stage_module(workload: str, model: nn.Module, layout: Layout, stage: int, global_batch: int) -> nn.Module:
    """This stage's part of the model; its layers follow --stage-split (common.layout.Layout.stage_layers)."""
    if workload == "cnn":
        return CnnWithLoss(model)
    layers = layout.stage_layers(stage, model.spec, global_batch // layout.data)
    part = DecoderStage if workload == "lm" else BertStage
    return part(model, layers, stage == 0, stage == layout.pp - 1)
