"""Small building blocks shared by model families: positions, embeddings, attention, FFN, and
the residual sub-layer connection with layer dropout.

Layer dropout follows the textbook: Xiao Tong and Zhu Jingbo 2021, *Machine Translation:
Foundations and Models*, ch. 15 (cited as "textbook ch. 15"), after Pham et al. 2019,
"Very deep self-attention networks for end-to-end speech recognition".

Shapes: B batch, S source length, T target length, D model width, H heads, Dh = D / H.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Dropout(nn.Module):
    """Inverted dropout with a cheaper random source than ``nn.Dropout``.

    On CPU, ``torch.bernoulli_`` costs ~25 % of a small Transformer's training step. Here the
    keep mask compares 16-bit random integers (``random_lanes``) with a threshold, so the
    drop rate is p rounded to a multiple of 1/65536. Same expectation as
    ``nn.Dropout``: kept values are scaled by 1 / (1 - p). Identity at inference. The mask is
    made of 0/1 numbers by clamping, not of booleans: comparisons, ``where`` and bool
    conversions run several times slower than arithmetic on CPU.
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.threshold = round(p * 65536) - 32768  # int16 draws >= threshold are kept
        kept = 1.0 - round(p * 65536) / 65536  # p rounded to 1 keeps nothing
        self.scale = 1.0 / kept if kept > 0 else 0.0

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.threshold <= -32768:  # p == 0 (rounded)
            return x
        if not self.scale:  # p == 1 (rounded): nothing kept
            return x * 0.0
        lanes = random_lanes(x.numel(), x.device).view(x.shape)
        low = self.threshold - 1  # keep = 1 where lane >= threshold, else 0
        keep = lanes.clamp(low, self.threshold).sub_(low).to(x.dtype)
        return (x * keep).mul_(self.scale)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def random_lanes(n: int, device: torch.device) -> Tensor:
    """``n`` uniform random int16 values (1-D) drawn from torch's generator state, so
    ``torch.manual_seed`` and a resumed RNG state repeat them.

    On CPU, ``Tensor.random_`` (a single-threaded Mersenne Twister) was three quarters of a
    dropout's time; there one int64 from torch's generator seeds a numpy SFC64 stream, 2.5x
    faster per value. Elsewhere ``random_``. Four int16 lanes per 64-bit draw."""
    words = (n + 3) // 4
    if device.type != "cpu":
        bits = torch.empty(words, dtype=torch.int64, device=device)
        return bits.random_(-(2**63), 2**63 - 1).view(torch.int16)[:n]
    seed = int(torch.randint(0, 2**62, ()))
    bits = np.random.SFC64(seed).random_raw(words)
    return torch.from_numpy(bits.view(np.int16)[:n])


def sinusoidal_table(n_positions: int, dim: int) -> Tensor:
    """Sinusoidal positions (Vaswani et al. 2017 sec. 3.5): PE(p, 2i) = sin(p / 10000^(2i/D)),
    PE(p, 2i+1) = cos(p / 10000^(2i/D)). Returns (n_positions, dim)."""
    pos = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2).float() / dim)  # (D/2,)
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: dim // 2])
    return table


