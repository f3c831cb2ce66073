"""Recurrent encoder-decoder: encoder padding and reversal, incremental decoding, state
reordering, reference path, configuration checks, presets and search."""

import pytest
import torch

from xinda.config import DecodeConfig
from xinda.decode.search import beam_search, greedy_search
from xinda.errors import XindaError
from xinda.models.registry import PRESETS, list_presets, resolve
from xinda.models.rnn import RNNConfig, RNNEncoderOut, RNNModel
from xinda.models.rnn.encoder import reverse_padded

SMALL = {"embed_dim": 8, "hidden_dim": 8, "dropout": 0.0}
TINY = {"arch": "rnn", **SMALL}
RNN_PRESETS = ["rnn-sutskever", "rnn-bahdanau", "rnn-luong-global", "rnn-luong-local-p", "gnmt"]

# option combinations beyond the presets, each small
COMBOS = {
    "bahdanau-bilstm": {"attention": "concat", "attention_style": "bahdanau",
                        "bidirectional": True},
    "bahdanau-local-m": {"attention": "general", "attention_style": "bahdanau",
                         "attention_window": "local-m", "window_d": 1},
    "luong-dot": {"attention": "dot"},
    "luong-general-if": {"attention": "general", "input_feeding": True},
    "luong-concat-if-local-m": {"attention": "concat", "input_feeding": True,
                                "attention_window": "local-m", "window_d": 1},
    "luong-cosine-local-p": {"attention": "cosine", "attention_window": "local-p",
                             "window_d": 2},
    "luong-local-p-if-gru": {"cell": "gru", "attention": "general",
                             "attention_window": "local-p", "window_d": 1,
                             "input_feeding": True},
    "luong-location-rnn": {"cell": "rnn", "attention": "location", "max_positions": 16},
    "gnmt-if-residual": {"attention": "concat", "attention_style": "gnmt", "decoder_layers": 3,
                         "input_feeding": True, "residual_from": 2},
    "none-learned-gru": {"attention": "none", "cell": "gru", "decoder_init": "learned"},
    "learned-deeper-encoder": {"encoder_layers": 3, "decoder_layers": 2, "bidirectional": True},
    "learned-deeper-decoder": {"encoder_layers": 1, "decoder_layers": 3, "residual_from": 2},
    "bi-bottom-residual": {"encoder_layers": 3, "bidirectional": True,
                           "bidirectional_bottom_only": True, "residual_from": 3},
}
ALL = {**{name: {"preset": name, **SMALL} for name in RNN_PRESETS},
       **{name: {**TINY, **fields} for name, fields in COMBOS.items()}}


def step_by_step(model, prev, enc, state=None):
    state = {} if state is None else state
    steps = [model.decode(prev[:, t:t + 1], enc, state, need_weights=True)
             for t in range(prev.size(1))]
    attn = None if steps[0][1] is None else torch.cat([a for _, a in steps], 1)
    return torch.cat([lg for lg, _ in steps], 1), attn, state


# --- encoder --------------------------------------------------------------------------------

def test_reverse_padded_reverses_only_real_tokens():
    x = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
    assert reverse_padded(x, torch.tensor([3, 4])).tolist() == [[3, 2, 1, 0], [7, 6, 5, 4]]


def test_reversed_encoding_equals_forward_encoding_of_reversed_sentence(make_model, vocab):
    rev = make_model(TINY, reverse_source=True, encoder_layers=2)
    fwd = make_model(TINY, reverse_source=False, encoder_layers=2)  # same seed: same weights
    src = torch.tensor([[5, 6, 7, vocab.pad], [8, 9, 10, 11]])  # "a b c" and a full-width row
    backwards = torch.tensor([[7, 6, 5, vocab.pad], [11, 10, 9, 8]])
    with torch.no_grad():
        a, b = rev.encode(src), fwd.encode(backwards)
    # memory position s of the reversed encoder belongs to source token s: flip b back
    torch.testing.assert_close(a.memory[0, :3], b.memory[0, :3].flip(0))
    torch.testing.assert_close(a.memory[1], b.memory[1].flip(0))
    for layer_a, layer_b in zip(a.final, b.final):
        for part_a, part_b in zip(layer_a, layer_b):
            torch.testing.assert_close(part_a, part_b)


