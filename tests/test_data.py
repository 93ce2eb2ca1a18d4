"""Readers, masking and sharding: the part of the suite that makes backends comparable."""
from __future__ import annotations

import gzip
import hashlib
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from common.data import token_cache
from common.data.batches import (
    TOKEN_WEIGHTS,
    TrainBatches,
    _model_inputs,
    batch_weight,
    epoch_order,
    eval_batches,
    eval_indices,
    eval_samples,
    next_token_inputs,
)
from common.data.datasets import SplitData, load_split, resolve_data_mode
from common.data.masking import EVAL_EPOCH, mask_tokens
from common.data.mnist import load_mnist, read_idx_images, read_idx_labels
from common.data.synthetic import synthetic_mnist, synthetic_wikitext
from common.data.wikitext import build_vocab, load_wikitext, token_stream
from common.errors import BadInput, DataError
from common.spec import BERT_SIZES, CLS_ID, CNN, MASK_ID, PAD_ID, SEP_ID, WIKITEXT2_VOCAB_SIZE

TINY = BERT_SIZES["tiny"]
# Per-class counts from ../shared/data/README.md.
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


# ----------------------------------------------------------------------------- MNIST


def test_mnist_real_counts(data_dir):
    for split, counts in (("train", TRAIN_COUNTS), ("test", TEST_COUNTS)):
        images, labels = load_mnist(data_dir, split)
        assert images.shape == (sum(counts), 28, 28) and images.dtype == np.uint8
        assert np.bincount(labels, minlength=10).tolist() == counts
        assert images.min() == 0 and images.max() == 255


def _write_gz(path: Path, payload: bytes) -> Path:
    with gzip.open(path, "wb") as fh:
        fh.write(payload)
    return path


@pytest.mark.parametrize("header, body, needle", [
    (struct.pack(">IIII", 2049, 1, 28, 28), bytes(784), "magic 2049"),
    (struct.pack(">IIII", 2051, 2, 28, 28), bytes(784), "header promises"),
    (struct.pack(">IIII", 2051, 1, 32, 32), bytes(1024), "32x32"),
    (b"\x00\x00", b"", "shorter than"),
])
def test_mnist_images_rejects_bad_headers(tmp_path, header, body, needle):
    path = _write_gz(tmp_path / "bad-images-idx3-ubyte.gz", header + body)
    with pytest.raises(DataError, match=needle) as info:
        read_idx_images(path)
    assert str(path) in str(info.value)


def test_mnist_labels_rejects_bad_values(tmp_path):
    path = _write_gz(tmp_path / "l.gz", struct.pack(">II", 2049, 2) + bytes([3, 11]))
    with pytest.raises(DataError, match="label 11"):
        read_idx_labels(path)


def test_mnist_truncated_gzip_names_the_file(tmp_path, data_dir):
    src = data_dir / "mnist" / "t10k-images-idx3-ubyte.gz"
    cut = tmp_path / "t10k-images-idx3-ubyte.gz"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(DataError, match="truncated") as info:
        read_idx_images(cut)
    assert str(cut) in str(info.value)


