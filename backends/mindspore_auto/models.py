"""The workloads on mindspore.nn / mindspore.ops, built from common.spec (the decoder LM from its model file,
common.predict.decoder).

Every primitive that a parallel layout touches is created through `Sharder`, which applies its
strategy from strategies.py when MindSpore partitions operators (semi_auto / auto); in
DATA_PARALLEL mode strategies mean nothing and none are set. Parameters are created as
placeholders; weights.py loads common.initial_weights into them, so every replica (and every
other framework) starts from the same weights without a broadcast.
"""
from __future__ import annotations

import math

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype

from backends.mindspore_auto.parallel_config import ParallelConfig
from backends.mindspore_auto.strategies import layer_placement, operator_strategies, stage_plan
from backends.mindspore_auto.weights import load_initial_weights
from common.spec import BertSpec, CnnSpec

# Added to the scores of keys a query may not read (padding; in the decoder, later positions): exp() of it is
# exactly 0 in float32.
MASK_BIAS = -1e9


class Sharder:
    """Hands out primitives with their strategy applied when the layout partitions operators."""

    def __init__(self, strategies: dict, apply: bool):
        self.strategies, self.apply = strategies, apply

    def __call__(self, name: str, primitive):
        return primitive.shard(self.strategies[name]) if self.apply else primitive


def placeholder(shape, value: float = 0.0) -> Tensor:
    """A parameter's value until weights.py loads the shared initial weights into it."""
    return Tensor(np.full(shape, value, np.float32))


class Linear(nn.Cell):
    """y = x W^T + b with W stored [out, in], as strategies.py's `_linear` expects; bias None: y = x W^T."""

    def __init__(self, weight: Tensor, bias: Tensor | None, shard: Sharder, name: str):
        super().__init__()
        self.weight = Parameter(weight, name="weight")
        self.matmul = shard(f"{name}.matmul", ops.MatMul(transpose_b=True))
        self.bias = None if bias is None else Parameter(bias, name="bias")
        self.add = None if bias is None else shard(f"{name}.bias", ops.Add())

    def construct(self, x):
        y = self.matmul(x, self.weight)
        return y if self.bias is None else self.add(y, self.bias)


class LayerNorm(nn.Cell):
    def __init__(self, size: int, eps: float, shard: Sharder, name: str):
        super().__init__()
        self.gamma = Parameter(placeholder((size,), 1.0), name="gamma")
        self.beta = Parameter(placeholder((size,)), name="beta")
        self.norm = shard(name, ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=eps))

    def construct(self, x):
        return self.norm(x, self.gamma, self.beta)[0]


def _linear(fin: int, fout: int, shard: Sharder, name: str, bias: bool = True) -> Linear:
    return Linear(placeholder((fout, fin)), placeholder((fout,)) if bias else None, shard, name)


class ScaledDotProduct(nn.Cell):
    """softmax(q k^T / sqrt(head_dim) + bias) v on [batch, heads, rows, head_dim], head-parallel (strategies.py's
    `_head_parallel_attention`); the bias is 0 where a query may read a key and MASK_BIAS where it may not."""

    def __init__(self, head_dim: int, shard: Sharder):
        super().__init__()
        self.scores = shard("attention.scores", ops.BatchMatMul(transpose_b=True))
        self.scale = shard("attention.scale", ops.Mul())
        self.add_mask = shard("attention.add_mask", ops.Add())
        self.softmax = shard("attention.softmax", ops.Softmax(axis=-1))
        self.context = shard("attention.context", ops.BatchMatMul())
        self.inv_sqrt_d = Tensor(1.0 / math.sqrt(head_dim), mstype.float32)

    def construct(self, q, k, v, bias):
        return self.context(self.softmax(self.add_mask(self.scale(self.scores(q, k), self.inv_sqrt_d), bias)), v)


# ----------------------------------------------------------------------------- CNN


