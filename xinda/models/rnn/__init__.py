"""Recurrent encoder-decoder family: registration and presets.

Sizes are chosen to train on a CPU; the papers' sizes are noted beside each preset.
"""

from xinda.models.registry import register_architecture, register_preset
from xinda.models.rnn.config import RNNConfig
from xinda.models.rnn.encoder import RNNEncoderOut
from xinda.models.rnn.model import RNNModel

register_architecture("rnn", RNNConfig, "recurrent encoder-decoder (LSTM/GRU/RNN, "
                      "Sutskever/Bahdanau/Luong/GNMT attention)")(RNNModel)

# Widths are 256 throughout so the presets compare at equal width and train in minutes on a
# CPU; the papers' sizes are in the comments (override hidden_dim/embed_dim/layers to match).
# Sutskever et al. 2014: 4-layer LSTM, reversed source, no attention, the encoder's final
# state starts the decoder (paper: 1000 units, 1000-dim embeddings).
register_preset("rnn-sutskever", "Sutskever et al. 2014: 4+4 LSTM x 256, reversed source, "
                "no attention", arch="rnn", cell="lstm", embed_dim=256, hidden_dim=256,
                encoder_layers=4, decoder_layers=4, reverse_source=True, attention="none",
                decoder_init="final", dropout=0.2)
# Bahdanau et al. 2015 (RNNsearch): bidirectional GRU encoder, additive attention queried by
# s_{t-1}, context fed to the GRU, learned initial state (paper: 1000 units, 620 embeddings).
register_preset("rnn-bahdanau", "Bahdanau et al. 2015: bi-GRU x 256, additive attention "
                "queried by s_{t-1}", arch="rnn", cell="gru", embed_dim=256, hidden_dim=256,
                encoder_layers=1, decoder_layers=1, bidirectional=True, attention="concat",
                attention_style="bahdanau", decoder_init="learned", dropout=0.2)
# Luong et al. 2015: stacked LSTM, reversed source, "general" global attention, attentional
# vector h~_t, input feeding (paper: 4 layers of 1000 units).
register_preset("rnn-luong-global", "Luong et al. 2015: 2+2 LSTM x 256, general global "
                "attention, input feeding", arch="rnn", cell="lstm", embed_dim=256,
                hidden_dim=256, encoder_layers=2, decoder_layers=2, reverse_source=True,
                attention="general", attention_style="luong", input_feeding=True,
                decoder_init="final", dropout=0.2)
# Luong et al. 2015 local-p: predicted centre p_t, window D = 10, Gaussian sigma = D / 2.
register_preset("rnn-luong-local-p", "Luong et al. 2015: 2+2 LSTM x 256, local-p attention "
                "(D = 10), input feeding", arch="rnn", cell="lstm", embed_dim=256,
                hidden_dim=256, encoder_layers=2, decoder_layers=2, reverse_source=True,
                attention="general", attention_style="luong", attention_window="local-p",
                window_d=10, input_feeding=True, decoder_init="final", dropout=0.2)
# GNMT (Wu et al. 2016): deep LSTM encoder with a bidirectional bottom layer, residual
# connections from layer 3, a decoder whose bottom layer's output queries additive attention
# for all layers above (paper: 8+8 layers of 1024 units). As in the paper, the context does
# not join the bottom layer's input; TensorFlow NMT's GNMT cell feeds the previous one there
# (input_feeding: true), which scored 5.4 BLEU less at equal updates here (docs/benchmarks.md).
register_preset("gnmt", "GNMT (Wu et al. 2016): 4+4 LSTM x 256, bidirectional bottom, "
                "residual from layer 3", arch="rnn", cell="lstm", embed_dim=256,
                hidden_dim=256, encoder_layers=4, decoder_layers=4, bidirectional=True,
                bidirectional_bottom_only=True, residual_from=3, attention="concat",
                attention_style="gnmt", decoder_init="zeros", dropout=0.2)

__all__ = ["RNNConfig", "RNNEncoderOut", "RNNModel"]
