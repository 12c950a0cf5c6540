"""What third-party libraries may print: nothing but errors at the default verbosity (so that a command's
progress, results or one error line are not buried), all of it with `-v`. Most switches are environment
variables, set before the library is imported or Ray is started, so the processes Ray starts inherit them;
a variable the user set already wins.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
import warnings

VERBOSE_ENV = "QRAG_VERBOSE"

# Defaults applied at verbosity 0 (each only when the user has not set the variable).
QUIET_ENV: dict[str, str] = {
    "TRANSFORMERS_VERBOSITY": "error",  # transformers' warnings and advice
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # "Loading weights" bars (transformers routes them through the hub's switch)
    "TQDM_DISABLE": "1",  # any other tqdm bar (sentence-transformers, vLLM's model loader)
    "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_CONFIGURE_LOGGING": "1",
    # an errored ref nobody waited for (a failed shard task's siblings) is reported at garbage collection
    "RAY_IGNORE_UNHANDLED_ERRORS": "1",
    "RAY_DEDUP_LOGS": "1",
}

# Python warnings from libraries we call (not from qrag_ray itself) hidden at verbosity 0.
_QUIET_WARNING_MODULES = (r"(sentence_transformers|transformers|torch|huggingface_hub|vllm|ray|pyarrow|faiss"
                          r"|accelerate)(\..*)?")

_level: int | None = None


def verbosity() -> int:
    """The verbosity set by the CLI (`-v` count), else $QRAG_VERBOSE, else 0."""
    if _level is not None:
        return _level
    try:
        return int(os.environ.get(VERBOSE_ENV, "0") or 0)
    except ValueError:
        return 0


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record comes (a handler that kept the stream it was made
    with would write into a closed one once a test harness or a redirect swapped it). Records still
    propagate: with no root handler (the CLI) nothing prints twice, and log capture still sees them."""

    stream = property(lambda self: sys.stderr, lambda self, value: None)


def set_verbosity(level: int) -> None:
    """Apply `level` to this process and, through the environment, to the processes it starts."""
    global _level
    _level = max(0, int(level))
    os.environ[VERBOSE_ENV] = str(_level)
    own = logging.DEBUG if _level >= 2 else logging.INFO if _level == 1 else logging.WARNING
    for name in ("qrag", "qrag_ray"):
        package_logger = logging.getLogger(name)
        package_logger.setLevel(own)
        if not any(isinstance(h, _StderrHandler) for h in package_logger.handlers):
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            package_logger.addHandler(handler)
    if _level > 0:
        return
    for variable, setting in QUIET_ENV.items():
        os.environ.setdefault(variable, setting)
    for cat in (FutureWarning, DeprecationWarning, UserWarning, RuntimeWarning):
        warnings.filterwarnings("ignore", category=cat, module=_QUIET_WARNING_MODULES)
    # sentence-transformers and torch raise some warnings from frames outside their own modules
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("sentence_transformers", "transformers", "huggingface_hub", "vllm", "httpx", "faiss",
                 "filelock", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if "transformers" in sys.modules:  # it reads its env once at import: set it directly
        from transformers.utils import logging as tlog

        tlog.set_verbosity_error()
        tlog.disable_progress_bar()


def _mute_console(logger: logging.Logger, level: int) -> None:
    """Drop records below `level` (above CRITICAL: all of them) from the logger's console handlers, once."""
    for handler in logger.handlers:
        console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if console and not hasattr(handler, "_qrag_muted"):
            handler.addFilter(lambda record: record.levelno >= level)
            handler._qrag_muted = True  # type: ignore[attr-defined]


def quiet_ray_data() -> None:
    """Mute Ray's and Ray Data's console logging at verbosity 0 (call after `import ray.data`, which
    configures its logger); their log files keep everything. Ray's console handler is held at ERROR by a
    filter, since a later `ray.init()` resets the "ray" logger to INFO."""
    if verbosity() > 0:
        return
    _mute_console(logging.getLogger("ray.data"), logging.CRITICAL + 1)
    _mute_console(logging.getLogger("ray"), logging.ERROR)
    llm = logging.getLogger("ray.llm")
    if not llm.handlers:  # an ERROR handler of ours, so that ray.llm adds no INFO one
        handler = logging.StreamHandler()
        handler.setLevel(logging.ERROR)
        llm.addHandler(handler)
        llm.propagate = False
    # Ray's driver prints the raylet's messages ("N PYTHON worker processes have been started") to stdout
    # whatever `log_to_driver` says, which would corrupt `qrag index --json`: they go to the `qrag_ray.ray`
    # logger at DEBUG instead (a failure they announce still arrives as an exception)
    import ray._private.worker as ray_worker

    original = ray_worker.print_to_stdstream
    if getattr(original, "_qrag_quiet", False):
        return

    def print_to_stdstream(data, *args, **kwargs):
        if verbosity() == 0 and isinstance(data, dict) and data.get("pid") == "raylet":
            for line in data.get("lines") or []:
                logging.getLogger("qrag_ray.ray").debug("raylet: %s", line)
            return None
        return original(data, *args, **kwargs)

    print_to_stdstream._qrag_quiet = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_stdstream


# "[2026-11-25 00:53:13,848 E 5914 5914] core_worker.cc:2465: ..." (glog-style; FATAL lines are kept)
RAY_NATIVE_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWE] \d+ \d+\] \S+:\d+: ")


def is_native_noise(line: str) -> bool:
    """A line Ray's C++ code logged to stderr below FATAL."""
    return bool(RAY_NATIVE_LOG.match(line))


_native_filter: threading.Thread | None = None


def filter_native_stderr() -> bool:
    """At verbosity 0, route file descriptor 2 through a thread that drops the lines Ray's C++ core writes
    there (e.g. an ERROR for every Ray Data actor pool; RAY_BACKEND_LOG_LEVEL would also strip Ray's log
    files). Python's stderr keeps writing to the real one through a duplicate descriptor. Only done when
    sys.stderr is the process's own (not a test's capture), once; returns whether the filter is active."""
    global _native_filter
    if _native_filter is not None:
        return True
    if verbosity() > 0 or sys.stderr is not sys.__stderr__ or sys.stderr is None:
        return False
    try:
        if sys.stderr.fileno() != 2:
            return False
        sys.stderr.flush()
        real = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
    except (OSError, ValueError, AttributeError):
        return False
    encoding = getattr(sys.__stderr__, "encoding", None) or "utf-8"
    sys.stderr = open(real, "w", buffering=1, encoding=encoding,  # noqa: SIM115 - open for the process's life
                      errors="backslashreplace", closefd=False)

    def pump() -> None:
        buf = b""
        with contextlib.suppress(OSError):
            while data := os.read(read_end, 65536):
                *lines, buf = (buf + data).split(b"\n")
                out = [ln for ln in lines if not is_native_noise(ln.decode("utf-8", "replace"))]
                if out:
                    os.write(real, b"\n".join(out) + b"\n")

    _native_filter = threading.Thread(target=pump, name="qrag-stderr-filter", daemon=True)
    _native_filter.start()

    def drain() -> None:
        # registered before Ray is imported, so it runs after Ray's own atexit shutdown: put the real
        # stderr back on fd 2 and let the thread pass on what is still in the pipe
        with contextlib.suppress(OSError):
            os.dup2(real, 2)
            _native_filter.join(timeout=1.0)

    atexit.register(drain)
    return True
