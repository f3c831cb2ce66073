"""xinda (信达): a clear, fast neural machine translation toolkit on PyTorch."""

__version__ = "0.1.0"
__all__ = ["Translator", "__version__"]


def __getattr__(name: str):
    if name == "Translator":  # imported lazily: `import xinda` stays cheap
        from xinda.decode.translator import Translator

        return Translator
    raise AttributeError(name)