@pytest.mark.parametrize("fields", [{}, {"bidirectional": True, "cell": "gru"},
                                    {"reverse_source": True, "bidirectional": True,
                                     "bidirectional_bottom_only": True, "encoder_layers": 3,
                                     "residual_from": 3}])
def test_encoder_output_unchanged_by_extra_padding(fields, make_model, make_src, vocab):
    model = make_model(TINY, **fields)
    src = make_src([5, 3])
    padded = torch.cat([src, torch.full((2, 4), vocab.pad)], 1)
    with torch.no_grad():
        a, b = model.encode(src), model.encode(padded)
        alone = model.encode(src[1:2, :3])
    assert b.memory.shape[:2] == (2, 9) and b.src_pad[:, 5:].all()
    torch.testing.assert_close(a.memory, b.memory[:, :5], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(alone.memory[0], b.memory[1, :3], atol=1e-6, rtol=1e-5)
    for layer_a, layer_b, layer_alone in zip(a.final, b.final, alone.final):
        for part_a, part_b, part_alone in zip(layer_a, layer_b, layer_alone):
            torch.testing.assert_close(part_a, part_b, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(part_alone[0], part_b[1], atol=1e-6, rtol=1e-5)


def _silence_layers_above_first(stack: torch.nn.ModuleList) -> None:
    """Zero every weight of layers 2.. : an LSTM layer then outputs exactly 0."""
    with torch.no_grad():
        for layer in stack[1:]:
            for weight in layer.parameters():
                weight.zero_()


def test_residual_layers_add_their_input_before_dropout(make_model):
    """TF-NMT wraps the dropout inside the residual: with layers 2.. outputting 0, the stack's
    output is layer 1's output whatever the dropout between layers draws."""
    model = make_model(TINY, encoder_layers=3, decoder_layers=3, residual_from=2,
                       dropout=0.5, decoder_init="zeros")
    _silence_layers_above_first(model.encoder.layers)
    _silence_layers_above_first(model.decoder.layers)
    x = torch.randn(2, 4, 8)
    no_pad = torch.zeros(2, 4, dtype=torch.bool)
    enc_eval = model.encoder(x, no_pad)
    dec_eval = model.decoder._stack(x, model.decoder.initial_state(enc_eval), 0)
    model.train()
    torch.manual_seed(3)
    enc_train = model.encoder(x, no_pad)
    dec_train = model.decoder._stack(x, model.decoder.initial_state(enc_eval), 0)
    torch.testing.assert_close(enc_train.memory, enc_eval.memory)
    torch.testing.assert_close(dec_train, dec_eval)
    assert enc_eval.memory.abs().sum() > 0


@pytest.mark.parametrize("name", ["rnn-bahdanau", "gnmt", "luong-local-p-if-gru",
                                  "luong-location-rnn"])
def test_reference_path_equals_fused_path(name, make_model, make_src, make_prev):
    model = make_model(ALL[name])
    src, prev = make_src([5, 2, 4]), make_prev(3, 4)
    with torch.no_grad():
        fast_enc = model.encode(src)
        fast, fast_attn = model.decode(prev, fast_enc, need_weights=True)
        model.set_reference(True)
        ref_enc = model.encode(src)
        ref, ref_attn = model.decode(prev, ref_enc, need_weights=True)
    torch.testing.assert_close(ref_enc.memory, fast_enc.memory, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref, fast, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref_attn, fast_attn, atol=1e-5, rtol=1e-5)


def test_encoder_out_reorder_selects_memory_and_final_states(make_model, make_src):
    model = make_model(TINY, bidirectional=True)
    enc = model.encode(make_src([4, 2, 3]))
    order = torch.tensor([2, 0, 0])
    got = enc.reorder(order)
    assert isinstance(got, RNNEncoderOut)
    torch.testing.assert_close(got.memory, enc.memory[order])
    assert torch.equal(got.src_pad, enc.src_pad[order])
    assert [len(layer) for layer in got.final] == [2, 2]  # LSTM: h and c per layer
    torch.testing.assert_close(got.final[1][1], enc.final[1][1][order])
    assert got.final[0][0].shape == (3, 16)  # both directions concatenated
    assert enc.final[0][0].size(0) == 3  # the original is untouched


# --- decoder --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(ALL))
def test_incremental_decoding_matches_teacher_forcing(name, make_model, make_src, make_prev,
                                                      vocab):
    model = make_model(ALL[name])
    src, prev = make_src([6, 3, 5]), make_prev(3, 7)
    with torch.no_grad():
        enc = model.encode(src)
        full, full_attn = model.decode(prev, enc, need_weights=True)
        steps, step_attn, state = step_by_step(model, prev, enc)
    assert full.shape == (3, 7, vocab.tgt_size) and state["step"] == 7
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    if model.cfg.attention == "none":
        assert full_attn is None and step_attn is None
    else:
        assert full_attn.shape == (3, 7, 6)
        torch.testing.assert_close(step_attn, full_attn, atol=1e-5, rtol=1e-5)
        assert torch.all(full_attn[1, :, 3:] == 0)  # padded source positions: exactly 0


def test_incremental_decoding_with_multi_token_chunks_matches_teacher_forcing(
        make_model, make_src, make_prev, decode_in_chunks):
    model = make_model(TINY, attention="general")  # no feedback: chunks run through at once
    src, prev = make_src([5, 5]), make_prev(2, 7)
    full, chunked = decode_in_chunks(model, src, prev, [(0, 3), (3, 4), (4, 7)])
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["luong-concat-if-local-m", "gnmt-if-residual",
                                  "bahdanau-bilstm"])
def test_reorder_state_selects_the_right_rows(name, make_model, make_src, make_prev):
    model = make_model(ALL[name])
    src, prev = make_src([6, 4, 5]), make_prev(3, 5)
    order = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        enc = model.encode(src)
        _, _, state = step_by_step(model, prev[:, :3], enc)
        model.reorder_state(state, order)
        enc_r = enc.reorder(order)
        got, _, _ = step_by_step(model, prev[order, 3:], enc_r, state)
        expected, _ = model.decode(prev[order], enc_r)
    torch.testing.assert_close(got, expected[:, 3:], atol=1e-5, rtol=1e-5)
    assert all(t.size(0) == 4 for layer in state["hidden"] for t in layer)


def test_decoder_output_unchanged_by_source_padding(make_model, make_src, make_prev, vocab):
    model = make_model(ALL["rnn-luong-local-p"])
    src, prev = make_src([4]), make_prev(1, 5)
    with torch.no_grad():
        a, _ = model.decode(prev, model.encode(src))
        padded = torch.cat([src, torch.full((1, 3), vocab.pad)], 1)
        b, _ = model.decode(prev, model.encode(padded))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_decoder_init_final_copies_encoder_final_state(make_model, make_src):
    model = make_model(TINY, attention="none", decoder_init="final")
    enc = model.encode(make_src([4, 2]))
    state = model.decoder.initial_state(enc)
    for dec_layer, enc_layer in zip(state["hidden"], enc.final):
        for a, b in zip(dec_layer, enc_layer):
            assert a is b


def test_decoder_init_learned_is_tanh_of_projected_final_states(make_model, make_src):
    model = make_model(TINY, encoder_layers=3, decoder_layers=2, bidirectional=True)
    enc = model.encode(make_src([4, 2]))
    state = model.decoder.initial_state(enc)
    bridge = model.decoder.bridges[1][1]  # decoder layer 2, cell state
    assert bridge.in_features == 16  # both directions of the top encoder layer
    torch.testing.assert_close(state["hidden"][1][1], torch.tanh(bridge(enc.final[2][1])))
    assert model.decoder._source_layer(0) == 1  # tops aligned: encoder deeper by one


def test_no_attention_model_returns_no_weights(make_model, make_src, make_prev, vocab):
    model = make_model(ALL["rnn-sutskever"])
    logits, attn = model.decode(make_prev(2, 3), model.encode(make_src([3, 2])),
                                need_weights=True)
    assert logits.shape == (2, 3, vocab.tgt_size) and attn is None


@pytest.mark.parametrize("name", [*RNN_PRESETS, "gnmt-if-residual", "luong-location-rnn",
                                  "learned-deeper-decoder"])
def test_training_step_reaches_every_parameter(name, make_model, make_src, make_prev, vocab):
    model = make_model({**ALL[name], "dropout": 0.1}).train()
    logits = model(make_src([5, 3]), make_prev(2, 4))
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), make_prev(2, 4, seed=2).flatten(),
                                      ignore_index=vocab.pad).backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), pname
        assert param.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("feeding", [False, True])
