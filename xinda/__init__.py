"""xinda (信达): a clear, fast neural machine translation toolkit on PyTorch."""

__version__ = "0.1.0"
from xinda.errors import XindaError  # what every user mistake raises, with a one-line message

__all__ = ["Translator", "XindaError", "__version__"]


def __getattr__(name: str):
    if name == "Translator":  # imported lazily: `import xinda` stays cheap
        from xinda.decode.translator import Translator

        return Translator
    raise AttributeError(name)
