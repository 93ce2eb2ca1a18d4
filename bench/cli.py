"""Command-line pieces shared by bench.run, bench.compare and bench.report."""
from __future__ import annotations

import argparse
import sys

from backends import BACKENDS
from common.config import COMPILE_MODES, PRECISIONS, SCALING_MODES
from common.layout import SCHEDULES
from common.spec import BERT_SIZES, WORKLOADS


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


def relative_size(text: str) -> float:
    """A relative perturbation: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


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


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Options every run takes, so bench.compare can pass them through unchanged."""
    g = p.add_argument_group("run options")
    g.add_argument("--steps", type=positive_int, help="optimizer steps (default: a short throughput run)")
    g.add_argument("--epochs", type=positive_float, help="train for this many epochs instead of --steps")
    g.add_argument("--warmup-steps", type=non_negative_int, help="steps excluded from timing (default 5)")
    g.add_argument("--batch-size", type=positive_int,
                   help="per-device batch (weak scaling) or global batch (strong scaling)")
    g.add_argument("--scaling", choices=SCALING_MODES,
                   help="weak: per-device batch fixed; strong: global batch fixed "
                        "(default: strong with --epochs, else weak)")
    g.add_argument("--data", choices=("auto", "real", "synthetic"), default="auto",
                   help="real files, learnable synthetic data, or real when present (default)")
    g.add_argument("--data-dir", help="data directory (default $PARBENCH_DATA_DIR or ~/.cache/parbench)")
    g.add_argument("--seed", type=non_negative_int, default=0)
    g.add_argument("--out", default="results", help="results directory (default results/)")
    g.add_argument("--model-size", choices=tuple(BERT_SIZES), default="tiny", help="BERT size for mlm")
    g.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="amp: bfloat16 autocast; fp16: float16 with dynamic loss scaling (GPUs without bf16)")
    g.add_argument("--compile", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE",
                   help="compiled execution: torch.compile (MODE: " + ", ".join(COMPILE_MODES) + "), XLA "
                        "jit_compile for tf_mirrored, MindSpore's jit level; compile time is recorded apart")
    g.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--sync-bn", action="store_true", help="synchronise BatchNorm statistics across devices")
    g.add_argument("--eval-every", type=non_negative_int, default=0, help="evaluate every K steps")
    g.add_argument("--skip-eval", action="store_true",
                   help="no evaluation at the end (throughput or correctness runs); eval is null in the record")
    g.add_argument("--patience", type=non_negative_int, default=0,
                   help="stop after this many evaluations without improvement (needs --eval-every)")
    g.add_argument("--checkpoint-every", type=non_negative_int, default=0, help="checkpoint every K steps")
    g.add_argument("--checkpoint-dir", help="checkpoint directory (default OUT/checkpoints/<run key>, "
                   "in a sweep OUT/checkpoints/<sweep id>/<run key>)")
    g.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir")
    g.add_argument("--max-restarts", type=non_negative_int, default=0,
                   help="torch_ddp: restart the workers up to K times after a failure, from the newest valid "
                        "checkpoint (needs --checkpoint-every)")
    g.add_argument("--threads-per-device", type=positive_int,
                   help="CPU threads per virtual device (default 1 for bench.run; compare: cores / max N)")
    g.add_argument("--device-kind", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when present, else virtual CPU devices")
    g.add_argument("--tf-mode", choices=("mirrored", "multi_worker"),
                   help="tf_mirrored: one process over N logical devices (default), or one process per device")
    # --tf-tensorboard: the flag's name while only tf_mirrored wrote a log, kept as an alias.
    g.add_argument("--tensorboard", "--tf-tensorboard", dest="tensorboard", metavar="DIR",
                   help="write a TensorBoard log of the run to DIR (every backend; rank 0 writes it)")
    g.add_argument("--breakdown-steps", type=non_negative_int, default=0,
                   help="after training and evaluation, K probe steps timing forward+backward, gradient "
                        "communication, optimizer and data apart (backend_metrics.breakdown); default 0: none")
    g.add_argument("--timeout", type=positive_float, default=3600.0, help="wall-clock limit per run (s)")
    g.add_argument("--collective-timeout", type=positive_float, default=300.0,
                   help="limit for any rendezvous or collective (s)")
    m = p.add_argument_group("parallel layout (torch_3d, mindspore_auto; data-parallel backends refuse all but "
                             "the defaults); data parallel = devices / (model parallel x pipeline stages), "
                             "--batch-size is per data-parallel replica and micro-batch")
    m.add_argument("--parallel-mode", choices=("data", "semi_auto", "auto"), default="data",
                   help="mindspore_auto only: MindSpore DATA_PARALLEL, SEMI_AUTO_PARALLEL or AUTO_PARALLEL")
    m.add_argument("--model-parallel", type=positive_int, default=1, help="devices each layer is split over")
    m.add_argument("--pipeline-stages", type=positive_int, default=1, help="pipeline stages the layers are cut into")
    m.add_argument("--micro-batches", type=positive_int, default=1, help="micro-batches per pipeline step")
    m.add_argument("--pipeline-schedule", choices=SCHEDULES, default="gpipe",
                   help="pipeline schedule: all forwards then all backwards (gpipe), or one forward one backward")
    m.add_argument("--optimizer-shard", action="store_true",
                   help="shard parameters, gradients and optimizer state over data-parallel devices (FSDP/ZeRO)")
    m.add_argument("--recompute", action="store_true", help="recompute layer activations in the backward pass")
    m.add_argument("--vocab-emb-dp", action=argparse.BooleanOptionalAction, default=True,
                   help="replicate the embedding table (default) or split its vocabulary over model-parallel devices")


# The run options that reach a backend through RunConfig.backend_options.
BACKEND_OPTIONS = ("parallel_mode", "model_parallel", "pipeline_stages", "micro_batches", "pipeline_schedule",
                   "optimizer_shard", "recompute", "vocab_emb_dp")


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def workload_names() -> tuple[str, ...]:
    return WORKLOADS
