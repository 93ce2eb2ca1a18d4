"""The software that runs a decoder's step as the GPU model sees it, one entry per stack a published point ran,
each figure read off that stack's code."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from common.layout import Layout
from common.predict.decoder import DecoderSpec


@dataclass(frozen=True)
class Stack:
    name: str
    description: str
    attention_kernel: str                   # a key of the compute table's [attention.*]
    fused_projections: bool                 # Q, K, V one GEMM; a SwiGLU's gate and up one GEMM
    # (h-wide bytes per token, the rest) of one layer's forward elementwise work, for a model
    elementwise: Callable[[DecoderSpec], tuple[float, float]]
    elementwise_kernels: int                # memory-bound kernels per layer forward (each at least the launch floor)
    backward_factor: float
    logit_bytes: float                      # bytes per logit of the loss, forward and backward
    selective: str                          # what selective recomputation recomputes: "attention" | "odd-mm"
    optimizer_bytes: float                  # per parameter element a rank updates (AdamW, clipping included)
    fsdp_gather_copy_bytes: float           # FSDP's copy-out per parameter element all-gathered (0: none)
    fsdp_scatter_copy_bytes: float          # FSDP's copy-in per gradient element reduce-scattered
    source: str
    elementwise_formula: str = ""           # _megatron_te & co. in words, for the constants table
    # With tensor-parallel communication overlapped (tpo): the GEMMs the overlap cuts into chunks along the
    # tokens, by name (a forward GEMM's, or its ".dgrad"), "tp" for one chunk per tensor-parallel rank or a count.
    tp_overlap_split: tuple[tuple[str, str], ...] = ()
    tp_overlap_source: str = ""
    # FSDP under a pipeline: whether a layer is gathered again for its backward (resharded after its forward).
    fsdp_reshard_under_pp: bool = True
    # What the stack does not run as a layout names it: (the test on the layout, why), read off its code.
    refuses: tuple[tuple[Callable[[Layout], bool], str], ...] = ()

    def check(self, layout: Layout) -> None:
        """ValueError in one line for a layout this stack does not run."""
        if layout.tp_overlap and not self.tp_overlap_split:   # the grammar takes tpo with tp only
            raise ValueError(f"{layout.name}: {self.name} cannot overlap tensor-parallel communication (tpo): "
                             "torch's async TP needs torch.compile (--stack torch-compile)")
        for refused, why in self.refuses:
            if refused(layout):
                raise ValueError(f"{layout.name}: {self.name} does not run it: {why}")


def _megatron_te(spec: DecoderSpec) -> tuple[float, float]:
    # LayerNorm x 2 (read, write: 4h each), bias-dropout-add x 2 (read two, write one: 6h each); FFN: bias-GELU
    # or a ReLU (4f) or SwiGLU (reads gate and up, writes one: 6f).
    ffn = 6 * spec.ffn if spec.ffn_kind == "swiglu" else 4 * spec.ffn
    return 2 * 4 * spec.hidden + 2 * 6 * spec.hidden, ffn


def _torchtitan(spec: DecoderSpec, compiled: bool = False) -> tuple[float, float]:
    # Eager: torchtitan's RMSNorm x.float() (2+4), pow (4+4), mean (4), x * rsqrt (4+4), type_as (4+2), * weight
    # (2+2): 36 bytes per element, twice; the residual adds 6h twice. RoPE on Q and K: float (2+4), complex
    # multiply (4+4), type_as (4+2): 20 per element; repeat_kv copies K and V to all heads (2 x (2kv + 2q));
    # the attention output's transpose().contiguous() copies it (4q); silu (4f) and the product with the up
    # projection (6f).
    # A LayerNorm model (GPT) takes torch's fused nn.LayerNorm instead: one kernel reading and writing (4h).
    # Compiled: torch.compile per block (Inductor fuses elementwise chains), residual add + RMSNorm one kernel each
    # (reads x and the branch, writes the sum and the normalised: 8h), RoPE one pass (4 per element), repeat_kv
    # and the transpose still materialised for the attention and output projection (extern kernels), SwiGLU's
    # silu x up one kernel (6f).
    h, q, kv, f = spec.hidden, spec.q_width, spec.kv_width, spec.ffn
    norm = 36 * h if spec.norm == "rmsnorm" else 4 * h
    wide = 2 * 8 * h if compiled else 2 * norm + 2 * 6 * h
    rope = (4 if compiled else 20) * (q + kv) if spec.position == "rope" else 0
    repeat = 2 * (2 * kv + 2 * q) if spec.kv_heads != spec.heads else 0
    ffn = (6 if compiled else 10) * f if spec.ffn_kind == "swiglu" else 4 * f
    return wide, rope + repeat + 4 * q + ffn


# torchtitan 9dec370 (torchtitan/parallelisms/parallelize_llama.py, parallel_dims.py): what it runs.
TORCHTITAN_REFUSES = (
    (lambda layout: layout.zero1, "torchtitan 9dec370 has no ZeRO-1: it shards with FSDP2 (fsdp)"),
    (lambda layout: layout.dp > 1 and layout.fsdp == 1 and layout.devices > layout.dp,
     "torchtitan 9dec370 replicates with DDP only alone (\"DDP has not supported > 1D parallelism\"): shard "
     "with fsdp"),
    (lambda layout: layout.tp > 1 and not layout.sp, "torchtitan's tensor-parallel plan always splits the norms "
     "over the sequence (SequenceParallel): name it with sp"),
    (lambda layout: layout.cp > 1, "torchtitan shards the parameters over the data and context-parallel ranks "
     "together (FSDP over dp_shard x cp): not modelled"),
)
MEGATRON_TE = Stack(
    "megatron-te", "Megatron-Core with Transformer Engine: fused kernels, cuDNN attention",
    attention_kernel="cudnn", fused_projections=True, elementwise=_megatron_te, elementwise_kernels=5,
    backward_factor=1.5, logit_bytes=20.0, selective="attention", optimizer_bytes=42.0,
    fsdp_gather_copy_bytes=0.0, fsdp_scatter_copy_bytes=0.0,
    elementwise_formula="20h + 4f (GELU) or 6f (SwiGLU); h-wide part / tp under sp",
    tp_overlap_split=(("qkv", "tp"), ("fc1", "tp"), ("wo.dgrad", "tp"), ("w2.dgrad", "tp"), ("wo", "4"),
                      ("w2", "4")),
    tp_overlap_source="TransformerEngine v1.8 pytorch/module/base.py initialize_ub defaults (Megatron "
                      "--tp-comm-overlap without a config file): ring_exchange (the GEMM in tp chunks) for "
                      "qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; pipeline with num_splits 4 for "
                      "proj_fprop, fc2_fprop; bulk (unsplit) for the other dgrads and wgrads",
    source="Megatron-LM core_r0.8.0: TE LayerNormLinear / bias-GELU / bias-dropout-add fusions "
           "(megatron/core/fusions), TEDotProductAttention (cuDNN fused attention on sm_90), vocab-parallel "
           "cross entropy in float32, distributed optimizer with TE/apex fused Adam (reads parameter, "
           "gradient and moments in float32, writes them and the bf16 copy: 30 B) and multi-tensor clipping "
           "(12 B)",
    refuses=((lambda layout: layout.fsdp > 1, "Megatron-LM core_r0.8.0 shards no parameters (its arguments have "
              "no FSDP; the distributed optimizer shards the optimizer state: zero1)"),))
TORCH_EAGER = Stack(
    "torch-eager", "PyTorch eager (torchtitan without torch.compile): FSDP2, SDPA flash attention",
    attention_kernel="torch_flash", fused_projections=False, elementwise=_torchtitan, elementwise_kernels=22,
    backward_factor=2.0, logit_bytes=36.0, selective="odd-mm", optimizer_bytes=92.0,
    fsdp_gather_copy_bytes=4.0, fsdp_scatter_copy_bytes=6.0,
    elementwise_formula="84h (RMSNorm; 20h LayerNorm) + 20(q + kv) (RoPE) + 4(kv + q) (repeat_kv) + 4q + 10f "
                        "(SwiGLU) or 4f",
    source="torchtitan 9dec370: models/llama/model.py, models/norms.py (RMSNorm in eager ops), "
           "F.scaled_dot_product_attention (FLASH_ATTENTION backend on H100 in torch of 2024-12), "
           "cross_entropy on float32 logits (6 + 8 forward, 22 backward per logit), foreach AdamW "
           "(optimizer.fused false: lerp, mul, addcmul, sqrt, div, add, addcdiv, weight decay: 80 B) and "
           "foreach clipping (12 B); FSDP2's all-gather copy-out (2 + 2 per gathered element) and "
           "reduce-scatter copy-in to float32 (2 + 4)",
    # parallelize_llama.apply_fsdp: reshard_after_forward = not pp_enabled ("to avoid per-microbatch all-gathers")
    fsdp_reshard_under_pp=False,
    refuses=TORCHTITAN_REFUSES)
# torch.compile changes the elementwise work only (and makes async TP possible); the rest is torch-eager's.
TORCH_COMPILE = replace(
    TORCH_EAGER, name="torch-compile",
    description="PyTorch with torch.compile per transformer block (torchtitan --training.compile)",
    elementwise=lambda spec: _torchtitan(spec, compiled=True), elementwise_kernels=7,
    elementwise_formula="16h + 4(q + kv) (RoPE) + 4(kv + q) (repeat_kv) + 4q + 6f (SwiGLU) or 4f",
    tp_overlap_split=tuple((g, "tp") for g in ("wq", "wk", "wv", "wo", "w1", "w3", "w2", "wq.dgrad", "wk.dgrad",
                                                 "wv.dgrad", "wo.dgrad", "w1.dgrad", "w3.dgrad", "w2.dgrad")),
    tp_overlap_source="torch async TP (torch/distributed/_symmetric_memory: fused_all_gather_matmul and "
                      "fused_matmul_reduce_scatter decompose each all-gather + matmul and matmul + reduce-scatter "
                      "into tp chunk matmuls; torchtitan needs torch.compile for it)",
    source="torchtitan 9dec370 parallelize_llama.apply_compile (each TransformerBlock compiled, the loss and "
           "optimizer not); otherwise as torch-eager")
STACKS = {s.name: s for s in (MEGATRON_TE, TORCH_EAGER, TORCH_COMPILE)}


def load(name: str) -> Stack:
    if name not in STACKS:
        raise ValueError(f"stack {name!r}: the model knows {', '.join(STACKS)}")
    return STACKS[name]