def test_gnmt_queries_see_the_source_only_with_input_feeding(make_model, make_src, make_prev,
                                                             feeding):
    """The preset is the paper's: the bottom decoder layer (the attention queries) reads the
    target prefix alone, started from zeros. With input_feeding (TensorFlow NMT's GNMT cell)
    the previous context joins its input, so its states depend on the source."""
    model = make_model({**ALL["gnmt"], "input_feeding": feeding}).eval()
    prev = make_prev(1, 3)
    bottoms = []
    for seed in (1, 2):
        enc = model.encode(make_src([4], seed=seed))
        _, _, state = step_by_step(model, prev, enc)
        bottoms.append(state["hidden"][0][0])  # the bottom layer's h after 3 steps
    assert torch.allclose(*bottoms) != feeding


# --- initialisation and embeddings ----------------------------------------------------------

def test_every_lstm_in_the_model_has_forget_bias_one(make_model):
    model = make_model(ALL["gnmt"])
    rnns = [m for m in model.modules() if isinstance(m, torch.nn.LSTM)]
    assert len(rnns) == 8  # 4 encoder + 4 decoder layers
    for rnn in rnns:
        for name, b_ih in rnn.named_parameters():
            if name.startswith("bias_ih"):
                total = b_ih + getattr(rnn, name.replace("bias_ih", "bias_hh"))
                assert torch.equal(total.detach(), torch.tensor([0.0] * 8 + [1.0] * 8 +
                                                                [0.0] * 16))


