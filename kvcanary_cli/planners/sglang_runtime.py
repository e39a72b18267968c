"""Where the installed SGLang is loaded: its plan launcher, checked against kvcanary's model.

SGLang is imported the normal way (`sglang.kernels.ops.kv_canary.plan.api`, or 0.5.13 ..
0.5.16's `sglang.jit_kernel.kv_canary.plan.api`, which import the `sglang` package and with it
the server), and only when an SGLang planner first needs it:
never when kvcanary itself is imported, so `kvcanary --help` stays light. Before the import,
triton's environment is prepared as for kvcanary's own kernels (`triton_runtime`), since
SGLang's plan module imports triton.

The launcher must take the keyword arguments kvcanary's dump format is named after
(`dump.schema.LAUNCHER_ARGUMENTS`); anything else, or an SGLang without the launcher, is a
`PlannerUnavailableError` naming the version found (one line, exit 2). The versions whose
plan step kvcanary's planners were checked against are `VERIFIED_VERSIONS`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kvcanary_cli.dump.releases import KV_CANARY_PACKAGES, has_reference_dispatch
from kvcanary_cli.dump.schema import LAUNCHER_ARGUMENTS, LAUNCHER_FUNCTION
from kvcanary_cli.errors import PlannerUnavailableError

__all__ = [
    "REFERENCE_FUNCTION",
    "VERIFIED_VERSIONS",
    "VERIFY_ENTRY_FIELDS",
    "VERIFY_PLAN_FIELDS",
    "WRITE_PLAN_FIELDS",
    "SGLangLauncher",
    "installed_version",
    "load_launcher",
    "load_reference_launcher",
    "require_torch",
    "signature_problems",
]

#: SGLang releases whose kv-canary plan step kvcanary's planners were verified against, by
#: running SGLang's own code on every synthetic scenario (`kvcanary selftest --sglang`).
#: Each post release too (0.5.13.post1, 0.5.15.post1): servers run them like any other.
VERIFIED_VERSIONS: tuple[str, ...] = (
    *("0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17"),
    *("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"),
)
#: The same releases in words, for error lines: every release from the first to the last.
VERIFIED_RANGE = f"{VERIFIED_VERSIONS[0]} to {VERIFIED_VERSIONS[-1]}"

#: SGLang's torch reference of the launcher (what the launcher runs off CUDA from 0.5.21).
REFERENCE_FUNCTION = "launch_canary_plan_kernels_torch_reference"
#: The module of the launcher that dispatches to the reference off CUDA (0.5.21 on).
_DISPATCH_NAME = "use_torch_reference"

#: Fields of SGLang's `VerifyPlan` and `WritePlan` that kvcanary reads back (§1.3): the
#: per-entry ones first. `Plan.upstream_tensors` names its fields the same way.
VERIFY_ENTRY_FIELDS = (
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
)
VERIFY_PLAN_FIELDS = (*VERIFY_ENTRY_FIELDS, "verify_num_valid", "enable")
WRITE_PLAN_FIELDS = ("write_offsets", "write_seed_slot_indices", "write_num_valid_reqs")

#: How to add torch, which kvcanary installs only as an extra (`pyproject.toml`).
TORCH_INSTALL = "pip install 'kvcanary[torch]'"

_ALTERNATIVES = {
    "--kernel sglang": "--kernel vectorized or triton models SGLang {v} without it",
    "--backend sglang": "--backend vectorized or triton models SGLang {v} without it",
}


def _hint(option: str) -> str:
    """What to do instead, for the option that asked for SGLang."""
    default = "without --sglang, selftest checks kvcanary's model of SGLang {v} alone"
    return _ALTERNATIVES.get(option, default).format(v=VERIFIED_RANGE)


@dataclass(frozen=True, kw_only=True)
class SGLangLauncher:
    """The installed SGLang's plan launcher and its output types, ready to call."""

    #: `launch_canary_plan_kernels` (or its torch reference), keyword arguments only.
    launch: Callable[..., None]
    #: SGLang's `VerifyPlan` and `WritePlan` (dataclasses with an `allocate` classmethod).
    verify_plan: Any
    write_plan: Any
    #: the installed distribution's version (None: importable without package metadata).
    version: str | None
    #: `module:function` that `launch` is.
    where: str
    #: kv canary's package in this release (`sglang.kernels.ops.kv_canary`, or 0.5.13 ..
    #: 0.5.16's `sglang.jit_kernel.kv_canary`).
    package: str = KV_CANARY_PACKAGES[0]
    #: True when `launch` is the reference called directly because this release's launcher
    #: would run the device kernels off CUDA (before 0.5.21).
    direct_reference: bool = False


