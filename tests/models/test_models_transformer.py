"""Transformer: masks, incremental decoding, state reordering, weight tying, registry."""

import pytest
import torch

from xinda.errors import XindaError
from xinda.models.registry import PRESETS, build_model, list_presets, resolve
from xinda.models.transformer import Transformer, TransformerConfig

TINY = {"arch": "transformer", "d_model": 32, "heads": 4, "ffn_dim": 64,
        "encoder_layers": 2, "decoder_layers": 2}


# --- masking --------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_output_unchanged_by_extra_padding(norm, make_model, make_src, vocab):
    model = make_model(TINY, norm=norm)
    src = make_src([5, 3], seed=1)
    padded = torch.cat([src, torch.full((2, 4), vocab.pad)], 1)
    with torch.no_grad():
        a, b = model.encode(src), model.encode(padded)
    assert b.memory.shape == (2, 9, 32) and b.src_pad[:, 5:].all()
    torch.testing.assert_close(a.memory[0], b.memory[0, :5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.memory[1, :3], b.memory[1, :3], atol=1e-5, rtol=1e-5)


def test_encoder_sentence_alone_equals_sentence_in_padded_batch(make_model, make_src):
    model = make_model(TINY)
    batch = make_src([7, 4, 2], seed=2)
    with torch.no_grad():
        together = model.encode(batch).memory
        alone = model.encode(batch[1:2, :4]).memory
    torch.testing.assert_close(together[1, :4], alone[0], atol=1e-5, rtol=1e-5)


def test_decoder_output_unchanged_by_source_padding(make_model, make_src, make_prev, vocab):
    model = make_model(TINY)
    src, prev = make_src([4], seed=3), make_prev(1, 6, seed=3)
    with torch.no_grad():
        a, _ = model.decode(prev, model.encode(src))
        b, _ = model.decode(prev, model.encode(torch.cat([src, torch.full((1, 3), vocab.pad)], 1)))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_output_at_t_independent_of_later_target_tokens(norm, make_model, make_src,
                                                                make_prev, vocab):
    model = make_model(TINY, norm=norm)
    src, prev = make_src([6, 4], seed=4), make_prev(2, 7, seed=4)
    t = 3
    changed = prev.clone()
    torch.manual_seed(4)
    changed[:, t + 1:] = torch.randint(4, vocab.tgt_size, (2, prev.size(1) - t - 1))
    assert not torch.equal(changed, prev)
    with torch.no_grad():
        enc = model.encode(src)
        a, _ = model.decode(prev, enc)
        b, _ = model.decode(changed, enc)
    assert a.shape == (2, 7, vocab.tgt_size)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:], atol=1e-5)


# --- incremental decoding -------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["post", "pre"])
def test_incremental_decoding_matches_teacher_forcing(norm, make_model, make_src, make_prev,
                                                      vocab):
    model = make_model(TINY, norm=norm)
    src, prev = make_src([6, 3, 5], seed=5), make_prev(3, 8, seed=5)
    with torch.no_grad():
        enc = model.encode(src)
        full, full_attn = model.decode(prev, enc, need_weights=True)
        state: dict = {}
        steps, attns = [], []
        for t in range(prev.size(1)):
            logits, attn = model.decode(prev[:, t:t + 1], enc, state, need_weights=True)
            assert logits.shape == (3, 1, vocab.tgt_size)
            steps.append(logits)
            attns.append(attn)
    assert state["step"] == prev.size(1)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(attns, 1), full_attn, atol=1e-5, rtol=1e-5)


def test_incremental_decoding_with_multi_token_chunks_matches_teacher_forcing(
        make_model, make_src, make_prev, decode_in_chunks):
    model = make_model(TINY)
    src, prev = make_src([5, 5], seed=6), make_prev(2, 7, seed=6)
    full, chunked = decode_in_chunks(model, src, prev, [(0, 3), (3, 4), (4, 7)])
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)


def test_reorder_state_selects_the_right_rows(make_model, make_src, make_prev):
    model = make_model(TINY)
    src, prev = make_src([6, 4, 5], seed=7), make_prev(3, 5, seed=7)
    order = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        enc = model.encode(src)
        state: dict = {}
        for t in range(3):
            model.decode(prev[:, t:t + 1], enc, state)
        model.reorder_state(state, order)
        enc_r = enc.reorder(order)
        got = [model.decode(prev[order, t:t + 1], enc_r, state)[0] for t in range(3, 5)]
        expected, _ = model.decode(prev[order], enc_r)
    torch.testing.assert_close(torch.cat(got, 1), expected[:, 3:], atol=1e-5, rtol=1e-5)
    for cache in state["layers"]:
        assert cache["self"]["k"].size(0) == 4 and cache["cross"]["k"].size(0) == 4


def test_decode_beyond_max_positions_raises(make_model, make_src, vocab):
    model = make_model(TINY, max_positions=16)
    enc = model.encode(make_src([3]))
    with pytest.raises(ValueError, match="max_positions"):
        model.decode(torch.full((1, 17), vocab.bos), enc)


# --- embeddings and tying -------------------------------------------------------------------

def test_tied_and_shared_embeddings_are_one_tensor(make_model):
    model = make_model(TINY)
    assert model.output.weight is model.tgt_embed.embed.weight
    assert model.src_embed is model.tgt_embed
    names = [n for n, _ in model.named_parameters()]
    assert sum("embed.weight" in n or n == "output.weight" for n in names) == 1


