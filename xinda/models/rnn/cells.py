"""Recurrent cells: each cell's equations written out, beside PyTorch's fused modules.

The readable cells take their weights in PyTorch's layout (``weight_ih`` (G*H, I), ``weight_hh``
(G*H, H), gate blocks stacked in PyTorch's order), so the same numbers drive both paths and
``unroll_reference`` can replay a fused ``nn.LSTM``/``nn.GRU``/``nn.RNN`` step by step.

Shapes: B batch, T time, I input width, H hidden width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

FUSED = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}


def rnn_cell(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
             b_hh: Tensor) -> Tensor:
    """Elman RNN: h_t = tanh(W x_t + U h_{t-1} + b). x (B, I), h (B, H) -> (B, H)."""
    return torch.tanh(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)


def lstm_cell(x: Tensor, h: Tensor, c: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
              b_hh: Tensor) -> tuple[Tensor, Tensor]:
    """LSTM (Hochreiter & Schmidhuber 1997, with forget gate): f, i, o = sigmoid(W x + U h + b),
    c~ = tanh(W_c x + U_c h + b_c), c_t = f * c_{t-1} + i * c~, h_t = o * tanh(c_t).
    Gate blocks in PyTorch order i, f, g (= c~), o. x (B, I), h/c (B, H) -> h, c (B, H)."""
    pre = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh  # (B, 4H)
    i, f, g, o = pre.chunk(4, dim=-1)  # each (B, H)
    i, f, o, g = torch.sigmoid(i), torch.sigmoid(f), torch.sigmoid(o), torch.tanh(g)
    c = f * c + i * g
    return o * torch.tanh(c), c


def gru_cell(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
             b_hh: Tensor) -> Tensor:
    """GRU (Cho et al. 2014), PyTorch's convention: r = sigmoid(W_r x + U_r h + b_r),
    z = sigmoid(W_z x + U_z h + b_z), n = tanh(W_n x + b_in + r * (U_n h + b_hn)),
    h_t = (1 - z) * n + z * h_{t-1}. Gate blocks r, z, n. x (B, I), h (B, H) -> (B, H)."""
    xr, xz, xn = (x @ w_ih.T + b_ih).chunk(3, dim=-1)  # each (B, H)
    hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, dim=-1)  # each (B, H)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1 - z) * n + z * h


def cell_kind(rnn: nn.RNNBase) -> str:
    return {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn"}[rnn.mode]


def _direction(kind: str, x: Tensor, h: Tensor, c: Tensor | None,
               weights: list[Tensor]) -> tuple[Tensor, Tensor, Tensor | None]:
    """Run one cell over x (B, T, I) from h/c (B, H) -> outputs (B, T, H), final h, final c."""
    outputs = []
    for t in range(x.size(1)):
        if kind == "lstm":
            h, c = lstm_cell(x[:, t], h, c, *weights)
        else:
            h = (gru_cell if kind == "gru" else rnn_cell)(x[:, t], h, *weights)
        outputs.append(h)
    return torch.stack(outputs, 1), h, c


def unroll_reference(rnn: nn.RNNBase, x: Tensor, state=None):
    """Readable replacement for ``rnn(x, state)`` (batch_first, unpadded): loops over layers,
    directions and time with the cells above. x (B, T, I); state as the fused module takes it,
    h (layers*dirs, B, H) [and c]. Returns (output (B, T, dirs*H), final state like the module)."""
    kind, dirs = cell_kind(rnn), 2 if rnn.bidirectional else 1
    zeros = x.new_zeros(rnn.num_layers * dirs, x.size(0), rnn.hidden_size)
    h0, c0 = (state if kind == "lstm" else (state, None)) if state is not None else (zeros, zeros)
    finals_h, finals_c = [], []
    for layer in range(rnn.num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            weights = [getattr(rnn, f"{name}{sfx}") for name in
                       ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            k = layer * dirs + d
            xin = x.flip(1) if d else x  # the backward direction reads right to left
            out, h, c = _direction(kind, xin, h0[k], None if c0 is None else c0[k], weights)
            outs.append(out.flip(1) if d else out)
            finals_h.append(h)
            finals_c.append(c)
        x = torch.cat(outs, -1)  # (B, T, dirs*H)
    h_n = torch.stack(finals_h)  # (layers*dirs, B, H)
    return x, ((h_n, torch.stack(finals_c)) if kind == "lstm" else h_n)


def run_rnn(rnn: nn.RNNBase, x: Tensor, state=None, reference: bool = False):
    """Fast path (fused module) or readable path (``unroll_reference``), same interface."""
    if reference:
        return unroll_reference(rnn, x, state)
    if x.is_cpu and torch.is_autocast_enabled("cpu") and \
            torch.get_autocast_dtype("cpu") == torch.float16:
        # oneDNN has no fp16 LSTM on CPUs ("could not create a primitive descriptor"): fp32
        with torch.autocast("cpu", enabled=False):
            floats = None if state is None else (
                tuple(s.float() for s in state) if isinstance(state, tuple) else state.float())
            return rnn(x.float(), floats)
    return rnn(x, state)


_STEP = {"lstm": torch.lstm_cell, "gru": torch.gru_cell, "rnn": torch.rnn_tanh_cell}


def step_fused(rnn: nn.RNNBase, x: Tensor, parts: list[Tensor]) -> list[Tensor]:
    """One time step of a single-layer, unidirectional fused module through PyTorch's cell
    kernels (``torch.lstm_cell`` etc., the ones ``nn.LSTMCell`` uses) with the module's own
    weights: x (B, I), [h] or [h, c] each (B, H) -> the new [h] or [h, c]. Cheaper per step
    than calling the sequence module with T = 1, and its bf16 weight casts are cached."""
    weights = (rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0)
    kind = cell_kind(rnn)
    if kind == "lstm":
        return list(_STEP[kind](x, (parts[0], parts[1]), *weights))
    return [_STEP[kind](x, parts[0], *weights)]


def from_module_state(kind: str, state) -> list[Tensor]:
    """Fused module state h (dirs, B, H) [and c] -> [h] or [h, c], each (B, dirs*H) with the
    directions concatenated (batch first, so ``reorder_nested`` can index it)."""
    parts = state if kind == "lstm" else (state,)
    return [torch.cat(list(part), dim=-1) for part in parts]


def to_module_state(kind: str, parts: list[Tensor]):
    """[h] or [h, c], each (B, H) -> the (1, B, H) state a single-layer fused module takes."""
    h0 = [t[None].contiguous() for t in parts]  # each (1, B, H)
    return tuple(h0) if kind == "lstm" else h0[0]


def init_rnn_(rnn: nn.RNNBase) -> None:
    """Xavier-uniform for each gate's weight matrix separately, biases 0, and the
    LSTM forget-gate bias 1 (Jozefowicz et al. 2015). nn.LSTM adds two bias vectors
    (b_ih + b_hh): b_ih's forget block is set to 1 and b_hh's to 0, so the effective bias is 1."""
    kind = cell_kind(rnn)
    hidden = rnn.hidden_size
    for name, param in rnn.named_parameters():
        with torch.no_grad():
            if name.startswith("weight"):
                for block in param.split(hidden, dim=0):  # one (H, I) matrix per gate
                    nn.init.xavier_uniform_(block)
            else:
                param.zero_()
                if kind == "lstm" and name.startswith("bias_ih"):
                    param[hidden:2 * hidden] = 1.0  # forget gate block (order i, f, g, o)


def make_rnn(kind: str, input_dim: int, hidden_dim: int, bidirectional: bool = False) -> nn.RNNBase:
    """One fused, batch-first, single-layer recurrent module, initialised by ``init_rnn_``."""
    rnn = FUSED[kind](input_dim, hidden_dim, batch_first=True, bidirectional=bidirectional)
    init_rnn_(rnn)
    return rnn
