"""Token-count batching and collation."""

import itertools

import numpy as np
import pytest
import torch

from xinda.data.batching import Batch, collate, make_batches

PAD, BOS, EOS = 0, 2, 3


@pytest.fixture
def lengths():
    rng = np.random.default_rng(0)
    src = rng.integers(1, 40, size=600)
    tgt = np.clip(src + rng.integers(-5, 6, size=600), 1, None)
    return src, tgt


def _size(src, tgt, batch):
    return np.maximum(src[batch], tgt[batch]) + 1  # + EOS / BOS


@pytest.mark.parametrize("max_tokens", [64, 200, 1000])
def test_every_index_appears_exactly_once(lengths, max_tokens):
    src, tgt = lengths
    batches = make_batches(src, tgt, max_tokens, seed=1, epoch=1)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(src)))
    assert all(len(b) > 0 for b in batches)


@pytest.mark.parametrize("max_tokens", [64, 200, 1000])
def test_batches_fit_max_tokens_with_padding(lengths, max_tokens):
    src, tgt = lengths
    for batch in make_batches(src, tgt, max_tokens, seed=1, epoch=3):
        size = _size(src, tgt, batch)
        if len(batch) > 1:
            assert len(batch) * size.max() <= max_tokens


def test_overlong_sentence_gets_a_batch_of_its_own():
    src = np.array([3, 50, 4, 2])
    tgt = np.array([3, 60, 4, 2])
    batches = make_batches(src, tgt, max_tokens=20, seed=0, epoch=0)
    assert [1] in [b.tolist() for b in batches]
    assert sorted(np.concatenate(batches).tolist()) == [0, 1, 2, 3]


def test_unshuffled_batches_are_length_sorted_and_greedily_full(lengths):
    src, tgt = lengths
    max_tokens = 200
    batches = make_batches(src, tgt, max_tokens, seed=5, epoch=5, shuffle=False)
    sizes = [_size(src, tgt, b) for b in batches]
    for size in sizes:
        assert np.all(np.diff(size) >= 0)  # sorted within a batch
    for this, nxt in itertools.pairwise(sizes):
        assert this.max() <= nxt.min()  # and across batches (length buckets)
        # adding the next sentence would have broken the budget: batches are full
        assert (len(this) + 1) * max(this.max(), nxt[0]) > max_tokens
    again = make_batches(src, tgt, max_tokens, seed=9, epoch=0, shuffle=False)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))


def test_deterministic_for_seed_and_epoch(lengths):
    src, tgt = lengths
    a = make_batches(src, tgt, 300, seed=7, epoch=2)
    b = make_batches(src, tgt, 300, seed=7, epoch=2)
    assert len(a) == len(b)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_different_epochs_and_seeds_give_different_orders(lengths):
    src, tgt = lengths
    base = np.concatenate(make_batches(src, tgt, 300, seed=7, epoch=2))
    for seed, epoch in ((7, 3), (8, 2)):
        other = np.concatenate(make_batches(src, tgt, 300, seed=seed, epoch=epoch))
        assert sorted(other.tolist()) == sorted(base.tolist())
        assert not np.array_equal(base, other)


def _order_correlation(values) -> float:
    """Spearman's rank correlation of ``values`` with their position (ties ranked in order):
    1 for an ascending list, about 0 for a random order."""
    ranks = np.argsort(np.argsort(values, kind="stable"))
    return float(np.corrcoef(np.arange(len(values)), ranks)[0, 1])


