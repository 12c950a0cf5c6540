"""User-facing errors: anything a user can cause raises QragError with one clear line (the CLI prints it
and exits 2, the server answers 4xx); everything else is a bug and keeps its traceback."""

from __future__ import annotations

from collections.abc import Iterator


class QragError(Exception):
    """An error caused by input, its message shown as raised: kept apart from `args` (to which Ray Data
    appends retry advice in a map task), it is what `str()` and pickling (back from a Ray worker) use."""

    exit_code = 2

    def __init__(self, message: object = "", *args: object):
        super().__init__(message, *args)
        self.message = str(message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (type(self), (self.message,), {k: v for k, v in self.__dict__.items() if k != "message"})


class IndexFormatError(QragError):
    """An index directory is missing, incomplete, corrupt or of an unknown format version."""


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and each exception behind it (a RayTaskError's `cause`, causes, contexts), once each."""
    seen = set()
    stack = [exc]
    while stack:
        error = stack.pop()
        if error is not None and id(error) not in seen:
            seen.add(id(error))
            yield error
            cause = getattr(error, "cause", None)  # RayTaskError.cause
            stack += [cause if isinstance(cause, BaseException) else None, error.__cause__, error.__context__]


def find_user_error(exc: BaseException) -> QragError | None:
    """The QragError behind an exception, looking through Ray's wrappers and cause chains."""
    error = next((e for e in exception_chain(exc) if isinstance(e, QragError)), None)
    # Ray re-raises a task's QragError as a RayTaskError subclass of it whose str() is the remote
    # traceback; the user gets the original one-line message
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, QragError) else error
