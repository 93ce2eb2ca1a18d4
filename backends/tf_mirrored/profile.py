"""--profile for tf_mirrored: tf.profiler over the steps common.profile runs, each step a tf.profiler Trace with
its step number (TensorBoard's profile plugin shows them as steps), and the XSpace it writes
(`plugins/profile/<time>/<host>.xplane.pb`, TensorBoard's profile plugin: `tensorboard --logdir DIR/<run id>`)
read back with TensorFlow's own protobuf for common.attribution.

RULES is the one place TensorFlow's op names are classified. An op event is named `scope/name:OpType`; its
path adds the events around it on its thread (ExecutorState::Process and the like, whose own time is the
executor's bookkeeping). The Keras scopes of keras-hub's BERT and of the CNN say what an op belongs to.
"""
from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from common.attribution import STEP_MARKER, OpEvent
from common.profile import Trace

# The event's own op type; or its ParallelFor's, the shards of the op's work on TensorFlow's intra-op thread pool,
# nested in the op on its thread: the op's own work, not "other" (10% of a CNN step's profiled time on 2 CPU replicas).
OP_TYPE = r":(?:{})[^>]*(?: > ParallelFor)?$"
XLA_LEAF = r"(^| > ){}$"  # an XLA instruction's event: its own name, no op type


def _types(*names: str) -> str:
    return OP_TYPE.format("|".join(names))


RULES = (
    ("all_reduce", r"CollectiveReduce|CollectiveOpV2Kernel|AllReduce|NcclAllReduce|all_reduce|allreduce"),
    ("all_gather", r"CollectiveGather|AllGather"),
    ("broadcast", r"CollectiveBcast"),
    ("send_recv", _types("_Send", "_Recv", "_HostSend", "_HostRecv")),
    # tf.data's input pipeline, feeding the step.
    ("data_movement", r"Iterator|Prefetch|GetNextFromShard|InstantiatedCapturedFunction|ParallelMap|RemoteCall"),
    ("optimizer", r"(adam_?w?|torch_adam_?w?|optimizer|AssignVariableOp|AssignSubVariableOp|AssignAddVariableOp"
                  r"|ResourceApplyAdam\w*)"),
    # keras' MultiHeadAttention: the query/key/value/output projections are its EinsumDense sublayers (matmuls);
    # the rest inside it is the attention proper (scores, mask, softmax, dropout, weighted sum).
    ("matmul", r"self_attention\w*/(query|key|value|attention_output)(_\d+)?/"),
    ("attention", r"self_attention_layer(_\d+)?/"),
    ("dropout_rng", r"dropout|StatelessRandom|RandomUniform|RandomStandardNormal|RngReadAndSkip"),
    ("normalization", r"layer_norm|layernorm|batch_norm|batchnorm|FusedBatchNorm|/bn\d"),
    ("activation", r"gelu|Gelu|relu|Relu|Erf|Tanh|MaxPool|max_pooling"),
    ("softmax", r"Softmax|SparseSoftmaxCrossEntropyWithLogits|LogSoftmax"),
    # oneDNN's kernels take their own op types where TensorFlow's CPU build picks them (seen on AMD EPYC:
    # _MklNativeFusedConv2D, _MklNativeConv2DBackpropFilterWithBias).
    ("matmul", _types("MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2D", "Conv2DBackpropInput",
                      "Conv2DBackpropFilter", "_FusedMatMul", "_FusedConv2D", r"_Mkl\w*(MatMul|Conv2D)")),
    ("data_movement", _types("GatherV2", "ResourceGather", "UnsortedSegmentSum", "ScatterNd", "TensorScatterAdd",
                             "ConcatV2", "Pack", "Unpack", "Slice", "StridedSlice", "StridedSliceGrad", "Tile",
                             "Transpose", "Identity", "IdentityN", "Fill", "ZerosLike", "OnesLike", "Cast",
                             "ReadVariableOp", "IteratorGetNext", "GatherNd", "Pad", "Reshape", "BroadcastTo",
                             "Select", "SelectV2", "Range", "ExpandDims", "Squeeze", "Shape")),
    ("elementwise", _types("AddV2", "Add", "AddN", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Neg", "Sum", "Mean",
                           "Max", "Min", "ArgMax", "Square", "Sqrt", "Rsqrt", "Pow", "Exp", "Log", "Equal",
                           "NotEqual", "Greater", "Less", "GreaterEqual", "LessEqual", "Maximum", "Minimum",
                           "BiasAdd", "BiasAddGrad", "SquaredDifference", "Reciprocal", "_UnaryOpsComposition",
                           "Prod", "LogicalAnd", "LogicalOr", "All", "Any", "IsFinite", "_FusedBatchNormEx",
                           "ReluGrad")),
    # --compile: XLA runs each replica's forward and backward as one program; its events are HLO instructions
    # named after the TF op or the fusion (MatMul.82, dot.28, subtract_exponential_fusion), without Keras scopes.
    ("matmul", XLA_LEAF.format(r"(dot|MatMul\w*|BatchMatMul\w*|Einsum\w*|convolution\w*|Conv2D\w*)(\.\d+)?")),
    ("activation", XLA_LEAF.format(r"\w*(tanh|erf|relu|maximum)\w*_fusion(\.\d+)?")),
    ("softmax", XLA_LEAF.format(r"\w*exponential\w*_fusion(\.\d+)?")),
    ("data_movement", XLA_LEAF.format(r"(wrapped_)?(copy|transpose|gather|scatter|concatenate|dynamic-slice"
                                      r"|dynamic-update-slice|slice|pad|broadcast|iota)[\w.-]*")),
    ("elementwise", XLA_LEAF.format(r"(wrapped_[\w-]+(\.\d+)?|[a-z][\w-]*_fusion(\.\d+)?|[a-z][\w-]*\.\d+)")),
    # The executor's and eager runtime's own time, and the Python thread waiting for a tf.function.
    ("host_idle", r"(CpuExecutable::\w+|ThunkExecutor::\w+|end: [\w.-]+|_?XlaRun|XlaLaunch|_XlaCompile"
                  r"|ExecutorState::\w+|ExecutorDoneCallback|EagerExecute|EagerLocalExecute[^>]*|EagerKernelExecute"
                  r"|KernelAndDeviceFunc::\w+|TFE_\w+|FunctionRun|EagerCopyToDevice|ValidateInputTypeAndPlacement"
                  r"|ThreadpoolListener::\w+|__inference\w*|_distributed_step|tf\.constant|convert_to_tensor"
                  r"|\w+:(NoOp|_Arg|_Retval|Const|VarHandleOp|PartitionedCall|StatefulPartitionedCall))[^>]*$"),
)


