"""SGLang's real kv-canary plan modules, from the release wheel, without the rest of SGLang.

`kvcanary check --kernel sglang` imports SGLang the normal way, which pulls in the whole server.
For the integration test, `extract_kv_canary(wheel, root)` unpacks only the modules the plan
launcher needs (and the wheel's package metadata, so the version is found as usual) into a
temporary tree, with our own stub `__init__.py` for the package levels whose real ones import
the server, and a stub `sglang.kernels.jit.utils` (the JIT CUDA toolchain: the CUDA path only).
Nothing is copied into this repository; the wheel is fetched by `.ci/run` into a cache
(`pip download sglang==0.5.23 --no-deps`), found through `wheel_path()`.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

__all__ = [
    "MISSING_WHEEL",
    "RELEASES",
    "WHEEL_ENV",
    "WHEEL_VERSION",
    "extract_canary_runner",
    "extract_kv_canary",
    "extract_release",
    "missing_wheel",
    "unpack",
    "wheel_path",
]

WHEEL_VERSION = "0.5.23"
#: Points at the wheel file (or a folder holding it) when it is not in the cache.
WHEEL_ENV = "KVCANARY_SGLANG_WHEEL"
_CANARY = "sglang/kernels/ops/kv_canary/"
#: The modules `plan.api` imports, taken from the wheel as they are.
MODULES = tuple(
    _CANARY + name
    for name in (
        "_dispatch.py",
        "consts.py",
        "plan_ref.py",
        "verify.py",
        "write.py",
        "plan/__init__.py",
        "plan/api.py",
        "plan/entries_kernel.py",
        "plan/offsets_kernel.py",
        "plan/utils.py",
    )
)
#: Our `sglang.kernels.jit.utils`: the three names `verify`, `write` and `entries_kernel` import.
_JIT_STUB = '''"""Stub of the JIT CUDA toolchain: off CUDA nothing calls it."""


def cache_once(fn):
    """Like the real decorator, for import; the stubbed loaders below are never cached."""
    return fn


def load_jit(*args, **kwargs):
    """The CUDA path needs the real toolchain."""
    raise RuntimeError("stub: the JIT CUDA toolchain is not part of this test tree")


def make_cpp_args(*args):
    """The CUDA path needs the real toolchain."""
    raise RuntimeError("stub: the JIT CUDA toolchain is not part of this test tree")
'''

#: Package levels whose real `__init__` imports the server (or a kernel registry): ours are
#: empty, except `sglang.kernels.jit.utils`.
STUBS = {
    "sglang/__init__.py": '"""Stub: the real package imports the whole server."""\n',
    "sglang/kernels/__init__.py": '"""Stub: the real one imports the kernel registry."""\n',
    "sglang/kernels/ops/__init__.py": '"""Stub: the real one imports every op group."""\n',
    _CANARY + "__init__.py": '"""Stub: the real one registers the launchers."""\n',
    "sglang/kernels/jit/__init__.py": '"""Stub: JIT kernels are for CUDA only."""\n',
    "sglang/kernels/jit/utils/__init__.py": _JIT_STUB,
}


def _cache_dir() -> Path:
    base = os.environ.get("KVCANARY_CACHE") or Path.home() / ".cache" / "kvcanary"
    return Path(base) / "wheels"


#: Earlier releases with kv canary the release tests run against: every one (each fetched
#: like the 0.5.23 wheel, `pip download sglang==V --no-deps`; a test is skipped without its
#: wheel).
RELEASES = (
    *("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17"),
    *("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22"),
)


def wheel_path(version: str = WHEEL_VERSION) -> Path | None:
    """The cached SGLang wheel of `version` (default 0.5.23): `$KVCANARY_SGLANG_WHEEL` (a file,
    used for 0.5.23 only, or a folder), else the cache `.ci/run` downloads into; None when
    neither has it."""
    pattern = f"sglang-{version}-*.whl"
    given = os.environ.get(WHEEL_ENV)
    places = [Path(given)] if given else []
    places.append(_cache_dir())
    for place in places:
        if place.is_file():
            if version != WHEEL_VERSION and not place.name.startswith(f"sglang-{version}-"):
                continue
            return place
        if place.is_dir():
            found = sorted(place.glob(pattern))
            if found:
                return found[0]
    return None


#: Why a test that needs the wheel is skipped without it (and how to get it).
MISSING_WHEEL = (
    f"the SGLang {WHEEL_VERSION} wheel is not cached: .ci/run fetches it with `pip download "
    f"sglang=={WHEEL_VERSION} --no-deps -d $KVCANARY_CACHE/wheels` (default "
    f"~/.cache/kvcanary/wheels), or set {WHEEL_ENV}"
)


def missing_wheel(version: str) -> str:
    """Why a test that needs the `version` wheel is skipped without it."""
    return (
        f"the SGLang {version} wheel is not cached: `pip download sglang=={version} --no-deps "
        f"-d $KVCANARY_CACHE/wheels` (default ~/.cache/kvcanary/wheels)"
    )


#: 0.5.13 .. 0.5.16's layout: kv canary under `jit_kernel`, whose `utils` module is the JIT
#: toolchain (stubbed as for 0.5.23).
_OLD_CANARY = "sglang/jit_kernel/kv_canary/"
_OLD_STUBS = {
    "sglang/__init__.py": STUBS["sglang/__init__.py"],
    "sglang/jit_kernel/__init__.py": '"""Stub: JIT kernels are for CUDA only."""\n',
    "sglang/jit_kernel/utils.py": _JIT_STUB,
    _OLD_CANARY + "__init__.py": '"""Stub: the real one registers the launchers."""\n',
}


def extract_release(wheel: Path, root: Path, version: str) -> Path:
    """`extract_kv_canary` for any release with kv canary: the plan launcher's modules in the
    release's own layout (`kernels/ops` from 0.5.17, `jit_kernel` before; `_dispatch.py` only
    where the release has it), the stubs that layout needs, and the package metadata."""
    with zipfile.ZipFile(wheel) as archive:
        members, stubs = _launcher_members(set(archive.namelist()))
    return unpack(wheel, root, (*members, f"sglang-{version}.dist-info/METADATA"), stubs)


def _launcher_members(names: set[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The plan launcher's modules among a wheel's `names`, in its layout, and the stubs
    that layout needs."""
    new_layout = any(name.startswith(_CANARY) for name in names)
    prefix, stubs = (_CANARY, STUBS) if new_layout else (_OLD_CANARY, _OLD_STUBS)
    members = tuple(
        prefix + module.removeprefix(_CANARY)
        for module in MODULES
        if prefix + module.removeprefix(_CANARY) in names
    )
    return members, stubs


