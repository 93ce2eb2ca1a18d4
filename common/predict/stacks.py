"""The software that runs a decoder's step as the GPU model sees it, one entry per stack a published point ran,
each figure read off that stack's code."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from common.layout import Layout
from common.predict.decoder import DecoderSpec
from common.predict.memory import EAGER_LOGIT_BYTES


@dataclass(frozen=True)
class Float8:
    """Float8 training as a stack runs it (tensorwise dynamic scaling: torchao's Float8Linear, Transformer Engine's
    current scaling): every layer's Linear on the compute table's fp8 rates, the output layer in bf16, and the
    memory-bound casts around them, in bytes per element (docs/prediction-at-scale.md, "Float8")."""
    cast_bytes: float        # bf16 read, fp8 written; its amax fused into the kernel that produced the tensor
    amax_bytes: float        # an amax of its own (a weight's: nothing produced it in the step)
    transpose_bytes: float   # an fp8 tensor copied column-major for a GEMM's operand (read 1, write 1)
    gather_bytes: float      # per weight element FSDP gathers, per activation element tensor parallelism gathers
    scale_bytes: float       # per element of a weight's shard, once a step: its amax read (and its cast, where the
                             # weights are kept in fp8)
    kernels_forward: int     # cast kernels per layer forward (the inputs' casts)
    source: str
    # The cast writes the column-major copy beside the row-major one (Transformer Engine's cast_transpose: 1 B more,
    # no copy kernel); a tensor tensor parallelism gathers after its cast is still copied after the gather.
    transpose_in_cast: bool = False
    # The attention output's and every output gradient's amax read by a kernel of their own (amax_bytes) before
    # their cast (Transformer Engine's current scaling: nothing that produced them computes it); False: every
    # amax fused into the kernel that produced the tensor.
    amax_unfused: bool = False
    # The weights kept in fp8 (fp8 primary weights): none cast or copied column-major per micro-batch; each cast
    # once a step from its master shard (scale_bytes) and copied column-major once a step; the distributed
    # optimizer (zero1) gathers them in fp8 as FSDP does.
    weights_in_fp8: bool = False


@dataclass(frozen=True)
class ContextParallel:
    """Attention over context-parallel ranks as torch's context_parallel runs it (torchtitan's rotate method
    "allgather"): K and V all-gathered once, after the first step's attention, their gradients passed on round the
    ring in float32, one flash-attention call a step (cp steps, each 1/cp of a rank's causal attention under the
    round-robin load balance) and the steps' outputs merged in float32 by eager kernels. Bytes per element of the
    rank's attention output (q wide) or of its K and V, at the rank that merges every step whole (the last;
    docs/prediction-at-scale.md, "Context parallelism")."""
    kv_repeated: bool           # K and V reach the attention expanded to every query head (torchtitan's repeat_kv)
    grad_bytes: float           # per K or V element of the gradient passed on each step
    merge_once: float           # per output element: the first block to float32, the result back to bf16
    merge_step: float           # per output element, each later step: merged into the float32 running output
    send_copy: float            # per K or V element, each step but the last: cat'ed into the buffer it sends
    grad_once: float            # per q, K or V element: the float32 accumulators zeroed, cast back to bf16
    grad_q_step: float          # per q element, each step: the block's query gradient added in float32
    grad_kv_first: float        # per K or V element, the first step: added in float32, cat'ed into the send buffer
    grad_kv_step: float         # per K or V element, each later step: likewise, half of it added
    kernels_forward: int        # eager kernels each later step merges and sends with
    kernels_backward: int       # eager kernels each step accumulates and sends with
    source: str


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
    grad_reduce_bytes: float = 4.0          # per gradient element reduced (all-reduce or reduce-scatter): float32
    logit_live_bytes: float = EAGER_LOGIT_BYTES   # what the loss holds per logit at its peak (memory)
    elementwise_formula: str = ""           # _megatron_te & co. in words, for the constants table
    # With tensor-parallel communication overlapped (tpo): the GEMMs the overlap cuts into chunks along the
    # tokens, by name (a forward GEMM's, or its ".dgrad"), "tp" for one chunk per tensor-parallel rank or a count.
    tp_overlap_split: tuple[tuple[str, str], ...] = ()
    tp_overlap_source: str = ""
    # FSDP under a pipeline: whether a layer is gathered again for its backward (resharded after its forward);
    # False: the stage's layers held gathered through the step, their gradients reduced after the last micro-batch.
    fsdp_reshard_under_pp: bool = True
    # What the stack does not run as a layout names it: (the test on the layout, why), read off its code.
    refuses: tuple[tuple[Callable[[Layout], bool], str], ...] = ()
    float8: Float8 | None = None            # Float8 training; None: every GEMM in bf16
    # Context parallelism: torch's context_parallel; None: a ring (K and V passed on cp - 1 times, each behind one
    # step's attention, the merge inside the attention kernels: Transformer Engine's p2p).
    context_parallel: ContextParallel | None = None
    # Context parallel alone shards the parameters with FSDP over the cp ranks (torchtitan's dp_shard_cp mesh);
    # False: the cp ranks hold them as the data-parallel replicas do.
    fsdp_over_cp: bool = False
    # The stack builds OLMo 2's blocks (QK-norm, the norm on each branch's output) and its elementwise work counts
    # them; False: a model with either is refused rather than timed as a Llama block.
    olmo2_blocks: bool = False

    def check_model(self, spec: DecoderSpec) -> None:
        """ValueError in one line for a model whose blocks this stack does not build."""
        if (spec.qk_norm or spec.norm_position != "input") and not self.olmo2_blocks:
            raise ValueError(f"{spec.name}: {self.name} does not build OLMo 2's blocks (QK-norm, the norm on each "
                             "branch's output); the olmo-core stacks do")

    def check(self, layout: Layout) -> None:
        """ValueError in one line for a layout this stack does not run."""
        why = self.refusal(layout)
        if why:
            raise ValueError(f"{layout.name}: {why}")

    def refusal(self, layout: Layout) -> str | None:
        """Why this stack does not run `layout` (None: it does), without the layout's name."""
        for refused, why in self.refuses:     # first: a stack without tensor parallelism says so, not tpo's words
            if refused(layout):
                return f"{self.name} does not run it: {why}"
        if layout.tp_overlap and not self.tp_overlap_split:   # the grammar takes tpo with tp only
            return (f"{self.name} cannot overlap tensor-parallel communication (tpo): torch's async TP needs "
                    "torch.compile (--stack torch-compile)")
        return None


