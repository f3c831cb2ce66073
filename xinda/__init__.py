"""xinda (信达): a clear, fast neural machine translation toolkit on PyTorch."""

__version__ = "0.1.0"