def test_mnist_missing_and_mismatched_counts(tmp_path, data_dir):
    with pytest.raises(DataError, match="not found"):
        load_mnist(tmp_path, "test")
    (tmp_path / "mnist").mkdir()
    shutil.copy(data_dir / "mnist" / "t10k-images-idx3-ubyte.gz", tmp_path / "mnist")
    _write_gz(tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz", struct.pack(">II", 2049, 3) + bytes(3))
    with pytest.raises(DataError, match="10000 t10k images but 3 labels"):
        load_mnist(tmp_path, "test")


def test_real_mode_without_files_is_bad_input(tmp_path):
    with pytest.raises(DataError, match="bench.data download"):
        resolve_data_mode("real", "cnn", tmp_path)
    assert resolve_data_mode("auto", "cnn", tmp_path) == "synthetic"


# ----------------------------------------------------------------------------- WikiText-2


def test_wikitext_vocabulary(data_dir):
    vocab = build_vocab(data_dir)
    assert len(vocab) == WIKITEXT2_VOCAB_SIZE
    assert [vocab[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]
    assert vocab["the"] == 5  # the most frequent word comes first


def test_wikitext_packing(data_dir):
    tokens = load_wikitext(data_dir, "valid", TINY.seq_len)
    assert tokens.shape[1] == 128 and tokens.dtype == np.int32
    assert (tokens[:, 0] == CLS_ID).all()
    # 213,886 words + one [SEP] for each of the 2,461 non-blank lines, 127 per row.
    real = (tokens[:, 1:] != PAD_ID).sum()
    assert real == 213886 + (tokens == SEP_ID).sum()
    assert len(tokens) == -(-real // 127)
    assert (tokens[:-1] != PAD_ID).all()  # only the last row is padded


def test_wikitext_ids_are_computed_once_per_content_and_read_back_the_same(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv(token_cache.CACHE_ENV, str(tmp_path / "cache"))
    copy = tmp_path / "data" / "wikitext-2"
    copy.mkdir(parents=True)
    for split in ("train", "valid"):
        shutil.copy(data_dir / "wikitext-2" / f"wiki.{split}.tokens", copy)
    computed = token_stream(tmp_path / "data", "valid")
    [cached] = (tmp_path / "cache").glob("wikitext2-valid-*.npy")
    assert np.array_equal(np.load(cached), computed)
    build_vocab.cache_clear()
    with monkeypatch.context() as m:  # read from the cache: no tokenizing, no vocabulary built
        m.setattr("common.data.wikitext.build_vocab", None)
        assert np.array_equal(token_stream(tmp_path / "data", "valid"), computed)
    # A changed file is another key: its ids are computed anew, never the stale ones served.
    with (copy / "wiki.valid.tokens").open("a") as f:
        f.write(" the end \n")
    changed = token_stream(tmp_path / "data", "valid")
    assert len(changed) == len(computed) + 3 and len(list((tmp_path / "cache").glob("wikitext2-valid-*.npy"))) == 2
    # A damaged cache file is computed anew; a cache dir that cannot be written is no error.
    cached.write_bytes(b"not an array")
    assert np.array_equal(token_stream_after_edit_undone(copy, data_dir, tmp_path), computed)
    monkeypatch.setenv(token_cache.CACHE_ENV, str(cached))  # a file, not a folder
    assert np.array_equal(token_stream(tmp_path / "data", "valid"), computed)


def token_stream_after_edit_undone(copy: Path, data_dir: Path, root: Path) -> np.ndarray:
    shutil.copy(data_dir / "wikitext-2" / "wiki.valid.tokens", copy)
    return token_stream(root / "data", "valid")


# ----------------------------------------------------------------------------- masking


@pytest.fixture(scope="module")
def valid_tokens(data_dir):
    return load_wikitext(data_dir, "valid", TINY.seq_len)


def test_masking_statistics(valid_tokens):
    m = mask_tokens(valid_tokens, TINY, seed=0, epoch=0)
    sel = m["mask_weights"] > 0
    maskable = ~np.isin(valid_tokens, [PAD_ID, CLS_ID, SEP_ID, MASK_ID])
    assert sel.sum() / maskable.sum() == pytest.approx(0.15, abs=0.005)
    rows, cols = np.nonzero(sel)
    pos = m["mask_positions"][rows, cols]
    original = valid_tokens[rows, pos]
    assert (m["mask_ids"][rows, cols] == original).all()  # labels are the original words
    assert maskable[rows, pos].all()  # never a special token
    got = m["input_ids"][rows, pos]
    as_mask, kept = (got == MASK_ID).mean(), (got == original).mean()
    assert as_mask == pytest.approx(0.8, abs=0.01)
    assert kept == pytest.approx(0.1, abs=0.01)  # 10% kept, plus the rare random draw of itself
    # Outside the selected positions the input is untouched.
    untouched = np.ones_like(valid_tokens, dtype=bool)
    untouched[rows, pos] = False
    assert (m["input_ids"][untouched] == valid_tokens[untouched]).all()
    assert (m["mask_ids"][~sel] == 0).all()


def test_masking_is_a_function_of_seed_and_epoch(valid_tokens):
    a = mask_tokens(valid_tokens, TINY, seed=3, epoch=1)
    b = mask_tokens(valid_tokens, TINY, seed=3, epoch=1)
    c = mask_tokens(valid_tokens, TINY, seed=3, epoch=2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["mask_positions"], c["mask_positions"])


# ----------------------------------------------------------------------------- sharding


def _split(n=1000):
    return load_split("cnn", "test", "synthetic", Path("."), CNN, seed=0)


def test_epoch_order_is_a_function_of_seed_and_epoch():
    assert np.array_equal(epoch_order(100, 1, 2), epoch_order(100, 1, 2))
    assert not np.array_equal(epoch_order(100, 1, 2), epoch_order(100, 1, 3))
    assert sorted(epoch_order(100, 1, 2)) == list(range(100))


@pytest.mark.parametrize("world, accum", [(2, 1), (4, 1), (2, 3)])
def test_ranks_together_see_the_one_device_batch(world, accum):
    data = _split()
    one = TrainBatches(data, CNN, 0, per_device_batch=4 * world * accum, world=1, rank=0)
    ranks = [TrainBatches(data, CNN, 0, per_device_batch=4, world=world, rank=r, micro_batches=accum)
             for r in range(world)]
    for step in (0, 7, one.steps_per_epoch + 1):  # also across an epoch boundary
        ref = one.get(step)
        shards = [rb.get(step) for rb in ranks]
        # Micro-batch k of rank r holds global positions k*b*world + r*b ... + b.
        joined = np.concatenate([shards[r].micro[k]["label"] for k in range(accum) for r in range(world)])
        assert np.array_equal(joined, ref.micro[0]["label"])
        assert all(s.denominator == ref.denominator == 4 * world * accum for s in shards)
    epochs = {r.epoch_digest(0) for r in ranks}
    assert len(epochs) == world  # different samples per rank


def test_mlm_denominator_counts_the_global_masked_tokens():
    data = load_split("mlm", "train", "synthetic", Path("."), TINY, seed=0)
    ranks = [TrainBatches(data, TINY, 0, 4, 2, r) for r in range(2)]
    steps = [r.get(5) for r in ranks]
    total = sum(float(s.micro[0]["mask_weights"].sum()) for s in steps)
    assert steps[0].denominator == steps[1].denominator == total


@pytest.mark.parametrize("n, world", [(10000, 1), (10000, 3), (7, 4), (3, 4)])
def test_eval_covers_every_sample_exactly_once(n, world):
    seen = np.concatenate([eval_indices(n, r, world) for r in range(world)])
    assert np.array_equal(np.sort(seen), np.arange(n))


def test_eval_batches_count(data_dir):
    data = load_split("cnn", "test", "real", data_dir, CNN, seed=0)
    counts = [sum(len(b["label"]) for b in eval_batches(data, CNN, 0, r, 3, 256)) for r in range(3)]
    assert sum(counts) == 10000
    # --eval-samples 700: the split's first 700, each once, over the ranks; more than the split is all of it.
    limited = [b["label"] for r in range(3) for b in eval_batches(data, CNN, 0, r, 3, 256, limit=700)]
    assert sum(len(b) for b in limited) == 700 == eval_samples(data, 700)
    assert np.array_equal(np.concatenate(limited), data.arrays["label"][:700])
    assert eval_samples(data, 50_000) == eval_samples(data) == 10000


# ----------------------------------------------------------------------------- synthetic


def test_synthetic_mnist_is_learnable():
    """A nearest-class-mean classifier fitted on train gets far above chance on test."""
    x, y = synthetic_mnist("train", seed=0)
    tx, ty = synthetic_mnist("test", seed=0)
    means = np.stack([x[y == c].reshape(-1, 784).mean(0) for c in range(10)])
    pred = np.argmin(((tx.reshape(-1, 1, 784) / 255.0 - means[None] / 255.0) ** 2).sum(-1), axis=1)
    assert (pred == ty).mean() > 0.5
    assert x.shape == (60000, 28, 28) and tx.shape == (10000, 28, 28)


def test_synthetic_wikitext_is_predictable_from_the_left_neighbour():
    tokens = synthetic_wikitext("train", TINY.seq_len, seed=0)
    assert tokens.shape[1] == TINY.seq_len and tokens.max() < TINY.vocab_size
    pairs = {}
    for a, b in zip(tokens[:, 1:-1].ravel(), tokens[:, 2:].ravel()):
        pairs.setdefault(a, []).append(b)
    agree = np.mean([np.mean(np.array(v) == np.bincount(v).argmax()) for v in pairs.values()])
    assert agree > 0.85


# ----------------------------------------------------------------------------- one rank's shard, by hand
# Eight samples whose label is their id and whose pixels are 51 x (id % 6): which ids each rank, micro-batch and
# device gets is read back from the batch itself.

# epoch_order(8, seed 0, ...): every backend's global order, so the exact permutation is part of the experiment.
ORDER_0 = [7, 6, 4, 2, 1, 3, 5, 0]
ORDER_1 = [2, 5, 4, 7, 0, 6, 1, 3]


def _ids(n: int = 8) -> SplitData:
    ids = np.arange(n, dtype=np.uint8)
    return SplitData("cnn", "train", True, {"image": np.broadcast_to((51 * (ids % 6))[:, None, None], (n, 2, 2)).copy(),
                                            "label": ids})


def _labels(step_batch) -> list[list[int]]:
    return [b["label"].tolist() for b in step_batch.micro]


def test_the_epoch_order_is_the_shared_permutation_of_seed_and_epoch():
    assert epoch_order(8, 0, 0).tolist() == ORDER_0
    assert epoch_order(8, 0, 1).tolist() == ORDER_1
    assert epoch_order(8, 1, 0).tolist() == [4, 5, 3, 0, 2, 6, 1, 7]


def test_each_rank_gets_its_slice_of_every_micro_batch():
    # b=1, 2 ranks, 2 micro-batches: a global batch of 4, two steps an epoch. Step 0 takes ORDER_0[0:4] = 7 6 4 2:
    # micro-batch 0 is 7 (rank 0), 6 (rank 1); micro-batch 1 is 4, 2.
    ranks = [TrainBatches(_ids(), CNN, 0, 1, 2, r, micro_batches=2) for r in range(2)]
    assert (ranks[1].global_batch, ranks[1].steps_per_epoch) == (4, 2)
    assert [_labels(r.get(0)) for r in ranks] == [[[7], [4]], [[6], [2]]]
    assert [_labels(r.get(1)) for r in ranks] == [[[1], [5]], [[3], [0]]]
    # Step 2 is the first of epoch 1: ORDER_1[0:4] = 2 5 4 7.
    second = ranks[1].get(2)
    assert _labels(second) == [[5], [7]] and second.epoch == 1 and type(second.epoch) is int
    assert ranks[1].get(3).epoch == 1 and ranks[1].get(1).epoch == 0
    assert [i.tolist() for i in ranks[1].rank_indices(3)] == [[6], [3]]
    assert ranks[1].global_indices(3).tolist() == [0, 6, 1, 3]
    assert ranks[0].get(0).denominator == 4.0 and ranks[0].get(0).device_ids[0].tolist() == [7, 4]


def test_a_cnn_batch_is_scaled_once_to_float32_and_labelled_int32():
    [micro] = TrainBatches(_ids(), CNN, 0, 2, 1, 0).get(0).micro  # ids 7 and 6: pixels 51 and 0
    assert micro["image"].dtype == np.float32 and micro["label"].dtype == np.int32
    assert micro["label"].tolist() == [7, 6]
    assert micro["image"][:, 0, 0].tolist() == [pytest.approx(0.2, rel=1e-6), 0.0]
    [micro] = TrainBatches(_ids(), CNN, 0, 2, 1, 0).get(1).micro  # ids 4 and 2: pixels 204 and 102
    assert micro["image"][:, 1, 1].tolist() == [pytest.approx(0.8, rel=1e-6), pytest.approx(0.4, rel=1e-6)]
    [micro] = TrainBatches(_ids(11), CNN, 0, 11, 1, 0).get(0).micro  # id 5: pixel 255 is 1
    assert micro["image"].max() == pytest.approx(1.0, rel=1e-6)


def test_a_rank_driving_two_devices_hands_each_its_contiguous_piece():
    # One rank, b=2 over 2 local devices, 2 micro-batches: 7 6 | 4 2; device 0 trains on 7 then 4, device 1 on 6, 2.
    local = TrainBatches(_ids(), CNN, 0, 2, 1, 0, micro_batches=2, local_devices=2)
    assert [d.tolist() for d in local.get(0).device_ids] == [[7, 4], [6, 2]]
    # Of 2 ranks with b=2 each, rank 1 holds 4 2: device 0 gets 4, device 1 gets 2.
    rank1 = TrainBatches(_ids(), CNN, 0, 2, 2, 1, local_devices=2)
    assert [d.tolist() for d in rank1.get(0).device_ids] == [[4], [2]]
    # One device by default: it trains on the whole rank's share.
    assert [d.tolist() for d in TrainBatches(_ids(), CNN, 0, 2, 1, 0, micro_batches=2).get(0).device_ids] == [
        [7, 6, 4, 2]]


def test_a_global_batch_may_take_every_sample_and_no_more():
    whole = TrainBatches(_ids(), CNN, 0, 4, 2, 0)
    assert whole.steps_per_epoch == 1 and _labels(whole.get(1)) == [[2, 5, 4, 7]]
    with pytest.raises(BadInput, match=r"^global batch 9 exceeds the 8 samples of cnn/train$"):
        TrainBatches(_ids(), CNN, 0, 3, 3, 0)


def test_an_epoch_digest_is_the_sha256_of_the_rank_s_ids_as_int64():
    # Epoch 1 of rank 1 (b=1, 2 ranks, 2 micro-batches): steps 2 and 3 give it 5 7 and 6 3.
    rank1 = TrainBatches(_ids(), CNN, 0, 1, 2, 1, micro_batches=2)
    assert rank1.epoch_digest(1) == hashlib.sha256(np.array([5, 7, 6, 3], np.int64).tobytes()).hexdigest()
    assert rank1.epoch_digest(0) == hashlib.sha256(np.array([6, 2, 3, 0], np.int64).tobytes()).hexdigest()


def test_an_epoch_is_drawn_once_however_many_steps_read_it(monkeypatch):
    drawn = []
    orders = epoch_order

    def counted(n, seed, epoch):
        drawn.append(epoch)
        return orders(n, seed, epoch)
    monkeypatch.setattr("common.data.batches.epoch_order", counted)
    batches = TrainBatches(_ids(), CNN, 0, 1, 2, 0, micro_batches=2)
    for step in (0, 1, 0, 2, 3):
        batches.get(step)
    assert drawn == [0, 1]


LM_TOKENS = np.array([[CLS_ID, 5, 6, 7], [CLS_ID, 8, PAD_ID, PAD_ID]], np.int32)


def test_next_token_inputs_shift_by_one_and_weigh_real_labels():
    got = next_token_inputs(LM_TOKENS)
    assert got["input_ids"].tolist() == [[CLS_ID, 5, 6], [CLS_ID, 8, PAD_ID]]
    assert got["labels"].tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]
    assert got["label_weights"].tolist() == [[1, 1, 1], [1, 0, 0]] and got["label_weights"].dtype == np.float32
    assert set(got) == {"input_ids", "labels", "label_weights"}


def test_an_lm_step_is_the_shifted_tokens_and_its_denominator_the_real_labels():
    data = SplitData("lm", "train", True, {"tokens": LM_TOKENS})
    assert _model_inputs(data, TINY, 0, 0)["labels"].tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]
    step = TrainBatches(data, TINY, 0, 1, 1, 0, micro_batches=2).get(0)
    order = epoch_order(2, 0, 0).tolist()
    assert [m["labels"][0, 0] for m in step.micro] == [[5, 8][i] for i in order]
    assert step.denominator == 4.0  # 3 real labels in row 0, 1 in row 1


def test_batch_weight_is_samples_for_the_cnn_and_weighted_tokens_otherwise():
    assert TOKEN_WEIGHTS == {"mlm": "mask_weights", "lm": "label_weights"}
    assert batch_weight("cnn", {"label": np.zeros(3, np.int32)}) == 3.0
    assert batch_weight("mlm", {"mask_weights": np.array([[1.0, 0.0, 1.0]]), "label": np.zeros(5)}) == 2.0
    assert batch_weight("lm", {"label_weights": np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])}) == 3.0