class ConvBlock(nn.Cell):
    def __init__(self, cin: int, cout: int, pool: bool, spec: CnnSpec, shard: Sharder, name: str):
        super().__init__()
        self.weight = Parameter(placeholder((cout, cin, spec.kernel, spec.kernel)), name="weight")
        self.bias = Parameter(placeholder((cout,)), name="bias")
        self.conv = shard(f"{name}.conv", ops.Conv2D(cout, spec.kernel, pad_mode="valid"))
        self.bias_add = shard(f"{name}.bias", ops.BiasAdd())
        # MindSpore's momentum weighs the running statistic, torch's the new batch statistic.
        self.norm = nn.BatchNorm2d(cout, eps=spec.bn_eps, momentum=1.0 - spec.bn_momentum)
        self.relu = shard(f"{name}.relu", ops.ReLU())
        self.pool = nn.MaxPool2d(2, 2) if pool else nn.Identity()

    def construct(self, x):
        return self.pool(self.relu(self.norm(self.bias_add(self.conv(x, self.weight), self.bias))))


class _Apply(nn.Cell):
    """A primitive as a cell, so that it shares its layer's pipeline stage."""

    def __init__(self, primitive):
        super().__init__()
        self.primitive = primitive

    def construct(self, x):
        return self.primitive(x)


class SimpleCNN(nn.Cell):
    def __init__(self, spec: CnnSpec, shard: Sharder):
        super().__init__()
        blocks, cin = [], spec.in_channels
        for i, (cout, pool) in enumerate(zip(spec.conv_channels, spec.pool_after)):
            blocks.append(ConvBlock(cin, cout, pool, spec, shard, f"conv{i}"))
            cin = cout
        self.blocks = nn.CellList(blocks)
        dims = (spec.flat_features, *spec.fc_sizes)
        self.hidden = nn.CellList([
            nn.SequentialCell([_linear(fin, fout, shard, f"fc{i}"),
                               _Apply(shard(f"fc{i}.relu", ops.ReLU()))])
            for i, (fin, fout) in enumerate(zip(dims, dims[1:]))])
        self.classifier = _linear(dims[-1], spec.num_classes, shard, f"fc{len(dims) - 1}")
        self.expand = ops.ExpandDims()
        self.flat_features = spec.flat_features

    def construct(self, image):
        """image [B, 28, 28] in [0, 1] -> logits [B, 10]."""
        x = self.expand(image, 1)
        for block in self.blocks:
            x = block(x)
        x = x.reshape((x.shape[0], self.flat_features))
        for layer in self.hidden:
            x = layer(x)
        return self.classifier(x)

    def stage_parts(self) -> dict[str, nn.Cell]:
        parts = {f"conv{i}": block for i, block in enumerate(self.blocks)}
        parts.update({f"fc{i}": layer for i, layer in enumerate(self.hidden)})
        parts[f"fc{len(self.hidden)}"] = self.classifier
        return parts


# ----------------------------------------------------------------------------- BERT MLM


class Embeddings(nn.Cell):
    def __init__(self, spec: BertSpec, shard: Sharder):
        super().__init__()
        h = spec.hidden
        self.token_table = Parameter(placeholder((spec.vocab_size, h)), name="token_table")
        self.position_table = Parameter(placeholder((spec.seq_len, h)), name="position_table")
        self.segment_table = Parameter(placeholder((spec.type_vocab_size, h)), name="segment_table")
        self.gather = shard("embedding.token", ops.Gather())
        self.add_position = shard("embedding.add_position", ops.Add())
        self.add_segment = shard("embedding.add_segment", ops.Add())
        self.norm = LayerNorm(h, spec.layer_norm_eps, shard, "embedding.norm")

    def construct(self, input_ids):
        x = self.gather(self.token_table, input_ids, 0)
        x = self.add_position(x, self.position_table)
        # One segment: every token has type 0.
        x = self.add_segment(x, self.segment_table[0])
        return self.norm(x)


