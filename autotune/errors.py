"""How a measurement fails: every failure of a candidate is recorded with its error as
"kind: message", never the tuner's end (DESIGN.md, "Errors"). Kinds:
  build_error    the schedule or the compiler raised, or the build process died
  build_timeout  the build took longer than the builder's timeout_s
  run_error      loading or calling the library raised (a Python-level error)
  runtime_crash  the kernel killed its process (segfault, abort); the worker restarts
  run_timeout    the kernel ran longer than the runner's timeout_s; the worker restarts
  wrong_result   outputs differ from the task's reference_outputs

Shared by the builder and the runner; needs nothing but the standard library.
"""

from __future__ import annotations

BUILD_ERROR = "build_error"
BUILD_TIMEOUT = "build_timeout"
RUN_ERROR = "run_error"
RUNTIME_CRASH = "runtime_crash"
RUN_TIMEOUT = "run_timeout"
WRONG_RESULT = "wrong_result"
ERROR_KINDS = (BUILD_ERROR, BUILD_TIMEOUT, RUN_ERROR, RUNTIME_CRASH, RUN_TIMEOUT,
               WRONG_RESULT)

MAX_MESSAGE = 500


def format_error(kind: str, message: object) -> str:
    """"kind: message" on one line: records are JSON Lines and TVM errors span screens."""
    return f"{kind}: {' '.join(str(message).split())[:MAX_MESSAGE]}"


def error_kind(error: str | None) -> str | None:
    """The kind of a "kind: message" error text, None for no error."""
    return error.split(":", 1)[0] if error else None
