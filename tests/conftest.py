"""Shared test settings and scaffolding.

Single-threaded torch keeps timings stable on a small shared machine. The factories below build
what the model and decoding tests share: vocabularies, tiny seeded models from a spec dict, and
right-padded source / BOS-initial target batches.
"""

from __future__ import annotations

import pytest
import torch

from xinda.data.vocab import VocabInfo
from xinda.device import ONEDNN_CACHE_VARIABLES
from xinda.models.registry import build_model

# pad 0, bos 2, eos 3 (sentencepiece's ids), 30 tokens: ids 4..29 are real words
VOCAB_FIELDS = {"src_size": 30, "tgt_size": 30, "pad": 0, "bos": 2, "eos": 3, "joint": True}


@pytest.fixture(autouse=True)
def _single_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True)
def _onednn_variables_restored(monkeypatch):
    """Each test starts without the oneDNN cache variables and leaves none behind: Trainer()
    sets them when unset (os.environ.setdefault), and every later subprocess would inherit
    them. setenv then delenv makes monkeypatch record them (set or absent) and restore them."""
    for name in ONEDNN_CACHE_VARIABLES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@pytest.fixture
def make_vocab():
    """``make_vocab(**fields)`` -> the joint 30-token test vocabulary with ``fields`` changed."""
    def make(**fields) -> VocabInfo:
        return VocabInfo(**{**VOCAB_FIELDS, **fields})
    return make


@pytest.fixture
def vocab(make_vocab) -> VocabInfo:
    """The joint 30-token vocabulary: pad 0, bos 2, eos 3."""
    return make_vocab()


@pytest.fixture
def split_vocab(make_vocab) -> VocabInfo:
    """Separate vocabularies (40 source, 25 target tokens), same special ids."""
    return make_vocab(src_size=40, tgt_size=25, joint=False)


@pytest.fixture
def make_model(vocab):
    """``make_model(spec, seed=0, vocab=None, eos_bias=None, **overrides)`` -> the model
    ``build_model({**spec, **overrides})`` builds after ``torch.manual_seed(seed)``, in eval mode.

    ``eos_bias`` gives the output layer (untied: ``tie_output: false``) a bias that is
    ``eos_bias`` on the EOS logit and 0 elsewhere, so that a random model ends sentences."""
    default = vocab

    def make(spec: dict, seed: int = 0, vocab: VocabInfo | None = None,
             eos_bias: float | None = None, **overrides) -> torch.nn.Module:
        vocab = vocab or default
        torch.manual_seed(seed)
        model = build_model({**spec, **overrides}, vocab).eval()
        if eos_bias is not None:
            bias = torch.zeros(vocab.tgt_size)
            bias[vocab.eos] = eos_bias
            model.output.bias = torch.nn.Parameter(bias)
        return model
    return make


@pytest.fixture
def make_src(vocab):
    """``make_src(lengths, seed=0, width=None, low=4, eos=None, vocab=None)`` -> (B, S)
    right-padded random sources of the given lengths (counting the final EOS; ``eos`` defaults
    to the vocabulary's), padded to ``width`` (default: the longest)."""
    default = vocab

    def make(lengths: list[int], seed: int = 0, width: int | None = None, low: int = 4,
             eos: int | None = None, vocab: VocabInfo | None = None) -> torch.Tensor:
        vocab = vocab or default
        gen = torch.Generator().manual_seed(seed)
        src = torch.full((len(lengths), width or max(lengths)), vocab.pad)
        for row, n in enumerate(lengths):
            src[row, : n - 1] = torch.randint(low, vocab.src_size, (n - 1,), generator=gen)
            src[row, n - 1] = vocab.eos if eos is None else eos
        return src
    return make


@pytest.fixture
def make_prev(vocab):
    """``make_prev(batch, length, seed=1, vocab=None)`` -> (B, T) target prefixes: BOS, then
    ``length - 1`` random real tokens."""
    default = vocab

    def make(batch: int, length: int, seed: int = 1,
             vocab: VocabInfo | None = None) -> torch.Tensor:
        vocab = vocab or default
        gen = torch.Generator().manual_seed(seed)
        return torch.cat([torch.full((batch, 1), vocab.bos),
                          torch.randint(4, vocab.tgt_size, (batch, length - 1), generator=gen)], 1)
    return make


@pytest.fixture
def decode_in_chunks():
    """``decode_in_chunks(model, src, prev, cuts)`` -> (teacher-forced logits, the logits of
    ``prev[:, a:b]`` for each ``(a, b)`` in ``cuts`` fed in turn through one incremental state,
    concatenated)."""
    def run(model, src: torch.Tensor, prev: torch.Tensor,
            cuts: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            enc = model.encode(src)
            full, _ = model.decode(prev, enc)
            state: dict = {}
            chunks = [model.decode(prev[:, a:b], enc, state)[0] for a, b in cuts]
        return full, torch.cat(chunks, 1)
    return run