def _megatron_te(spec: DecoderSpec) -> tuple[float, float]:
    # LayerNorm x 2 (read, write: 4h each), bias-dropout-add x 2 (read two, write one: 6h each); FFN: bias-GELU
    # or a ReLU (4f) or SwiGLU (reads gate and up, writes one: 6f).
    ffn = 6 * spec.ffn if spec.ffn_kind == "swiglu" else 4 * spec.ffn
    return 2 * 4 * spec.hidden + 2 * 6 * spec.hidden, ffn


def _megatron_core(spec: DecoderSpec) -> tuple[float, float]:
    # Megatron-Core's layer as _megatron_te's, with RoPE fused (apply_rope_fusion: TE's fused_apply_rotary_pos_emb
    # reads and writes Q and K once, 4 bytes per element).
    wide, narrow = _megatron_te(spec)
    return wide, narrow + (4 * (spec.q_width + spec.kv_width) if spec.position == "rope" else 0)


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
    # OLMo 2's blocks (OLMo-core's, compiled per block as torchtitan's): the reordered norm normalises each
    # branch's output and adds the residual in one kernel (reads both, writes the sum: 6h, no normalised copy);
    # QK-norm's sum of squares reads Q and K once (2(q + kv)), its scaling folded into RoPE's pass; eager, an
    # RMSNorm over Q and K as over the hidden state (36 per element).
    h, q, kv, f = spec.hidden, spec.q_width, spec.kv_width, spec.ffn
    norm_per_element = 36 if spec.norm == "rmsnorm" else 4
    norm = norm_per_element * h
    if compiled:
        wide = 2 * (6 if spec.norm_position == "output" else 8) * h
    else:
        wide = 2 * norm + 2 * 6 * h
    rope = (4 if compiled else 20) * (q + kv) if spec.position == "rope" else 0
    qk_norm = (2 if compiled else norm_per_element) * (q + kv) if spec.qk_norm else 0
    repeat = 2 * (2 * kv + 2 * q) if spec.kv_heads != spec.heads else 0
    ffn = (6 if compiled else 10) * f if spec.ffn_kind == "swiglu" else 4 * f
    return wide, rope + qk_norm + repeat + 4 * q + ffn


