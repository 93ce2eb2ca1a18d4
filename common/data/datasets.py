"""One split of a workload's data as NumPy arrays, real or synthetic, before batching."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from common.data.files import DATASETS, missing_files
from common.data.mnist import load_mnist
from common.data.synthetic import synthetic_mnist, synthetic_wikitext
from common.data.wikitext import load_wikitext
from common.errors import DataError
from common.spec import BertSpec, CnnSpec

TRAIN_SPLIT = "train"


@dataclass(frozen=True)
class SplitData:
    workload: str
    split: str
    synthetic: bool
    # cnn: image uint8 [N,28,28], label uint8 [N]; mlm: tokens int32 [N,L]; lm: tokens int32 [N,L+1]
    arrays: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))


def resolve_data_mode(mode: str, workload: str, data_dir: Path) -> str:
    """`auto` means real when every file is there, else synthetic; `real` with files missing is an error."""
    missing = missing_files(data_dir, DATASETS[workload])
    if mode == "auto":
        return "synthetic" if missing else "real"
    if mode == "real" and missing:
        raise DataError(f"{missing[0]}: not found; run `python -m bench.data download "
                        f"--data-dir {data_dir}` or use --data synthetic")
    return mode


@lru_cache(maxsize=8)
def _real(workload: str, split: str, data_dir: Path, seq_len: int) -> dict[str, np.ndarray]:
    if workload == "cnn":
        images, labels = load_mnist(data_dir, split)
        return {"image": images, "label": labels}
    return {"tokens": load_wikitext(data_dir, split, seq_len, causal=workload == "lm")}


def load_split(workload: str, split: str, data_mode: str, data_dir: Path,
               spec: CnnSpec | BertSpec, seed: int) -> SplitData:
    if data_mode == "real":
        seq_len = getattr(spec, "seq_len", 0)
        return SplitData(workload, split, False, _real(workload, split, Path(data_dir), seq_len))
    if workload == "cnn":
        images, labels = synthetic_mnist(split, seed)
        return SplitData(workload, split, True, {"image": images, "label": labels})
    if data_mode != "synthetic":
        raise DataError(f"unknown data mode {data_mode!r}")
    tokens = synthetic_wikitext(split, spec.seq_len, seed, causal=workload == "lm")
    return SplitData(workload, split, True, {"tokens": tokens})
