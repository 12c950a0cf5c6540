"""User-facing errors: anything a user can cause (bad flags, missing files, corrupt indexes) raises
QragError with one clear line; the CLI prints it and exits 2, the server maps it to a 4xx. Everything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class QragError(Exception):
    """An error caused by input; its message is shown to the user as is. It is kept apart from `args`,
    to which Ray Data appends its retry advice in a map task: `str()` and pickling (the way back from a
    Ray worker) use the message as it was raised."""

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


def find_user_error(exc: BaseException) -> QragError | None:
    """The QragError behind an exception, looking through Ray's wrappers and cause chains."""
    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        cause = getattr(e, "cause", None)  # RayTaskError.cause
        if isinstance(e, QragError):
            # Ray re-raises a task's QragError as a RayTaskError subclass of it whose str() is the
            # remote traceback; the user gets the original one-line message.
            return cause if isinstance(cause, QragError) else e
        if isinstance(cause, BaseException):
            stack.append(cause)
        stack += [e.__cause__, e.__context__]
    return None