class TokenEmbedding(nn.Module):
    """Token embedding scaled by sqrt(D) (Vaswani et al. 2017, sec. 3.4), plus sinusoidal
    positions, then dropout."""

    def __init__(self, vocab_size: int, dim: int, pad_id: int, dropout: float,
                 max_positions: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        nn.init.normal_(self.embed.weight, mean=0.0, std=dim**-0.5)
        with torch.no_grad():
            self.embed.weight[pad_id].zero_()
        self.scale = math.sqrt(dim)
        self.register_buffer("positions", sinusoidal_table(max_positions, dim), persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        """ids (B, T) -> (B, T, D); ``start`` offsets positions for incremental decoding."""
        length = ids.size(1)
        if start + length > self.positions.size(0):
            raise ValueError(f"sequence of {start + length} tokens exceeds max_positions "
                             f"{self.positions.size(0)}")
        x = self.embed(ids) * self.scale + self.positions[start:start + length]
        return self.dropout(x)


def attention_reference(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None,
                        dropout: float = 0.0) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, written out: softmax(q k^T / sqrt(Dh)) v (Vaswani eq. 1).

    q (B, H, T, Dh), k/v (B, H, S, Dh), keep: bool broadcastable to (B, H, T, S), True = attend.
    Returns (output (B, H, T, Dh), weights (B, H, T, S)).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    weights = torch.nan_to_num(weights)  # a fully masked row attends to nothing
    return F.dropout(weights, dropout) @ v, weights


def attention_bias(keep: Tensor | None, causal: bool, t: int, s: int,
                   dtype: torch.dtype, device: torch.device) -> Tensor | None:
    """The additive form of the attention mask, 0 where a query may look and -inf elsewhere:
    ``keep`` (bool, True = attend) and/or the causal mask, aligned bottom-right (query i of t
    sees keys up to i + s - t). Broadcastable to (B, H, t, s)."""
    bias = None
    if keep is not None:
        bias = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill_(~keep, -math.inf)
    if causal:
        future = torch.full((t, s), -math.inf, dtype=dtype, device=device).triu_(s - t + 1)
        bias = future if bias is None else bias + future
    return bias


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017 sec. 3.2.2) with a key/value cache for
    incremental decoding.

    Self-attention projects q, k, v with one fused matmul; cross-attention projects k, v of the
    (static) memory once per sentence and caches them. The fast path is PyTorch's fused
    ``scaled_dot_product_attention``; ``need_weights=True`` takes the readable reference path
    and also returns the attention weights averaged over heads (B, T, S). Training with
    attention dropout on CPU writes the attention out (``_attend_with_dropout``): there SDPA
    takes its unfused path, with boolean masking and ``bernoulli_`` draws, which is slower.
    """

    def __init__(self, dim: int, heads: int, dropout: float, self_attention: bool):
        super().__init__()
        if dim % heads:
            raise ValueError(f"d_model {dim} is not divisible by {heads} heads")
        self.heads, self.head_dim, self.dropout = heads, dim // heads, dropout
        self.self_attention = self_attention
        if self_attention:
            self.qkv = nn.Linear(dim, 3 * dim)
        else:
            self.q = nn.Linear(dim, dim)
            self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        self.weight_dropout = Dropout(dropout)  # on the attention weights, in training
        for lin in (m for m in self.children() if isinstance(m, nn.Linear)):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def _split(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, H, T, Dh)
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def _project(self, x: Tensor, memory: Tensor | None, cache: dict | None):
        if self.self_attention:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            q, k, v = self._split(q), self._split(k), self._split(v)
            if cache is not None:
                if "k" in cache:  # append this step's keys/values to the cache
                    k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
                cache["k"], cache["v"] = k, v
            return q, k, v
        q = self._split(self.q(x))
        if cache is not None and "k" in cache:
            return q, cache["k"], cache["v"]
        k, v = (self._split(t) for t in self.kv(memory).chunk(2, dim=-1))
        if cache is not None:
            cache["k"], cache["v"] = k, v
        return q, k, v

    def forward(self, x: Tensor, memory: Tensor | None = None, keep: Tensor | None = None,
                causal: bool = False, cache: dict | None = None,
                need_weights: bool = False, group: int = 1) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D); memory (B, S, D) for cross-attention; keep bool (B, 1, 1, S) or
        (B, 1, T, S), True = may attend; causal adds the future mask (self-attention).
        ``group`` > 1 (cross-attention): x has ``group`` consecutive rows per memory row
        (beams of one sentence), memory and keep one row per sentence (B / group).
        Returns (output (B, T, D), head-averaged weights (B, T, S) or None)."""
        q, k, v = self._project(x, memory, cache)
        if group > 1:  # the group's queries attend to their one memory row together
            q = _rows_to_queries(q, group)
        out, weights = self._attend(q, k, v, keep, causal, need_weights)
        if group > 1:
            out = _queries_to_rows(out, group)
            if weights is not None:  # (B / G, G * T, S) -> (B, T, S)
                weights = weights.unflatten(1, (group, -1)).flatten(0, 1)
        return self.out(out.transpose(1, 2).flatten(2)), weights  # (B, T, D)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, causal: bool,
                need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Heads in, heads out: (B, H, T, Dh) -> (B, H, T, Dh) and the head-averaged weights
        (B, T, S) when asked."""
        p = self.dropout if self.training else 0.0
        causal = causal and q.size(2) > 1  # one new query may see every cached key
        if causal and (need_weights or keep is not None or q.size(2) != k.size(2)):
            # SDPA's is_causal cannot be combined with attn_mask and aligns the mask top-left,
            # which is wrong behind cached keys: build the bottom-right-aligned mask instead.
            future = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device)
            future = future.tril(k.size(2) - q.size(2))
            keep = future if keep is None else keep & future
            causal = False
        if need_weights:
            out, weights = attention_reference(q, k, v, keep, p)
            return out, weights.mean(1)
        if p > 0 and q.device.type == "cpu":  # GPUs keep SDPA's fused dropout kernels
            return self._attend_with_dropout(q, k, v, keep, causal), None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p,
                                              is_causal=causal and keep is None), None

    def _attend_with_dropout(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None,
                             causal: bool) -> Tensor:
        """dropout(softmax(q k^T / sqrt(Dh) + mask)) v (Vaswani eq. 1), the mask additive
        (``attention_bias``), the dropout ``Dropout``. (B, H, T, Dh) -> (B, H, T, Dh)."""
        scores = (q * self.head_dim**-0.5) @ k.transpose(-2, -1)  # (B, H, T, S)
        bias = attention_bias(keep, causal, q.size(2), k.size(2), scores.dtype, q.device)
        if bias is not None:
            scores = scores + bias
        return self.weight_dropout(torch.softmax(scores, dim=-1)) @ v


def _rows_to_queries(q: Tensor, group: int) -> Tensor:
    """(B*G, H, T, Dh) -> (B, H, G*T, Dh): a sentence's G rows become G*T queries."""
    rows, heads, length, dim = q.shape
    return q.view(rows // group, group, heads, length, dim).transpose(1, 2).reshape(
        rows // group, heads, group * length, dim)


def _queries_to_rows(out: Tensor, group: int) -> Tensor:
    """The inverse of ``_rows_to_queries``: (B, H, G*T, Dh) -> (B*G, H, T, Dh)."""
    batch, heads, queries, dim = out.shape
    return out.view(batch, heads, group, queries // group, dim).transpose(1, 2).reshape(
        batch * group, heads, queries // group, dim)


class FeedForward(nn.Module):
    """Position-wise FFN (Vaswani eq. 2): W2 dropout(act(W1 x + b1)) + b2."""

    def __init__(self, dim: int, hidden: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.act = {"relu": nn.ReLU(), "gelu": nn.GELU()}[activation]
        self.dropout = Dropout(dropout)
        for lin in (self.w1, self.w2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.dropout(self.act(self.w1(x))))


def skip_probability(index: int, total: int, phi: float) -> float:
    """Layer dropout rate of sub-layer ``index`` (1-based) of ``total``: p_l = l / N * phi,
    rising linearly from the bottom (textbook ch. 15; N = 2L in the encoder, 3L in the
    decoder)."""
    return index / total * phi


class SublayerConnection(nn.Module):
    """Residual connection around a sub-layer with LayerNorm before it (pre-norm,
    x + F(LN(x)), Xiong et al. 2020, table 1; textbook ch. 15) or after it (post-norm,
    LN(x + F(x)), Vaswani et al. 2017, sec. 3.1); dropout on F's output (sec. 5.4).

    ``skip_prob`` p > 0 (``skip_probability``) adds layer dropout (textbook ch. 15): in training
    the whole sub-layer is skipped with probability p, x_{l+1} = M * F(LN(x_l)) + x_l with
    M ~ Bernoulli(1 - p) / (1 - p), so the kept F is scaled up and, with pre-norm, inference
    (never skipped) sees each sub-layer's training expectation given its input. Post-norm takes the
    LayerNorm of the sum, which is not linear: there inference only approximates it (the
    textbook and Pham et al. 2019 use pre-norm). ``residual=False`` drops the "+ x" (only with
    sub-layer fusion, which then carries the earlier information).
    """

    def __init__(self, dim: int, dropout: float, pre_norm: bool, skip_prob: float = 0.0,
                 residual: bool = True):
        super().__init__()
        self.norm, self.dropout, self.pre_norm = nn.LayerNorm(dim), Dropout(dropout), pre_norm
        self.skip_prob, self.residual = skip_prob, residual

    def forward(self, x: Tensor, sublayer) -> tuple[Tensor, object]:
        """``sublayer`` maps a (B, T, D) tensor to (output, extra); extra is passed through."""
        scale = 1.0
        if self.skip_prob and self.training:  # layer dropout: M of the docstring
            if torch.rand(()) < self.skip_prob:
                return (x if self.pre_norm else self.norm(x)), None
            scale = 1.0 / (1.0 - self.skip_prob)
        skip = x if self.residual else 0.0
        if self.pre_norm:
            y, extra = sublayer(self.norm(x))
            return skip + self._scaled(y, scale), extra
        y, extra = sublayer(x)
        return self.norm(skip + self._scaled(y, scale)), extra

    def _scaled(self, y: Tensor, scale: float) -> Tensor:
        y = self.dropout(y)
        return y if scale == 1.0 else y * scale
