"""Scaffolding of the deep-Transformer option tests (test_dlcl, test_fusion, test_layer_dropout,
test_transformer_options): a tiny Transformer (d_model 16, 2 + 2 layers, 20-token vocabulary),
a source/target batch for it, and helpers to compare models and record what units read."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def tiny_spec() -> dict:
    """The tiny Transformer's model section."""
    return {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32,
            "encoder_layers": 2, "decoder_layers": 2}


@pytest.fixture
def tiny_vocab(make_vocab):
    """A joint 20-token vocabulary: pad 0, bos 2, eos 3."""
    return make_vocab(src_size=20, tgt_size=20)


@pytest.fixture
def tiny_transformer(make_model, tiny_spec, tiny_vocab):
    """``tiny_transformer(seed=0, **overrides)`` -> the tiny Transformer (eval mode)."""
    def make(seed: int = 0, **overrides):
        return make_model(tiny_spec, seed, vocab=tiny_vocab, **overrides)
    return make


@pytest.fixture
def tiny_batch(tiny_vocab):
    """``tiny_batch(seed=1, b=2, s=5, t=6)`` -> a source (B, S) with one padded row and a
    BOS-initial target prefix (B, T)."""
    def make(seed: int = 1, b: int = 2, s: int = 5, t: int = 6):
        g = torch.Generator().manual_seed(seed)
        src = torch.randint(4, tiny_vocab.src_size, (b, s), generator=g)
        src[0, -2:] = tiny_vocab.pad
        prev = torch.randint(4, tiny_vocab.tgt_size, (b, t), generator=g)
        prev[:, 0] = tiny_vocab.bos
        return src, prev
    return make


@pytest.fixture
def outputs():
    """``outputs(model, src, prev)`` -> (encoder memory, decoder logits), without gradients."""
    def run(model, src, prev):
        with torch.no_grad():
            enc = model.encode(src)
            return enc.memory, model.decode(prev, enc)[0]
    return run


@pytest.fixture
def copy_into():
    """``copy_into(target, source)`` copies the shared parameters by name; returns the keys
    only ``target`` has."""
    def copy(target, source):
        missing, unexpected = target.load_state_dict(source.state_dict(), strict=False)
        assert not unexpected
        return missing
    return copy


@pytest.fixture
def recorder():
    """``recorder(fn, seen)`` -> a unit applying ``fn`` that appends every input it reads to
    ``seen``."""
    def make(fn, seen: list):
        def unit(x):
            seen.append(x.clone())
            return fn(x)
        return unit
    return make


@pytest.fixture
def randomise_norms():
    """``randomise_norms(module, seed=0)`` gives every LayerNorm distinct affine parameters,
    so using the wrong one shows."""
    def randomise(module, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for m in module.modules():
                if isinstance(m, torch.nn.LayerNorm):
                    m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g))
    return randomise


@pytest.fixture
def ln():
    """``ln(norm, x)``: the LayerNorm ``norm`` applied to ``x`` through the functional form."""
    def apply(norm, x):
        return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    return apply
