"""--profile for mindspore_auto: MindSpore's profiler (mindspore.profiler.profile) over the steps common.profile
runs, its output under the rank's folder (`<host>_<pid>_<time>_ascend_ms/`, MindSpore Insight's layout) with the
timeline as a Chrome trace (`ASCEND_PROFILER_OUTPUT/trace_view.json`: Perfetto, chrome://tracing), whose op
events common.attribution reads.

MindSpore's CPU timeline has no step annotation: a step's window is taken by the wall clock (time.time_ns) around
it, the clock the CPU op timestamps use. RULES is the one place MindSpore's op names are classified: an op is
named by its scope in the graph (`Default/.../MatMul-op3`, `Gradients/Default/.../Grad_MatMul/MatMul-op1`).
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import mindspore as ms
from mindspore.profiler import ProfilerActivity

from common.attribution import OpEvent
from common.profile import Trace

RULES = (
    ("all_reduce", r"AllReduce|all_reduce"),
    ("all_gather", r"AllGather"),
    ("reduce_scatter", r"ReduceScatter"),
    ("broadcast", r"Broadcast-op"),
    ("all_to_all", r"AllToAll|AlltoAll"),
    ("send_recv", r"/(Send|Receive)-op"),
    ("optimizer", r"AdamW|Adam-op|optimizer|/Assign(Add|Sub)?-op|ApplyAdam"),
    # The model's attention is inline in EncoderLayer (its projections are Linear cells): the products of the
    # scores and the context, the scaling, the softmax (whose backward MindSpore expands outside any scope).
    ("attention", r"EncoderLayer/(Grad_\w+/)*(BatchMatMul|Softmax|Mul)\w*-op\d+$|_SoftmaxBackward|FlashAttention"),
    ("dropout_rng", r"[Dd]ropout|StandardNormal|UniformReal|RandomChoice"),
    ("normalization", r"LayerNorm|BatchNorm|layer_norm|/norm/"),
    ("activation", r"GeLU|Gelu|ReLU|Relu|Erf|Tanh|MaxPool"),
    ("softmax", r"Softmax|CrossEntropy|/loss-\w+/"),  # the loss's log-softmax over the classes, and the loss
    ("matmul", r"/(MatMul|BatchMatMul|Conv2D|Conv2DBackpropInput|Conv2DBackpropFilter|Dense|MatMulExt"
               r"|BatchMatMulExt)-op\d+$"),
    ("data_movement", r"/(Gather|GatherV2|GatherD|Gather\w*|UnsortedSegmentSum|ScatterNd\w*|TensorScatter\w*|Concat"
                      r"|Stack|Transpose|TransposeExt\w*|Tile|BroadcastTo|Cast|Slice|StridedSlice\w*|Identity|Pad"
                      r"|Reshape|ExpandDims|Squeeze|ZerosLike|OnesLike|Fill\w*|Zeros|Ones|Select|OneHot|EmbeddingLookup"
                      r"|MaskedFill|Range|TensorMove)-op\d+$"),
    ("elementwise", r"/(Add|AddN|Sub|Mul|Div|RealDiv|Neg|ReduceSum|ReduceMean|ReduceMax|ReduceMin|Square|Sqrt|Rsqrt"
                    r"|Pow|Exp|Log|Equal|NotEqual|Greater|Less|GreaterEqual|LessEqual|Maximum|Minimum|BiasAdd"
                    r"|BiasAddGrad|SquaredDifference|Reciprocal|Argmax\w*|ArgMaxWithValue|Abs|Sign|LogicalAnd"
                    r"|LogicalOr|LogicalNot|IsFinite|AllFinite|Sum\w*|Mean\w*|Max|Min|Clip\w*)-op\d+$"),
)


class MindSporeProfiler:
    """common.profile's StepProfiler for MindSpore."""

    def __init__(self, directory: Path, device_kind: str):
        self.directory = directory
        device = {"ascend": [ProfilerActivity.NPU], "cuda": [ProfilerActivity.GPU]}.get(device_kind, [])
        activities = [ProfilerActivity.CPU, *device]
        self._profile = ms.profiler.profile(  # started by start(), not here (its default)
            activities=activities, start_profile=False,
            on_trace_ready=ms.profiler.tensorboard_trace_handler(str(directory)))
        self._windows: list[tuple[float, float]] = []
        self.name = ("mindspore.profiler.profile (CPU activity), events from the Chrome trace it writes "
                     "(ASCEND_PROFILER_OUTPUT/trace_view.json); step windows by the wall clock")
        self.rules = RULES

    def start(self) -> None:
        self._profile.start()

    @contextlib.contextmanager
    def step(self, index: int):
        began = time.time_ns()
        yield
        self._windows.append((began / 1e9, time.time_ns() / 1e9))

    def stop(self) -> Trace:
        self._profile.stop()  # analyses the run and writes the output (tensorboard_trace_handler)
        path = sorted(self.directory.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json"))[-1]
        return Trace(read_events(path), list(self._windows), [path])


def read_events(path: Path) -> list[OpEvent]:
    """The complete ("X") events of MindSpore's Chrome trace: operators (CPU OP) and their scopes (Scope Layer)."""
    raw = json.loads(path.read_text())
    events = raw["traceEvents"] if isinstance(raw, dict) else raw
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    out = []
    for e in events:
        if e.get("ph") != "X" or processes.get(e.get("pid")) == "Scope Layer":  # scopes repeat the ops' names
            continue
        start = float(e["ts"]) / 1e6
        out.append(OpEvent(e["name"], start, start + float(e.get("dur", 0)) / 1e6, f"{e['pid']}:{e['tid']}"))
    return out
