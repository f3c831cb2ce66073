"""How a Transformer stack passes information from one layer (or sub-layer) to the next.

A stack is a list of *units*: callables (B, T, D) -> (B, T, D), each one layer or one
sub-layer with its own residual connection. A connection runs the units in order and decides
what each unit reads:

- ``run_plain``: the previous unit's output (the standard Transformer);
- ``DenseConnection``: DLCL (Wang et al. 2019, "Learning deep Transformer models for machine
  translation") and its grouped form, a learned linear combination of every earlier (group)
  output, as in ch. 15 of the textbook (Xiao Tong and Zhu Jingbo 2021, *Machine Translation:
  Foundations and Models*), cited below as "textbook ch. 15";
- ``InformationFusion``: layer- and sub-layer-wise information-transfer enhancement with a
  retention gate, from the paper this project was seeded with (the "fusion paper": equation
  numbers below are that paper's eqs. 7-16; docs/references.md says what is known of it), a
  gated merge of the current output with a fusion of all earlier outputs.

Layer dropout, the third deep-network method, acts inside one sub-layer, so it lives in
``xinda.models.layers`` (``SublayerConnection`` and ``skip_probability``).

Everything is per position, so incremental decoding sees exactly what full decoding sees.
Shapes: B batch, T length, D model width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Unit = Callable[[Tensor], Tensor]


def run_plain(x: Tensor, units: Sequence[Unit]) -> Tensor:
    """x_{l+1} = unit_l(x_l): every unit reads its predecessor's output."""
    for unit in units:
        x = unit(x)
    return x


def dlcl_aggregate(weights: Tensor, history: Sequence[Tensor]) -> Tensor:
    """DLCL, g_l = sum_{i<=l} W_{l,i} z_i: ``weights`` (l+1,) for the l+1 stored z_i (B, T, D)."""
    out = history[0] * weights[0]
    for w, z in zip(weights[1:], history[1:]):
        out = out + w * z
    return out


DenseInit = Literal["mean", "last"]


class DenseConnection(nn.Module):
    """Dynamic linear combination of layers (DLCL, Wang et al. 2019), grouped every p layers.

    z_0 is the embedding output; after every p-th layer the output x is stored as
    z_k = LN_k(x) (pre-norm; post-norm stores x and normalises the sum instead, as in the
    paper), and the next layer reads g_k = sum_{i<=k} W_{k,i} z_i. W is a learnable
    lower-triangular (K+1) x (K+1) matrix, K = layers // p, each row initialised to 1/M over its
    M = k+1 entries (the mean; ``init="last"`` puts all weight on z_k). p = 1 is DLCL itself;
    p > layers never aggregates, i.e. the plain Transformer. Layers between two aggregation
    points read their predecessor's output.
    """

    def __init__(self, layers: int, dim: int, every: int = 1, pre_norm: bool = True,
                 init: DenseInit = "mean"):
        super().__init__()
        self.every, self.pre_norm = every, pre_norm
        points = layers // every  # aggregation points K
        # without an aggregation point W is never read: no gradient (DDP would wait for one)
        self.weights = nn.Parameter(dlcl_init(points + 1, init), requires_grad=points > 0)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(points))

    def forward(self, x: Tensor, units: Sequence[Unit]) -> Tensor:
        history = [x]  # z_0 = embedding output, not normalised (as in Wang et al.'s own code)
        for layer, unit in enumerate(units, 1):
            x = unit(x)
            if layer % self.every:
                continue  # inside a group: plain connection
            k = len(history)  # index of the new z_k
            history.append(self.norms[k - 1](x) if self.pre_norm else x)
            x = dlcl_aggregate(self.weights[k, :k + 1], history)
            if not self.pre_norm:
                x = self.norms[k - 1](x)
        return x


def dlcl_init(size: int, init: DenseInit = "mean") -> Tensor:
    """DLCL's initial (size, size) lower-triangular W. ``mean`` (textbook ch. 15): row k is
    1 / (k + 1) on its k + 1 entries. ``last``: row k is 1 on z_k, the newest output, and 0 on
    the earlier ones, so training starts from a plain stack and learns to reach back (a
    post-norm one; with pre-norm each layer then reads LN_k(x_k), the stored z_k, where a plain
    pre-norm stack passes x_k on)."""
    if init == "last":
        return torch.eye(size)
    rows = torch.arange(1, size + 1, dtype=torch.float32)[:, None]
    return torch.ones(size, size).tril() / rows


GateForm = Literal["elementwise", "matrix", "scalar"]


