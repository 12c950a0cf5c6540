"""User-facing errors.

Anything a user can cause (bad flags, missing files, corrupt indexes) raises QragError with one clear
line; the CLI prints it to stderr and exits non-zero, the server maps it to a 4xx. Everything else is a
bug and keeps its traceback.
"""


class QragError(Exception):
    """An error caused by input; its message is shown to the user as is."""

    exit_code = 2


class IndexFormatError(QragError):
    """An index directory is missing, incomplete, corrupt or of an unknown format version."""