def installed_version() -> str | None:
    """The installed SGLang's version, without importing it.

    "unknown" when `sglang` is importable but has no package metadata (a source checkout on
    `PYTHONPATH`); None when it is not installed.
    """
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        found = importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        found = False
    return "unknown" if found else None


def require_torch(option: str) -> ModuleType:
    """torch, which SGLang's planners run on; `PlannerUnavailableError` (one line naming the
    extra, exit 2) where it is not installed: kvcanary's own planners never need it."""
    try:
        import torch
    except ImportError as exc:
        raise PlannerUnavailableError(
            f"SGLang's planners run on torch, which cannot be imported here ({exc})",
            option=option,
            hint=f"{TORCH_INSTALL}; {_hint(option)}",
        ) from None
    return torch


def _named(version: str | None) -> str:
    return f"SGLang {version}" if version and version != "unknown" else "SGLang (version unknown)"


def _import(module: str, *, option: str, version: str | None) -> Any:
    """Import one of SGLang's modules; any failure becomes one `PlannerUnavailableError` line."""
    import kvcanary_cli.planners.triton_runtime as triton_runtime

    triton_runtime.prepare_environment()
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if version is None and (missing == "sglang" or module.startswith(missing + ".")):
            raise PlannerUnavailableError(
                "SGLang is not installed here (cannot import sglang)",
                option=option,
                hint=f"pip install the SGLang your server runs; {_hint(option)}",
            ) from None
        if module == missing or module.startswith(missing + "."):
            raise PlannerUnavailableError(
                f"{_named(version)} has no {module} (kvcanary models SGLang {VERIFIED_RANGE})",
                option=option,
                hint=_hint(option),
            ) from None
        raise _import_failed(module, exc, option=option, version=version) from None
    except Exception as exc:  # importing the server can fail in any way
        raise _import_failed(module, exc, option=option, version=version) from None


def _import_failed(
    module: str, exc: BaseException, *, option: str, version: str | None
) -> PlannerUnavailableError:
    text = " ".join(str(exc).split()) or "no message"
    return PlannerUnavailableError(
        f"importing {module} from {_named(version)} failed: {type(exc).__name__}: {text}",
        option=option,
        hint=_hint(option),
    )


