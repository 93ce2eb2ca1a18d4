"""The parallel layout of a run: one type for every backend that executes layouts and for the predictor and the
planner that reason about them (docs/layouts.md is its reference page).

Dimensions, in the spirit of torchtitan's ParallelDims: dp replicas (gradients all-reduced), fsdp shards
(parameters, gradients and optimizer state sharded; dp x fsdp is HSDP), tp (tensor parallel), pp (pipeline
stages), cp (context parallel). Ranks are laid out pp outermost, then dp, fsdp, cp, tp innermost (Megatron's and
torchtitan's mesh order): rank = ((((pp_i x dp + dp_i) x fsdp + fsdp_i) x cp + cp_i) x tp + tp_i.

Each option is declared once, in OPTIONS: its field, bench.run's flag, its default and help, and its word in a
layout's name (bench.compare --layouts dp2xtp2-rc). The command line, the flags a sweep passes on, the flags a
backend refuses by name and the names are all derived from it. A backend executes a subset (its registry entry's
`layouts`, backends/__init__.py) and refuses the rest in one line; the predictor refuses only what it cannot
model.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property

from common.errors import BadInput, Unsupported
from common.stage_split import AUTO, EVEN, even_split, layers_per_stage, parse_split

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
RANK_ORDER = ("pp", "dp", "fsdp", "cp", "tp")   # outermost first
# Words the grammar knows and refuses, whatever the model: not layouts parbench executes or models.
REFUSED = {
    "fp8": "fp8 is the software's, not the layout's: a stack that trains in float8 says it (bench.predict "
           "--stack torch-compile-float8, torchao's Float8 training)",
    "ep": "expert parallelism is not modelled: the bundled models are dense",
}


class Refused(ValueError):
    """A name the grammar does not say, or says and refuses, whatever the device count."""


@dataclass(frozen=True)
class LayoutOption:
    """One layout option: a dimension, a count, a choice, a switch or a free-form value."""
    field: str
    flag: str
    help: str
    default: int | str | bool
    choices: tuple[str, ...] = ()
    dim: str = ""      # a mesh dimension: its name part is <dim><N> (N >= 2)
    token: str = ""    # its word among a name's options: a count's prefix (nmb<K>) or the word that sets a switch
    words: tuple[tuple[str, str], ...] = ()   # a choice's words in a name: (word, value)
    needs: str = ""    # the dimension a name must have for the option to mean anything
    # A free-form value: its parser, ValueError for a bad one; in a name it follows its token, commas as '+'.
    parse: Callable[[str], str] | None = None

    @property
    def is_count(self) -> bool:
        return isinstance(self.default, int) and not isinstance(self.default, bool)

    def flag_for(self, value) -> str:
        """How a user types this value on bench.run's command line ("" for the default)."""
        if value == self.default:
            return ""
        if isinstance(self.default, bool):
            return self.flag if value else f"--no-{self.flag[2:]}"
        return f"{self.flag} {value}"

    def word_for(self, value) -> str:
        """This value's word in a layout name ("" where the name does not show it)."""
        if self.parse is not None:
            return f"{self.token}{str(value).replace(',', '+')}" if value != self.default else ""
        if self.is_count:
            return f"{self.token}{value}" if self.token and value != self.default else ""
        if self.words:
            return "" if value == self.default else dict((v, w) for w, v in self.words).get(value, "")
        return self.token if value and value != self.default else ""


_NEEDS_WHY = {"pp": "needs a pipeline (pp<N>)", "tp": "needs tensor parallelism (tp<N>)",
              "fsdp": "needs FSDP shards (fsdp<N>)"}

