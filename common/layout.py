"""The parallel layout of a run: data x tensor x pipeline parallelism, one object for every backend.

The harness builds it once from the command line and validates it before any worker starts;
a backend translates it in one place (mindspore_auto's ParallelConfig, torch_3d's mesh) or,
when it cannot honour a part of it, refuses that part by flag name. Ranks are laid out on a
("pp", "dp", "tp") grid, tensor parallel innermost: rank = (stage x dp + dp index) x tp + tp index.

Each layout option is declared once, in OPTIONS: its field, bench.run's flag, its default and help,
and its part of a layout's name (bench.compare --layouts dp2xtp2-rc). The command line, the flags a
sweep passes on, the flags a backend refuses by name, and the names are all derived from it.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

from common.errors import BadInput, Unsupported
from common.spec import BertSpec, CnnSpec
from common.stage_split import EVEN, even_split, layers_per_stage, parse_split

SCHEDULES = ("gpipe", "1f1b")
MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class LayoutOption:
    """One layout option: a count (a mesh dimension or the micro-batches), a choice, or a switch."""
    field: str
    flag: str
    help: str
    default: int | str | bool
    choices: tuple[str, ...] = ()
    dim: str = ""      # a mesh dimension: its name part is <dim><N> (N >= 2)
    token: str = ""    # its name part among a name's options: a count's prefix (mb<K>) or the word that sets it
    needs: str = ""    # the dimension a name must have for the token to mean anything ...
    needs_why: str = ""  # ... and how a bad name is told so
    # A free-form value (neither a count, a choice nor a switch): its parser, ValueError for a bad one; in a
    # name it follows its token, its commas written '+' (a sweep's --layouts list is comma-separated).
    parse: Callable[[str], str] | None = None

    def name_part(self, value) -> str:
        return f"{self.token}{str(value).replace(',', '+')}"

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


OPTIONS = (
    LayoutOption("tp", "--model-parallel", "devices each layer is split over", 1, dim="tp"),
    LayoutOption("pp", "--pipeline-stages", "pipeline stages the layers are cut into", 1, dim="pp"),
    LayoutOption("micro_batches", "--micro-batches", "micro-batches per pipeline step", 1, token="mb", needs="pp",
                 needs_why="needs a pipeline (pp<N>)"),
    LayoutOption("schedule", "--pipeline-schedule", "pipeline schedule: all forwards then all backwards (gpipe), "
                 "or one forward one backward", "gpipe", choices=SCHEDULES, needs="pp",
                 needs_why="needs a pipeline (pp<N>)"),
    LayoutOption("optimizer_shard", "--optimizer-shard", "shard parameters, gradients and optimizer state over "
                 "data-parallel devices (FSDP/ZeRO); in a name, fsdp<N> instead of dp<N>", False),
    LayoutOption("recompute", "--recompute", "recompute layer activations in the backward pass", False, token="rc"),
    LayoutOption("vocab_emb_dp", "--vocab-emb-dp", "replicate the embedding table (default) or split its "
                 "vocabulary over model-parallel devices", True, token="vocab", needs="tp",
                 needs_why="splits the vocabulary over tensor parallel: it needs tp<N>"),
    LayoutOption("stage_split", "--stage-split", "encoder layers per pipeline stage: even (the last stage takes "
                 "any remainder), auto (balanced by each stage's cost, common.stage_split, the embeddings and the "
                 "MLM head included) or a list, e.g. 3,1", EVEN, token="split", needs="pp",
                 needs_why="places layers on pipeline stages: it needs pp<N>", parse=parse_split),
)
OPTION = {o.field: o for o in OPTIONS}
_DIMENSION = re.compile(r"(fsdp|dp|tp|pp)([0-9]+)")


@dataclass(frozen=True)
class Layout:
    dp: int = 1                  # data-parallel replicas: what the devices leave
    tp: int = 1                  # --model-parallel: devices each layer is split over
    pp: int = 1                  # --pipeline-stages
    micro_batches: int = 1       # --micro-batches per pipeline step
    schedule: str = "gpipe"      # --pipeline-schedule
    optimizer_shard: bool = False  # parameters, gradients and optimizer state sharded over dp
    recompute: bool = False      # layer activations recomputed in the backward pass
    # True: the token embedding (and the MLM head tied to it) is replicated; False: its
    # vocabulary is split over the tensor-parallel devices.
    vocab_emb_dp: bool = True
    stage_split: str = EVEN      # --stage-split: even, auto or layers per stage ("3,1")

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def splits_model(self) -> bool:
        return self.tp > 1 or self.pp > 1

    def non_default_flags(self) -> list[str]:
        """The layout flags beyond plain data parallelism, as the user typed them."""
        return [flag for o in OPTIONS if (flag := o.flag_for(getattr(self, o.field)))]

    def run_flags(self) -> list[str]:
        """bench.run's layout flags for this layout, as arguments (--devices is the caller's)."""
        return [token for flag in self.non_default_flags() for token in flag.split()]

    def accumulation(self, grad_accum: int = 1) -> int:
        """Micro-batches per optimizer step: --grad-accum times the pipeline's micro-batches (what a
        1-device reference of this layout accumulates)."""
        return grad_accum * self.micro_batches

    @property
    def name(self) -> str:
        """The canonical name: dimensions in the order dp, tp, pp, then the options that differ from the
        defaults in OPTIONS' order (a pipeline always says its micro-batches). One device is '1 device'."""
        dims = [f"{'fsdp' if self.optimizer_shard else 'dp'}{self.dp}" if self.dp > 1 or self.optimizer_shard else ""]
        dims += [f"{o.dim}{getattr(self, o.field)}" if getattr(self, o.field) > 1 else "" for o in OPTIONS if o.dim]
        options = []
        for o in OPTIONS:
            value = getattr(self, o.field)
            if o.dim or not (o.token or o.choices or o.parse) or (o.needs and getattr(self, o.needs) == 1):
                continue
            if o.is_count and o.token:
                options.append(f"{o.token}{value}")
            elif o.parse is not None:
                options += [o.name_part(value)] if value != o.default else []
            elif value != o.default:
                options.append(o.token or str(value))
        return "-".join(["x".join(d for d in dims if d) or "1 device", *options])

    @classmethod
    def parse(cls, entry: str) -> Layout:
        """A layout name (bench.compare --layouts) -> Layout; ValueError with a one-line reason for anything
        the grammar (bench/layouts.py) does not say. A pipeline's micro-batches default to 2 x its stages."""
        head, *words = entry.split("-")
        values: dict[str, object] = {}
        for part in head.split("x"):
            match = _DIMENSION.fullmatch(part)
            if not match:
                raise ValueError(f"{entry!r}: {part!r} is not dp<N>, fsdp<N>, tp<N> or pp<N>")
            kind, size = match.group(1), _size(match.group(2), f"{match.group(1)} size", entry, 2)
            dim = "dp" if kind == "fsdp" else kind
            if dim in values:
                raise ValueError(f"{entry!r}: the {dim} dimension is given twice")
            values[dim] = size
            values["optimizer_shard"] = values.get("optimizer_shard", False) or kind == "fsdp"
        for word in words:
            field, value = _option_word(entry, word)
            if field in values:
                raise ValueError(f"{entry!r}: {word!r} repeats an option already given")
            option = OPTION[field]
            if option.needs and values.get(option.needs, 1) == 1:
                raise ValueError(f"{entry!r}: {word!r} {option.needs_why}")
            values[field] = value
        if values.get("pp", 1) > 1:
            values.setdefault("micro_batches", 2 * values["pp"])
        return cls(**values)

    def validate(self, spec: CnnSpec | BertSpec, global_batch: int, grad_accum: int = 1) -> None:
        """Raise BadInput naming the first combination that cannot be laid out."""
        dp, tp, pp, k = self.dp, self.tp, self.pp, self.micro_batches
        if min(dp, tp, pp, k) < 1:
            raise BadInput(f"parallel sizes must be >= 1: data {dp}, model {tp}, pipeline {pp}, micro-batches {k}")
        if self.schedule not in SCHEDULES:
            raise BadInput(f"--pipeline-schedule {self.schedule}: choose from {', '.join(SCHEDULES)}")
        if k > 1 and pp == 1:
            raise BadInput(f"--micro-batches {k} with 1 pipeline stage: micro-batches feed a pipeline; "
                           "use --grad-accum to accumulate without one")
        if self.schedule != "gpipe" and pp == 1:
            raise BadInput(f"--pipeline-schedule {self.schedule} with 1 pipeline stage: there is no pipeline")
        if pp > 1 and k < pp:
            raise BadInput(f"--micro-batches {k} is fewer than the {pp} pipeline stages")
        if self.stage_split != EVEN and pp == 1:
            raise BadInput(f"--stage-split {self.stage_split} with 1 pipeline stage: there is nothing to split")
        if pp > 1 and grad_accum > 1:
            raise BadInput(f"--grad-accum {grad_accum} with {pp} pipeline stages: the pipeline's "
                           "--micro-batches already accumulate")
        if global_batch % (dp * k):
            raise BadInput(f"global batch {global_batch} is not divisible by data parallel {dp} x "
                           f"micro-batches {k}")
        if isinstance(spec, BertSpec):
            self._validate_bert(spec)
        else:
            self._validate_cnn(spec)

    def _validate_bert(self, spec: BertSpec) -> None:
        tp, pp = self.tp, self.pp
        sizes = {"attention heads": spec.heads, "hidden size": spec.hidden, "intermediate size": spec.intermediate}
        if not self.vocab_emb_dp:
            sizes["vocabulary"] = spec.vocab_size
        for what, size in sizes.items():
            if size % tp:
                raise BadInput(f"{what} {size} is not divisible by model parallel {tp}")
        if spec.layers < pp:
            raise BadInput(f"{spec.layers} layers cannot fill {pp} pipeline stages")
        if self.stage_split not in (EVEN, "auto"):
            counts = [int(n) for n in self.stage_split.split(",")]
            if len(counts) != pp or sum(counts) != spec.layers:
                raise BadInput(f"--stage-split {self.stage_split}: {pp} stages of {spec.name} BERT's {spec.layers} "
                               f"layers need {pp} counts that add up to {spec.layers}")

    def _validate_cnn(self, spec: CnnSpec) -> None:
        tp, pp = self.tp, self.pp
        # Only the first two fully connected layers are split (column then row).
        if spec.fc_sizes[0] % tp:
            raise BadInput(f"fc size {spec.fc_sizes[0]} is not divisible by model parallel {tp}")
        if cnn_layers(spec) < pp:
            raise BadInput(f"the CNN's {cnn_layers(spec)} layers cannot fill {pp} pipeline stages")
        if not self.vocab_emb_dp:
            raise BadInput("--no-vocab-emb-dp: the CNN has no embedding table")
        if self.stage_split != EVEN:
            raise BadInput(f"--stage-split {self.stage_split}: the CNN's pipeline is cut evenly; a split by cost "
                           "places the MLM's encoder layers")

    def bubble(self) -> float:
        """The analytic idle share of a GPipe/1F1B pipeline step: (pp - 1) / (micro-batches + pp - 1)."""
        return (self.pp - 1) / (self.micro_batches + self.pp - 1)

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each mesh dimension."""
        stage, rest = divmod(rank, self.dp * self.tp)
        return {"pp": stage, "dp": rest // self.tp, "tp": rest % self.tp}

    def stage_of_layer(self, layer: int, layers: int) -> int:
        """The stage of a layer under an even split (common.stage_split.even_split)."""
        ends = [sum(even_split(layers, self.pp)[:s + 1]) for s in range(self.pp)]
        return next(s for s, end in enumerate(ends) if layer < end)

    def stage_layers(self, stage: int, spec: BertSpec, samples: int) -> list[int]:
        """The encoder layers a stage holds under --stage-split; `samples`: the sequences one pipeline runs per
        step (global batch / dp), which the auto split's costs weigh."""
        counts = layers_per_stage(self.stage_split, spec, self.pp, samples)
        first = sum(counts[:stage])
        return list(range(first, first + counts[stage]))

    def holds(self, rank: int, spec: CnnSpec | BertSpec, samples: int) -> str:
        """What one rank holds, in words: its stage's parts and the share of them."""
        c = self.coordinates(rank)
        if isinstance(spec, BertSpec):
            layers = self.stage_layers(c["pp"], spec, samples)
            parts = [f"layers {layers[0]}-{layers[-1]}"]
            if c["pp"] == 0:
                parts.insert(0, "embeddings")
            if c["pp"] == self.pp - 1:
                parts.append("MLM head")
            what = " + ".join(parts)
            split = "heads, FFN" + ("" if self.vocab_emb_dp else " and vocabulary")
        else:
            what, split = "the whole CNN", "fc0/fc1"
        if self.tp > 1:
            what += f", {split} shard {c['tp'] + 1}/{self.tp}"
        if self.optimizer_shard:
            what += f", parameters and optimizer state shard {c['dp'] + 1}/{self.dp}"
        return what

    def as_record(self, spec: CnnSpec | BertSpec, global_batch: int) -> dict:
        samples = global_batch // self.dp
        per_rank = [{"rank": r, "dp": c["dp"], "tp": c["tp"], "pp": c["pp"], "holds": self.holds(r, spec, samples)}
                    for r in range(self.devices) for c in [self.coordinates(r)]]
        placed = {"layers_per_stage": layers_per_stage(self.stage_split, spec, self.pp, samples)} \
            if isinstance(spec, BertSpec) else {}
        return {**asdict(self), **placed, "per_rank": per_rank}

    @classmethod
    def for_devices(cls, devices: int, **options) -> Layout:
        """The layout asked for on the command line (OPTIONS' fields); data parallel takes the devices tp x pp
        leave."""
        tp, pp = options.get("tp", 1), options.get("pp", 1)
        if devices % (tp * pp):
            raise BadInput(f"{devices} devices are not divisible by model parallel {tp} x pipeline stages {pp}")
        return cls(dp=devices // (tp * pp), **options)

    @classmethod
    def from_record(cls, layout: dict) -> Layout:
        """The layout a run record's `layout` object (as_record) describes."""
        return cls(**{f.name: layout[f.name] for f in fields(cls) if f.name in layout})


def _size(text: str, what: str, entry: str, low: int) -> int:
    value = int(text)
    if value < low or text != str(value):
        raise ValueError(f"{entry!r}: {what} must be an integer >= {low} without leading zeros, got {text}")
    return value


def _option_word(entry: str, word: str) -> tuple[str, object]:
    """One option word of a layout name -> (field, value), from OPTIONS' tokens and choices."""
    for o in OPTIONS:
        if o.dim:
            continue
        if o.is_count and o.token and (match := re.fullmatch(rf"{o.token}([0-9]+)", word)):
            return o.field, _size(match.group(1), o.token, entry, 1)
        if o.parse is not None and word.startswith(o.token):
            try:
                return o.field, o.parse(word[len(o.token):])
            except ValueError as exc:
                raise ValueError(f"{entry!r}: {word!r}: {exc}") from None
        if word in o.choices:
            return o.field, word
        if o.token and word == o.token and isinstance(o.default, bool):
            return o.field, not o.default
    words = [w for o in OPTIONS for w in ([f"{o.token}<K>"] if o.is_count and o.token else
                                          [f"{o.token}<VALUE>"] if o.parse else
                                          [*o.choices, *([o.token] if o.token and not o.is_count else [])])]
    raise ValueError(f"{entry!r}: unknown option {word!r}; choose from {', '.join(words)}")


def cnn_layers(spec: CnnSpec) -> int:
    """The units a CNN pipeline is cut between: each conv block and each fully connected layer."""
    return len(spec.conv_channels) + len(spec.fc_sizes) + 1


def refuse_layout(layout: Layout, backend: str, runs_layouts: list[str]) -> None:
    """For a data-parallel-only backend: Unsupported naming the first layout flag it cannot honour, and the
    backends that run layouts."""
    asked = layout.non_default_flags()
    if asked:
        raise Unsupported(f"{asked[0]}: {backend} is data parallel only; {', '.join(runs_layouts)} run layouts")