def test_embeddings_not_shared_without_joint_vocabulary(make_model, make_src, make_prev,
                                                        split_vocab):
    model = make_model(TINY, vocab=split_vocab)
    assert model.src_embed is not model.tgt_embed
    assert model.src_embed.embed.weight.shape == (40, 32)
    assert model.tgt_embed.embed.weight.shape == (25, 32)
    assert model.output.weight is model.tgt_embed.embed.weight
    logits = model(make_src([3], vocab=split_vocab), make_prev(1, 2, vocab=split_vocab))
    assert logits.shape == (1, 2, 25)


def test_share_embeddings_false_keeps_separate_tables(make_model):
    model = make_model(TINY, share_embeddings=False)
    assert model.src_embed is not model.tgt_embed
    assert model.output.weight is model.tgt_embed.embed.weight


def test_untied_output_is_its_own_parameter(make_model, vocab):
    model = make_model(TINY, tie_output=False)
    assert model.output.weight is not model.tgt_embed.embed.weight
    tied = make_model(TINY)
    assert model.num_parameters() == tied.num_parameters() + vocab.tgt_size * 32


def test_padding_embedding_row_is_zero(make_model, vocab):
    model = make_model(TINY)
    assert torch.all(model.src_embed.embed.weight[vocab.pad] == 0)


def test_num_parameters_counts_tied_weights_once(make_model):
    model = make_model(TINY)
    unique = {id(p): p.numel() for p in model.parameters()}
    assert model.num_parameters() == sum(unique.values())
    # build the same parameter count by hand: one embedding table, no output matrix
    v, d, f, n_enc, n_dec = 30, 32, 64, 2, 2
    attn = 4 * d * d + 4 * d
    ffn = 2 * d * f + f + d
    norm = 2 * d
    expected = (v * d + n_enc * (attn + ffn + 2 * norm) + n_dec * (2 * attn + ffn + 3 * norm))
    assert model.num_parameters() == expected  # post-norm: no final LayerNorms


def test_preset_parameter_count_counts_tied_weights_once(make_vocab):
    cfg = resolve({"preset": "transformer-tiny"})
    torch.manual_seed(0)
    model = build_model(cfg, make_vocab(src_size=50, tgt_size=50))
    d, f = cfg.d_model, cfg.ffn_dim
    attn, ffn, norm = 4 * d * d + 4 * d, 2 * d * f + f + d, 2 * d
    expected = (50 * d + cfg.encoder_layers * (attn + ffn + 2 * norm)
                + cfg.decoder_layers * (2 * attn + ffn + 3 * norm) + 2 * norm)  # + final norms
    assert model.num_parameters() == expected
    every = model.named_parameters(remove_duplicate=False)  # tied tensors listed each time
    assert model.num_parameters() == sum(p.numel() for _, p in every) - 2 * 50 * d


# --- registry -------------------------------------------------------------------------------

TRANSFORMER_PRESETS = sorted(n for n, f in PRESETS.items() if f["arch"] == "transformer")


@pytest.mark.parametrize("name", TRANSFORMER_PRESETS)
def test_every_preset_resolves(name):
    cfg = resolve({"preset": name})
    assert isinstance(cfg, TransformerConfig)
    assert cfg.d_model % cfg.heads == 0


def test_presets_are_registered():
    resolve({"preset": "transformer-base"})  # loads the families
    assert {"transformer-base", "transformer-big", "transformer-deep", "transformer-tiny",
            "transformer-small"} <= set(PRESETS)
    assert [name for name, _, _ in list_presets()] == list(PRESETS)


def test_preset_overrides_apply():
    cfg = resolve({"preset": "transformer-tiny", "dropout": 0.2, "encoder_layers": 1})
    assert cfg.dropout == 0.2 and cfg.encoder_layers == 1 and cfg.d_model == 128


def test_transformer_deep_is_pre_norm_with_30_encoder_layers():
    cfg = resolve({"preset": "transformer-deep"})
    assert cfg.norm == "pre" and cfg.encoder_layers == 30 and cfg.decoder_layers == 6


def test_transformer_base_matches_vaswani_base():
    cfg = resolve({"preset": "transformer-base"})
    assert (cfg.d_model, cfg.heads, cfg.ffn_dim, cfg.encoder_layers, cfg.decoder_layers,
            cfg.norm) == (512, 8, 2048, 6, 6, "post")


def test_unknown_preset_raises_with_name():
    with pytest.raises(XindaError, match="model.preset.*'transformer-huge'"):
        resolve({"preset": "transformer-huge"})


def test_unknown_architecture_raises_with_name():
    with pytest.raises(XindaError, match="model.arch.*'lstm'"):
        resolve({"arch": "lstm"})


def test_unknown_field_raises_with_key_named():
    with pytest.raises(XindaError, match=r"model.d_modle"):
        resolve({**TINY, "d_modle": 64})


def test_wrong_type_raises_with_key_named():
    with pytest.raises(XindaError, match=r"model.heads"):
        resolve({**TINY, "heads": "four"})
    with pytest.raises(XindaError, match=r"model.norm"):
        resolve({"preset": "transformer-tiny", "norm": "middle"})


def test_build_model_returns_transformer_in_expected_shape(make_model):
    model = make_model(TINY, norm="pre")
    assert isinstance(model, Transformer)
    assert len(model.encoder_layers) == 2 and len(model.decoder_layers) == 2
    assert isinstance(model.encoder_norm, torch.nn.LayerNorm)
    post = make_model(TINY)
    assert isinstance(post.encoder_norm, torch.nn.Identity)