def test_tied_shared_and_separate_embeddings(make_model, make_src, make_prev, vocab,
                                             split_vocab):
    tied = make_model(TINY, tie_output=True)
    assert tied.output.weight is tied.tgt_embed.weight and tied.src_embed is tied.tgt_embed
    assert torch.all(tied.src_embed.weight[vocab.pad] == 0)
    split = make_model(TINY, vocab=split_vocab)
    assert split.src_embed.weight.shape == (40, 8) and split.tgt_embed.weight.shape == (25, 8)
    assert split(make_src([3]), make_prev(1, 2, vocab=split_vocab)).shape == (1, 2, 25)


# --- configuration --------------------------------------------------------------------------

@pytest.mark.parametrize("fields, message", [
    ({"attention": "none", "input_feeding": True}, "input_feeding needs attention"),
    ({"attention": "none", "attention_window": "local-p"}, "local attention_window needs"),
    ({"attention": "location", "attention_window": "local-m"}, "location attention"),
    ({"attention": "dot", "bidirectional": True}, "dot attention needs encoder output width 16"),
    ({"decoder_init": "final", "bidirectional": True}, "decoder_init final"),
    ({"decoder_init": "final", "encoder_layers": 3}, "decoder_init final"),
    ({"attention_style": "bahdanau", "input_feeding": True}, "bahdanau style"),
    ({"attention_style": "gnmt", "decoder_layers": 1}, "decoder_layers >= 2"),
    ({"bidirectional_bottom_only": True}, "needs bidirectional"),
    ({"tie_output": True, "embed_dim": 16}, "tie_output needs"),
    ({"residual_from": 1}, "residual_from 1"),
    ({"attention": "none", "decoder_init": "zeros"}, "never reads the source"),
    ({"bidirectional": True, "bidirectional_bottom_only": True, "residual_from": 2},
     "residual encoder layer 2 maps width 16 to 8"),
])
def test_impossible_combinations_are_rejected(fields, message):
    with pytest.raises(XindaError, match=message):
        resolve({**TINY, **fields})


def test_unknown_field_and_wrong_value_name_the_key():
    with pytest.raises(XindaError, match="model.hiden_dim"):
        resolve({**TINY, "hiden_dim": 8})
    with pytest.raises(XindaError, match="model.attention_window"):
        resolve({**TINY, "attention_window": "local"})