class TfProfiler:
    """common.profile's StepProfiler for TensorFlow."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.name = ("tf.profiler.experimental (host tracer; device tracer on GPUs), events from the XSpace read "
                     "with tensorflow.tsl.profiler.protobuf.xplane_pb2")
        self.rules = RULES

    def start(self) -> None:
        tf.profiler.experimental.start(str(self.directory))

    def step(self, index: int):
        # _r=1: a TraceMe the profiler records as a step of the trace viewer's own (TensorFlow's step markers)
        return tf.profiler.experimental.Trace(STEP_MARKER, step_num=index, _r=1)

    def stop(self) -> Trace:
        tf.profiler.experimental.stop()
        return read_trace(sorted(self.directory.glob("plugins/profile/*/*.xplane.pb"))[-1])


def read_trace(path: Path) -> Trace:
    """The op events and step windows of the XSpace in `path`."""
    events, windows = [], []
    for plane in read_xspace(path).planes:
        names = {i: m.name for i, m in plane.event_metadata.items()}
        for line in plane.lines:
            thread = f"{plane.name}/{line.name}"
            base_ps = line.timestamp_ns * 1000
            for e in line.events:
                start = (base_ps + e.offset_ps) / 1e12
                end = start + e.duration_ps / 1e12
                if names[e.metadata_id] == STEP_MARKER:
                    windows.append((start, end))
                else:
                    events.append(OpEvent(names[e.metadata_id], start, end, thread))
    return Trace(events, sorted(windows), [path])


def read_xspace(path: Path):
    """The XSpace in `path`, parsed by TensorFlow's own protobuf class for it."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # TensorFlow's copy of the profiler's schema

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    return space