class EncoderLayer(nn.Cell):
    """Post-LN block on [B*S, H] rows: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, spec: BertSpec, shard: Sharder):
        super().__init__()
        h, i = spec.hidden, spec.intermediate

        def linear(fin, fout, name):
            return _linear(fin, fout, shard, name)

        self.heads, self.head_dim = spec.heads, spec.head_dim
        self.query, self.key, self.value = (linear(h, h, f"attention.{p}") for p in ("query", "key", "value"))
        self.split_q, self.split_k, self.split_v = (shard("attention.split_heads", ops.Transpose())
                                                    for _ in range(3))
        self.attend = ScaledDotProduct(spec.head_dim, shard)
        self.merge_heads = shard("attention.merge_heads", ops.Transpose())
        self.output = linear(h, h, "attention.output")
        self.attention_residual = shard("attention.residual", ops.Add())
        self.attention_norm = LayerNorm(h, spec.layer_norm_eps, shard, "attention.norm")
        self.ffn_in = linear(h, i, "ffn.in")
        self.gelu = shard("ffn.gelu", ops.GeLU())  # MindSpore's GeLU is the tanh approximation the spec asks for
        self.ffn_out = linear(i, h, "ffn.out")
        self.ffn_residual = shard("ffn.residual", ops.Add())
        self.ffn_norm = LayerNorm(h, spec.layer_norm_eps, shard, "ffn.norm")

    def _heads(self, x, batch, seq, transpose):
        return transpose(x.reshape((batch, seq, self.heads, self.head_dim)), (0, 2, 1, 3))

    def construct(self, x, mask_bias, batch: int, seq: int):
        q = self._heads(self.query(x), batch, seq, self.split_q)
        k = self._heads(self.key(x), batch, seq, self.split_k)
        v = self._heads(self.value(x), batch, seq, self.split_v)
        ctx = self.merge_heads(self.attend(q, k, v, mask_bias), (0, 2, 1, 3))
        ctx = ctx.reshape((batch * seq, self.heads * self.head_dim))
        x = self.attention_norm(self.attention_residual(x, self.output(ctx)))
        return self.ffn_norm(self.ffn_residual(x, self.ffn_out(self.gelu(self.ffn_in(x)))))


class MaskedLMHead(nn.Cell):
    """Dense + exact GELU + LN at the gathered positions, then the decoder tied to the token table."""

    def __init__(self, spec: BertSpec, shard: Sharder):
        super().__init__()
        h = spec.hidden
        self.seq_len = spec.seq_len
        self.one_hot = shard("head.one_hot", ops.OneHot())
        self.gather = shard("head.gather", ops.BatchMatMul())
        self.dense = _linear(h, h, shard, "head.dense")
        self.erf = shard("head.gelu", ops.Erf())  # exact GELU, as keras-hub's MaskedLMHead
        self.norm = LayerNorm(h, spec.layer_norm_eps, shard, "head.norm")
        self.decoder = shard("head.decoder.matmul", ops.MatMul(transpose_b=True))
        self.add_bias = shard("head.decoder.bias", ops.Add())
        self.bias = Parameter(placeholder((spec.vocab_size,)), name="bias")
        self.on, self.off = Tensor(1.0, mstype.float32), Tensor(0.0, mstype.float32)

    def construct(self, x, mask_positions, token_table):
        """x [B, S, H], mask_positions [B, P] -> logits [B*P, vocab]."""
        select = self.one_hot(mask_positions, self.seq_len, self.on, self.off)   # [B, P, S]
        picked = self.gather(select, x)                                           # [B, P, H]
        picked = picked.reshape((-1, picked.shape[-1]))
        h = self.dense(picked)
        h = self.norm(h * 0.5 * (1.0 + self.erf(h * (1.0 / math.sqrt(2.0)))))
        return self.add_bias(self.decoder(h, token_table), self.bias)


class BertMLM(nn.Cell):
    def __init__(self, spec: BertSpec, shard: Sharder):
        super().__init__()
        self.embedding = Embeddings(spec, shard)
        self.layers = nn.CellList([EncoderLayer(spec, shard) for _ in range(spec.layers)])
        self.head = MaskedLMHead(spec, shard)
        self.attention_mask = shard("attention.mask", ops.Mul())
        self.mask_fill = Tensor(np.full((1, 1, 1, 1), MASK_BIAS, np.float32))

    def construct(self, input_ids, padding_mask, mask_positions):
        """-> logits [B*P, vocab] at the P gathered mask positions only."""
        batch, seq = input_ids.shape
        x = self.embedding(input_ids)
        hidden = x.shape[-1]
        # [B, 1, 1, S]: 0 for real keys, MASK_BIAS for padding.
        keep = padding_mask.astype(mstype.float32).reshape((batch, 1, 1, seq))
        mask_bias = self.attention_mask(1.0 - keep, self.mask_fill)
        x = x.reshape((batch * seq, hidden))
        for layer in self.layers:
            x = layer(x, mask_bias, batch, seq)
        return self.head(x.reshape((batch, seq, hidden)), mask_positions, self.embedding.token_table)

    def stage_parts(self) -> dict[str, nn.Cell]:
        parts = {"embedding": self.embedding, "head": self.head}
        parts.update({f"layers.{i}": layer for i, layer in enumerate(self.layers)})
        return parts


# ----------------------------------------------------------------------------- decoder LM
# The cells carry the canonical names of common.initial_weights (embeddings.token, layers.{i}.attention.wq.weight,
# head.output.weight...), so weights.py maps every name to itself. Activations are [B*S, H] rows, as the MLM's.


class RMSNorm(nn.Cell):
    """x / sqrt(mean(x^2) + eps) * gamma over the last axis (torch.nn.RMSNorm), from primitives: MindSpore's
    RmsNorm has no CPU kernel."""

    def __init__(self, size: int, eps: float, shard: Sharder, name: str):
        super().__init__()
        self.gamma = Parameter(placeholder((size,), 1.0), name="gamma")
        self.square = shard(f"{name}.square", ops.Square())
        self.mean = shard(f"{name}.mean", ops.ReduceMean(keep_dims=True))
        self.add_eps = shard(f"{name}.add_eps", ops.Add())
        self.rsqrt = shard(f"{name}.rsqrt", ops.Rsqrt())
        self.normalize = shard(f"{name}.normalize", ops.Mul())
        self.scale = shard(f"{name}.scale", ops.Mul())
        self.eps = Tensor(eps, mstype.float32)

    def construct(self, x):
        inverse_rms = self.rsqrt(self.add_eps(self.mean(self.square(x), -1), self.eps))
        return self.scale(self.normalize(x, inverse_rms), self.gamma)


def rotary_tables(head_dim: int, seq_len: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [seq_len, head_dim] in the rotate-half layout, frequency j driving dimensions j and
    j + head_dim / 2, in float32 as backends/torch_common/models.py computes them."""
    inverse = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    angles = np.outer(np.arange(seq_len, dtype=np.float32), inverse)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def causal_bias(seq_len: int, group: int) -> np.ndarray:
    """[group x seq_len, seq_len]: 0 where a query (row q, position q mod seq_len) may read key k (k <= its
    position), MASK_BIAS after it; one block per query head of a key/value head's group (CausalAttention)."""
    later = np.triu(np.ones((seq_len, seq_len), bool), k=1)
    return np.tile(np.where(later, MASK_BIAS, 0.0).astype(np.float32), (group, 1))