def signature_problems(function: Callable[..., Any]) -> list[str]:
    """How `function`'s signature departs from the launcher's keyword arguments (none: fits)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError) as exc:
        return [f"no readable signature ({exc})"]
    by_keyword = {
        name
        for name, p in parameters.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }
    open_keywords = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    problems = []
    missing = [n for n in LAUNCHER_ARGUMENTS if n not in by_keyword and not open_keywords]
    if missing:
        problems.append(f"no keyword argument {', '.join(missing)}")
    required = [
        name
        for name, p in parameters.items()
        if name not in LAUNCHER_ARGUMENTS
        and p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        problems.append(f"requires {', '.join(required)}, which kvcanary does not know")
    return problems


def _output_type(
    module: Any, name: str, fields: tuple[str, ...], *, version: str | None, option: str
) -> Any:
    cls = getattr(module, name, None)
    have = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    lacking = [f for f in fields if f not in have]
    if cls is None or lacking or not callable(getattr(cls, "allocate", None)):
        what = "is missing" if cls is None else f"lacks {', '.join(lacking) or 'allocate()'}"
        raise PlannerUnavailableError(
            f"{_named(version)}: {module.__name__}.{name} {what}, unlike the SGLang "
            f"{VERIFIED_RANGE} kvcanary models",
            option=option,
            hint=_hint(option),
        )
    return cls


def _package(option: str, version: str | None) -> str:
    """kv canary's package in the installed SGLang: the first layout whose plan launcher
    module exists (`find_spec` imports only the parents, as importing it would)."""
    import kvcanary_cli.planners.triton_runtime as triton_runtime

    triton_runtime.prepare_environment()
    for package in KV_CANARY_PACKAGES:
        try:
            if importlib.util.find_spec(f"{package}.plan.api") is not None:
                return package
        except ModuleNotFoundError:
            continue
        except Exception as exc:  # importing the parents imports the server
            raise _import_failed(package, exc, option=option, version=version) from None
    return KV_CANARY_PACKAGES[0]  # the import below then says what is missing


def _load(
    function_name: str, option: str, *, reference: bool, cuda: bool = False
) -> SGLangLauncher:
    version = installed_version()
    package = _package(option, version) if version is not None else KV_CANARY_PACKAGES[0]
    launcher_module = f"{package}.plan.api"
    module = _import(launcher_module, option=option, version=version)
    direct = False
    if not reference and not cuda:
        # before 0.5.21 the launcher runs the Triton and JIT CUDA kernels on any device: its
        # module lacks the dispatch, and its version (when known) is below 0.5.21
        direct = not hasattr(module, _DISPATCH_NAME) and has_reference_dispatch(version) is not True
    module_name, name = launcher_module, function_name
    if reference or direct:
        module_name, name = f"{package}.plan_ref", REFERENCE_FUNCTION
        module = _import(module_name, option=option, version=version)
    function = getattr(module, name, None)
    where = f"{module_name}:{name}"
    if not callable(function):
        raise PlannerUnavailableError(
            f"{_named(version)} has no {where}", option=option, hint=_hint(option)
        )
    problems = signature_problems(function)
    if problems:
        raise PlannerUnavailableError(
            f"{_named(version)}'s {name} does not match the signature kvcanary models "
            f"(SGLang {VERIFIED_RANGE}): {'; '.join(problems)}",
            option=option,
            hint=_hint(option),
        )
    verify = _import(f"{package}.verify", option=option, version=version)
    write = _import(f"{package}.write", option=option, version=version)
    return SGLangLauncher(
        launch=function,
        verify_plan=_output_type(
            verify, "VerifyPlan", VERIFY_PLAN_FIELDS, version=version, option=option
        ),
        write_plan=_output_type(
            write, "WritePlan", WRITE_PLAN_FIELDS, version=version, option=option
        ),
        version=version,
        where=where,
        package=package,
        direct_reference=direct,
    )


def load_launcher(*, option: str = "--kernel sglang", device: str = "cpu") -> SGLangLauncher:
    """SGLang's `launch_canary_plan_kernels`: its kernels on CUDA, its torch reference elsewhere.

    Off CUDA (`device`), a release whose launcher would still run the device kernels (before
    0.5.21: no torch-reference dispatch) gives its reference (`plan_ref`) instead, called
    directly (`direct_reference`), as SGLang 0.5.21 on does by itself. Raises
    `PlannerUnavailableError` (naming `option`) when SGLang cannot be imported, lacks the
    launcher, or the launcher's signature is not the one kvcanary models.
    """
    return _load(LAUNCHER_FUNCTION, option, reference=False, cuda=device == "cuda")


def load_reference_launcher(*, option: str = "--kernel sglang") -> SGLangLauncher:
    """SGLang's torch reference of the launcher (`plan_ref`), on any device; for benchmarks.

    Same arguments and checks as `load_launcher`.
    """
    return _load(REFERENCE_FUNCTION, option, reference=True)
