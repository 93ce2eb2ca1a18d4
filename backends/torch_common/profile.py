"""--profile for every torch backend: torch.profiler over the steps common.profile runs, a Chrome/Perfetto trace
(`rank<R>.pt.trace.json`: ui.perfetto.dev, chrome://tracing, or TensorBoard's torch-tb-profiler plugin), and the
trace's op events with torch's own FLOP counts (with_flops: matmuls and convolutions) for common.attribution.

RULES is the one place torch's op names are classified. An event's path is its enclosing events on the thread,
then its own name, so that an op inside AdamW's step, SDPA or a dropout counts as that, whatever the op: the
first rule that matches wins. Autograd's and DDP's wrappers keep only their own bookkeeping time (host_idle).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from common.attribution import STEP_MARKER, OpEvent
from common.profile import Trace

LEAF = r"[^>]*$"  # the rest of the path is the event's own name
RULES = (
    # On a GPU the host's ops only launch the kernels, which the device's events hold.
    ("host_idle", r"^host: "),
    ("all_reduce", r"all_?reduce|AllReduce"),
    ("reduce_scatter", r"reduce_?scatter|ReduceScatter"),
    ("all_gather", r"all_?gather|AllGather"),
    ("broadcast", r"broadcast|Broadcast"),
    ("all_to_all", r"all_?to_?all|AllToAll"),
    ("send_recv", r"c10d::(send|recv)|gloo:(send|recv)|nccl:(send|recv)|SendRecv"),
    ("optimizer", r"Optimizer\.(step|zero_grad)|_adamw|multi_tensor_apply"),
    ("attention", r"scaled_dot_product|ScaledDotProduct|flash_attention|efficient_attention|fmha|flash_fwd|flash_bwd"),
    ("dropout_rng", r"dropout|bernoulli|Dropout|philox"),
    ("normalization", r"layer_norm|batch_norm|LayerNorm|BatchNorm|layernorm|bn_fw|bn_bw"),
    ("activation", r"gelu|relu|threshold|GeluBackward|ReluBackward|ThresholdBackward|max_pool|MaxPool"),
    # The loss's log-softmax over the vocabulary is a softmax too; the loss goes with it.
    ("softmax", r"softmax|Softmax|cross_entropy|nll_loss|NllLoss"),
    ("elementwise", r"reducer::mul_out"),  # DDP divides the reduced gradients by the world size
    ("data_movement", r"copy_bucket_to_grad"),
    ("matmul", r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|einsum|conv\w*|_convolution\w*|mkldnn_convolution"
               r"|_slow_conv2d\w*|convolution\w*)" + LEAF + r"|gemm|cutlass|cublas|sm\d+_xmma"),
    ("data_movement", r"aten::(copy_|_to_copy|to|clone|contiguous|cat|stack|index_select|embedding\w*|gather"
                      r"|scatter\w*|index\w*|take_along_dim|zero_|zeros|zeros_like|fill_|ones|full|arange|unflatten_dense_tensors"
                      r"|flatten_dense_tensors)" + LEAF
                      + r"|embedding|Memcpy|Memset|EmbeddingBackward|GatherBackward|IndexBackward"),
    ("elementwise", r"aten::(add|add_|sub|rsub|mul|mul_|div|div_|sum|mean|pow|sqrt|rsqrt|exp|log|neg|where"
                    r"|masked_fill\w*|eq|ne|ge|gt|lt|le|abs|clamp\w*|max|min|argmax|sort|lerp_|addcmul_|addcdiv_"
                    r"|_foreach_\w+|ones_like|bitwise_\w+|logical_\w+|expand_as|reciprocal|sign|tanh_backward"
                    r"|_local_scalar_dense|item|square|var|std|norm|linalg_vector_norm)" + LEAF),
    # torch's own bookkeeping: views, allocations, autograd's and DDP's wrappers (their self time only).
    ("host_idle", r"(aten::(view|reshape|_reshape_alias|t|transpose|permute|expand|as_strided|unsqueeze|squeeze"
                  r"|slice|select|detach|detach_|empty|empty_strided|empty_like|alias|resolve_conj|resolve_neg"
                  r"|flatten|split|chunk|unbind|narrow|_unsafe_view|lift_fresh|result_type|set_|is_nonzero|resize_|numpy_T)"
                  r"|autograd::engine::evaluate_function: \w+|\w+Backward\d*|torch::autograd::AccumulateGrad"
                  r"|detach|DistributedDataParallel\.\w+|DataParallel\.\w+|cudaStreamSynchronize|cudaDeviceSynchronize"
                  r"|cudaLaunchKernel|cudaMemcpyAsync|c10d::wait|Future::wait|FSDP::\w+.*"
                  # DTensor's dispatch (tensor parallel): a functional collective's wait, its wrappers, the
                  # subclass's Python dispatch and redistribution (their self time; the collectives inside count
                  # as collectives)
                  r"|_c10d_functional::wait_tensor|_c10d_functional::_wrap_tensor_autograd|PythonSubclass"
                  r"|_FromTorchTensor|_ToTorchTensor|Redistribute)" + LEAF),
)


def _thread(event) -> str:
    return f"{event.device_type.name}:{event.device_index}:{event.thread}"


class TorchProfiler:
    """common.profile's StepProfiler for torch."""

    def __init__(self, directory: Path, device: torch.device, rank: int):
        self.directory, self.rank = directory, rank
        self.cuda = device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        # with_flops: torch's own count for matmuls and convolutions; shapes and stacks stay off (their cost
        # would land in the steps).
        self._profile = profile(activities=activities, with_flops=True)
        self.name = (f"torch.profiler ({', '.join(a.name for a in activities)} activities), events from "
                     f"profile.events(); trace {self.directory / self._file_name()}")
        self.rules = RULES

    def _file_name(self) -> str:
        return f"rank{self.rank}.pt.trace.json"

    def start(self) -> None:
        self._profile.start()

    def step(self, index: int):
        return record_function(STEP_MARKER)

    def stop(self) -> Trace:
        self._profile.stop()
        path = self.directory / self._file_name()
        self._profile.export_chrome_trace(str(path))
        events, windows = [], []
        for e in self._profile.events():
            start, end = e.time_range.start / 1e6, e.time_range.end / 1e6
            on_host = e.device_type == DeviceType.CPU
            if e.name == STEP_MARKER:
                if on_host:  # on a GPU the annotation shows on the device's timeline as well
                    windows.append((start, end))
                continue
            name = f"host: {e.name}" if self.cuda and on_host else e.name
            events.append(OpEvent(name, start, end, _thread(e), float(getattr(e, "flops", 0) or 0)))
        return Trace(events, sorted(windows), [path])