class RetentionGate(nn.Module):
    """Retention gate (fusion paper, eqs. 8-9 and 11-12): g = sigmoid(W [fusion; current] + b),
    out = LN((1 - g) * current + g * fusion). Three forms of W (``form``):

    - ``elementwise``, the paper as written (W in R^{D x 2}): each dimension d has its own gate
      from two numbers, g_d = sigmoid(W_d1 fusion_d + W_d2 current_d + b_d); 3D parameters;
    - ``matrix`` (W in R^{D x 2D}): each g_d reads all 2D numbers; 2D^2 + D parameters;
    - ``scalar`` (W in R^{1 x 2D}): one gate per position for all dimensions; 2D + 1.

    The LayerNorm adds 2D. Every form starts with gates at or near 0.5: b = 0, the elementwise
    W Xavier-uniform over its (D, 2) (pre-activations of std ~0.1 at D = 512), the matrix and
    scalar W zero (Xavier over their 2D columns would give std ~1.2-1.4: gates from 0.01 to
    0.99, some saturated from the start).
    """

    def __init__(self, dim: int, form: GateForm = "elementwise"):
        super().__init__()
        self.form = form
        rows, cols = {"elementwise": (dim, 2), "matrix": (dim, 2 * dim),
                      "scalar": (1, 2 * dim)}[form]
        init = nn.init.xavier_uniform_ if form == "elementwise" else nn.init.zeros_
        self.weight = nn.Parameter(init(torch.empty(rows, cols)))
        self.bias = nn.Parameter(torch.zeros(rows))
        self.norm = nn.LayerNorm(dim)

    def gate(self, current: Tensor, fusion: Tensor) -> Tensor:
        """g: (B, T, D), or (B, T, 1) for the scalar form."""
        if self.form == "elementwise":  # g_d = sigmoid(W_d1 fusion_d + W_d2 current_d + b_d)
            w = self.weight
            return torch.sigmoid(fusion * w[:, 0] + current * w[:, 1] + self.bias)
        return torch.sigmoid(F.linear(torch.cat([fusion, current], dim=-1), self.weight, self.bias))

    def forward(self, current: Tensor, fusion: Tensor) -> Tensor:
        g = self.gate(current, fusion)
        return self.norm((1 - g) * current + g * fusion)


def gate_parameters(dim: int, form: GateForm) -> int:
    """Parameters of one retention gate's W and b (without its LayerNorm)."""
    return {"elementwise": 3 * dim, "matrix": 2 * dim * dim + dim, "scalar": 2 * dim + 1}[form]


def mean_fusion(history: Sequence[Tensor]) -> Tensor:
    """Fusion by the arithmetic mean (eq. 7, f = mean): (1/n) sum_i h_i."""
    out = history[0]
    for h in history[1:]:
        out = out + h
    return out / len(history)


class LinearFusion(nn.Module):
    """Fusion by a learned linear transform (eq. 7, f = linear): W [h_1; ...; h_n], W of shape
    D x nD, initialised to [I/n ... I/n] so that training starts from the mean."""

    def __init__(self, n: int, dim: int):
        super().__init__()
        self.proj = nn.Linear(n * dim, dim, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(dim).repeat(1, n) / n)

    def forward(self, history: Sequence[Tensor]) -> Tensor:
        return self.proj(torch.cat(list(history), dim=-1))


class InformationFusion(nn.Module):
    """Information-transfer enhancement over ``units`` (layers or sub-layers).

    After unit i (i >= 2) the next unit reads LN((1 - g) * out_i + g * f(out_1..out_{i-1}))
    (``RetentionGate`` of form ``gate``), f the mean or a learned linear transform of all earlier
    unit outputs (the raw outputs, before gating). Layer-wise fusion uses layers as units (eqs.
    7-9), sub-layer-wise fusion uses sub-layers (eqs. 10-12). ``last_only`` fuses once, after
    the final unit (the last-layer "sub-layer connection" variant, eqs. 13-16).
    """

    def __init__(self, units: int, dim: int, function: str = "mean", last_only: bool = False,
                 gate: GateForm = "elementwise"):
        super().__init__()
        self.units, self.last_only = units, last_only
        points = [units - 1] if last_only else list(range(1, units))  # 0-based fused units
        self.points = points
        self.gates = nn.ModuleList(RetentionGate(dim, gate) for _ in points)
        self.linear = (nn.ModuleList(LinearFusion(i, dim) for i in points)
                       if function == "linear" else None)

    def fuse(self, slot: int, history: Sequence[Tensor]) -> Tensor:
        return mean_fusion(history) if self.linear is None else self.linear[slot](history)

    def forward(self, x: Tensor, units: Sequence[Unit]) -> Tensor:
        history: list[Tensor] = []
        slots = {unit: slot for slot, unit in enumerate(self.points)}
        for i, unit in enumerate(units):
            out = unit(x)
            slot = slots.get(i)
            x = out if slot is None else self.gates[slot](out, self.fuse(slot, history))
            history.append(out)
        return x
