"""Command-line pieces shared by the bench commands."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from rich.markup import escape
from rich.table import Table

from backends import BACKEND_ONLY, BACKENDS, layout_backend
from backends.keras_jax.modes import MODES as JAX_MODES
from backends.tf_mirrored.modes import MODES as TF_MODES
from common.config import COMPILE_MODES, PRECISIONS, SCALING_MODES
from common.errors import BadInput
from common.layout import OPTIONS as LAYOUT_OPTIONS
from common.layout import LayoutOption
from common.profile import DEFAULT_STEPS as PROFILE_STEPS
from common.spec import SIZES, WORKLOADS

MODEL_SIZES = tuple(dict.fromkeys(s for w in WORKLOADS if w != "cnn" for s in SIZES[w]))


def console_table(title: str, columns, rows, caption: str | None = None) -> Table:
    """Rows of text cells as a rich table, columns folded where the console is narrow, markup shown as text."""
    table = Table(title=escape(title), title_justify="left", caption=caption and escape(caption),
                  caption_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    return table


class OneLineParser(argparse.ArgumentParser):
    """Bad input is one clear line on stderr and exit 2 (CONVENTIONS §3), not usage plus an error."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def number_below(high: float, what: str = "a number"):
    """argparse type: a number in [0, high)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not 0.0 <= value < high:
            raise argparse.ArgumentTypeError(f"must be in [0, {high:g}), got {text}")
        return value
    parse.__name__ = what
    return parse


relative_size = number_below(1.0)  # a relative perturbation
percentage = number_below(100.0, "a percentage")


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is at most 65535, got {value}")
    return value


def name_list(choices):
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown or text!r}; choose from {', '.join(choices)}")
        return list(dict.fromkeys(names))
    parse.__name__ = "list"
    return parse


def int_list(text: str) -> list[int]:
    # An empty entry ("1,,2") is refused, not skipped: it may be a count the user meant to type.
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"device counts must be integers >= 1, got {text!r}")
    return sorted(set(values))


@dataclass(frozen=True)
class RunOption:
    """One option every run takes, declared once: bench.run adds it, bench.compare passes it on to each run.
    `backend`: the option is that backend's alone (bench.run refuses it for the others; a sweep passes it to
    the backends that declare it in the registry)."""
    flags: tuple[str, ...]
    kwargs: dict = field(default_factory=dict)
    layout: bool = False  # a parallel-layout option (common.layout.OPTIONS): a --layouts entry sets it

    @property
    def dest(self) -> str:
        return self.kwargs.get("dest") or self.flags[0][2:].replace("-", "_")

    def forward(self, value) -> list[str]:
        """bench.run's arguments for `value` of this option ([] for an unset one)."""
        action = self.kwargs.get("action")
        if action is argparse.BooleanOptionalAction:  # --x / --no-x: both values must reach bench.run
            return [self.flags[0] if value else f"--no-{self.flags[0][2:]}"]
        if action == "store_true":
            return [self.flags[0]] if value else []
        return [] if value is None else [self.flags[0], str(value)]


def _option(*flags: str, **kwargs) -> RunOption:
    return RunOption(flags, kwargs)


