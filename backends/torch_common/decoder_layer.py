"""One decoder layer of a bench.predict model (common/predict/decoder.py), written the way torchtitan's eager Llama
writes it (models/llama/model.py at 9dec370: RMSNorm in eager ops, RoPE through complex numbers, repeat_kv,
SDPA, SwiGLU; a GPT model's LayerNorm and GELU where the spec says so), timed forward and backward on one
device; and the rest of a rank's step the same way (the final norm, output layer and float32 loss; the
optimizer's step over a shard of the parameters): what bench.layer_check holds the model's prediction against.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from backends.torch_common.compute_probe import DTYPES, sdpa_backend
from common.predict.decoder import DecoderSpec


class RMSNorm(nn.Module):
    """torchtitan's eager RMSNorm: computed in float32, cast back, then scaled."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_frequencies(head_dim: int, seq: int, device, theta: float = 500000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    return torch.polar(torch.ones(seq, head_dim // 2, device=device), torch.outer(torch.arange(seq, device=device),
                                                                                  freqs).float())


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs[None, :, None, :]).flatten(3).type_as(x)


class DecoderLayer(nn.Module):
    def __init__(self, spec: DecoderSpec):
        super().__init__()
        h, d = spec.hidden, spec.head_dim
        self.spec = spec
        bias = spec.biases
        norm = RMSNorm if spec.norm == "rmsnorm" else nn.LayerNorm
        self.attention_norm, self.ffn_norm = norm(h), norm(h)
        self.wq, self.wk, self.wv = (nn.Linear(h, w, bias=bias) for w in (spec.q_width, spec.kv_width,
                                                                          spec.kv_width))
        self.wo = nn.Linear(spec.q_width, h, bias=bias)
        self.w1, self.w2 = nn.Linear(h, spec.ffn, bias=bias), nn.Linear(spec.ffn, h, bias=bias)
        self.w3 = nn.Linear(h, spec.ffn, bias=bias) if spec.ffn_kind == "swiglu" else None
        self.q_norm, self.k_norm = (norm(spec.q_width), norm(spec.kv_width)) if spec.qk_norm else (None, None)
        self.head_dim = d

    def attention(self, x, freqs):
        b, s, _ = x.shape
        spec = self.spec
        q, k = self.wq(x), self.wk(x)
        if self.q_norm is not None:   # OLMo 2: over the whole projection, before the heads are split
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, s, spec.heads, self.head_dim)
        k = k.view(b, s, spec.kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, spec.kv_heads, self.head_dim)
        if spec.position == "rope":
            q, k = apply_rope(q, freqs), apply_rope(k, freqs)
        repeats = spec.heads // spec.kv_heads
        if repeats > 1:  # torchtitan's repeat_kv: K and V copied out to every query head
            k, v = (t[:, :, :, None, :].expand(b, s, spec.kv_heads, repeats, self.head_dim)
                    .reshape(b, s, spec.heads, self.head_dim) for t in (k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))

    def feed_forward(self, x):
        if self.w3 is not None:
            return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))
        return self.w2(nn.functional.gelu(self.w1(x)))

    def forward(self, x, freqs):
        if self.spec.norm_position == "output":   # OLMo 2's reordered norm: each branch's output normalised
            h = x + self.attention_norm(self.attention(x, freqs))
            return h + self.ffn_norm(self.feed_forward(h))
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))


# torchtitan's op-level selective activation checkpointing (9dec370 parallelize_llama._apply_ac_to_transformer_block):
# the outputs of these ops are kept, every other one recomputed in the backward, except every second matmul.
def _saved_ops() -> set:
    ops = torch.ops.aten
    return {ops.mm.default, ops._scaled_dot_product_flash_attention.default,
            ops._scaled_dot_product_efficient_attention.default, ops._scaled_dot_product_cudnn_attention.default,
            ops.max.default}


