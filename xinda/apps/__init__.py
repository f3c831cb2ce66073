"""Generation tasks beyond translation, trained as sequence-to-sequence models on real data:
couplets (``couplet``: first line -> second line) and quatrains (``poetry``: form + keywords ->
poem). Each module writes its corpus from ``../shared/data`` in the layout ``xinda prepare``
reads and holds the task's rules as pure functions on strings; the metrics are in
``xinda.evaluate.generation``. ``python -m xinda.apps TASK SHARED OUT_DIR`` writes a corpus.
"""