def _argument_type(parse, name: str):
    """argparse's type for a parser that raises ValueError: its reason on the error line."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = name
    return convert


def _layout_option(o: LayoutOption) -> RunOption:
    if isinstance(o.default, bool):
        kind = {"action": argparse.BooleanOptionalAction if o.default else "store_true"}
    elif o.field == "recompute":   # a bare --recompute recomputes every layer's forward
        kind = {"choices": o.choices, "nargs": "?", "const": "full"}
    elif o.choices:
        kind = {"choices": o.choices}
    elif o.parse is not None:
        kind = {"type": _argument_type(o.parse, o.flag[2:])}
    else:   # a count; 0 where its default says "not given" (--micro-batch-size)
        kind = {"type": _int_at_least(min(1, o.default))}
    return RunOption((o.flag,), {**kind, "default": o.default, "dest": o.field, "help": o.help}, layout=True)


RUN_OPTIONS = (
    _option("--steps", type=positive_int, help="optimizer steps (default: a short throughput run)"),
    _option("--epochs", type=positive_float, help="train for this many epochs instead of --steps"),
    _option("--warmup-steps", type=non_negative_int, help="steps excluded from timing (default 5)"),
    _option("--batch-size", type=positive_int, help="per-device batch (weak scaling) or global batch (strong scaling)"),
    _option("--scaling", choices=SCALING_MODES, help="weak: per-device batch fixed; strong: global batch fixed "
            "(default: strong with --epochs, else weak)"),
    _option("--data", choices=("auto", "real", "synthetic"), default="auto",
            help="real files, learnable synthetic data, or real when present (default)"),
    _option("--data-dir", help="data directory (default $PARBENCH_DATA_DIR or ~/.cache/parbench)"),
    _option("--seed", type=non_negative_int, default=0),
    _option("--out", default="results", help="results directory (default results/)"),
    _option("--model-size", choices=MODEL_SIZES, default="tiny",
            help="mlm: " + ", ".join(SIZES["mlm"]) + "; lm: " + ", ".join(SIZES["lm"]) + " (the CNN has one)"),
    _option("--precision", choices=PRECISIONS, default="fp32",
            help="amp: bfloat16 autocast; fp16: float16 with dynamic loss scaling (GPUs without bf16)"),
    _option("--compile", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE",
            help="compiled execution: torch.compile (MODE: " + ", ".join(COMPILE_MODES) + "), XLA jit_compile for "
                 "tf_mirrored, MindSpore's jit level; compile time is recorded apart"),
    _option("--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step"),
    _option("--sync-bn", action="store_true", help="synchronise BatchNorm statistics across devices"),
    _option("--eval-every", type=non_negative_int, default=0, help="evaluate every K steps"),
    _option("--skip-eval", action="store_true",
            help="no evaluation at the end (throughput or correctness runs); eval is null in the record"),
    _option("--eval-samples", type=non_negative_int, default=0, metavar="N",
            help="evaluate on the split's first N samples only (default 0: all of it); the record's eval says "
                 "how many of how many"),
    _option("--patience", type=non_negative_int, default=0,
            help="stop after this many evaluations without improvement (needs --eval-every)"),
    _option("--checkpoint-every", type=non_negative_int, default=0, help="checkpoint every K steps"),
    _option("--checkpoint-dir", help="checkpoint directory (default OUT/checkpoints/<run key>, in a sweep "
            "OUT/checkpoints/<sweep id>/<run key>)"),
    _option("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir"),
    _option("--threads-per-device", type=positive_int,
            help="CPU threads per virtual device (default 1 for bench.run; compare: cores / max N)"),
    _option("--device-kind", choices=("auto", "cpu", "cuda"), default="auto",
            help="auto: CUDA when present, else virtual CPU devices"),
    # --tf-tensorboard: the flag's name while only tf_mirrored wrote a log, kept as an alias.
    _option("--tensorboard", "--tf-tensorboard", dest="tensorboard", metavar="DIR",
            help="write a TensorBoard log of the run to DIR/<run id> (every backend; rank 0 writes it)"),
    _option("--breakdown-steps", type=non_negative_int, default=0,
            help="after training and evaluation, K probe steps timing forward+backward, gradient communication, "
                 "optimizer and data apart (backend_metrics.breakdown); default 0: none"),
    _option("--profile", nargs="?", const=PROFILE_STEPS, type=non_negative_int, default=0, metavar="STEPS",
            help=f"after everything measured, STEPS (default {PROFILE_STEPS}) more steps under the framework's own "
                 "profiler: a trace for TensorBoard's profile plugin or Perfetto in --profile-dir, and where the step "
                 "goes per op category in backend_metrics.attribution; default: none"),
    _option("--profile-dir", metavar="DIR",
            help="where --profile writes its traces, DIR/<run id>/rank<R>/ (default OUT/profiles)"),
    _option("--memory-per-device", type=positive_float, metavar="GIB",
            help="memory one device may use (GiB): a run predicted not to fit is refused before it starts, "
                 "status invalid in a sweep (default: a GPU's own memory; none on CPU devices)"),
    _option("--no-fit-check", action="store_true",
            help="start a run even when it is predicted not to fit its devices (the prediction is still recorded)"),
    _option("--timeout", type=positive_float, default=3600.0, help="wall-clock limit per run (s)"),
    _option("--collective-timeout", type=positive_float, default=300.0,
            help="limit for any rendezvous or collective (s)"),
    *(_layout_option(o) for o in LAYOUT_OPTIONS),
    # One backend's own (backends.BACKENDS[...].options).
    _option("--max-restarts", type=non_negative_int, default=0,
            help="torch_ddp: restart the workers up to K times after a failure, from the newest valid checkpoint "
                 "(needs --checkpoint-every)"),
    _option("--tf-mode", choices=TF_MODES,
            help="tf_mirrored: one process over N logical devices (default), or one process per device"),
    _option("--jax-mode", choices=JAX_MODES,
            help="keras_jax: one process over N devices (default), or one process per device (jax.distributed)"),
    _option("--parallel-mode", choices=("data", "semi_auto", "auto"), default="data",
            help="mindspore_auto: MindSpore DATA_PARALLEL, SEMI_AUTO_PARALLEL or AUTO_PARALLEL"),
)
assert {o.dest for o in RUN_OPTIONS} >= BACKEND_ONLY, "a backend declares an option bench.cli does not"
LAYOUT_GROUP = (f"parallel layout ({', '.join(n for n, e in BACKENDS.items() if e.layouts)}; data-parallel backends "
                "refuse all but the defaults); data parallel = devices / (model parallel x pipeline stages), "
                "--batch-size is per data-parallel replica and micro-batch")


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Options every run takes (RUN_OPTIONS), so bench.compare can pass them through unchanged."""
    groups = {"run": p.add_argument_group("run options"), "layout": p.add_argument_group(LAYOUT_GROUP),
              "backend": p.add_argument_group("options of one backend (the registry says whose)")}
    for option in RUN_OPTIONS:
        where = "layout" if option.layout else "backend" if option.dest in BACKEND_ONLY else "run"
        groups[where].add_argument(*option.flags, **option.kwargs)


def forwarded(args, backends_options: tuple[str, ...], skip: tuple[str, ...] = ()) -> list[str]:
    """bench.run's arguments for the run options in `args`, leaving out `skip` (dests) and the options of
    another backend than the one whose `backends_options` (its registry declaration) are given."""
    return [token for option in RUN_OPTIONS if option.dest not in skip
            and (option.dest not in BACKEND_ONLY or option.dest in backends_options)
            for token in option.forward(getattr(args, option.dest))]


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def default_layout_backend(parser: argparse.ArgumentParser, what: str) -> str:
    """The registry's backend for --layouts without --backends, or bad input saying none is registered."""
    name = layout_backend()
    if name is None:
        parser.error(f"--layouts {what} no backend by default: none registered runs every layout; give --backends")
    return name


def check_model_size(workload: str, size: str) -> None:
    """--model-size names one of the workload's sizes (the CNN has one and ignores it)."""
    if workload != "cnn" and size not in SIZES[workload]:
        raise BadInput(f"--model-size {size}: {workload} has sizes {', '.join(SIZES[workload])}")


def workload_names() -> tuple[str, ...]:
    return WORKLOADS