class Rotary(nn.Cell):
    """x [B, heads, S, head_dim] turned by position: x cos + (-x2, x1) sin, x1 and x2 its halves."""

    def __init__(self, cos: Tensor, sin: Tensor, shard: Sharder):
        super().__init__()
        self.cos, self.sin = cos, sin
        self.halves = shard("attention.rotary.halves", ops.Split(axis=-1, output_num=2))
        self.negate = shard("attention.rotary.negate", ops.Neg())
        self.join = shard("attention.rotary.join", ops.Concat(axis=-1))
        self.turn_cos = shard("attention.rotary.cos", ops.Mul())
        self.turn_sin = shard("attention.rotary.sin", ops.Mul())
        self.add = shard("attention.rotary.add", ops.Add())

    def construct(self, x):
        first, second = self.halves(x)
        return self.add(self.turn_cos(x, self.cos), self.turn_sin(self.join((self.negate(second), first)), self.sin))


class CausalAttention(nn.Cell):
    """Causal grouped-query attention with rotary positions, no biases. Query head i reads key/value head
    i // group (torch's enable_gqa): the queries of one key/value head's group are folded into its rows,
    [B, kv_heads, group x S, head_dim], so one batched matmul serves the group without copying keys and values,
    and a split of the key/value heads over devices keeps each group whole."""

    def __init__(self, spec, shard: Sharder):
        super().__init__()
        h = spec.hidden
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        self.group = spec.heads // spec.kv_heads
        self.wq = _linear(h, spec.q_width, shard, "attention.wq", bias=False)
        self.wk = _linear(h, spec.kv_width, shard, "attention.wk", bias=False)
        self.wv = _linear(h, spec.kv_width, shard, "attention.wv", bias=False)
        self.split_q, self.split_k, self.split_v = (shard("attention.split_heads", ops.Transpose()) for _ in range(3))
        cos, sin = (Tensor(t) for t in rotary_tables(spec.head_dim, spec.seq_len, spec.rope_theta))
        self.rotate_q, self.rotate_k = Rotary(cos, sin, shard), Rotary(cos, sin, shard)
        self.attend = ScaledDotProduct(spec.head_dim, shard)
        self.merge_heads = shard("attention.merge_heads", ops.Transpose())
        self.wo = _linear(spec.q_width, h, shard, "attention.wo", bias=False)
        self.causal_bias = Tensor(causal_bias(spec.seq_len, self.group))

    def _heads(self, x, heads: int, batch: int, seq: int, transpose):
        return transpose(x.reshape((batch, seq, heads, self.head_dim)), (0, 2, 1, 3))

    def construct(self, x, batch: int, seq: int):
        q = self.rotate_q(self._heads(self.wq(x), self.heads, batch, seq, self.split_q))
        k = self.rotate_k(self._heads(self.wk(x), self.kv_heads, batch, seq, self.split_k))
        v = self._heads(self.wv(x), self.kv_heads, batch, seq, self.split_v)
        q = q.reshape((batch, self.kv_heads, self.group * seq, self.head_dim))
        ctx = self.attend(q, k, v, self.causal_bias).reshape((batch, self.heads, seq, self.head_dim))
        return self.wo(self.merge_heads(ctx, (0, 2, 1, 3)).reshape((batch * seq, self.heads * self.head_dim)))


