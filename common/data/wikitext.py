"""WikiText-2 (tokenized v1): word vocabulary from the train split, packed fixed-length sequences (the MLM's, and
the decoder LM's one token longer: its inputs and, shifted by one, its labels)."""
from __future__ import annotations

from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np

from common.data import token_cache
from common.errors import DataError
from common.spec import CLS_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID, WIKITEXT2_VOCAB_SIZE

SPLITS = ("train", "valid", "test")


def _read_words(path: Path) -> list[list[str]]:
    """Non-blank lines as word lists. The files are already tokenized: whitespace splits words."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: unreadable as UTF-8 text ({exc})") from None
    return [words for words in (line.split() for line in text.splitlines()) if words]


@lru_cache(maxsize=4)
def build_vocab(data_dir: Path) -> dict[str, int]:
    """Specials first, then train words by descending count (ties: first appearance)."""
    path = data_dir / "wikitext-2" / "wiki.train.tokens"
    counts = Counter(w for line in _read_words(path) for w in line)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word, _ in counts.most_common():
        vocab.setdefault(word, len(vocab))
    if len(vocab) != WIKITEXT2_VOCAB_SIZE:
        raise DataError(f"{path}: vocabulary of {len(vocab)} entries, the spec expects "
                        f"{WIKITEXT2_VOCAB_SIZE}; is this the tokenized v1 WikiText-2?")
    return vocab


def pack(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """[CLS] + (seq_len - 1) stream tokens per row; the last row is padded with [PAD]."""
    body = seq_len - 1
    rows = -(-len(stream) // body)
    packed = np.full((rows, seq_len), PAD_ID, dtype=np.int32)
    packed[:, 0] = CLS_ID
    flat = np.full(rows * body, PAD_ID, dtype=np.int32)
    flat[: len(stream)] = stream
    packed[:, 1:] = flat.reshape(rows, body)
    return packed


def pack_causal(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Rows of seq_len + 1 tokens for next-token training, each starting where the last one's inputs end (the
    row's last token is its last label and the next row's first input), so every token after the first is a
    label exactly once; the last row is padded with [PAD], which the stream never holds."""
    rows = -(-(len(stream) - 1) // seq_len)
    flat = np.full(rows * seq_len + 1, PAD_ID, dtype=np.int32)
    flat[: len(stream)] = stream
    starts = np.arange(rows)[:, None] * seq_len
    return flat[starts + np.arange(seq_len + 1)[None, :]]


def _split_path(data_dir: Path, split: str) -> Path:
    return data_dir / "wikitext-2" / f"wiki.{split}.tokens"


def token_stream(data_dir: Path, split: str) -> np.ndarray:
    """The token ids of `split`, in order, int32; each line ends with [SEP], as an <eos> would. Computed once per
    content of the train (vocabulary) and split files, then read from common.data.token_cache."""
    path, train = _split_path(data_dir, split), _split_path(data_dir, "train")
    if not path.is_file() or not train.is_file():
        raise DataError(f"{path if not path.is_file() else train}: file not found")
    name = token_cache.key(f"wikitext2-{split}", [train, path])
    cached = token_cache.read(name)
    if cached is not None:
        return cached
    vocab = build_vocab(data_dir)
    ids = np.asarray([vocab.get(w, UNK_ID) for line in _read_words(path) for w in (*line, SPECIAL_TOKENS[SEP_ID])],
                     dtype=np.int32)
    token_cache.write(name, ids)
    return ids


def load_wikitext(data_dir: Path, split: str, seq_len: int, causal: bool = False) -> np.ndarray:
    """Token ids of `split`, packed: [N, seq_len] for the MLM, [N, seq_len + 1] for next-token training
    (`causal`), int32."""
    stream = token_stream(data_dir, split)
    return pack_causal(stream, seq_len) if causal else pack(stream, seq_len)
