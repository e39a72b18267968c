"""The SGLang releases that ship kv canary, and what differs between them.

kv canary ships in every release from 0.5.13 to 0.5.23 with one planner semantics, ring, tag
set, fail bits, log format and error text; what moved is where its modules live and what the
allocators and launcher offer around it (read from each release's wheel):

- 0.5.13 .. 0.5.16: the package is `sglang.jit_kernel.kv_canary`; 0.5.17 on:
  `sglang.kernels.ops.kv_canary`.
- before 0.5.20 an allocator has no `get_all_free_pages()`: its free pages are `free_pages`
  plus the staged `release_pages`.
- before 0.5.21 the launcher has no torch-reference dispatch: off CUDA it still runs the
  Triton and JIT CUDA kernels, so a CPU caller must call the reference (`plan_ref`) itself.
- from 0.5.22 a real-KV source's rows are stepped by `stride(0)` (a per-layer view may be
  passed); before, by its width, and a source must be contiguous.

Importing this module costs only the standard library (the capture hook uses it in servers).
"""

from __future__ import annotations

import re

__all__ = [
    "FIRST_RELEASE",
    "KV_CANARY_PACKAGES",
    "LAST_RELEASE",
    "METADATA_KEY",
    "PLAN_MODULES",
    "has_reference_dispatch",
    "out_of_range_note",
    "parse_release",
]

#: The first and last releases with kv canary that kvcanary was checked against.
FIRST_RELEASE = (0, 5, 13)
LAST_RELEASE = (0, 5, 23)
#: The dump metadata key the capture hook stamps with the server's SGLang version.
METADATA_KEY = "sglang.version"
#: kv canary's package, newest layout first: 0.5.17 on, then 0.5.13 .. 0.5.16.
KV_CANARY_PACKAGES = ("sglang.kernels.ops.kv_canary", "sglang.jit_kernel.kv_canary")
#: The plan launcher's module in each layout.
PLAN_MODULES = tuple(f"{package}.plan.api" for package in KV_CANARY_PACKAGES)

_RELEASE = re.compile(r"\s*v?(\d{1,4})\.(\d{1,4})\.(\d{1,4})(?:[.+\-]?[0-9A-Za-z.+\-]{0,40})?\s*")


def parse_release(text: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version like `0.5.23`, `0.5.23.post1` or `0.5.23+cu128`;
    None when `text` is absent or not a version."""
    if text is None:
        return None
    match = _RELEASE.fullmatch(text)
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def _at_least(text: str | None, release: tuple[int, int, int]) -> bool | None:
    parsed = parse_release(text)
    return None if parsed is None else parsed >= release


def has_reference_dispatch(version: str | None) -> bool | None:
    """Whether the release's launcher runs its torch reference off CUDA by itself (0.5.21 on)."""
    return _at_least(version, (0, 5, 21))


def _name(release: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in release)


def out_of_range_note(version: str | None, what: str) -> str | None:
    """One note when `what` (a dump, a log) says it comes from an SGLang release outside
    0.5.13 .. 0.5.23 (or from a version that cannot be read); None inside the range or when
    no version is recorded (an empty one included)."""
    if version is None or not version.strip():
        return None
    parsed = parse_release(version)
    span = f"{_name(FIRST_RELEASE)} .. {_name(LAST_RELEASE)}"
    shown = version.strip()[:40].encode("ascii", "replace").decode("ascii")
    if parsed is None:
        return (
            f"{what} records SGLang version {shown!r}, which is not a release number; "
            f"read as a release of {span} would be"
        )
    if parsed < FIRST_RELEASE:
        return (
            f"{what} comes from SGLang {_name(parsed)}, older than {_name(FIRST_RELEASE)}, the "
            f"first release with kv canary; read as {span} would be, where the format allows"
        )
    if parsed > LAST_RELEASE:
        return (
            f"{what} comes from SGLang {_name(parsed)}, newer than {_name(LAST_RELEASE)}, the "
            f"last release kvcanary was checked against; read as {_name(LAST_RELEASE)}'s, "
            "where the format allows"
        )
    return None