class SwiGLU(nn.Cell):
    """w2(silu(w1 x) * w3 x): w1 the gate, w3 the up projection; silu(g) = g sigmoid(g)."""

    def __init__(self, spec, shard: Sharder):
        super().__init__()
        self.w1 = _linear(spec.hidden, spec.ffn, shard, "ffn.w1", bias=False)
        self.w3 = _linear(spec.hidden, spec.ffn, shard, "ffn.w3", bias=False)
        self.w2 = _linear(spec.ffn, spec.hidden, shard, "ffn.w2", bias=False)
        self.sigmoid = shard("ffn.sigmoid", ops.Sigmoid())
        self.silu = shard("ffn.silu", ops.Mul())
        self.gate = shard("ffn.gate", ops.Mul())

    def construct(self, x):
        g = self.w1(x)
        return self.w2(self.gate(self.silu(g, self.sigmoid(g)), self.w3(x)))


class DecoderLayer(nn.Cell):
    """Pre-norm Llama block: x = x + attention(RMSNorm(x)); x = x + ffn(RMSNorm(x))."""

    def __init__(self, spec, shard: Sharder):
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden, spec.norm_eps, shard, "attention_norm")
        self.attention = CausalAttention(spec, shard)
        self.attention_residual = shard("attention.residual", ops.Add())
        self.ffn_norm = RMSNorm(spec.hidden, spec.norm_eps, shard, "ffn_norm")
        self.ffn = SwiGLU(spec, shard)
        self.ffn_residual = shard("ffn.residual", ops.Add())

    def construct(self, x, batch: int, seq: int):
        x = self.attention_residual(x, self.attention(self.attention_norm(x), batch, seq))
        return self.ffn_residual(x, self.ffn(self.ffn_norm(x)))