def launcher_modules(wheel: Path) -> dict[str, bytes]:
    """The plan launcher's modules a release wheel ships (those `extract_release` unpacks),
    by name."""
    with zipfile.ZipFile(wheel) as archive:
        members, _ = _launcher_members(set(archive.namelist()))
        return {member: archive.read(member) for member in members}


def extract_kv_canary(wheel: Path, root: Path) -> Path:
    """Unpack the plan launcher's modules and the metadata into `root` (the sys.path entry)."""
    info = f"sglang-{WHEEL_VERSION}.dist-info/METADATA"
    return unpack(wheel, root, (*MODULES, info), STUBS)


def unpack(wheel: Path, root: Path, members: tuple[str, ...], stubs: dict[str, str]) -> Path:
    """The wheel's `members` as they are, and our `stubs` (path -> text), under `root`."""
    with zipfile.ZipFile(wheel) as archive:
        for member in members:
            target = root / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(member))
    for member, text in stubs.items():
        target = root / member
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


#: The canary runner's modules the capture hook meets in a server: `kernel_launcher` (which
#: binds the launcher from the `plan` package) and `violation_reporter`, with what they import.
RUNNER_MODULES = tuple(
    "sglang/srt/" + name
    for name in (
        "environ.py",
        "kv_canary/buffer_group.py",
        "kv_canary/config.py",
        "kv_canary/endpoint.py",
        "kv_canary/expected_inputs.py",
        "kv_canary/plan_input.py",
        "kv_canary/state.py",
        "kv_canary/runner/__init__.py",
        "kv_canary/runner/kernel_launcher.py",
        "kv_canary/runner/violation_reporter.py",
    )
)
_EMPTY = '"""Stub: the real package level imports the server."""\n'
#: `runtime_context` imports the server's settings machinery; the canary config only calls
#: `get_observability` in `CanaryConfig.from_env`, which tests do not use.
_RUNTIME_STUB = '''"""Stub of SGLang's runtime context: tests build CanaryConfig themselves."""


def get_observability():
    """The server's settings are not part of this test tree."""
    raise RuntimeError("stub: no server runtime context in this test tree")
'''
RUNNER_STUBS = {
    **STUBS,
    "sglang/srt/__init__.py": _EMPTY,
    "sglang/srt/kv_canary/__init__.py": _EMPTY,
    "sglang/srt/runtime_context.py": _RUNTIME_STUB,
}


def extract_canary_runner(wheel: Path, root: Path) -> Path:
    """The plan launcher's modules and the canary runner's (`extract_kv_canary`'s, plus
    `RUNNER_MODULES`) under `root`."""
    info = f"sglang-{WHEEL_VERSION}.dist-info/METADATA"
    return unpack(wheel, root, (*MODULES, *RUNNER_MODULES, info), RUNNER_STUBS)
