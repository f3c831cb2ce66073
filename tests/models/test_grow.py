"""Progressive training: growing a trained h-layer encoder into an N-layer one."""

import pytest
import torch

from xinda.errors import XindaError
from xinda.models.base import EncoderOut
from xinda.models.transformer.grow import grow_encoder, grown_config, source_layer
from xinda.models.transformer.model import Transformer, TransformerConfig

TINY = {"arch": "transformer", "d_model": 16, "heads": 2, "ffn_dim": 32, "decoder_layers": 1,
        "dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1}


@pytest.fixture
def trained_like(make_model):
    """``trained_like(layers, seed=0, **options)`` -> a model whose every parameter is random
    (not the default init), as after training."""
    def make(layers: int, seed: int = 0, **options) -> Transformer:
        model = make_model(TINY, seed, encoder_layers=layers, **options)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        return model.eval()
    return make


def grow(old: Transformer, layers: int) -> Transformer:
    torch.manual_seed(123)
    return grow_encoder(old, Transformer(grown_config(old.cfg, layers), old.vocab)).eval()


def layer_io(model: Transformer, src: torch.Tensor) -> tuple[list, list, torch.Tensor]:
    """Inputs and outputs of every encoder layer (its first sub-layer's input, its last
    sub-layer's output: layers are not called as modules under sub-layer fusion), and the input
    of the final encoder norm."""
    inputs, outputs, final = [], [], []

    def keep(found: list, take):
        def hook(module, args, out) -> None:
            found.append(take(args, out))
        return hook

    hooks = []
    for layer in model.encoder_layers:
        hooks.append(layer.attn_sub.register_forward_hook(keep(inputs, lambda a, o: a[0])))
        hooks.append(layer.ffn_sub.register_forward_hook(keep(outputs, lambda a, o: o[0])))
    hooks.append(model.encoder_norm.register_forward_hook(keep(final, lambda a, o: a[0])))
    with torch.no_grad():
        model.encode(src)
    for hook in hooks:
        hook.remove()
    return inputs, outputs, final[0]


SRC = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 11, 3, 0]])
OPTIONS = [{}, {"norm": "pre"}, {"dense": "encoder", "norm": "pre"}, {"dense": "encoder"},
           {"dense": "both", "norm": "pre", "dense_every": 2},
           {"fusion": "layer", "fusion_side": "encoder"},
           {"fusion": "sublayer", "fusion_function": "linear", "fusion_side": "both"}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values()))
                         or "plain")
@pytest.mark.parametrize("h,n", [(2, 4), (2, 3), (4, 6)])
def test_first_h_layers_compute_what_the_old_encoder_computed(options, h, n,
                                                              trained_like):
    old = trained_like(h, **options)
    new = grow(old, n)
    old_in, old_out, old_final = layer_io(old, SRC)
    new_in, new_out, _ = layer_io(new, SRC)
    for j in range(h):
        assert torch.equal(new_in[j], old_in[j]), j
        assert torch.equal(new_out[j], old_out[j]), j
    # what the old encoder handed to its final norm is what the first new layer above reads
    # (a DLCL aggregation point at h feeds both; otherwise layer h reads layer h-1's output)
    assert torch.equal(new_in[h], old_final)


@pytest.mark.parametrize("h,n", [(2, 4), (3, 5), (1, 2)])
def test_copy_rule_for_layers_and_everything_else(h, n, trained_like):
    old = trained_like(h, norm="pre", share_embeddings=False, tie_output=False)
    new = grow(old, n)
    assert [source_layer(j, h, n) for j in range(n)] == \
        list(range(h)) + list(range(2 * h - n, h))
    for j in range(n):
        a = new.encoder_layers[j].state_dict()
        b = old.encoder_layers[source_layer(j, h, n)].state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    old_rest = {k: v for k, v in old.state_dict().items() if not k.startswith("encoder_layers")}
    new_rest = {k: v for k, v in new.state_dict().items() if not k.startswith("encoder_layers")}
    assert old_rest.keys() == new_rest.keys()
    assert all(torch.equal(old_rest[k], new_rest[k]) for k in old_rest)


def test_2h_stacks_the_whole_encoder_twice(trained_like):
    old = trained_like(3)
    new = grow(old, 6)
    for j in range(3):
        for k, v in old.encoder_layers[j].state_dict().items():
            assert torch.equal(new.encoder_layers[j].state_dict()[k], v)
            assert torch.equal(new.encoder_layers[j + 3].state_dict()[k], v)


def test_dlcl_weights_block_and_norms(trained_like):
    old = trained_like(2, dense="encoder", norm="pre")
    new = grow(old, 4)
    w_old, w_new = old.encoder_connection.weights, new.encoder_connection.weights
    assert w_new.shape == (5, 5)
    assert torch.equal(w_new[:3, :3], w_old)
    # the new rows keep the 1/M initialisation
    for k in (3, 4):
        assert torch.allclose(w_new[k, :k + 1], torch.full((k + 1,), 1 / (k + 1)))
        assert torch.all(w_new[k, k + 1:] == 0)
    norms_old, norms_new = old.encoder_connection.norms, new.encoder_connection.norms
    for k, src in [(0, 0), (1, 1), (2, 0), (3, 1)]:  # new layer j >= 2 copies layer j - 2
        for name, v in norms_old[src].state_dict().items():
            assert torch.equal(norms_new[k].state_dict()[name], v)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_growing_h_to_2h_runs_the_old_encoder_twice_under_the_old_decoder(norm, trained_like):
    """N = 2h stacks the trained encoder on itself: the grown memory is the old layer stack L
    run twice over the source embeddings, then the final norm once (identity for post-norm):
    norm(L(L(x))); the grown decoder (a copy) reads it exactly as the old decoder would."""
    old = trained_like(2, norm=norm)
    new = grow(old, 4)
    prev = torch.tensor([[2, 5, 6], [2, 7, 8]])
    with torch.no_grad():
        src_pad = SRC.eq(old.vocab.pad)
        x = old.src_embed(SRC)
        for layer in [*old.encoder_layers, *old.encoder_layers]:
            x = layer(x, ~src_pad[:, None, None, :])
        twice = EncoderOut(old.encoder_norm(x), src_pad)
        grown = new.encode(SRC)
        logits, attn = new.decode(prev, grown, need_weights=True)
        old_logits, old_attn = old.decode(prev, twice, need_weights=True)
    assert not torch.equal(twice.memory, old.encode(SRC).memory)  # not the shallow encoder's
    assert torch.equal(grown.src_pad, src_pad)
    torch.testing.assert_close(grown.memory, twice.memory, atol=0, rtol=0)
    torch.testing.assert_close(logits, old_logits, atol=0, rtol=0)
    torch.testing.assert_close(attn, old_attn, atol=0, rtol=0)


@pytest.mark.parametrize("n", [2, 1, 5, 8])
def test_bounds_h_lt_n_le_2h(n):
    with pytest.raises(XindaError, match="need 2 < N <= 4"):
        grown_config(TransformerConfig(encoder_layers=2, **TINY), n)


def test_refuses_models_that_differ_in_more_than_depth(trained_like):
    old = trained_like(2)
    other = Transformer(TransformerConfig(encoder_layers=4, **{**TINY, "d_model": 32}),
                        old.vocab)
    with pytest.raises(XindaError, match="except for encoder_layers"):
        grow_encoder(old, other)
    with pytest.raises(XindaError, match="need 2 < N <= 4"):
        grow_encoder(old, trained_like(5))
