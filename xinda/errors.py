"""The one user-facing error type, below every other module so that all of them can raise it."""


class XindaError(Exception):
    """A user-facing error: printed as one line by the CLI, exit code 1."""