def test_eval_batches_take_the_rank_s_contiguous_shard_in_batches():
    # 8 samples over 3 ranks: 0 1 2 | 3 4 5 | 6 7; rank 1 in batches of 2: 3 4, then 5, scaled like training.
    batches = list(eval_batches(_ids(), CNN, 0, 1, 3, 2))
    assert [b["label"].tolist() for b in batches] == [[3, 4], [5]]
    assert batches[0]["image"].dtype == np.float32 and batches[0]["image"][0, 0, 0] == pytest.approx(0.6, rel=1e-6)
    # The first 4 only: 0 1 | 2 | 3.
    assert [b["label"].tolist() for b in eval_batches(_ids(), CNN, 0, 1, 3, 2, limit=4)] == [[2]]


def test_mlm_eval_batches_are_masked_the_fixed_evaluation_way():
    tokens = np.random.default_rng(0).integers(5, 100, (6, 32)).astype(np.int32)
    tokens[:, 0] = CLS_ID
    data = SplitData("mlm", "valid", True, {"tokens": tokens})
    got = list(eval_batches(data, TINY, 3, 0, 1, 4))
    want = mask_tokens(tokens, TINY, 3, EVAL_EPOCH)
    assert [len(b["input_ids"]) for b in got] == [4, 2]
    for key in want:
        assert np.array_equal(np.concatenate([b[key] for b in got]), want[key])
    assert not np.array_equal(want["mask_positions"], mask_tokens(tokens, TINY, 3, 0)["mask_positions"])