class TokenEmbedding(nn.Cell):
    def __init__(self, spec, shard: Sharder):
        super().__init__()
        self.token = Parameter(placeholder((spec.vocab, spec.hidden)), name="token")
        self.gather = shard("embedding.token", ops.Gather())

    def construct(self, input_ids):
        return self.gather(self.token, input_ids, 0)


class DecoderHead(nn.Cell):
    """The final RMSNorm and the untied output layer: logits at every position."""

    def __init__(self, spec, shard: Sharder):
        super().__init__()
        self.norm = RMSNorm(spec.hidden, spec.norm_eps, shard, "head.norm")
        self.output = _linear(spec.hidden, spec.vocab, shard, "head.output", bias=False)

    def construct(self, x):
        return self.output(self.norm(x))


class DecoderLM(nn.Cell):
    """The lm workload's Llama-style decoder (backends/torch_common/models.py's DecoderLM in MindSpore) on rows of
    spec.seq_len tokens, the length its rotary tables and causal bias are built for."""

    def __init__(self, spec, shard: Sharder):
        super().__init__()
        self.embeddings = TokenEmbedding(spec, shard)
        self.layers = nn.CellList([DecoderLayer(spec, shard) for _ in range(spec.layers)])
        self.head = DecoderHead(spec, shard)

    def construct(self, input_ids):
        """-> logits [B*S, vocab] at every position."""
        batch, seq = input_ids.shape
        x = self.embeddings(input_ids)
        x = x.reshape((batch * seq, x.shape[-1]))
        for layer in self.layers:
            x = layer(x, batch, seq)
        return self.head(x)

    def stage_parts(self) -> dict[str, nn.Cell]:
        parts = {"embedding": self.embeddings, "head": self.head}
        parts.update({f"layers.{i}": layer for i, layer in enumerate(self.layers)})
        return parts


# ----------------------------------------------------------------------------- loss


class CrossEntropy(nn.Cell):
    """Weighted sums of per-row cross-entropy and of correct predictions, from primitives so the
    class dimension can stay split. A row is correct when its label's logit is the row maximum."""

    def __init__(self, classes: int, shard: Sharder):
        super().__init__()
        self.classes = classes
        self.max = shard("loss.max", ops.ReduceMax(keep_dims=True))
        self.shift = shard("loss.shift", ops.Sub())
        self.exp = shard("loss.exp", ops.Exp())
        self.sum_exp = shard("loss.sum_exp", ops.ReduceSum(keep_dims=True))
        self.log = shard("loss.log", ops.Log())
        self.one_hot = shard("loss.one_hot", ops.OneHot())
        self.pick = shard("loss.pick", ops.Mul())
        self.picked = shard("loss.picked", ops.ReduceSum(keep_dims=True))
        self.on, self.off = Tensor(1.0, mstype.float32), Tensor(0.0, mstype.float32)

    def construct(self, logits, labels, weights):
        shifted = self.shift(logits, ops.stop_gradient(self.max(logits, -1)))
        log_sum_exp = self.log(self.sum_exp(self.exp(shifted), -1))
        picked = self.picked(self.pick(shifted, self.one_hot(labels, self.classes, self.on, self.off)), -1)
        per_row = (log_sum_exp - picked).reshape((-1,))
        correct = (picked.reshape((-1,)) >= 0).astype(mstype.float32)
        return (per_row * weights).sum(), (correct * weights).sum()