OPTIONS = (
    LayoutOption("fsdp", "--fsdp", "devices each FSDP group shards parameters, gradients and optimizer state over "
                 "(ZeRO-3); the data-parallel devices it leaves are replicas of the groups (HSDP)", 1, dim="fsdp"),
    LayoutOption("tp", "--model-parallel", "devices each layer is split over (tensor parallel)", 1, dim="tp"),
    LayoutOption("pp", "--pipeline-stages", "pipeline stages the layers are cut into", 1, dim="pp"),
    LayoutOption("cp", "--context-parallel", "devices each sequence is split over (context parallel, ring "
                 "attention)", 1, dim="cp"),
    LayoutOption("micro_batches", "--micro-batches", "the NUMBER of micro-batches per step on each data rank "
                 "(a pipeline's; without one they accumulate)", 1, token="nmb"),
    LayoutOption("micro_batch_size", "--micro-batch-size", "the SIZE of a micro-batch, samples per data rank "
                 "(instead of the number; 0: the number decides)", 0, token="mbs"),
    LayoutOption("schedule", "--pipeline-schedule", "pipeline schedule: all forwards then all backwards (gpipe), "
                 "one forward one backward (1f1b), or 1F1B over virtual stages (interleaved)", "gpipe",
                 choices=SCHEDULES, words=(("1f1b", "1f1b"), ("gpipe", "gpipe")), needs="pp"),
    LayoutOption("virtual_stages", "--virtual-stages", "model chunks per rank of an interleaved pipeline", 1,
                 token="vp", needs="pp"),
    LayoutOption("recompute", "--recompute", "activation recomputation in the backward pass, per layer: full "
                 "(every layer's forward again) or selective (the attention core, or the stack's op policy)",
                 "none", choices=RECOMPUTE, words=(("rc", "full"), ("sel", "selective"))),
    LayoutOption("sp", "--sequence-parallel", "sequence parallelism: the norms' and dropouts' activations split "
                 "over tp (all-gather + reduce-scatter instead of all-reduce)", False, token="sp", needs="tp"),
    LayoutOption("zero1", "--zero1", "shard the optimizer state over the data-parallel replicas (ZeRO-1, "
                 "Megatron's distributed optimizer)", False, token="zero1"),
    LayoutOption("zero2", "--zero2", "keep each FSDP unit's parameters whole from its forward through its backward "
                 "(ZeRO-2: gathered once a micro-batch, not again for the backward; torch FSDP's SHARD_GRAD_OP, "
                 "fully_shard's reshard_after_forward=False)", False, token="zero2", needs="fsdp"),
    LayoutOption("tp_overlap", "--tp-overlap", "overlap tensor-parallel communication with the GEMMs "
                 "(Megatron's --tp-comm-overlap, torchtitan's AsyncTP)", False, token="tpo", needs="tp"),
    LayoutOption("vocab_split", "--vocab-split", "split the token embedding (and a tied or output layer) over "
                 "the tensor-parallel devices by vocabulary rows, instead of replicating it", False,
                 token="vocab", needs="tp"),
    LayoutOption("stage_split", "--stage-split", "encoder layers per pipeline stage: even (the last stage takes "
                 "any remainder), auto (balanced by each stage's cost, common.stage_split, the embeddings and the "
                 "MLM head included) or a list, e.g. 3,1", EVEN, token="split", needs="pp", parse=parse_split),
)
OPTION = {o.field: o for o in OPTIONS}
NAME_ORDER = ("micro_batches", "micro_batch_size", "schedule", "virtual_stages", "recompute", "sp", "zero1",
              "zero2", "tp_overlap", "vocab_split", "stage_split")
_DIMENSION = re.compile(r"(fsdp|dp|tp|pp|cp)([0-9]*)")
# What a backend may execute, by name (its registry entry's `layouts`), and the option a user asked it with.
FEATURES = ("tp", "pp", "fsdp", "hsdp", "cp", "micro_batches", "micro_batch_size", "1f1b", "interleaved",
            "recompute", "selective", "sp", "zero1", "zero2", "tp_overlap", "vocab_split", "stage_split")