@pytest.mark.parametrize("name", RNN_PRESETS)
def test_every_preset_resolves_and_builds_tiny(name, make_model, make_src, make_prev, vocab):
    full = resolve({"preset": name})
    assert isinstance(full, RNNConfig) and full.hidden_dim in (256, 512)
    model = make_model({"preset": name, **SMALL})
    assert isinstance(model, RNNModel)
    assert model(make_src([4, 2]), make_prev(2, 3)).shape == (2, 3, vocab.tgt_size)


@pytest.mark.parametrize("name", RNN_PRESETS)
def test_fp16_autocast_on_the_cpu_runs_every_preset(name, make_model, make_src, make_prev):
    """Before: the fused LSTM of a whole-sequence decoder (Sutskever, GNMT, Luong without
    input feeding) failed in oneDNN under CPU fp16 autocast ("could not create a primitive
    descriptor"): ``train.precision: fp16`` crashed at the first update."""
    model = make_model({"preset": name, **SMALL})
    src, prev = make_src([4, 2]), make_prev(2, 3)
    with torch.autocast("cpu", dtype=torch.float16):
        half = model(src, prev).float()
    torch.testing.assert_close(half, model(src, prev), atol=0.02, rtol=0.02)


def test_presets_follow_the_papers():
    sutskever = resolve({"preset": "rnn-sutskever"})
    assert (sutskever.encoder_layers, sutskever.decoder_layers, sutskever.reverse_source,
            sutskever.attention, sutskever.decoder_init) == (4, 4, True, "none", "final")
    bahdanau = resolve({"preset": "rnn-bahdanau"})
    assert bahdanau.bidirectional and (bahdanau.attention, bahdanau.attention_style) == (
        "concat", "bahdanau")
    luong = resolve({"preset": "rnn-luong-global"})
    assert (luong.attention, luong.attention_style, luong.input_feeding) == (
        "general", "luong", True)
    local = resolve({"preset": "rnn-luong-local-p"})
    assert (local.attention_window, local.window_d) == ("local-p", 10)
    gnmt = resolve({"preset": "gnmt"})
    assert (gnmt.encoder_layers, gnmt.bidirectional_bottom_only, gnmt.residual_from,
            gnmt.attention_style) == (4, True, 3, "gnmt")
    assert 4 <= gnmt.decoder_layers <= 8
    assert set(RNN_PRESETS) <= set(PRESETS)
    assert {name for name, arch, _ in list_presets() if arch == "rnn"} == set(RNN_PRESETS)


# --- search ---------------------------------------------------------------------------------

@pytest.fixture
def searchable(make_model, vocab):
    """``searchable(name, eos_bias)`` -> a random model with decisive logits (hidden 32,
    unit-variance embeddings, scaled output) and an EOS bias, so that greedy outputs vary in
    length."""
    def make(name: str, eos_bias: float):
        model = make_model({**ALL[name], "embed_dim": 32, "hidden_dim": 32})
        with torch.no_grad():
            model.src_embed.weight.normal_()
            model.output.weight *= 4
            model.output.bias[vocab.eos] = eos_bias
        return model
    return make


@pytest.mark.parametrize("name, eos_bias", [("rnn-luong-global", 0.0), ("rnn-bahdanau", 2.0),
                                            ("rnn-sutskever", 0.0)])
def test_beam_of_one_equals_greedy(name, eos_bias, make_src, searchable):
    model = searchable(name, eos_bias)
    src = make_src([6, 3, 1, 5])
    greedy = greedy_search(model, src, DecodeConfig(alpha=0.6))
    beam = beam_search(model, src, DecodeConfig(beam=1, alpha=0.6))
    assert len({len(h.tokens) for h in greedy}) > 1  # varied lengths
    for g, b in zip(greedy, beam):
        assert b[0].tokens == g.tokens
        assert b[0].score == pytest.approx(g.score, abs=1e-4)


def test_beam_search_with_attention_and_coverage_runs_on_gnmt(make_src, vocab, searchable):
    model = searchable("gnmt", 0.5)
    src = make_src([6, 3, 5])
    results = beam_search(model, src, DecodeConfig(beam=3, nbest=2, coverage=0.2),
                          need_attention=True)
    for row, hyps in enumerate(results):
        assert len(hyps) == 2
        n_real = int(src[row].ne(vocab.pad).sum())
        for h in hyps:
            assert h.attention.shape == (len(h.tokens) + 1, src.size(1))
            assert torch.all(h.attention[:, n_real:] == 0)
