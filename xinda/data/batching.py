"""Length-bucketed token-count batches and their padded tensors.

Sentences are sorted by length (ties broken randomly per epoch), packed greedily so that
``batch size x longest sentence`` (padding included) stays within ``max_tokens``, and the
batches are shuffled. The batch list of an epoch is a pure function of (seed, epoch), so
training can resume at any batch of any epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids + EOS, right-padded
    prev: Tensor  # (B, T) BOS + target ids (decoder input)
    target: Tensor  # (B, T) target ids + EOS (what is predicted)
    ntokens: int  # non-pad target tokens, EOS included
    indices: np.ndarray  # corpus indices of the sentences

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.src.to(device), self.prev.to(device), self.target.to(device),
                     self.ntokens, self.indices)


def make_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int,
                 epoch: int, shuffle: bool = True) -> list[np.ndarray]:
    """Group sentence indices into batches of at most ``max_tokens`` padded tokens."""
    rng = np.random.default_rng([seed, epoch])
    size = np.maximum(src_lens, tgt_lens) + 1  # + EOS (or BOS)
    tiebreak = rng.random(len(size)) if shuffle else np.arange(len(size))
    order = np.lexsort((tiebreak, tgt_lens, size))  # by size, then target length, then random
    batches, start, longest = [], 0, 0
    for pos, idx in enumerate(order):
        longest_if_added = max(longest, int(size[idx]))
        if pos > start and longest_if_added * (pos - start + 1) > max_tokens:
            batches.append(order[start:pos])
            start, longest_if_added = pos, int(size[idx])
        longest = longest_if_added
    if start < len(order):
        batches.append(order[start:])
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(indices: np.ndarray, src_data, tgt_data, pad: int, bos: int, eos: int) -> Batch:
    """Build padded tensors for the sentences ``indices`` of two ``TokenArrays``."""
    srcs = [src_data[i] for i in indices]
    tgts = [tgt_data[i] for i in indices]
    n = len(indices)
    src = np.full((n, max(len(s) for s in srcs) + 1), pad, dtype=np.int64)
    width = max(len(t) for t in tgts) + 1
    prev = np.full((n, width), pad, dtype=np.int64)
    target = np.full((n, width), pad, dtype=np.int64)
    for row, (s, t) in enumerate(zip(srcs, tgts)):
        src[row, : len(s)], src[row, len(s)] = s, eos
        prev[row, 0], prev[row, 1 : len(t) + 1] = bos, t
        target[row, : len(t)], target[row, len(t)] = t, eos
    ntokens = sum(len(t) + 1 for t in tgts)
    return Batch(torch.from_numpy(src), torch.from_numpy(prev), torch.from_numpy(target),
                 ntokens, np.asarray(indices))
