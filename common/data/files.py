"""The public data files the suite reads: their place in the data dir, checksums and sources.

One table for the readers, the downloader and the tests. Checksums are those of
the verified copies described in ``../shared/data/README.md``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DATA_DIR_ENV = "PARBENCH_DATA_DIR"
DEFAULT_DATA_DIR = Path("~/.cache/parbench")

# wikitext-2-v1.zip holds the three token files under this folder name.
WIKITEXT_ZIP_URL = "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip"
WIKITEXT_ZIP_MEMBER_DIR = "wikitext-2/"


@dataclass(frozen=True)
class DataFile:
    dataset: str        # "mnist" or "wikitext-2"
    name: str           # file name inside the dataset folder
    size: int           # bytes
    sha256: str
    urls: tuple[str, ...] = ()  # direct sources, tried in order; zip members are handled apart

    @property
    def relpath(self) -> str:
        return f"{self.dataset}/{self.name}"


_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)


def _mnist(name: str, size: int, sha256: str) -> DataFile:
    return DataFile("mnist", name, size, sha256, tuple(m + name for m in _MNIST_MIRRORS))


def _wikitext(split: str, size: int, sha256: str, example_name: str) -> DataFile:
    # PyTorch's word_language_model example ships the same blobs under other names.
    example = f"https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2/{example_name}"
    return DataFile("wikitext-2", f"wiki.{split}.tokens", size, sha256, (example,))


FILES: tuple[DataFile, ...] = (
    _mnist("train-images-idx3-ubyte.gz", 9912422,
           "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
    _mnist("train-labels-idx1-ubyte.gz", 28881,
           "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
    _mnist("t10k-images-idx3-ubyte.gz", 1648877,
           "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
    _mnist("t10k-labels-idx1-ubyte.gz", 4542,
           "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
    _wikitext("train", 10797148,
              "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f", "train.txt"),
    _wikitext("valid", 1121681,
              "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8", "valid.txt"),
    _wikitext("test", 1256449,
              "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0", "test.txt"),
)

DATASETS = {"cnn": "mnist", "mlm": "wikitext-2", "lm": "wikitext-2"}  # workload -> dataset folder


def files_of(dataset: str) -> tuple[DataFile, ...]:
    return tuple(f for f in FILES if f.dataset == dataset)


def resolve_data_dir(explicit: str | os.PathLike | None = None) -> Path:
    """--data-dir, else $PARBENCH_DATA_DIR, else ~/.cache/parbench; absolute, because the docs'
    `PARBENCH_DATA_DIR=../shared/data` must mean the same to every worker and file:// URI made from it."""
    raw = explicit or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(raw).expanduser().absolute()


def missing_files(data_dir: Path, dataset: str) -> list[Path]:
    return [data_dir / f.relpath for f in files_of(dataset) if not (data_dir / f.relpath).is_file()]