def selective_context():
    """A fresh pair of checkpoint contexts under torchtitan's policy (a matmul count per forward and recompute)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    saved, counts = _saved_ops(), {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[mode] += 1
        keep = func in saved and not (func == torch.ops.aten.mm.default and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Checkpointed(nn.Module):
    """A layer whose activations are recomputed in the backward: all of them (`full`), or what torchtitan's
    selective policy does not keep (`selective`)."""

    def __init__(self, layer: nn.Module, recompute: str):
        super().__init__()
        self.layer, self.recompute = layer, recompute

    def forward(self, x, freqs):
        from torch.utils.checkpoint import checkpoint, noop_context_fn
        context = selective_context if self.recompute == "selective" else noop_context_fn
        return checkpoint(self.layer, x, freqs, use_reentrant=False, context_fn=context, preserve_rng_state=False)


def _sdpa(kernel: str):
    from torch.nn.attention import sdpa_kernel
    return sdpa_kernel(sdpa_backend(kernel))


def time_layer(spec: DecoderSpec, device: torch.device, precision: str, micro_batch: int, kernel: str,
               steps: int, compile: bool = False, recompute: str = "none") -> dict:
    """Forward and backward seconds of one layer on `micro_batch` sequences (median over `steps` after one
    untimed step, which compiles), the layer's weights in `precision` as FSDP's mixed precision computes with
    them; `compile`: the layer through torch.compile, as torchtitan's --training.compile compiles each block;
    `recompute`: none, selective (torchtitan's op policy) or full activation recomputation, applied before the
    compile as torchtitan applies it."""
    torch.manual_seed(0)
    dtype = DTYPES[precision]
    module = DecoderLayer(spec).to(device=device, dtype=dtype)
    layer = module if recompute == "none" else Checkpointed(module, recompute)
    layer = torch.compile(layer) if compile else layer
    x = torch.randn(micro_batch, spec.seq_len, spec.hidden, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    freqs = rope_frequencies(spec.head_dim, spec.seq_len, device)
    cuda = device.type == "cuda"
    def zero():
        for p in module.parameters():
            p.grad = None
        x.grad = None

    with _sdpa(kernel):
        forward, backward = _timed_steps(lambda: layer(x, freqs), lambda out: out.backward(grad), zero, steps, cuda)
    return {"forward_s": statistics.median(forward), "backward_s": statistics.median(backward),
            "forward_runs_s": forward, "backward_runs_s": backward, "compiled": compile, "recompute": recompute,
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None}


def _timed_steps(forward_fn, backward_fn, zero, steps: int, cuda: bool) -> tuple[list[float], list[float]]:
    """(forward, backward) seconds of each step after the first; on a GPU from CUDA events around each half."""
    forward, backward = [], []
    for step in range(steps + 1):
        zero()
        if cuda:
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            marks[0].record()
            out = forward_fn()
            marks[1].record()
            backward_fn(out)
            marks[2].record()
            marks[2].synchronize()
            fwd, bwd = marks[0].elapsed_time(marks[1]) / 1e3, marks[1].elapsed_time(marks[2]) / 1e3
        else:
            t0 = time.perf_counter()
            out = forward_fn()
            t1 = time.perf_counter()
            backward_fn(out)
            fwd, bwd = t1 - t0, time.perf_counter() - t1
        if step:
            forward.append(fwd)
            backward.append(bwd)
    return forward, backward


class Head(nn.Module):
    """torchtitan's last stage: the final norm, the untied output layer, and the loss over float32 logits
    (train.py: cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)))."""

    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.norm = RMSNorm(spec.hidden) if spec.norm == "rmsnorm" else nn.LayerNorm(spec.hidden)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)

    def forward(self, x, labels):
        logits = self.output(self.norm(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def time_head(spec: DecoderSpec, device: torch.device, precision: str, micro_batch: int, steps: int) -> dict:
    """Forward and backward seconds of the head and loss on `micro_batch` sequences (medians as time_layer's)."""
    torch.manual_seed(0)
    dtype = DTYPES[precision]
    head = Head(spec).to(device=device, dtype=dtype)
    x = torch.randn(micro_batch, spec.seq_len, spec.hidden, device=device, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, spec.vocab, (micro_batch, spec.seq_len), device=device)

    def zero():
        for p in head.parameters():
            p.grad = None
        x.grad = None

    forward, backward = _timed_steps(lambda: head(x, labels), lambda loss: loss.backward(), zero, steps,
                                     device.type == "cuda")
    return {"forward_s": statistics.median(forward), "backward_s": statistics.median(backward),
            "forward_runs_s": forward, "backward_runs_s": backward}


def time_optimizer(spec: DecoderSpec, device: torch.device, shards: int, steps: int) -> dict:
    """Seconds of one optimizer step over a rank's 1/`shards` of every parameter (float32, as FSDP2 keeps the
    sharded master weights): gradient-norm clipping and AdamW, both foreach, as torchtitan runs them
    (optimizer.fused false; clip_grad_norm_ with foreach)."""
    torch.manual_seed(0)
    sizes = [lin.inputs * lin.outputs for lin in spec.linears()] * spec.layers
    sizes += [lin.outputs for lin in spec.linears()] * spec.layers if spec.biases else []
    sizes += [spec.norm_params()] * (2 * spec.layers + 1) + [spec.embedding_params()]
    sizes += [] if spec.tied_embeddings else [spec.vocab * spec.hidden]
    params = [torch.randn(-(-n // shards), device=device, requires_grad=True) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, foreach=True)

    def step():
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        optimizer.step()

    # The step timed as a forward with nothing after it: _timed_steps' events and untimed first step.
    seconds, _ = _timed_steps(step, lambda _: None, lambda: None, steps, device.type == "cuda")
    return {"step_s": statistics.median(seconds), "runs_s": seconds, "elements": sum(p.numel() for p in params)}
