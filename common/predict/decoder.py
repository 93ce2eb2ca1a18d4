"""A decoder-only transformer (GPT-3, Megatron's GPT, Llama 3) described in a TOML file (models/README.md), and the
one set of formulas bench.predict uses for every size (docs/prediction-at-scale.md, "The models")."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path

from common.predict.hardware import tomllib
from common.spec import Gemm, Linear, attention_flops, linear_gemms

MODELS_DIR = Path(__file__).parent / "models"
FFN_KINDS = ("gelu", "relu", "swiglu")
POSITIONS = ("learned", "rope", "alibi")
NORM_POSITIONS = ("input", "output")


@dataclass(frozen=True)
class DecoderSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    ffn_kind: str
    vocab: int
    seq_len: int
    tied_embeddings: bool
    position: str = "rope"
    norm: str = "rmsnorm"
    biases: bool = False
    # Where each sublayer's norm sits: on its input (pre-norm: GPT, Llama) or on its output, inside the residual
    # branch (OLMo 2's reordered norm: h = x + norm(attention(x))); the final norm either way.
    norm_position: str = "input"
    # An RMSNorm over the whole Q and K projections' outputs before RoPE (OLMo 2's QK-norm), of q and kv width.
    qk_norm: bool = False
    # What a run that trains the model reads besides its shapes (the `lm` workload): the norms' epsilon, RoPE's
    # base wavelength and the initial weights' standard deviation (truncated at 2 std). Llama 3's by default.
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    init_stddev: float = 0.02
    description: str = ""
    source: str = ""
    path: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    # The layer's formulas below are kept on the spec once worked out (it is frozen): a plan asks for them for each
    # of some 10^5 layouts.
    def linears(self) -> tuple[Linear, ...]:
        """A layer's linear layers in forward order (torchtitan's and Megatron's modules, unfused)."""
        return self._linears

    @cached_property
    def _linears(self) -> tuple[Linear, ...]:
        h, f = self.hidden, self.ffn
        w3 = [Linear("w3", h, f, "column")] if self.ffn_kind == "swiglu" else []
        return (Linear("wq", h, self.q_width, "column"), Linear("wk", h, self.kv_width, "column"),
                Linear("wv", h, self.kv_width, "column"), Linear("wo", self.q_width, h, "row"),
                Linear("w1", h, f, "column"), *w3, Linear("w2", f, h, "row"))

    def norm_params(self) -> int:
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def linear_weights(self) -> int:
        """A layer's Linear weight elements (what a Float8 stack computes with in fp8)."""
        return self._linear_weights

    @cached_property
    def _linear_weights(self) -> int:
        return sum(lin.inputs * lin.outputs for lin in self.linears())

    def qk_norm_params(self) -> int:
        return (self.q_width + self.kv_width) * (2 if self.norm == "layernorm" else 1) if self.qk_norm else 0

    def layer_params(self) -> int:
        return self._layer_params

    @cached_property
    def _layer_params(self) -> int:
        weights = self.linear_weights()
        biases = sum(lin.outputs for lin in self.linears()) if self.biases else 0
        return weights + biases + 2 * self.norm_params() + self.qk_norm_params()

    def embedding_params(self) -> int:
        return self.vocab * self.hidden + (self.seq_len * self.hidden if self.position == "learned" else 0)

    def head_params(self) -> int:
        """The final norm and, untied, the output layer."""
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def param_count(self) -> int:
        return self.embedding_params() + self.layers * self.layer_params() + self.head_params()

    def layer_gemms(self, tokens: int, tp: int = 1, fused: bool = False) -> tuple[Gemm, ...]:
        """A layer's forward GEMMs on one tensor-parallel rank for `tokens` tokens; `fused`: Q, K and V as one GEMM
        and a SwiGLU's gate and up as one (Megatron's linear_qkv, linear_fc1), else torchtitan's one per module."""
        known = self._layer_gemms_known.get((tokens, tp, fused))
        if known is None:
            known = self._layer_gemms_known[(tokens, tp, fused)] = self._layer_gemms(tokens, tp, fused)
        return known

    @cached_property
    def _layer_gemms_known(self) -> dict[tuple[int, int, bool], tuple[Gemm, ...]]:
        return {}

    def _layer_gemms(self, tokens: int, tp: int, fused: bool) -> tuple[Gemm, ...]:
        lins = self.linears()
        if fused:
            by = {lin.name: lin for lin in lins}
            qkv = Linear("qkv", self.hidden, self.q_width + 2 * self.kv_width, "column")
            up = Linear("fc1", self.hidden, self.ffn * (2 if self.ffn_kind == "swiglu" else 1), "column")
            lins = (qkv, by["wo"], up, by["w2"])
        return tuple(linear_gemms(lins, tokens, tp))

    @staticmethod
    def backward_gemms(forward: Gemm) -> list[Gemm]:
        """The input gradient dX[m, k] = dY[m, n] W^T and the weight gradient dW[k, n] = X^T dY (over the tokens)."""
        return [Gemm(forward.name + ".dgrad", forward.m, forward.k, forward.n),
                Gemm(forward.name + ".wgrad", forward.k, forward.n, forward.m)]

    def head_gemm(self, tokens: int, tp: int = 1) -> Gemm:
        """The output layer's logits, the vocabulary split over tp (Megatron, torchtitan's loss parallel)."""
        return Gemm("output", tokens, self.vocab // tp, self.hidden)

    def gemms(self, samples: int) -> list[Gemm]:
        """Every forward GEMM of `samples` sequences (common.spec.forward_flops counts FLOPs from them)."""
        tokens = samples * self.seq_len
        return [*self.layers * self.layer_gemms(tokens), self.head_gemm(tokens)]

    def layer_forward_macs(self) -> int:
        """Per sequence, one layer: its GEMMs and causal attention's two products (a pipeline's stage costs)."""
        gemms = sum(g.flops for g in self.layer_gemms(self.seq_len))
        return int(gemms + attention_flops(self.seq_len, self.seq_len, self.q_width, causal=True)) // 2

    def head_forward_macs(self) -> int:
        """Per sequence: the output layer's logits at every position."""
        return int(self.head_gemm(self.seq_len).flops) // 2

    def attention_flops(self, samples: int, causal: bool = True) -> float:
        return self.layers * attention_flops(samples * self.seq_len, self.seq_len, self.q_width, causal)

    def stored_activation_bytes(self, tokens: int, tp: int = 1, sequence_parallel: bool = False,
                                flash: bool = True, dropout: bool = False, value_bytes: int = 2) -> float:
        """Bytes one layer keeps for its backward on one rank, for `tokens` tokens (sequences of seq_len),
        Korthikanti et al.'s accounting component by component (`value_bytes` per value: 16-bit on a GPU cluster,
        float32 in an fp32 run; 1-byte dropout masks)."""
        h, f, t, v, s = self.hidden, self.ffn, tp, value_bytes, self.seq_len
        shard = t if sequence_parallel else 1          # what sequence parallelism also splits
        per_token = 2 * v * h / shard                  # the two norms' inputs
        per_token += v * h / shard                     # the Q, K, V projections' input
        per_token += v * (self.q_width + 2 * self.kv_width) / t   # Q, K (scores) and V (context)
        if self.qk_norm:
            per_token += v * (self.q_width + self.kv_width) / t   # QK-norm's inputs
        if flash:
            per_token += 4 * self.heads / t            # the softmax's log-sum-exp, float32 per head
        else:
            per_token += (2 * v + (1 if dropout else 0)) * self.heads * s / t  # softmax out, its mask, dropped
        per_token += v * self.q_width / t              # the output projection's input (the context)
        per_token += v * h / shard                     # the FFN's input
        per_token += (4 if self.ffn_kind == "swiglu" else 2) * v * f / t   # GELU, ReLU: its input, fc2's input
        if dropout:                                    # SwiGLU: gate out, up out, silu(gate), the product
            per_token += 2 * h / shard                 # the two residual dropouts' masks
        return per_token * tokens


def available() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.toml"))


def load(name_or_file: str, seq_len: int | None = None) -> DecoderSpec:
    """A bundled model by name (models/<name>.toml) or a file of one's own, at `seq_len` tokens a sequence where
    given instead of its own; ValueError in one line."""
    path = MODELS_DIR / f"{name_or_file}.toml" if name_or_file in available() else Path(name_or_file)
    if not path.is_file():
        raise ValueError(f"--model {name_or_file}: no such file or bundled model (bundled: {', '.join(available())})")
    try:
        raw = tomllib.loads(path.read_text())
        unknown = sorted(set(raw) - {f.name for f in fields(DecoderSpec) if f.name != "path"})
        if unknown:
            raise KeyError(f"unknown keys {unknown}")
        spec = DecoderSpec(**raw, path=str(path))
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"--model {path}: {type(exc).__name__}: {exc} (format: {MODELS_DIR}/README.md)") from None
    problems = []
    if spec.ffn_kind not in FFN_KINDS:
        problems.append(f"ffn_kind {spec.ffn_kind!r} is not one of {', '.join(FFN_KINDS)}")
    if spec.hidden % spec.heads or spec.heads % spec.kv_heads:
        problems.append(f"hidden {spec.hidden}, heads {spec.heads}, kv_heads {spec.kv_heads} do not divide")
    if spec.position not in POSITIONS or spec.norm not in ("layernorm", "rmsnorm"):
        problems.append(f"position {spec.position!r} ({'|'.join(POSITIONS)}) or norm {spec.norm!r} "
                        "(layernorm|rmsnorm)")
    if spec.norm_position not in NORM_POSITIONS:
        problems.append(f"norm_position {spec.norm_position!r} is not one of {', '.join(NORM_POSITIONS)}")
    if problems:
        raise ValueError(f"--model {path}: {'; '.join(problems)}")
    return replace(spec, seq_len=seq_len) if seq_len else spec
