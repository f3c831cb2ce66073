"""Trained models in other runtimes' formats: ``xinda export ctranslate2`` (``ctranslate2``
checks and writes, ``ct2_spec`` maps the weights; only the command line imports this package)."""
