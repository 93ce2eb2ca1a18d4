"""The layouts large decoders train with, for bench.predict --model: Megatron tensor parallel with or without
sequence parallelism, pipelines (GPipe, 1F1B, interleaved 1F1B with virtual stages), context parallelism, data
parallelism plain, with a distributed optimizer (ZeRO-1), FSDP (ZeRO-3) or HSDP, full or selective recompute,
micro-batches of a chosen size (gradient accumulation), bf16.

A name is common.layout's grammar widened: dimensions dp<N>, fsdp<N>, tp<N>, pp<N>, cp<N> joined by 'x' (a bare
dp or fsdp takes the devices the others leave, and a name with neither takes them as dp; dp<R>xfsdp<S> is HSDP,
R replicas of S-way shards), then options
joined by '-': sp (sequence parallel), zero1 (distributed optimizer), gpipe | 1f1b (default), vp<V> (interleaved
1F1B, V model chunks per rank), mbs<B> (sequences per micro-batch, default 1), rc (full recompute) | sel
(selective), tpo (tensor-parallel communication overlapped with GEMMs: Megatron --tp-comm-overlap,
torchtitan's AsyncTP). E.g. tp8xpp6xdp-sp-zero1-vp2-tpo. What the model cannot honour is refused in one line
(fp8, expert parallelism, anything unknown): no option is accepted and ignored.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from common.predict.decoder import DecoderSpec

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
_DIM = re.compile(r"(fsdp|dp|tp|pp|cp)([0-9]*)")
REFUSED = {
    "fp8": "fp8 is not modelled (the compute tables hold bf16 GEMM rates; Float8's scaling and casts are not "
           "counted)",
    "ep": "expert parallelism is not modelled: the bundled models are dense",
}


class Refused(ValueError):
    """A name the grammar does not say or the model cannot honour, whatever the device count."""


@dataclass(frozen=True)
class LlmLayout:
    dp: int = 1                 # data-parallel replicas (under HSDP: the replicas of each shard group)
    shard: int = 1              # FSDP shard group size (1: no FSDP)
    tp: int = 1
    pp: int = 1
    cp: int = 1
    sp: bool = False
    zero1: bool = False
    schedule: str = "1f1b"
    virtual: int = 1            # interleaved 1F1B: model chunks per rank
    micro_batch: int = 1        # sequences per micro-batch
    recompute: str = "none"
    tp_overlap: bool = False
    precision: str = "bf16"

    @property
    def data(self) -> int:
        """Ranks that split the batch: replicas x shards."""
        return self.dp * self.shard

    @property
    def devices(self) -> int:
        return self.data * self.tp * self.pp * self.cp

    @property
    def name(self) -> str:
        dims = []
        if self.dp > 1:
            dims.append(f"dp{self.dp}")
        if self.shard > 1:
            dims.append(f"fsdp{self.shard}")
        dims += [f"{d}{getattr(self, d)}" for d in ("tp", "pp", "cp") if getattr(self, d) > 1]
        opts = [w for w, on in (("sp", self.sp), ("zero1", self.zero1), ("gpipe", self.schedule == "gpipe"),
                                (f"vp{self.virtual}", self.schedule == "interleaved"),
                                (f"mbs{self.micro_batch}", self.micro_batch != 1),
                                ("rc", self.recompute == "full"), ("sel", self.recompute == "selective"),
                                ("tpo", self.tp_overlap)) if on]
        return "-".join(["x".join(dims) or "1 device", *opts])

    def micro_batches(self, global_batch: int) -> int:
        return global_batch // (self.data * self.micro_batch)

    def validate(self, spec: DecoderSpec, global_batch: int) -> None:
        """ValueError naming the first thing that cannot be laid out."""
        if spec.heads % self.tp or spec.ffn % self.tp:
            raise ValueError(f"{self.name}: {spec.name}'s {spec.heads} heads and FFN {spec.ffn} must divide by tp "
                             f"{self.tp}")
        if self.tp > spec.kv_heads and self.tp % spec.kv_heads:
            raise ValueError(f"{self.name}: {spec.kv_heads} key/value heads cannot be split or replicated over tp "
                             f"{self.tp}")
        if self.sp and self.tp == 1:
            raise ValueError(f"{self.name}: sequence parallelism (sp) needs tensor parallelism")
        if self.zero1 and self.shard > 1:
            raise ValueError(f"{self.name}: zero1 shards the optimizer of plain data parallelism; FSDP already does")
        if self.pp == 1 and (self.schedule != "1f1b" or self.virtual > 1):
            raise ValueError(f"{self.name}: a pipeline schedule needs pp > 1")
        chunks = self.pp * self.virtual
        if spec.layers < chunks:
            raise ValueError(f"{self.name}: {spec.layers} layers cannot fill {chunks} pipeline chunks")
        if global_batch % (self.data * self.micro_batch):
            raise ValueError(f"{self.name}: global batch {global_batch} is not a multiple of {self.data} data ranks "
                             f"x micro-batches of {self.micro_batch}")
        m = self.micro_batches(global_batch)
        if self.schedule == "interleaved" and m % self.pp:
            raise ValueError(f"{self.name}: interleaved 1F1B needs the {m} micro-batches to be a multiple of pp "
                             f"{self.pp} (as Megatron requires)")
        if spec.seq_len % (2 * self.cp):
            raise ValueError(f"{self.name}: sequence {spec.seq_len} must split into 2 x cp {self.cp} chunks")


def parse(entry: str, devices: int) -> LlmLayout:
    """A layout name at a device count; Refused (a ValueError, one line) for anything the grammar (module doc)
    does not say or the model cannot honour, ValueError when the name cannot fill `devices`."""
    head, *words = entry.strip().split("-")
    values: dict[str, object] = {}
    bare = None
    for part in head.split("x"):
        match = _DIM.fullmatch(part)
        if not match:
            why = REFUSED.get(re.sub(r"[0-9]+$", "", part))
            raise Refused(f"{entry!r}: {why}" if why else
                             f"{entry!r}: {part!r} is not dp<N>, fsdp<N>, tp<N>, pp<N> or cp<N> (or a bare dp/fsdp)")
        kind, size = match.group(1), match.group(2)
        key = "shard" if kind == "fsdp" else kind
        if key in values or (bare and bare == kind):
            raise Refused(f"{entry!r}: the {kind} dimension is given twice")
        if not size:
            if kind not in ("dp", "fsdp") or bare:
                raise Refused(f"{entry!r}: only one bare dp or fsdp may take the devices left")
            bare = kind
            continue
        if int(size) < 1 or size != str(int(size)):
            raise Refused(f"{entry!r}: {part!r} needs a size >= 1 without leading zeros")
        values[key] = int(size)
    for word in words:
        _option(entry, word, values)
    if values.get("virtual", 1) > 1 and values.get("schedule") != "interleaved":
        raise Refused(f"{entry!r}: vp<V> is interleaved 1F1B; it cannot be combined with {values['schedule']}")
    layout = LlmLayout(**values)
    taken = layout.devices
    if not bare and layout.data == 1 and taken < devices:
        bare = "dp"   # as bench.predict's BERT layouts: a name without a data dimension takes the rest as dp
    if bare:
        if devices % taken:
            raise ValueError(f"{entry!r} at {devices} devices: the other dimensions ({taken}) do not divide them")
        layout = replace(layout, **{"shard" if bare == "fsdp" else "dp": devices // taken})
    elif layout.devices != devices:
        raise ValueError(f"{entry!r} uses {layout.devices} devices, not {devices}")
    return layout


def _option(entry: str, word: str, values: dict) -> None:
    flags = {"sp": ("sp", True), "zero1": ("zero1", True), "gpipe": ("schedule", "gpipe"),
             "1f1b": ("schedule", "1f1b"), "rc": ("recompute", "full"), "sel": ("recompute", "selective"),
             "tpo": ("tp_overlap", True), "bf16": ("precision", "bf16")}
    if word in flags:
        key, value = flags[word]
    elif (m := re.fullmatch(r"vp([0-9]+)", word)) and int(m.group(1)) >= 2:
        key, value = "virtual", int(m.group(1))
        if values.get("schedule", "1f1b") != "1f1b":
            raise Refused(f"{entry!r}: vp<V> is interleaved 1F1B; it cannot be combined with {values['schedule']}")
        values["schedule"] = "interleaved"
    elif (m := re.fullmatch(r"mbs([0-9]+)", word)) and int(m.group(1)) >= 1:
        key, value = "micro_batch", int(m.group(1))
    elif word in REFUSED:
        raise Refused(f"{entry!r}: {REFUSED[word]}")
    else:
        raise Refused(f"{entry!r}: unknown option {word!r}; choose from sp, zero1, gpipe, 1f1b, vp<V>, mbs<B>, "
                         "rc, sel, tpo")
    if key in values and not (key == "schedule" and values[key] == "interleaved" and value == "1f1b"):
        raise Refused(f"{entry!r}: {word!r} repeats an option or contradicts one given")
    if key == "schedule" and values.get(key) == "interleaved":
        return
    values[key] = value