@pytest.mark.parametrize(("seed", "epoch"), [(1, 1), (7, 2), (3, 9)])
def test_shuffled_batches_come_in_no_length_order(lengths, seed, epoch):
    """The batches of an epoch are shuffled: their order is unrelated to their sentences'
    lengths (rank correlation near 0), where the unshuffled order is the length order (near
    1). Guards the shuffle of the batch list, not the random tie-break within a length."""
    src, tgt = lengths
    batches = make_batches(src, tgt, 200, seed=seed, epoch=epoch)
    assert len(batches) > 30
    longest = [int(_size(src, tgt, b).max()) for b in batches]
    assert abs(_order_correlation(longest)) < 0.4
    ordered = make_batches(src, tgt, 200, seed=seed, epoch=epoch, shuffle=False)
    sizes = [int(_size(src, tgt, b).max()) for b in ordered]
    assert _order_correlation(sizes) > 0.95


def test_empty_corpus_gives_no_batches():
    assert make_batches(np.array([], dtype=int), np.array([], dtype=int), 100, 1, 1) == []


# --- collate --------------------------------------------------------------------------------

SRC = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10, 11, 12, 13])]
TGT = [np.array([14, 15]), np.array([16, 17, 18, 19]), np.array([20])]


def test_collate_shapes_and_contents():
    batch = collate(np.array([0, 1, 2]), SRC, TGT, PAD, BOS, EOS)
    assert isinstance(batch, Batch)
    assert batch.src.tolist() == [[5, 6, 7, EOS, PAD, PAD],
                                  [8, EOS, PAD, PAD, PAD, PAD],
                                  [9, 10, 11, 12, 13, EOS]]
    assert batch.prev.tolist() == [[BOS, 14, 15, PAD, PAD],
                                   [BOS, 16, 17, 18, 19],
                                   [BOS, 20, PAD, PAD, PAD]]
    assert batch.target.tolist() == [[14, 15, EOS, PAD, PAD],
                                     [16, 17, 18, 19, EOS],
                                     [20, EOS, PAD, PAD, PAD]]
    assert batch.ntokens == 3 + 5 + 2
    assert batch.indices.tolist() == [0, 1, 2]
    assert batch.src.dtype == batch.prev.dtype == batch.target.dtype == torch.int64


def test_collate_prev_is_target_shifted_right_by_one():
    batch = collate(np.array([2, 0, 1]), SRC, TGT, PAD, BOS, EOS)
    assert torch.all(batch.prev[:, 0] == BOS)
    for row, i in enumerate([2, 0, 1]):
        n = len(TGT[i])
        assert batch.prev[row, 1:n + 1].tolist() == batch.target[row, :n].tolist()
        assert batch.target[row, n] == EOS
        assert torch.all(batch.target[row, n + 1:] == PAD)
        assert torch.all(batch.prev[row, n + 1:] == PAD)
        s = len(SRC[i])
        assert batch.src[row, s] == EOS and torch.all(batch.src[row, s + 1:] == PAD)
    assert batch.ntokens == int(batch.target.ne(PAD).sum())


def test_collate_follows_the_order_of_indices():
    batch = collate(np.array([1]), SRC, TGT, PAD, BOS, EOS)
    assert batch.src.tolist() == [[8, EOS]]
    assert batch.target.tolist() == [[16, 17, 18, 19, EOS]]
    assert batch.ntokens == 5


def test_batch_to_device_keeps_everything():
    batch = collate(np.array([0, 2]), SRC, TGT, PAD, BOS, EOS).to("cpu")
    assert batch.ntokens == 5 and batch.indices.tolist() == [0, 2]
    assert batch.src.shape == (2, 6)


def test_collate_of_a_make_batches_batch_fits_the_budget():
    rng = np.random.default_rng(4)
    src = [rng.integers(4, 50, size=n) for n in rng.integers(1, 20, size=100)]
    tgt = [rng.integers(4, 50, size=n) for n in rng.integers(1, 20, size=100)]
    src_lens, tgt_lens = np.array([len(s) for s in src]), np.array([len(t) for t in tgt])
    for indices in make_batches(src_lens, tgt_lens, 120, seed=1, epoch=1):
        batch = collate(indices, src, tgt, PAD, BOS, EOS)
        if len(indices) > 1:
            assert batch.src.numel() <= 120 and batch.target.numel() <= 120