def _mpt(spec: DecoderSpec, unpadded: bool = True) -> tuple[float, float]:
    # llm-foundry's MPTBlock.forward in eager torch 2.1 under bf16 autocast, the residual stream in bf16 (FSDP's
    # param_dtype): low_precision_layernorm x 2 (LPLayerNorm: F.layer_norm on the bf16 input, one kernel: 4h each),
    # the residual adds x + resid_dropout(b) (resid_pdrop 0.0: the identity; 6h each); each Linear's bias added in
    # its GEMM (F.linear: addmm, cuBLASLt's bias epilogue); GELU (approximate 'none': 4f), or a gated FFN's
    # (MPTGLU) act(gate) (4f) times up (6f). attn_impl flash (flash_attn_fn): flash-attn's bert_padding unpads Q,
    # K and V (index_first_axis, a gather each: 4(q + 2kv)) and pads the output back (index_put_first_axis: zeros,
    # then index_put: 6q); attn_impl triton takes Q, K, V and gives the output as views (no copy).
    h, q, kv, f = spec.hidden, spec.q_width, spec.kv_width, spec.ffn
    ffn = 10 * f if spec.ffn_kind == "swiglu" else 4 * f
    return 2 * 4 * h + 2 * 6 * h, ffn + (4 * (q + 2 * kv) + 6 * q if unpadded else 0)


# torch's context parallelism as torchtitan 9dec370 runs it (train.py create_context_parallel_ctx, config_manager.py
# --experimental.context_parallel_rotate_method default "allgather"), read in torch's
# torch/distributed/tensor/experimental/_attention.py at pytorch 0123248a (the published runs' torch 1963fc8 not at
# hand; the rotaters, the merger and the backward loop read the same in the torch-2.5-era copy read beside it).
TORCH_CONTEXT_PARALLEL = ContextParallel(
    kv_repeated=True, grad_bytes=4.0, merge_once=12.0, merge_step=38.0, send_copy=4.0, grad_once=10.0,
    grad_q_step=10.0, grad_kv_first=18.0, grad_kv_step=21.0, kernels_forward=11, kernels_backward=7,
    source="torch/distributed/tensor/experimental/_attention.py (pytorch 0123248a): _templated_ring_attention "
           "with _AllGatherRotater (one all_gather_tensor of the cat'ed K and V, issued with the first step's "
           "attention and waited for at the second), _cp_options convert_to_f32 and enable_load_balance (round "
           "robin: each step 1/cp of the rank's causal attention); _SDPAMerger in float32 (block to float32 2 + "
           "4; out - block 4 + 4 + 4; sigmoid(lse difference) x that 4 + 4; out - product 4 + 4 + 4: 38 B a "
           "step; the result to bf16 4 + 2); the "
           "K and V cat'ed into a send buffer every step but the last (2 + 2); _templated_ring_attention_backward: "
           "the float32 accumulators zeroed (4) and cast back (4 + 2), the query gradient added each step (4 + 2 "
           "+ 4), K's and V's added whole at the first step (4 + 2 + 4), in half at each later one through "
           "_partial_update's cat (5 + 8), and cat'ed into the buffer _AllToAllRotater passes on (4 + 4); the K "
           "and V all-gathered again and cat'ed as forward; the gradients passed on every step in float32, the "
           "last waited for after the loop; counted at the rank that runs every step whole (the last: i <= rank). "
           "Kernels: a later step's merge 11 (two casts, the lse's five, the output's three, the K and V cat), "
           "a step's accumulation 7. torchtitan's repeat_kv expands K and V to every query head before the "
           "attention")