class CnnLoss(nn.Cell):
    """(image, label, weight) -> (weighted loss sum, weighted correct); weight 0 marks padding rows."""

    def __init__(self, model: SimpleCNN, spec: CnnSpec, shard: Sharder):
        super().__init__()
        self.model, self.loss = model, CrossEntropy(spec.num_classes, shard)

    def construct(self, image, label, weight):
        return self.loss(self.model(image), label, weight)


class MlmLoss(nn.Cell):
    def __init__(self, model: BertMLM, spec: BertSpec, shard: Sharder):
        super().__init__()
        self.model, self.loss = model, CrossEntropy(spec.vocab_size, shard)

    def construct(self, input_ids, padding_mask, mask_positions, mask_ids, mask_weights):
        logits = self.model(input_ids, padding_mask, mask_positions)
        return self.loss(logits, mask_ids.reshape((-1,)), mask_weights.reshape((-1,)))


class LmLoss(nn.Cell):
    """The next-token loss at every position, weighted by label_weights (0 where the label is padding)."""

    def __init__(self, model: DecoderLM, spec, shard: Sharder):
        super().__init__()
        self.model, self.loss = model, CrossEntropy(spec.vocab, shard)

    def construct(self, input_ids, labels, label_weights):
        return self.loss(self.model(input_ids), labels.reshape((-1,)), label_weights.reshape((-1,)))


# The batch columns each loss cell takes, in order, the weights last (the CNN's weight column is added by the
# trainer).
INPUT_COLUMNS = {
    "cnn": ("image", "label", "weight"),
    "mlm": ("input_ids", "padding_mask", "mask_positions", "mask_ids", "mask_weights"),
    "lm": ("input_ids", "labels", "label_weights"),
}
# Each workload's model and loss cells.
NETS = {"cnn": (SimpleCNN, CnnLoss), "mlm": (BertMLM, MlmLoss), "lm": (DecoderLM, LmLoss)}


def _place(model, loss: nn.Cell, workload: str, spec, cfg: ParallelConfig) -> None:
    """Pipeline stage, gradient fusion group and recompute per layer, as the tutorial's config does."""
    stages = stage_plan(workload, cfg, spec)
    parts = model.stage_parts()
    layer_names = [n for n in stages if n.startswith(("layers.", "conv", "fc"))]
    for i, name in enumerate(layer_names):
        cell = parts[name]
        cell.set_comm_fusion(layer_placement(i, len(layer_names), cfg).fusion_group)
        if cfg.recompute:
            cell.recompute()
    if cfg.pipeline_stage > 1:
        for name, stage in stages.items():
            parts[name].pipeline_stage = stage
        loss.loss.pipeline_stage = cfg.pipeline_stage - 1
        if workload == "mlm":
            # The tied decoder reads the token table on the last stage as well.
            model.embedding.token_table.add_pipeline_stage(cfg.pipeline_stage - 1)


def build_loss_net(workload: str, spec, cfg: ParallelConfig, weights: dict[str, np.ndarray]) -> nn.Cell:
    """The model, holding `weights` (common.initial_weights), wrapped in its loss, sharded and placed for `cfg`."""
    shard = Sharder(operator_strategies(workload, cfg, spec), apply=cfg.mode != "data")
    model_cell, loss_cell = NETS[workload]
    model = model_cell(spec, shard)
    loss = loss_cell(model, spec, shard)
    load_initial_weights(model, spec, weights)
    _place(model, loss, workload, spec, cfg)
    return loss


def param_count(net: nn.Cell) -> int:
    return sum(int(np.prod(p.shape)) for p in net.trainable_params())
