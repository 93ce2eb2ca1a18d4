"""MNIST IDX reader (NumPy only): validates every header field before trusting the bytes."""
from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from common.errors import DataError

IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049
SPLIT_PREFIX = {"train": "train", "test": "t10k"}


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as fh:
            return fh.read()
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise DataError(f"{path}: unreadable or truncated gzip stream ({exc})") from None


def read_idx_images(path: Path) -> np.ndarray:
    raw = _read_bytes(path)
    if len(raw) < 16:
        raise DataError(f"{path}: {len(raw)} bytes, shorter than the 16-byte IDX image header")
    magic, count, rows, cols = struct.unpack(">IIII", raw[:16])
    if magic != IMAGE_MAGIC:
        raise DataError(f"{path}: magic {magic}, expected {IMAGE_MAGIC} for an IDX image file")
    if (rows, cols) != (28, 28):
        raise DataError(f"{path}: images are {rows}x{cols}, expected 28x28")
    expected = 16 + count * rows * cols
    if len(raw) != expected:
        raise DataError(f"{path}: {len(raw)} bytes, header promises {expected} ({count} images)")
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(count, rows, cols)


def read_idx_labels(path: Path) -> np.ndarray:
    raw = _read_bytes(path)
    if len(raw) < 8:
        raise DataError(f"{path}: {len(raw)} bytes, shorter than the 8-byte IDX label header")
    magic, count = struct.unpack(">II", raw[:8])
    if magic != LABEL_MAGIC:
        raise DataError(f"{path}: magic {magic}, expected {LABEL_MAGIC} for an IDX label file")
    if len(raw) != 8 + count:
        raise DataError(f"{path}: {len(raw)} bytes, header promises {8 + count} ({count} labels)")
    labels = np.frombuffer(raw, dtype=np.uint8, offset=8)
    if labels.size and labels.max() > 9:
        raise DataError(f"{path}: label {int(labels.max())} outside 0-9")
    return labels


def load_mnist(data_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 28, 28], labels uint8 [N]) of `split` ("train" or "test")."""
    prefix = SPLIT_PREFIX[split]
    folder = data_dir / "mnist"
    images = read_idx_images(folder / f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx_labels(folder / f"{prefix}-labels-idx1-ubyte.gz")
    if len(images) != len(labels):
        raise DataError(f"{folder}: {len(images)} {prefix} images but {len(labels)} labels")
    return images, labels
