"""int8 inference on CPU: every ``nn.Linear`` of a model copy replaced by a dynamic-int8 one.

Weights are quantised once, symmetrically per output row (scale_r = max|W_r| / 127); the
activations are quantised per call from their own range (PyTorch's dynamic quantisation; the
mapping r = S(q - Z) is Jacob et al. 2018, eq. 1, whose activation ranges are fixed in training
instead), the product accumulates in int32 and is rescaled to float32. PyTorch's fbgemm kernels
(x86 AVX2 / AVX-512 VNNI) do the matmul. Embeddings, attention and layer norms stay float32.

``scale="batch"`` quantises a call's activations by the range of all its rows, so a sentence's
output can change with the sentences batched beside it (24 of 100 Multi30k outputs did);
``"row"`` divides each row by its own max |x| first (and multiplies the product back), so no
row is quantised by another's range (per-row scales, as CTranslate2's; here each row's range
maps onto fbgemm's 7-bit asymmetric grid, a step twice as coarse as a symmetric int8 one). The
element-wise work costs about 1.15x the decoding time. Float rounding that depends on the
padding of a batch can still move a row's value across a rounding step: scores then differ in
the second or third decimal and, rarely, a choice changes (``docs/benchmarks.md``).
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn

from xinda.errors import XindaError

INT8_MAX = 127
SCALES = ("batch", "row")  # what quantises the activations: the call's range, or each row's


class Int8Linear(nn.Module):
    """y = dequant(quant(x) @ quant(W)^T) + b, with W quantised per output row and x by the
    range of the call (``scale="batch"``) or of each row (``"row"``, see the module's doc)."""

    def __init__(self, linear: nn.Linear, scale: str = "batch"):
        super().__init__()
        if scale not in SCALES:
            raise XindaError(f"int8 activation scale {scale!r}: use one of {', '.join(SCALES)}")
        weight = linear.weight.detach().float()
        row_scale = (weight.abs().amax(dim=1) / INT8_MAX).clamp(min=1e-8).double()
        zero = torch.zeros(weight.size(0), dtype=torch.long)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.per_row = scale == "row"
        with warnings.catch_warnings():  # the quantized-tensor constructors warn on 2.x
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, row_scale, zero, 0, torch.qint8)
            # per row the bias is added after the rows' scales are multiplied back
            self._packed = torch.ops.quantized.linear_prepack(
                qweight, None if self.per_row else bias)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._row_bias = bias if self.per_row else None
        # rows holding +1 and -1: with each row scaled into [-1, 1], every call's range
        self._ends = torch.zeros(1 + (self.in_features == 1), self.in_features)
        self._ends[0, 0], self._ends[-1, -1] = 1.0, -1.0
        self._float: tuple[Tensor, Tensor | None] | None = None

    @property
    def weight(self) -> Tensor:
        """The dequantised weight, for code that uses it outside ``forward`` (RNN scores)."""
        return self._dequantised()[0]

    @property
    def bias(self) -> Tensor | None:
        return self._dequantised()[1]

    def _dequantised(self) -> tuple[Tensor, Tensor | None]:
        if self._float is None:
            qweight, bias = torch.ops.quantized.linear_unpack(self._packed)
            self._float = (qweight.dequantize(), self._row_bias if self.per_row else bias)
        return self._float

    def forward(self, x: Tensor) -> Tensor:
        # reduce_range: 7-bit activations, so the int16 pair sums of VNNI cannot overflow
        if not self.per_row:
            return torch.ops.quantized.linear_dynamic(x.float(), self._packed, True)
        rows = x.reshape(-1, self.in_features).float()
        peak = rows.abs().amax(1, keepdim=True).clamp_(1e-30)  # (15x vector_norm's speed)
        scaled = rows.new_empty(len(rows) + len(self._ends), self.in_features)
        torch.div(rows, peak, out=scaled[:len(rows)])  # W (x / m) m = W x
        scaled[len(rows):] = self._ends
        y = torch.ops.quantized.linear_dynamic(scaled, self._packed, True)[:len(rows)]
        y = y * peak if self._row_bias is None else torch.addcmul(self._row_bias, y, peak)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        per = ", per-row activation scales" if self.per_row else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8{per}"


def int8_supported() -> bool:
    """Whether this PyTorch build has a CPU int8 engine (fbgemm on x86, qnnpack on Arm)."""
    return any(e in torch.backends.quantized.supported_engines for e in ("fbgemm", "x86",
                                                                         "qnnpack"))


def quantize_int8(model: nn.Module, scale: str = "batch") -> nn.Module:
    """A copy of ``model`` for CPU inference with every ``nn.Linear`` in int8 (tied weights
    are copied: the embedding stays float32, the output layer gets its own int8 copy);
    ``scale``: the activations' (``SCALES``, see the module's doc)."""
    if not int8_supported():
        raise XindaError("decode.precision int8: this PyTorch build has no CPU int8 engine")
    quantized = copy.deepcopy(model).cpu().float().eval()  # (a bf16 model's norms too)
    quantized.requires_grad_(False)  # (an inference copy: the per-row path writes out=)
    for parent in list(quantized.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear(child, scale))
    return quantized
