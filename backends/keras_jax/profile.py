"""--profile for keras_jax: jax.profiler over the steps common.profile runs, each a StepTraceAnnotation, writing
the XSpace TensorBoard's profile plugin opens (`plugins/profile/<time>/<host>.xplane.pb`) and a Perfetto trace
beside it (`perfetto_trace.json.gz`), read back with JAX's own reader (jax.profiler.ProfileData).

XLA runs the step as compiled HLO: an event names an HLO instruction (a fusion, a dot, a copy...), not a Keras
op. Each is described from the step's optimized HLO (backends.keras_jax.hlo.describe): its opcode, the opcodes
a fusion holds, and the Keras/JAX name scope it came from, so that RULES, the one place keras_jax's op names
are classified, sees e.g. `fusion.12 [dot,add] @.../self_attention_layer/query/...`.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax

from backends.keras_jax.hlo import describe
from common.attribution import STEP_MARKER, OpEvent
from common.profile import Trace

LEAF = r"[^>]*$"
HLO_FILE = "train_step.hlo.txt"
DATA_MOVEMENT_OPS = ("broadcast", "copy", "transpose", "gather", "scatter", "dynamic-slice", "dynamic-update-slice",
                     "concatenate", "pad", "slice", "iota", "reverse", "copy-start", "copy-done")
RULES = (
    ("all_reduce", r"all-reduce"),
    ("reduce_scatter", r"reduce-scatter"),
    ("all_gather", r"all-gather"),
    ("all_to_all", r"all-to-all"),
    ("send_recv", r"collective-permute"),
    ("optimizer", r"@jit\(_step\)/torch_adam_?w|optimizer"),
    # keras' MultiHeadAttention: its query/key/value/output projections are matmuls, the rest is attention.
    ("matmul", r"self_attention_layer/(query|key|value|attention_output)/"),
    ("attention", r"self_attention_layer/|dot_product_attention|flash|cudnn"),
    ("dropout_rng", r"dropout|\brng|threefry|philox|random_bits"),
    ("normalization", r"layer_norm|layernorm|batch_norm|batchnorm|@[^ ]*/bn\d"),
    ("activation", r"gelu|relu|/erfc?\b|/tanh\b|max_pool"),
    # The step's loss (the trainer's jax.named_scope "loss"): the log-softmax over the classes and its gradient.
    ("softmax", r"softmax|logsumexp|@jit\(_step\)/(transpose\()?jvp\(loss\)|/loss/"),
    ("matmul", r"\[[^\]]*\b(dot|convolution)\b[^\]]*\]|gemm"),
    ("data_movement", r"\[((" + "|".join(DATA_MOVEMENT_OPS) + r"),?)+\]|TransferTo|TransferFrom|CopyToDevice"
                      r"|BufferFromPyval|make_array|H2D|D2H|shard_args|DevicePut\w*"),
    ("elementwise", r"\[[^\]]*\]"),  # any other instruction of the program: arithmetic and reductions
    # JAX's and PjRt's own time: dispatch, argument handling, the thunk executor, the Python thread waiting.
    ("host_idle", r"(PjitFunction|ExecuteHelper|Execute\w*|ParseArguments|Handle \w+|Allocate\w+|ThreadpoolListener"
                  r"|PythonRefManager|ThunkExecutor|end: \w+|BlockHostUntilReady|ToLiteral|\$\w.*|pjit|jit_\w+"
                  r"|PjRt\w*|Tfrt\w*|CommonPjRt\w*|Wait for \w+ holds)" + LEAF),
)


class JaxProfiler:
    """common.profile's StepProfiler for JAX. hlo_text: the step's optimized HLO, read after the steps ran."""

    def __init__(self, directory: Path, hlo_text: Callable[[], str]):
        self.directory, self._hlo_text = directory, hlo_text
        self.name = ("jax.profiler (XLA's host and device tracers), events from the XSpace read with "
                     "jax.profiler.ProfileData, HLO instructions described from the compiled step")
        self.rules = RULES

    def start(self) -> None:
        # No Python tracer (JAX's default traces every Python call, which slows the host's side of the step
        # several-fold): TensorFlow's default, and what torch's profiler does without with_stack.
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0
        jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True, profiler_options=options)

    def step(self, index: int):
        return jax.profiler.StepTraceAnnotation(STEP_MARKER, step_num=index)

    def stop(self) -> Trace:
        jax.profiler.stop_trace()
        path = sorted(self.directory.glob("plugins/profile/*/*.xplane.pb"))[-1]
        hlo = self._hlo_text()
        # The program the trace's events name, for a person reading the trace.
        (path.parent / HLO_FILE).write_text(hlo)
        return read_trace(path, describe(hlo))


def read_trace(path: Path, instructions: dict[str, str]) -> Trace:
    """The op events and step windows of the XSpace in `path`; an HLO instruction's event named by its
    description in `instructions`."""
    events, windows = [], []
    for plane in jax.profiler.ProfileData.from_file(str(path)).planes:
        for line in plane.lines:
            thread = f"{plane.name}/{line.name}"
            for e in line.events:
                start = e.start_ns / 1e9
                end = start + e.duration_ns / 1e9
                if e.name == STEP_MARKER:
                    windows.append((start, end))
                    continue
                hlo_op = dict(e.stats).get("hlo_op")
                name = instructions.get(hlo_op, hlo_op) if hlo_op else e.name
                events.append(OpEvent(str(name), start, end, thread))
    return Trace(events, sorted(windows), [path, *path.parent.glob("*perfetto_trace.json.gz")])