@dataclass(frozen=True)
class Layout:
    dp: int = 1                  # data-parallel replicas: gradients all-reduced between them
    fsdp: int = 1                # FSDP shards within a replica: parameters, gradients, optimizer state sharded
    tp: int = 1                  # --model-parallel
    pp: int = 1                  # --pipeline-stages
    cp: int = 1                  # --context-parallel
    micro_batches: int = 1       # the NUMBER of micro-batches per step on a data rank (1 where the size is given)
    micro_batch_size: int = 0    # the SIZE of a micro-batch, samples per data rank (0: the number decides)
    schedule: str = "gpipe"      # gpipe | 1f1b | interleaved
    virtual_stages: int = 1      # model chunks per rank, interleaved only
    recompute: str = "none"      # none | selective | full, per layer
    sp: bool = False
    zero1: bool = False
    zero2: bool = False          # FSDP's parameters kept whole from the forward through the backward
    tp_overlap: bool = False
    vocab_split: bool = False    # the token embedding (and tied/output layer) split by vocabulary over tp
    stage_split: str = EVEN      # --stage-split: even, auto or layers per stage ("3,1")

    @property
    def data(self) -> int:
        """Ranks that split the batch: replicas x shards."""
        return self.dp * self.fsdp

    @property
    def devices(self) -> int:
        return self.data * self.tp * self.pp * self.cp

    @property
    def splits_model(self) -> bool:
        return self.tp > 1 or self.pp > 1

    @property
    def sharded(self) -> bool:
        """Parameters, gradients and optimizer state sharded (FSDP or HSDP)."""
        return self.fsdp > 1

    @property
    def recomputes(self) -> bool:
        return self.recompute != "none"

    def micro_batches_at(self, global_batch: int) -> int:
        """Micro-batches per step on a data rank: the number given, or the batch over data ranks x the size."""
        if self.micro_batch_size:
            return global_batch // (self.data * self.micro_batch_size)
        return self.micro_batches

    def features(self) -> list[tuple[str, str]]:
        """What this layout asks of a backend beyond plain data parallelism: (FEATURES' name, the flag asked)."""
        asked = {"tp": self.tp > 1, "pp": self.pp > 1, "fsdp": self.fsdp > 1 and self.dp == 1,
                 "hsdp": self.fsdp > 1 and self.dp > 1, "cp": self.cp > 1, "micro_batches": self.micro_batches > 1,
                 "micro_batch_size": self.micro_batch_size > 0, "1f1b": self.schedule == "1f1b",
                 "interleaved": self.schedule == "interleaved" or self.virtual_stages > 1,
                 "recompute": self.recompute == "full", "selective": self.recompute == "selective",
                 "sp": self.sp, "zero1": self.zero1, "zero2": self.zero2, "tp_overlap": self.tp_overlap,
                 "vocab_split": self.vocab_split, "stage_split": self.stage_split != EVEN}
        field = {"hsdp": "fsdp", "1f1b": "schedule", "interleaved": "schedule", "selective": "recompute"}
        return [(f, OPTION[field.get(f, f)].flag_for(getattr(self, field.get(f, f))) or f"--{f}")
                for f in FEATURES if asked[f]]

    def non_default_flags(self) -> list[str]:
        """The layout flags beyond plain data parallelism, as the user typed them."""
        return [flag for o in OPTIONS if (flag := o.flag_for(getattr(self, o.field)))]

    def run_flags(self) -> list[str]:
        """bench.run's layout flags for this layout, as arguments (--devices is the caller's)."""
        return [token for flag in self.non_default_flags() for token in flag.split()]

    def accumulation(self, grad_accum: int = 1) -> int:
        """Micro-batches per optimizer step: --grad-accum times the layout's micro-batches (what a 1-device
        reference of this layout accumulates)."""
        return grad_accum * self.micro_batches

    @cached_property
    def name(self) -> str:
        """The canonical name: dimensions in the order dp, fsdp, tp, pp, cp, then the options that differ from
        the defaults in NAME_ORDER (a pipeline always says its micro-batches). One device is '1 device'. Kept once
        made (the layout is frozen): a plan sorts and refuses by name some 10^5 times."""
        dims = [f"{d}{getattr(self, d)}" for d in ("dp", "fsdp", "tp", "pp", "cp") if getattr(self, d) > 1]
        words = []
        for f in NAME_ORDER:
            value = getattr(self, f)
            if OPTION[f].needs and getattr(self, OPTION[f].needs) == 1:
                continue   # means nothing without its dimension (validate refuses it)
            if f == "micro_batches" and self.pp > 1 and not self.micro_batch_size:
                words.append(f"nmb{value}")
            else:   # an interleaved schedule has no word: its vp<V> says it
                words.append(OPTION[f].word_for(value))
        return "-".join(["x".join(dims) or "1 device", *(w for w in words if w)])

    @classmethod
    def parse(cls, entry: str, devices: int | None = None) -> Layout:
        """A layout name -> Layout; Refused (a ValueError, one line) for anything the grammar (docs/layouts.md)
        does not say. At a device count, a bare dp or fsdp takes the devices the other dimensions leave, and a
        name with neither takes them as dp; ValueError when the name cannot fill them. A pipeline given neither
        the number nor the size of its micro-batches runs 2 x its stages."""
        head, *words = entry.strip().split("-")
        values: dict[str, object] = {}
        bare = ""
        for part in head.split("x"):
            match = _DIMENSION.fullmatch(part)
            if not match:
                why = REFUSED.get(re.sub(r"[0-9]+$", "", part))
                raise Refused(f"{entry!r}: {why}" if why else
                              f"{entry!r}: {part!r} is not dp<N>, fsdp<N>, tp<N>, pp<N> or cp<N>")
            dim, size = match.groups()
            if dim in values or dim == bare:
                raise Refused(f"{entry!r}: the {dim} dimension is given twice")
            if not size:
                if dim not in ("dp", "fsdp") or bare:
                    raise Refused(f"{entry!r}: only one bare dp or fsdp may take the devices left")
                if devices is None:
                    raise Refused(f"{entry!r}: a bare {dim} takes the devices the others leave: it needs a device "
                                  "count (bench.predict and bench.plan give one; a sweep's layouts give sizes)")
                bare = dim
                continue
            values[dim] = _size(size, f"{dim} size", entry, 2)
        for word in words:
            field, value = _option_word(entry, word)
            if field in values and not (field == "schedule" and {values[field], value} == {"interleaved", "1f1b"}):
                raise Refused(f"{entry!r}: {word!r} repeats an option already given or contradicts one")
            option = OPTION[field]
            if option.needs and values.get(option.needs, 1) == 1 and bare != option.needs:
                raise Refused(f"{entry!r}: {word!r} {_NEEDS_WHY[option.needs]}")
            if field == "virtual_stages":
                if values.get("schedule") == "gpipe":
                    raise Refused(f"{entry!r}: vp<V> is interleaved 1F1B; it cannot be combined with gpipe")
                values["schedule"] = "interleaved"
            if not (field == "schedule" and values.get(field) == "interleaved"):
                values[field] = value
        if values.get("micro_batches", 1) > 1 and values.get("micro_batch_size"):
            raise Refused(f"{entry!r}: give the number of micro-batches (nmb<K>) or their size (mbs<B>), not both")
        if values.get("pp", 1) > 1 and "micro_batch_size" not in values:
            values.setdefault("micro_batches", 2 * values["pp"])
        layout = cls(**values)
        if devices is None:
            return layout
        taken = layout.devices
        if not bare and layout.data == 1 and taken < devices:
            bare = "dp"
        if bare:
            if devices % taken:
                raise ValueError(f"{entry!r} at {devices} devices: the other dimensions ({taken}) do not divide them")
            layout = replace(layout, **{bare: devices // taken})
        if layout.devices != devices:
            raise ValueError(f"{entry!r} uses {layout.devices} devices, not {devices}")
        return layout

    def validate(self, spec, global_batch: int, grad_accum: int = 1) -> None:
        """Raise BadInput naming the first combination that cannot be laid out for `spec` (common.spec's BERT or
        CNN, or a decoder, common.predict.decoder) at `global_batch`."""
        sizes = (self.dp, self.fsdp, self.tp, self.pp, self.cp, self.micro_batches, self.virtual_stages)
        if min(sizes) < 1 or self.micro_batch_size < 0:
            raise BadInput(f"parallel sizes must be >= 1: data {self.dp} x {self.fsdp}, model {self.tp}, pipeline "
                           f"{self.pp}, context {self.cp}, micro-batches {self.micro_batches}")
        for o in (OPTION["schedule"], OPTION["recompute"]):
            if getattr(self, o.field) not in o.choices:
                raise BadInput(f"{o.flag} {getattr(self, o.field)}: choose from {', '.join(o.choices)}")
        if self.micro_batches > 1 and self.micro_batch_size:
            raise BadInput(f"--micro-batches {self.micro_batches} and --micro-batch-size {self.micro_batch_size}: "
                           "give the number or the size")
        if self.pp == 1:
            for o in (OPTION["schedule"], OPTION["virtual_stages"], OPTION["stage_split"]):
                if getattr(self, o.field) != o.default:
                    raise BadInput(f"{o.flag} {getattr(self, o.field)} with 1 pipeline stage: there is no pipeline")
        if (self.schedule == "interleaved") != (self.virtual_stages > 1):
            raise BadInput(f"--pipeline-schedule {self.schedule} with --virtual-stages {self.virtual_stages}: "
                           "an interleaved pipeline runs 2 or more virtual stages, and only it does")
        if self.tp == 1 and (self.sp or self.tp_overlap or self.vocab_split):
            raise BadInput("--sequence-parallel, --tp-overlap and --vocab-split need tensor parallelism "
                           "(--model-parallel)")
        if self.zero1 and self.fsdp > 1:
            raise BadInput("--zero1 with --fsdp: ZeRO-1 shards the optimizer of plain data parallelism; FSDP "
                           "already shards it")
        if self.zero2 and self.fsdp == 1:
            raise BadInput("--zero2 needs --fsdp: it keeps FSDP's gathered parameters through the backward")
        if self.pp > 1 and grad_accum > 1:
            raise BadInput(f"--grad-accum {grad_accum} with {self.pp} pipeline stages: the pipeline's "
                           "--micro-batches already accumulate")
        per_step = self.data * (self.micro_batch_size or self.micro_batches)
        if global_batch % per_step:
            raise BadInput(f"global batch {global_batch} is not divisible by data parallel {self.data} x "
                           + (f"micro-batch size {self.micro_batch_size}" if self.micro_batch_size else
                              f"micro-batches {self.micro_batches}"))
        m = self.micro_batches_at(global_batch)
        if self.pp > 1 and m < self.pp:
            raise BadInput(f"--micro-batches {m} is fewer than the {self.pp} pipeline stages")
        if self.schedule == "interleaved" and m % self.pp:
            raise BadInput(f"interleaved 1F1B needs the {m} micro-batches to be a multiple of the {self.pp} stages "
                           "(as Megatron requires)")
        from common.spec import BertSpec, CnnSpec  # noqa: PLC0415  (common.spec imports nothing of this module)
        if isinstance(spec, CnnSpec):
            self._validate_cnn(spec)
        elif isinstance(spec, BertSpec):
            self._validate_bert(spec)
        else:
            self._validate_decoder(spec)

    def _validate_executed_model(self, what: str) -> None:
        """What the executed workloads' runs take in another form: bench.run's --grad-accum and --batch-size."""
        if self.micro_batches > 1 and self.pp == 1:
            raise BadInput(f"--micro-batches {self.micro_batches} with 1 pipeline stage: micro-batches feed a "
                           "pipeline; use --grad-accum to accumulate without one")
        if self.micro_batch_size:
            raise BadInput(f"--micro-batch-size {self.micro_batch_size}: the {what}'s runs take the number of "
                           "micro-batches (--micro-batches); their size follows from --batch-size")

    def _validate_bert(self, spec) -> None:
        self._validate_executed_model("MLM")
        tp, pp = self.tp, self.pp
        sizes = {"attention heads": spec.heads, "hidden size": spec.hidden, "intermediate size": spec.intermediate}
        if self.vocab_split:
            sizes["vocabulary"] = spec.vocab_size
        for what, size in sizes.items():
            if size % tp:
                raise BadInput(f"{what} {size} is not divisible by model parallel {tp}")
        if spec.seq_len % (2 * self.cp):
            raise BadInput(f"sequence {spec.seq_len} does not split into 2 x context parallel {self.cp} chunks")
        if spec.layers < pp * self.virtual_stages:
            raise BadInput(f"{spec.layers} layers cannot fill {pp * self.virtual_stages} pipeline stages")
        if self.stage_split not in (EVEN, "auto"):
            counts = [int(n) for n in self.stage_split.split(",")]
            if len(counts) != pp or sum(counts) != spec.layers:
                raise BadInput(f"--stage-split {self.stage_split}: {pp} stages of {spec.name} BERT's {spec.layers} "
                               f"layers need {pp} counts that add up to {spec.layers}")

    def _validate_cnn(self, spec) -> None:
        self._validate_executed_model("CNN")
        tp, pp = self.tp, self.pp
        # Only the first two fully connected layers are split (column then row).
        if spec.fc_sizes[0] % tp:
            raise BadInput(f"fc size {spec.fc_sizes[0]} is not divisible by model parallel {tp}")
        if cnn_layers(spec) < pp:
            raise BadInput(f"the CNN's {cnn_layers(spec)} layers cannot fill {pp} pipeline stages")
        if self.vocab_split:
            raise BadInput("--vocab-split: the CNN has no embedding table")
        if self.cp > 1 or self.sp:
            raise BadInput("--context-parallel, --sequence-parallel: the CNN has no sequence")
        if self.zero2:
            raise BadInput("--zero2: the CNN is one FSDP unit, the root, which FSDP keeps gathered through the "
                           "backward already")
        if self.stage_split != EVEN:
            raise BadInput(f"--stage-split {self.stage_split}: the CNN's pipeline is cut evenly; a split by cost "
                           "places the MLM's encoder layers")

    def _validate_decoder(self, spec) -> None:
        tp = self.tp
        if spec.heads % tp or spec.ffn % tp:
            raise BadInput(f"{self.name}: {spec.name}'s {spec.heads} heads and FFN {spec.ffn} must divide by tp {tp}")
        if tp > spec.kv_heads and tp % spec.kv_heads:
            raise BadInput(f"{self.name}: {spec.kv_heads} key/value heads cannot be split or replicated over tp {tp}")
        if self.vocab_split and spec.vocab % tp:
            raise BadInput(f"{self.name}: vocabulary {spec.vocab} is not divisible by tp {tp}")
        chunks = self.pp * self.virtual_stages
        if spec.layers < chunks:
            raise BadInput(f"{self.name}: {spec.layers} layers cannot fill {chunks} pipeline chunks")
        if self.stage_split != EVEN:
            raise BadInput(f"{self.name}: --stage-split {self.stage_split}: a decoder's layers are split evenly "
                           "over its pipeline chunks")
        if spec.seq_len % (2 * self.cp):
            raise BadInput(f"{self.name}: sequence {spec.seq_len} must split into 2 x cp {self.cp} chunks")

    def bubble(self) -> float:
        """The analytic idle share of a GPipe/1F1B pipeline step: (pp - 1) / (micro-batches + pp - 1)."""
        return (self.pp - 1) / (self.micro_batches + self.pp - 1)

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each dimension (RANK_ORDER, tp innermost), and `data`: its index among the
        ranks that split the batch (replica x fsdp + shard)."""
        out, rest = {}, rank
        for dim in reversed(RANK_ORDER):
            rest, out[dim] = divmod(rest, getattr(self, dim))
        ordered = {dim: out[dim] for dim in RANK_ORDER}
        return {**ordered, "data": ordered["dp"] * self.fsdp + ordered["fsdp"]}

    def stage_of_layer(self, layer: int, layers: int) -> int:
        """The stage of a layer under an even split (common.stage_split.even_split)."""
        ends = [sum(even_split(layers, self.pp)[:s + 1]) for s in range(self.pp)]
        return next(s for s, end in enumerate(ends) if layer < end)

    def stage_layers(self, stage: int, spec, samples: int) -> list[int]:
        """The encoder layers a stage holds under --stage-split; `samples`: the sequences one pipeline runs per
        step (global batch / data ranks), which the auto split's costs weigh."""
        counts = layers_per_stage(self.stage_split, spec, self.pp, samples)
        first = sum(counts[:stage])
        return list(range(first, first + counts[stage]))

    def placed(self, spec, global_batch: int) -> Layout:
        """The layout with --stage-split auto placed: the layers per stage its costs pick at this batch."""
        if self.stage_split != AUTO:
            return self
        counts = layers_per_stage(AUTO, spec, self.pp, global_batch // self.data)
        return replace(self, stage_split=",".join(map(str, counts)))

    def holds(self, rank: int, spec, samples: int) -> str:
        """What one rank holds, in words: its stage's parts and the share of them."""
        from common.spec import BertSpec, CnnSpec  # noqa: PLC0415
        c = self.coordinates(rank)
        if isinstance(spec, CnnSpec):
            what, split = "the whole CNN", "fc0/fc1"
        else:
            layers = self.stage_layers(c["pp"], spec, samples)
            parts = [f"layers {layers[0]}-{layers[-1]}"]
            if c["pp"] == 0:
                parts.insert(0, "embeddings")
            if c["pp"] == self.pp - 1:
                parts.append("MLM head" if isinstance(spec, BertSpec) else "norm + output layer")
            what = " + ".join(parts)
            split = "heads, FFN" + (" and vocabulary" if self.vocab_split else "")
        if self.tp > 1:
            what += f", {split} shard {c['tp'] + 1}/{self.tp}"
        if self.sharded:
            what += f", parameters and optimizer state shard {c['fsdp'] + 1}/{self.fsdp}"
        return what

    def as_record(self, spec, global_batch: int) -> dict:
        from common.spec import CnnSpec  # noqa: PLC0415
        samples = global_batch // self.data
        per_rank = [{"rank": r, **{d: c[d] for d in ("dp", "fsdp", "tp", "pp")}, "holds": self.holds(r, spec, samples)}
                    for r in range(self.devices) for c in [self.coordinates(r)]]
        placed = {"layers_per_stage": layers_per_stage(self.stage_split, spec, self.pp, samples)} \
            if not isinstance(spec, CnnSpec) else {}
        return {**asdict(self), **placed, "per_rank": per_rank}

    @classmethod
    def for_devices(cls, devices: int, **options) -> Layout:
        """The layout asked for on the command line (OPTIONS' fields): the data-parallel replicas take the devices
        the other dimensions leave."""
        sizes = {"fsdp": options.get("fsdp", 1), "model parallel": options.get("tp", 1),
                 "pipeline stages": options.get("pp", 1), "context parallel": options.get("cp", 1)}
        if devices % math.prod(sizes.values()):
            named = [f"{what} {n}" for what, n in sizes.items()
                     if n > 1 or what in ("model parallel", "pipeline stages")]
            raise BadInput(f"{devices} devices are not divisible by {' x '.join(named)}")
        taken = math.prod(sizes.values())
        return cls(dp=devices // taken, **options)

    @classmethod
    def from_record(cls, layout: dict) -> Layout:
        """The layout a run record's `layout` object (as_record) describes; records written before the one layout
        type (optimizer_shard, vocab_emb_dp, a recompute switch) are read as they meant."""
        values = {f.name: layout[f.name] for f in fields(cls) if f.name in layout}
        if layout.get("optimizer_shard"):
            values.update(dp=1, fsdp=layout["dp"])
        if layout.get("vocab_emb_dp") is False:
            values["vocab_split"] = True
        if isinstance(values.get("recompute"), bool):
            values["recompute"] = "full" if values["recompute"] else "none"
        return cls(**values)


def check_name(entry: str) -> None:
    """Refused when the grammar refuses `entry`, whatever the device count it is later put at."""
    try:
        Layout.parse(entry, devices=1)
    except Refused:
        raise
    except ValueError:
        pass   # the device count's objection, not the name's


def _size(text: str, what: str, entry: str, low: int) -> int:
    value = int(text)
    if value < low or text != str(value):
        raise Refused(f"{entry!r}: {what} must be an integer >= {low} without leading zeros, got {text}")
    return value


def _option_word(entry: str, word: str) -> tuple[str, object]:
    """One option word of a layout name -> (field, value), from OPTIONS' tokens and words."""
    if word in REFUSED:
        raise Refused(f"{entry!r}: {REFUSED[word]}")
    for o in OPTIONS:
        if o.dim:
            continue
        if o.is_count and o.token and (match := re.fullmatch(rf"{o.token}([0-9]+)", word)):
            return o.field, _size(match.group(1), o.token, entry, 2 if o.field == "virtual_stages" else 1)
        if o.parse is not None and word.startswith(o.token):
            try:
                return o.field, o.parse(word[len(o.token):])
            except ValueError as exc:
                raise Refused(f"{entry!r}: {word!r}: {exc}") from None
        if word in dict(o.words):
            return o.field, dict(o.words)[word]
        if o.token and word == o.token and isinstance(o.default, bool):
            return o.field, not o.default
    known = [w for o in OPTIONS if not o.dim for w in ([f"{o.token}<K>"] if o.is_count else [f"{o.token}<VALUE>"]
                                                      if o.parse else [w for w, _ in o.words] or [o.token])]
    raise Refused(f"{entry!r}: unknown option {word!r}; choose from {', '.join(known)}")


def cnn_layers(spec) -> int:
    """The units a CNN pipeline is cut between: each conv block and each fully connected layer."""
    return len(spec.conv_channels) + len(spec.fc_sizes) + 1


def refuse_layout(layout: Layout, backend: str, executes: frozenset[str], executed_by: dict[str, list[str]],
                  reasons: dict[str, str] | None = None) -> None:
    """Unsupported naming the first thing the layout asks that `backend` does not execute (its registry entry's
    `layouts`): in the backend's own words where it has them (`reasons`), else with the backends that do
    (`executed_by`: feature -> backends)."""
    for feature, flag in layout.features():
        if feature in executes:
            continue
        if feature in (reasons or {}):
            raise Unsupported(f"{flag}: {reasons[feature]}")
        if not executes:
            runs = sorted({b for names in executed_by.values() for b in names})
            raise Unsupported(f"{flag}: {backend} is data parallel only; {', '.join(runs)} run layouts")
        who = executed_by.get(feature) or []
        raise Unsupported(f"{flag}: {backend} does not execute it; " + (
            f"{', '.join(who)} do{'es' if len(who) == 1 else ''}" if who else
            "no backend here does (bench.predict and bench.plan model it)"))