# torchtitan 9dec370 (torchtitan/parallelisms/parallelize_llama.py, parallel_dims.py): what it runs.
TORCHTITAN_REFUSES = (
    (lambda layout: layout.zero1, "torchtitan 9dec370 has no ZeRO-1: it shards with FSDP2 (fsdp)"),
    (lambda layout: layout.dp > 1 and layout.fsdp == 1 and layout.devices > layout.dp,
     "torchtitan 9dec370 replicates with DDP only alone (\"DDP has not supported > 1D parallelism\"): shard "
     "with fsdp"),
    (lambda layout: layout.tp > 1 and not layout.sp, "torchtitan's tensor-parallel plan always splits the norms "
     "over the sequence (SequenceParallel): name it with sp"),
    (lambda layout: layout.zero2 and layout.pp == 1, "torchtitan 9dec370 reshards each block after its forward "
     "unless it pipelines (apply_fsdp: reshard_after_forward = not pp_enabled): no ZeRO-2 without pp"),
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
           "F.scaled_dot_product_attention (FLASH_ATTENTION backend on H100 in torch of 2024-12: cuDNN attention not "
           "chosen by default, pytorch/pytorch#142132 on 2.6.0.dev20241204), "
           "cross_entropy on float32 logits (6 + 8 forward, 22 backward per logit), foreach AdamW "
           "(optimizer.fused false: lerp, mul, addcmul, sqrt, div, add, addcdiv, weight decay: 80 B) and "
           "foreach clipping (12 B); FSDP2 (torch 1963fc8, read in torch 2.6.0's fsdp/_fully_shard/"
           "_fsdp_collectives.py): the all-gather copy-out split_with_sizes_copy on the compute stream (2 + 2 per "
           "gathered element) and the reduce-scatter copy-in chunk_cat to float32 (2 + 4), no pre- or post-divide "
           "(ReduceOp.AVG in float32), for each block per micro-batch and for the root unit (embedding, final "
           "norm, output layer: fully_shard(model), not resharded after its forward) once a step; left out: the "
           "all-gather copy-in (the float32 shard cast to bf16 and copied into the gather's buffer, 10 B per "
           "element of the 1/N shard, on the copy-in stream beside the compute) and the last block kept gathered "
           "into the backward (apply_fsdp: one gather fewer, 0.4 ms at 8B)",
    # parallelize_llama.apply_fsdp: reshard_after_forward = not pp_enabled ("to avoid per-microbatch all-gathers");
    # torch's pipelining (torch 2.6 PipelineStage.backward_maybe_with_nosync, torch of 2024-12-23 for the published
    # runs) sets reshard_after_backward and requires_gradient_sync False for every micro-batch's backward and runs
    # FSDP's post_backward (the reduce-scatters) for every layer after the last one's
    fsdp_reshard_under_pp=False,
    # parallelize_llama: apply_fsdp over world_mesh["dp_shard_cp"] when dp_shard or cp is enabled
    context_parallel=TORCH_CONTEXT_PARALLEL, fsdp_over_cp=True,
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
# llm-foundry 5e85bd62d4ec (llmfoundry/models/mpt, scripts/train/train.py) on Composer v0.17.2 (composer/trainer/
# dist_strategy.py, mosaic_fsdp_utils.py SHARDING_MAP): what it runs.
LLM_FOUNDRY_REFUSES = (
    (lambda layout: layout.tp > 1 or layout.pp > 1 or layout.cp > 1,
     "llm-foundry 5e85bd62d4ec splits no model (no tensor, pipeline or context parallelism): Composer wraps it in "
     "torch FSDP only"),
    (lambda layout: layout.zero1, "Composer v0.17.2's FSDP has no ZeRO-1 (its sharding strategies: FULL_SHARD, "
     "SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2)"),
    (lambda layout: layout.dp > 1 and layout.fsdp == 1,
     "llm-foundry replicates through FSDP's NO_SHARD (an all-reduce per FSDP unit), not modelled: shard with fsdp"),
    (lambda layout: layout.recompute == "selective",
     "llm-foundry checkpoints whole MPT blocks (activation_checkpointing_fn: MPTBlock): recompute full (rc) or none"),
)
LLM_FOUNDRY = Stack(
    "llm-foundry", "MosaicML llm-foundry's MPT on Composer and torch FSDP (FSDP1), attn_impl flash (flash-attn 2)",
    attention_kernel="fa2", fused_projections=True, elementwise=_mpt, elementwise_kernels=25,
    # The backward's memory-bound bytes, op by op: LayerNorm's input gradient (dy, x, dx: 6h) and weight gradient
    # (dy, x: 4h) x 2; the two gradients of x summed where it forks to the norm and the residual (6h) x 2; GELU's
    # (6f); pad_input's gather (4q); unpad_input's zeros + scatter (6(q + 2kv)); Wqkv's split joined (cat: 4(q +
    # 2kv)); the four bias gradients, sums over the tokens of each output gradient (2(q + 2kv) + 2h + 2f + 2h):
    # 76h + 8f at MPT's MHA, 2.0 x the forward's 38h + 4f at MPT's f = 4h.
    # Not counted (the model has no term for a host sync): unpad_input's max().item() at every attention call and
    # DecoupledAdamW's state_steps[i].item() at every parameter. selective: refused (whole blocks checkpointed).
    backward_factor=2.0, logit_bytes=6.0, selective="attention", optimizer_bytes=92.0,
    fsdp_gather_copy_bytes=0.0, fsdp_scatter_copy_bytes=18.0,
    elementwise_formula="20h + 4f (GELU) or 10f (MPTGLU) + 4(q + 2kv) (unpad Q, K, V) + 6q (pad the output)",
    source="llm-foundry 5e85bd62d4ec (the H100 large-scale table: scripts/train/benchmarking/sweep.py --attn_impl "
           "flash for 1b, 3b, 7b, 70b; submit_benchmarks.py: pip '.[gpu-flash2]' (flash-attn 2.4.2), torch 2.1.0, "
           "norm_type low_precision_layernorm, FSDP mixed_precision DEFAULT as mod_parameters' default): MPTBlock "
           "(llmfoundry/models/layers/blocks.py, norm.py LPLayerNorm, ffn.py MPTMLP GELU), attention.py flash_attn_fn "
           "(Wqkv one GEMM; flash_attn_varlen_func between bert_padding's unpad and pad), no torch.compile "
           "(train.py compile_config unset); ComposerMPTCausalLM loss_fn fused_crossentropy: flash-attn 2.4.2's "
           "Triton cross entropy on the bf16 logits (reads them: 2; backward reads them and writes their gradient: "
           "2 + 2); pretrain yamls' decoupled_adamw, weight_decay 0.0: Composer v0.17.2 DecoupledAdamW.adamw, one "
           "parameter at a time (exp_avg mul_ 8 + add_ 12, exp_avg_sq mul_ 8 + addcmul_ 12, sqrt 8, / 8, add_ eps "
           "8, param addcdiv_ 16: 80 B) and gradient_clipping norm: FSDP.clip_grad_norm_ (norms 4, mul_ 8: 12 B); "
           "torch 2.1 FSDP1 (Composer's FSDP, use_orig_params True): the all-gather lands in the FlatParameter, "
           "its parameters views of it (no copy-out; the shard's cast to bf16, 6 B per element of the 1/N shard, "
           "left out), the gradient joined into the FlatParameter's (split's backward, a cat: 2 + 2), cast to "
           "reduce_dtype float32 (2 + 4) and pre-divided (div_: 4 + 4): 18 B per element reduce-scattered; "
           "activation_checkpointing: Composer's checkpoint_wrapper (NO_REENTRANT, the yamls' "
           "activation_checkpointing_reentrant false) on each MPTBlock, its forward run again whole",
    refuses=LLM_FOUNDRY_REFUSES)
# attn_impl triton (submit_benchmarks.py's default): MPT's own Triton flash attention, the rest as attn_impl flash.
LLM_FOUNDRY_TRITON = replace(
    LLM_FOUNDRY, name="llm-foundry-triton",
    description="llm-foundry's MPT as llm-foundry, attn_impl triton (MPT's Triton flash attention)",
    attention_kernel="mpt_triton", elementwise=lambda spec: _mpt(spec, unpadded=False), elementwise_kernels=5,
    # The backward as attn_impl flash's less the padding: 54h + 8f at MPT's MHA, over the forward's 20h + 4f.
    backward_factor=86 / 36, elementwise_formula="20h + 4f (GELU) or 10f (MPTGLU)",
    source="llm-foundry v0.3.0 (the runs of scripts/train/benchmarking/sweep.sh at b2a43a1477a4: submit_benchmarks."
           "py's --attn_impl default triton, git_branch v0.3.0, pip '.[gpu]': flash-attn 1.0.9, xentropy-cuda-lib, "
           "triton-pre-mlir) and 5e85bd62d4ec (sweep.py --attn_impl triton for 13b and 30b): attention.py "
           "triton_flash_attn_fn, flash_attn_triton.py (FlashAttention in Triton, copied from flash-attention "
           "eff9fe6b onto triton-pre-mlir; Q, K, V taken as strided views, no copy); fused cross entropy 2 + 2 + 2 "
           "per logit either way (xentropy's CUDA kernel at v0.3.0); otherwise as llm-foundry")
# torchtitan --float8.enable_float8_linear (torchtitan/float8.py Float8Handler at 9dec370, under torch.compile as
# its docs/float8.md asks, with that page's --float8.enable_fsdp_float8_all_gather and
# --float8.precompute_float8_dynamic_scale_for_fsdp): torchao eab345c's Float8Linear on every Linear but `output`.
TORCHAO_FLOAT8 = Float8(
    cast_bytes=3.0, amax_bytes=2.0, transpose_bytes=2.0, gather_bytes=1.0, scale_bytes=4.0,
    kernels_forward=4,
    source="torchao eab345c torchao/float8: float8_linear.py (tensorwise dynamic scaling: "
           "manual_float8_matmul_with_args_in_float8 saves the fp8 input and weight; the input cast once a "
           "tensor however many Linears read it, torch.compile's CSE, PrepareFloat8ModuleInput under tensor "
           "parallelism; the output gradient cast by NoopFwToFloat8BwDynamic), float8_ops.py preprocess_addmm "
           "(_scaled_mm takes a row-major first and a column-major second operand: the weight for the input "
           "gradient, the output gradient and the input for the weight gradient copied, 1 + 1 B), "
           "roofline_utils.py (the same bytes: amax fused into the producer for inputs and output gradients, "
           "5 B per element with torch.compile's extra fp8 read, pytorch#130015), fsdp_utils.py "
           "WeightWithDynamicFloat8CastTensor (the gathered fp8 weight copied out, 1 + 1 B; left out as torch-eager's "
           "bf16 copy-in is: the fp32 shard cast to fp8 before each all-gather, beside the compute), "
           "float8_tensor_parallel.py "
           "(Float8ColwiseParallel gathers its input in fp8, Float8RowwiseParallel the output gradient; "
           "reduce-scatters in bf16), precompute_float8_dynamic_scale_for_fsdp after the optimizer step "
           "(torch._foreach_norm of every shard, 4 B, then one all-reduce of the amaxes)")
TORCH_COMPILE_FLOAT8 = replace(
    TORCH_COMPILE, name="torch-compile-float8",
    description="torch-compile with torchao's Float8 training (torchtitan --float8.enable_float8_linear, float8 "
                "FSDP all-gather, precomputed scales)",
    float8=TORCHAO_FLOAT8,
    source="torchtitan 9dec370 torchtitan/float8.py and docs/float8.md (its command: "
           "--float8.enable_float8_linear --float8.enable_fsdp_float8_all_gather "
           "--float8.precompute_float8_dynamic_scale_for_fsdp), convert_to_float8_training with "
           "module_filter_fn fqn != 'output'; otherwise as torch-compile")
# Transformer Engine 2.9's Float8CurrentScaling (the "tensorwise" recipe Megatron-Bridge's fp8_cs names), read in
# NVIDIA/TransformerEngine release v2.9 (70f5366).
TE_CURRENT_SCALING = Float8(
    cast_bytes=3.0, amax_bytes=2.0, transpose_bytes=2.0, gather_bytes=1.0, scale_bytes=9.0, kernels_forward=5,
    transpose_in_cast=True, amax_unfused=True, weights_in_fp8=True,
    source="TransformerEngine v2.9: pytorch/csrc/quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl (the "
           "amax by nvte_compute_amax, 2 B, then the cast, 2 + 1, writing the column-major copy beside it when "
           "the backward needs it: cast_transpose, 1 B), csrc/extensions/normalization.cpp and activation.cpp "
           "(FUSED_NORM_AMAX_FP8, FUSED_ACTIVATION_AMAX_FP8: the norm's and the activation's amax in their own "
           "kernels; the attention output's and the output gradients' by compute_amax), module/linear.py and "
           "layernorm_linear.py (with sequence parallelism the input cast before the all-gather, in fp8, its "
           "column-major copy after it: 1 + 1); tensor/utils.py _cast_master_weights_to_fp8_current_scaling "
           "(fp8 primary weights: after the optimizer each master shard's amax, 4, the amaxes all-reduced over the "
           "data-parallel group, the shard cast, 4 + 1; the transpose caches reset, made again at their next use, "
           "once a step); Megatron-Core's distributed optimizer gathers the fp8 weights (fp8_param_gather)")
MEGATRON_BRIDGE_FP8_CS = replace(
    MEGATRON_TE, name="megatron-bridge-fp8-cs",
    description="Megatron-Bridge's performance recipes (NeMo 25.11: Megatron-Core 0.15, Transformer Engine 2.9) in "
                "FP8 with current scaling",
    elementwise=lambda spec: _megatron_core(spec), float8=TE_CURRENT_SCALING, grad_reduce_bytes=2.0,
    logit_bytes=10.0, elementwise_formula="20h + 4f (GELU) or 6f (SwiGLU) + 4(q + kv) (RoPE); h-wide part / tp "
                                          "under sp",
    tp_overlap_split=tuple((g, "tp") for g in ("qkv", "fc1", "wo.dgrad", "w2.dgrad", "wo", "w2")),
    tp_overlap_source="Megatron-Bridge v0.2.1 src/megatron/bridge/training/comm_overlap.py "
                      "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192 and userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_"
                      "seqlen8192 (the H100 FP8 recipes' configs): ring exchange, one chunk per rank, for qkv_fprop, "
                      "fc1_fprop, proj_fprop, fc2_fprop, proj_dgrad and fc2_dgrad; bulk for the other dgrads and "
                      "wgrads",
    source="Megatron-Bridge v0.2.1 (2025-12-09; pyproject: megatron-core 0.15, transformer-engine 2.9): "
           "scripts/performance/configs/llama3 and llama31 (llama3_70b_h100_config, llama31_405b_h100_config: "
           "precision fp8_cs, get_precision_config: bf16_with_fp8_current_scaling_mixed, fp8 'hybrid' recipe "
           "'tensorwise', fp8_param_gather True, first_last_layers_bf16 False), utils/helpers.py "
           "(set_workload_base_configs: sequence_parallel when tp > 1; set_common_perf_overrides: "
           "apply_rope_fusion, cross_entropy_fusion_impl 'te'), set_llama3_common_configs and "
           "set_llama31_common_configs (ddp.grad_reduce_in_fp32 False: gradients reduced in bf16), "
           "src/megatron/bridge/recipes/llama/llama3.py _llama3_common (distributed optimizer, overlap_grad_reduce, "
           "overlap_param_gather, tp_comm_overlap, no recomputation); TransformerEngine v2.9 "
           "pytorch/triton/cross_entropy.py (online_softmax_kernel reads the bf16 logits, 2; cross_entropy_kernel "
           "reads them again and writes their gradient in place, 2 + 2; backward element_mul_kernel by "
           "Megatron's per-token loss gradient, 2 + 2: 10 B a logit); RoPE by TE's fused_apply_rotary_pos_emb "
           "(Q and K read and written once: 4(q + kv)); otherwise Megatron-Core's fused layer as megatron-te "
           "(TE LayerNormLinear, bias-free dropout-add, SwiGLU fusion), not re-read at 0.15",
    refuses=((lambda layout: layout.fsdp > 1, "Megatron-FSDP (Megatron-Bridge's use_megatron_fsdp: "
              "optim_grads_params sharding, double buffers) is not described"),))
# OLMo-core e27ba7455 (2024-11-05: src/olmo_core/nn/transformer/model.py, config.py, train/trainer.py,
# internal/experiment.py) on its nightly image (Makefile: torch 2.6.0.dev20241009, torchao 0.5.0): what it runs.
OLMO_CORE_REFUSES = (
    (lambda layout: layout.tp > 1 or layout.pp > 1 or layout.cp > 1,
     "OLMo-core e27ba7455 splits no model (TransformerConfig.build applies FSDP2 or DDP only)"),
    (lambda layout: layout.zero1, "OLMo-core e27ba7455 has no ZeRO-1: it shards with FSDP2 (fsdp)"),
    (lambda layout: layout.zero2, "OLMo-core e27ba7455 reshards every block but the last after its forward "
     "(Transformer.apply_fsdp): no ZeRO-2"),
    (lambda layout: layout.dp > 1 and layout.fsdp == 1,
     "OLMo-core's DDP (torch's replicate, bucket_cap_mb 100) is not described: shard with fsdp"),
)
OLMO_CORE = replace(
    TORCH_COMPILE, name="olmo-core",
    description="OLMo-core: each block compiled (torch.compile), FSDP2, SDPA flash attention, fused AdamW, the "
                "loss compiled",
    # the compiled loss keeps the bf16 logits and writes their gradient in bf16: no float32 copy is held
    elementwise_kernels=8, logit_bytes=8.0, logit_live_bytes=4.0, optimizer_bytes=40.0, olmo2_blocks=True,
    # nothing of torchtitan's tensor or context parallelism: OLMo-core e27ba7455 runs neither (OLMO_CORE_REFUSES)
    tp_overlap_split=(), tp_overlap_source="", context_parallel=None, fsdp_over_cp=False,
    elementwise_formula="12h (norm on the branch's output + residual, OLMo 2) or 16h (pre-norm) + 4(q + kv) "
                        "(RoPE) + 2(q + kv) (QK-norm's sum of squares) + 4(kv + q) (repeat_interleave, GQA) + 4q "
                        "+ 6f (SwiGLU)",
    source="OLMo-core e27ba7455: TransformerConfig.llama_like (compile=True: use_flash False, SDPA on H100's "
           "FLASH_ATTENTION backend, the torch of 2024-10 as torchtitan's torch-compile; Q, K, V and the SwiGLU's "
           "gate and up separate nn.Linear; GQA's K and V repeat_interleave'd to every head before SDPA; the "
           "output transpose().contiguous()), Transformer.apply_compile (each block torch.compile'd, "
           "fullgraph=False), apply_fsdp (fully_shard each block, reshard_after_forward but the last, then the "
           "root: adapted from torchtitan 90c889e, whose FSDP2 copies torch-eager counts), trainer.py "
           "train_batch (rank_microbatch_size: every micro-batch's backward reduce-scatters, FSDP2's gradient "
           "sync left on), compile_loss: torch.compile'd cross_entropy_loss with z-loss (logits.float(), "
           "F.cross_entropy, logsumexp: Inductor's two passes over the bf16 logits, 2 + 2, the softmax "
           "recomputed in the backward from them and the saved log-sum-exp, 2, the gradient written in bf16, 2: "
           "8 B a logit), AdamWConfig fused=True: torch's _fused_adamw_ (param, grad, exp_avg, exp_avg_sq read, "
           "16, param and moments written, 12: 28 B) and GradClipperCallback's nn.utils.clip_grad_norm_ (norms "
           "4, mul_ 8: 12 B). Its table's 7B, 8B and 13B rows were published (2024-09 to 41400c46f, 2024-11-01) "
           "while their scripts took OLMo-core's Triton fused loss (fused_loss=True) instead, the same micro-"
           "batches: a few bytes a logit, under 0.5% of their step",
    refuses=OLMO_CORE_REFUSES)
# --model.float8_config.enabled=true: olmo_core/float8.py Float8Config's defaults (dynamic scaling of input, weight
# and output gradient; enable_fsdp_float8_all_gather, precompute_float8_dynamic_scale_for_fsdp by the
# Float8HandlerCallback after each optimizer step), convert_to_float8_training with modules_to_ignore {"w_out"}:
# torchtitan's float8.py, whence it came, under torch.compile.
OLMO_CORE_FLOAT8 = replace(
    OLMO_CORE, name="olmo-core-float8",
    description="olmo-core with torchao's Float8 training (Float8Config: float8 FSDP all-gather, precomputed "
                "scales)",
    float8=replace(TORCHAO_FLOAT8, source="OLMo-core e27ba7455 olmo_core/float8.py (Float8Config defaults: "
                   "tensorwise dynamic scaling, Float8LinearConfig(enable_fsdp_float8_all_gather=True, "
                   "enable_pre_and_post_forward=False), precompute_float8_dynamic_scale_for_fsdp) on torchao "
                   "0.5.0 (the Makefile's TORCHAO_VERSION): the design torchtitan's torch-compile-float8 runs, "
                   "its bytes as read in torchao eab345c (" + TORCHAO_FLOAT8.source + ")"),
    source="OLMo-core e27ba7455 TransformerConfig.build (Float8 Linear layers but w_out, before compile and "
           "FSDP2), train/callbacks/float8_handler.py; otherwise as olmo-core")
STACKS = {s.name: s for s in (MEGATRON_TE, TORCH_EAGER, TORCH_COMPILE, TORCH_COMPILE_FLOAT8, LLM_FOUNDRY,
                              LLM_FOUNDRY_TRITON, MEGATRON_BRIDGE_FP8_CS, OLMO_CORE, OLMO_CORE_FLOAT8)}


def load(name: str) -> Stack:
    if name not in STACKS:
        raise ValueError(f"stack {name!r}: the model knows {', '.join(STACKS)}")
    return STACKS[name]
