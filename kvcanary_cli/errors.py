"""Error types: every user mistake becomes one `KvcanaryError` line and exit code 2.

Each error names the tensor (or key, or option) at fault and, where there is one, the fix,
so that `str(err)` is the whole message the CLI prints.
"""

from __future__ import annotations

__all__ = [
    "CorruptDumpError",
    "DumpError",
    "KvcanaryError",
    "MetadataError",
    "MissingTensorError",
    "PlanTooLargeError",
    "PlannerUnavailableError",
    "TensorDtypeError",
    "TensorShapeError",
    "UpstreamPlanError",
    "UsageError",
]


class KvcanaryError(Exception):
    """A problem the user can fix: bad input, bad options, a missing backend."""

    def __init__(self, message: str, *, tensor: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.tensor = tensor
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.tensor}: {self.message}" if self.tensor else self.message
        return f"{text} ({self.hint})" if self.hint else text


class UsageError(KvcanaryError):
    """Options that contradict each other or the dump (e.g. `--group swa` without a LUT)."""


class DumpError(KvcanaryError):
    """The dump file cannot be used as a kvcanary dump."""


class CorruptDumpError(DumpError):
    """The file is not a readable safetensors file (truncated, hostile header, bad offsets)."""


class MissingTensorError(DumpError):
    """A tensor the format requires is absent."""


class TensorDtypeError(DumpError):
    """A tensor has a dtype the format does not accept (float, bool, ...)."""


class TensorShapeError(DumpError):
    """A tensor has the wrong rank or a length that disagrees with the batch size."""


class MetadataError(DumpError):
    """A scalar in `__metadata__` (or given twice) is not a usable integer."""


class PlannerUnavailableError(KvcanaryError):
    """A planner backend was asked for but cannot run here (e.g. triton not installed)."""


class PlanTooLargeError(KvcanaryError):
    """The lengths ask for more verify entries than kvcanary will materialize in memory."""


class UpstreamPlanError(Exception):
    """Raised by the strict reference planner exactly where SGLang's torch reference raises.

    Not a `KvcanaryError`: the dump is readable, and the message is upstream's, verbatim,
    so it reads like the failure the user saw in their server log.
    """

    def __init__(self, message: str, *, exception_type: str = "ValueError"):
        super().__init__(message)
        self.message = message
        self.exception_type = exception_type

    def __str__(self) -> str:
        return f"{self.exception_type}: {self.message}"
