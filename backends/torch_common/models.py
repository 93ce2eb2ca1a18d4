"""The workload models in PyTorch, built from common.spec (the decoder LM from its model file,
common.predict.decoder); shared by torch_dp, torch_ddp and torch_3d.

Their initial values come from common.initial_weights (weights.py loads them), not from torch's init."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.spec import BertSpec, CnnSpec


class SimpleCNN(nn.Module):
    def __init__(self, spec: CnnSpec):
        super().__init__()
        layers, cin = [], spec.in_channels
        for cout, pool in zip(spec.conv_channels, spec.pool_after):
            layers += [nn.Conv2d(cin, cout, spec.kernel), nn.BatchNorm2d(cout, spec.bn_eps, spec.bn_momentum),
                       nn.ReLU(inplace=True)]
            if pool:
                layers.append(nn.MaxPool2d(2))
            cin = cout
        self.features = nn.Sequential(*layers)
        dims = (spec.flat_features, *spec.fc_sizes)
        head = []
        for fin, fout in zip(dims, dims[1:]):
            head += [nn.Linear(fin, fout), nn.ReLU(inplace=True)]
        head.append(nn.Linear(dims[-1], spec.num_classes))
        self.classifier = nn.Sequential(*head)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """image: [B, 28, 28] in [0, 1] -> logits [B, 10]."""
        return self.classifier(torch.flatten(self.features(image.unsqueeze(1)), 1))


class SelfAttention(nn.Module):
    """Multi-head self-attention up to its output projection. A module of its own so that tensor parallelism
    can take its input once for query, key and value (torch_3d.parallelize)."""

    def __init__(self, spec: BertSpec):
        super().__init__()
        h = spec.hidden
        self.heads, self.dropout = spec.heads, spec.dropout
        self.query, self.key, self.value, self.output = (nn.Linear(h, h) for _ in range(4))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        p = self.dropout if self.training else 0.0
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, dropout_p=p)
        # -1: the heads this rank holds, all of them unless tensor parallelism split them
        return self.output(ctx.transpose(1, 2).reshape(b, s, -1))


class EncoderLayer(nn.Module):
    """Post-LN transformer block: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, spec: BertSpec):
        super().__init__()
        h = spec.hidden
        self.dropout = spec.dropout
        self.attention = SelfAttention(spec)
        self.attention_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.ffn_in = nn.Linear(h, spec.intermediate)
        self.ffn_out = nn.Linear(spec.intermediate, h)
        self.ffn_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.gelu = "tanh" if spec.ffn_gelu_approximate else "none"

    def forward(self, x: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        x = self.attention_norm(x + F.dropout(self.attention(x, attend), p, self.training))
        ffn = self.ffn_out(F.gelu(self.ffn_in(x), approximate=self.gelu))
        return self.ffn_norm(x + F.dropout(ffn, p, self.training))


class BertMLM(nn.Module):
    """BERT encoder + masked-LM head with the decoder tied to the token embedding (keras-hub layout)."""

    def __init__(self, spec: BertSpec):
        super().__init__()
        h = spec.hidden
        self.spec = spec
        self.token_embedding = nn.Embedding(spec.vocab_size, h)
        self.position_embedding = nn.Embedding(spec.seq_len, h)
        self.segment_embedding = nn.Embedding(spec.type_vocab_size, h)
        self.embeddings_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(spec) for _ in range(spec.layers))
        self.head_dense = nn.Linear(h, h)
        self.head_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.head_bias = nn.Parameter(torch.zeros(spec.vocab_size))
        self.head_gelu = "tanh" if spec.head_gelu_approximate else "none"

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor,
                mask_positions: torch.Tensor) -> torch.Tensor:
        """-> logits [B, P, vocab] at the P gathered mask positions only (the vocab projection dominates)."""
        x = self.embed(input_ids)
        attend = attention_mask(padding_mask)
        for layer in self.layers:
            x = layer(x, attend)
        return self.head(x, mask_positions)

    # The pieces a pipeline stage runs: embed on the first, head on the last.
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions) \
            + self.segment_embedding.weight[0]  # one segment: every token has type 0
        return F.dropout(self.embeddings_norm(x), self.spec.dropout, self.training)

    def head(self, x: torch.Tensor, mask_positions: torch.Tensor) -> torch.Tensor:
        return self.decode(self.head_transform(x, mask_positions))

    def head_transform(self, x: torch.Tensor, mask_positions: torch.Tensor) -> torch.Tensor:
        """The hidden states at the mask positions, through the head's dense layer and norm."""
        picked = torch.gather(x, 1, mask_positions.long().unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        return self.head_norm(F.gelu(self.head_dense(picked), approximate=self.head_gelu))

    def decode(self, picked: torch.Tensor) -> torch.Tensor:
        """The MLM decoder, tied to the token embedding."""
        return picked @ self.token_embedding.weight.T + self.head_bias


def attention_mask(padding_mask: torch.Tensor) -> torch.Tensor:
    return padding_mask.bool()[:, None, None, :]


def rotary_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq_len, head_dim] of rotary positions in the rotate-half layout (keras-hub's RotaryEmbedding,
    Hugging Face's Llama): frequency j drives dimensions j and j + head_dim / 2."""
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inverse)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, head_dim] rotated by position."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class CausalAttention(nn.Module):
    """Causal grouped-query attention with rotary positions, no biases. Its own module (as the FFN's) so that
    tensor parallelism takes its input once for wq, wk and wv (torch_3d.parallelize)."""

    def __init__(self, spec):
        super().__init__()
        h = spec.hidden
        self.grouped, self.head_dim = spec.heads != spec.kv_heads, spec.head_dim
        self.wq = nn.Linear(h, spec.q_width, bias=False)
        self.wk, self.wv = nn.Linear(h, spec.kv_width, bias=False), nn.Linear(h, spec.kv_width, bias=False)
        self.wo = nn.Linear(spec.q_width, h, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape   # -1: the heads this rank holds, all of them unless tensor parallelism split them
        return x.view(b, s, -1, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self._heads(self.wq(x)), self._heads(self.wk(x)), self._heads(self.wv(x))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # enable_gqa: query head i reads key/value head i // (heads / kv_heads), as keras-hub's repeat does
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.grouped)
        return self.wo(ctx.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): w1 the gate, w3 the up projection."""

    def __init__(self, spec):
        super().__init__()
        self.w1, self.w3 = nn.Linear(spec.hidden, spec.ffn, bias=False), nn.Linear(spec.hidden, spec.ffn, bias=False)
        self.w2 = nn.Linear(spec.ffn, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderBlock(nn.Module):
    """Pre-norm Llama block: x = x + attention(RMSNorm(x)); x = x + ffn(RMSNorm(x))."""

    def __init__(self, spec):
        super().__init__()
        h = spec.hidden
        self.attention_norm, self.ffn_norm = nn.RMSNorm(h, eps=spec.norm_eps), nn.RMSNorm(h, eps=spec.norm_eps)
        self.attention, self.ffn = CausalAttention(spec), SwiGLU(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class DecoderLM(nn.Module):
    """The lm workload's Llama-style decoder: token embedding, blocks, final RMSNorm, untied output layer."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.token_embedding = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleList(DecoderBlock(spec) for _ in range(spec.layers))
        self.norm = nn.RMSNorm(spec.hidden, eps=spec.norm_eps)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        cos, sin = rotary_tables(spec.head_dim, spec.seq_len, spec.rope_theta)
        # Not state: rebuilt from the spec, never checkpointed or loaded.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rotary(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables of the first `seq_len` positions (a pipeline stage's blocks read them too)."""
        return self.rope_cos[:seq_len], self.rope_sin[:seq_len]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """-> logits [B, S, vocab] at every position."""
        x = self.token_embedding(input_ids)
        cos, sin = self.rotary(input_ids.shape[1])
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


def build_model(workload: str, spec) -> nn.Module:
    if workload == "cnn":
        return SimpleCNN(spec)
    return DecoderLM(spec) if workload == "lm" else BertMLM(spec)


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
