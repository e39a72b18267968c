"""vLLM's real KV-cache manager on a CPU: the v1 `KVCacheManager` (block pool, free queue,
per-group managers, coordinator) of a vLLM release wheel or source tree, without the engine.

vLLM pins a CUDA torch and its package `__init__`s import the engine, so nothing of vLLM is
installed or imported the normal way. `load_vllm` puts a finder in front of the tree: a
module loads from its file as usual, but a package's `__init__` does not run (two do:
`vllm.v1.engine`, and `vllm.utils`, small from 0.12.0 on, before that the hash and helper module);
the package is hollow, and answers a name its real `__init__` would re-export by reading that
`__init__`'s import lines and importing the module they name, on first use. Four vllm modules
that pull in the model, compilation and distributed machinery are replaced whole by stand-ins
of ours (before 0.12.0 `vllm.config` defines what 0.12.0 moved into one of them itself, and answers
those names from the stand-in), and third-party packages the tree touches only at import are
stand-ins when they are not installed (a stand-in class satisfies pydantic: the config
dataclasses have fields typed with them).

The tree is untrusted input: whatever fails while importing it is one VllmUnavailableError
naming the module, exit 2. One vLLM per process (the modules are process-wide); the
stand-ins for missing third-party packages leave `sys.modules` once vLLM is imported.
Nothing here is vLLM's code.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcanary_cli.errors import TORCH_HINT, EngineUnavailableError
from kvcanary_cli.soak.wheel import WheelRefusedError, download_hint, not_there, unpack_wheel

__all__ = [
    "OLDEST",
    "RELEASES",
    "SUPPORTED",
    "VllmModules",
    "VllmUnavailableError",
    "find_vllm_tree",
    "load_vllm",
]

#: The releases the stand-ins, the driver and the capture are written for, oldest first; the
#: newest is the one a download hint names. Where they differ (0.34.0's prefix-cache map holds
#: block ids; 0.30.0 - 0.32.0's `vllm.distributed` re-exports its modules whole; before 0.26.0
#: the prefix lookup returns two values, not three; before 0.24.0 no frees are deferred;
#: before 0.23.0 the manager takes no scheduler block size; before 0.17.0 a request wants an
#: end-of-sequence token; before 0.12.0 `vllm.config` defines `VllmConfig` itself and the
#: hash functions are in `vllm.utils`; before 0.11.0 the prefix-cache map is a plain dict and
#: an attention spec says whether it is MLA's; before 0.10.2 a block hash is a named pair, and a
#: request takes multi-modal lists before its parameters; 0.10.0's request takes no block
#: hasher: its manager hashes) the code reads what the loaded tree has, never its version.
RELEASES = (
    "0.10.0",
    "0.10.1.1",
    "0.10.2",
    "0.11.0",
    "0.12.0",
    "0.13.0",
    "0.14.0",
    "0.14.1",
    "0.15.0",
    "0.15.1",
    "0.16.0",
    "0.17.0",
    "0.17.1",
    "0.18.0",
    "0.18.1",
    "0.19.0",
    "0.19.1",
    "0.20.0",
    "0.20.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)
OLDEST, SUPPORTED = RELEASES[0], RELEASES[-1]
#: Python packages the manager's modules import for real (the `vllm-cpu` extra).
EXTRA = "kvcanary[vllm-cpu]"
#: Package `__init__`s that run as they are (their names are used whole; small, but before
#: 0.12.0 `vllm.utils`, which is the whole helper module, the hash functions among them).
_RUN_INITS = frozenset({"vllm.utils", "vllm.v1.engine"})
#: Third-party packages only touched at import: a stand-in where not installed (0.10.0 - 0.11.0's
#: `vllm.utils` imports setproctitle and yaml, for process titles and config files).
_IMPORT_ONLY = (
    "PIL",
    "pybase64",
    "aiohttp",
    "requests",
    "cpuinfo",
    "uvloop",
    "cloudpickle",
    "huggingface_hub",
    "transformers",
    "safetensors",
    "prometheus_client",
    "scipy",
    "setproctitle",
    "yaml",
)
#: What the manager really runs on (a clear error names the extra when one is missing).
_REQUIRED = (
    "torch",
    "numpy",
    "msgspec",
    "pydantic",
    "psutil",
    "zmq",
    "regex",
    "packaging",
    "urllib3",
    "cbor2",
    "cachetools",
    "xxhash",
    "blake3",
)


class VllmUnavailableError(EngineUnavailableError):
    """The vLLM asked for cannot run here; one line, exit 2."""


@dataclass(frozen=True)
class VllmTree:
    """A vLLM found on disk: `root` holds the `vllm/` package."""

    root: Path
    version: str
    label: str


def _cache_dir() -> Path:
    base = os.environ.get("KVCANARY_CACHE") or Path.home() / ".cache" / "kvcanary"
    return Path(base) / "vllm-trees"


def _wanted(name: str) -> bool:
    """The wheel members loaded: vllm's Python modules (no native extensions, no kernels'
    data) and the dist-info's METADATA (its folder names the version)."""
    folder, _, base = name.rpartition("/")
    if name.startswith("vllm/"):
        return base.endswith(".py")
    return base == "METADATA" and folder.startswith("vllm-") and folder.endswith(".dist-info")


def _version_of(package: Path) -> str:
    for info in sorted(package.parent.glob("vllm-*.dist-info")):
        return info.name.removeprefix("vllm-").removesuffix(".dist-info")
    return "unknown"


_MANAGER = "v1/core/kv_cache_manager.py"


def _checked(root: Path, label: str) -> VllmTree:
    package = root / "vllm"
    if not (package / _MANAGER).is_file():
        raise VllmUnavailableError(
            f"not a vLLM tree with the v1 KV-cache manager (no vllm/{_MANAGER})", source=label
        )
    return VllmTree(root=root, version=_version_of(package), label=label)


def find_vllm_tree(source: str | Path) -> VllmTree:
    """The vLLM to run: a release wheel, a source checkout, the folder holding `vllm/`, or
    the `vllm/` folder itself."""
    path = Path(source).expanduser()
    label = str(source)
    if path.is_file() and path.suffix == ".whl":
        try:
            root = unpack_wheel(
                path, _cache_dir(), wanted=_wanted, check=lambda staged: _checked(staged, label)
            )
        except WheelRefusedError as exc:
            raise VllmUnavailableError(f"cannot unpack the wheel: {exc}", source=label) from None
    elif path.is_dir():
        found = [c for c in (path, path.parent) if (c / "vllm" / _MANAGER).is_file()]
        if not found:
            raise VllmUnavailableError(
                f"not a vLLM tree: no vllm/{_MANAGER} here or above", source=label
            )
        root = found[0]
    elif not path.exists():
        raise VllmUnavailableError(
            not_there(label), source=label, hint=download_hint("vllm", SUPPORTED, label)
        )
    else:
        raise VllmUnavailableError(
            "not a vLLM tree: neither a folder nor a .whl file", source=label
        )
    return _checked(root, label)


# --- stand-ins ------------------------------------------------------------------------------


def _any_schema(cls: type, source: Any, handler: Any) -> Any:
    from pydantic_core import core_schema

    return core_schema.any_schema()


class _AnyMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __getitem__(cls, item: Any) -> Any:
        return cls


class _Anything(metaclass=_AnyMeta):
    """Whatever a module asks of a stand-in at import: a class, a decorator, a constant, a
    field type (any value validates); never used for work."""

    __get_pydantic_core_schema__: Any = classmethod(_any_schema)

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> Any:
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Anything()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        made = _AnyMeta(name, (_Anything,), {"__module__": self.__name__})
        setattr(self, name, made)
        return made


def _unused_config(*args: object, **kwargs: object) -> None:
    """Nothing the manager runs reads the engine's configuration."""
    return None


def _no_engine_config(*args: object, **kwargs: object) -> Any:
    raise RuntimeError("kvcanary's vLLM stand-in has no engine configuration")


def _fill_config_vllm(module: types.ModuleType) -> None:
    module.__dict__.update(
        get_current_vllm_config_or_none=_unused_config,
        get_cached_compilation_config=_unused_config,
        get_current_vllm_config=_no_engine_config,
        get_layers_from_vllm_config=_no_engine_config,
    )


#: The module replaced whole that holds the engine's configuration (`VllmConfig` and the
#: functions reading the current one).
_ENGINE_CONFIG = "vllm.config.vllm"
#: vllm modules replaced whole: name -> what sets the names used at run time (the rest are
#: stand-in classes).
_REPLACED = {
    _ENGINE_CONFIG: _fill_config_vllm,
    "vllm.config.model": None,
    "vllm.compilation.cuda_graph": None,
    "vllm.distributed.parallel_state": None,
    # torch inductor and dynamo settings for compiled models (10 s of import, nothing used)
    "vllm.env_override": None,
}


def _reexports(init: Path, package: str) -> dict[str, tuple[str, str]]:
    """name -> (module, attribute) for every `from M import a as b` in a package `__init__`
    (any depth: re-exports under `if TYPE_CHECKING` are a lazy `__getattr__`'s)."""
    out: dict[str, tuple[str, str]] = {}
    try:
        tree = ast.parse(init.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return out
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:
            if alias.name != "*":
                out.setdefault(alias.asname or alias.name, (module, alias.name))
    return out


def _star_sources(init: Path, package: str) -> tuple[str, ...]:
    """The modules a package `__init__` re-exports whole (`from .m import *`), in order."""
    try:
        tree = ast.parse(init.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return ()
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)]
            parts = (base if node.level else []) + ([node.module] if node.module else [])
            out.append(".".join(parts))
    return tuple(out)


def _cpu_platform() -> Any:
    """vLLM's own CPU platform (its `__init__` would probe for CUDA, ROCm, TPU ... first)."""
    return importlib.import_module("vllm.platforms.cpu").CpuPlatform()


#: Names a hollow package's `__init__` defines itself (not re-exports): (package, name) -> maker.
_DEFINED = {("vllm.platforms", "current_platform"): _cpu_platform}
#: Hollow packages whose `__init__` defines what the replaced module named here holds in later
#: releases, and is too heavy to run: before 0.12.0 `vllm.config` defines `VllmConfig` and the
#: functions reading the current configuration itself (0.12.0 moved them to
#: `vllm.config.vllm`), and runs the model, multimodal and compilation configs to build it. A
#: name that `__init__` defines is answered as the replaced module answers it in later
#: releases (a stand-in class, or a function of `_fill_config_vllm`); a name it does not
#: define is not there, as in the real package.
_DEFINED_AS = {"vllm.config": _ENGINE_CONFIG}


def _defined_names(init: Path) -> frozenset[str]:
    """The names a package `__init__` binds itself at its top level (classes, functions,
    assignments), not those it imports."""
    try:
        tree = ast.parse(init.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(out)


_NOT_THERE = object()


class _HollowPackage(types.ModuleType):
    """A vllm package whose `__init__` did not run: a re-exported name resolves on first use."""

    _kvcanary_reexports: dict[str, tuple[str, str]]
    _kvcanary_stars: tuple[str, ...]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        made = _DEFINED.get((self.__name__, name))
        if made is not None:
            value = made()
            setattr(self, name, value)
            return value
        found = self.__dict__.get("_kvcanary_reexports", {}).get(name)
        if self.__name__ in _DEFINED_AS and (found is None or found[0] == self.__name__):
            # (0.10.0 - 0.11.0's `vllm.config` imports its own `VllmConfig` in a function)
            return self._kvcanary_defined_as(name)
        if found is None:
            return self._kvcanary_from_stars(name)
        module, attr = found
        if module == self.__name__:
            raise AttributeError(name)
        try:
            value = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            value = importlib.import_module(f"{module}.{attr}")
        setattr(self, name, value)
        return value

    def _kvcanary_defined_as(self, name: str) -> Any:
        """A name this package's `__init__` defines itself, from the replaced module that
        holds it in later releases (`_DEFINED_AS`); the `__init__` never runs."""
        if name not in _defined_names(Path(str(self.__spec__.origin if self.__spec__ else ""))):
            raise AttributeError(f"package {self.__name__} has no {name}")
        value = getattr(importlib.import_module(_DEFINED_AS[self.__name__]), name)
        setattr(self, name, value)
        return value

    def _kvcanary_from_stars(self, name: str) -> Any:
        """A name the `__init__` re-exports with `from .m import *` (0.30.0 - 0.32.0's
        `vllm.distributed`): from the last such module that defines it, as the `__init__`
        would bind it, a stand-in module (which answers every name) only where none does;
        else the `__init__` runs."""
        stars = [m for m in self.__dict__.get("_kvcanary_stars", ()) if m != self.__name__]
        if not name.startswith("_") and stars:
            loaded = [importlib.import_module(m) for m in reversed(stars)]
            for module in sorted(loaded, key=lambda m: isinstance(m, _StandinModule)):
                value = getattr(module, name, _NOT_THERE)
                if value is not _NOT_THERE:
                    setattr(self, name, value)
                    return value
        return self._kvcanary_run_init(name)

    def _kvcanary_run_init(self, name: str) -> Any:
        """A name the `__init__` defines itself: the `__init__` runs now, once (only the small
        ones get here: what the manager's modules read of them)."""
        if self.__dict__.get("_kvcanary_ran"):
            raise AttributeError(f"package {self.__name__} has no {name}")
        self._kvcanary_ran = True
        path = Path(str(self.__spec__.origin if self.__spec__ else ""))
        code = compile(path.read_text(), str(path), "exec")
        exec(code, self.__dict__)  # noqa: S102  (the package's own __init__, as import runs it)
        if name not in self.__dict__:
            raise AttributeError(f"package {self.__name__} has no {name}")
        return self.__dict__[name]


class _VllmFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """vllm from `root` with hollow packages and replaced modules; stand-ins for `missing`."""

    def __init__(self, root: Path, missing: set[str]) -> None:
        self.root = root
        self.missing = missing

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        """Our spec for vllm and the missing packages, None (the next finder) otherwise."""
        top = name.split(".")[0]
        if top in self.missing:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if top != "vllm":
            return None
        if name in _REPLACED:
            return importlib.machinery.ModuleSpec(name, self, is_package=False)
        where = self.root.joinpath(*name.split("."))
        init = where / "__init__.py"
        if init.is_file():
            if name in _RUN_INITS:
                return importlib.util.spec_from_file_location(
                    name, init, submodule_search_locations=[str(where)]
                )
            spec = importlib.machinery.ModuleSpec(name, self, origin=str(init), is_package=True)
            spec.submodule_search_locations = [str(where)]
            return spec
        module = where.with_suffix(".py")
        if module.is_file():
            return importlib.util.spec_from_file_location(name, module)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        """A stand-in module, a replaced module or a hollow package."""
        if spec.name.split(".")[0] in self.missing or spec.name in _REPLACED:
            module: types.ModuleType = _StandinModule(spec.name)
            if spec.name.split(".")[0] in self.missing:
                module.__path__ = []
            return module
        hollow = _HollowPackage(spec.name)
        hollow._kvcanary_reexports = _reexports(Path(str(spec.origin)), spec.name)
        hollow._kvcanary_stars = _star_sources(Path(str(spec.origin)), spec.name)
        return hollow

    def exec_module(self, module: types.ModuleType) -> None:
        """A replaced module gets its run-time names; nothing else runs."""
        fill = _REPLACED.get(module.__name__)
        if fill is not None:
            fill(module)


@dataclass(frozen=True)
class VllmModules:
    """The imported vLLM modules the driver and the capture use."""

    tree: VllmTree
    kv_cache_utils: Any
    block_pool: Any
    single_type: Any
    coordinator: Any
    manager: Any
    interface: Any
    request: Any
    sampling_params: Any
    hashing: Any


_MODULES = {
    "kv_cache_utils": "vllm.v1.core.kv_cache_utils",
    "block_pool": "vllm.v1.core.block_pool",
    "single_type": "vllm.v1.core.single_type_kv_cache_manager",
    "coordinator": "vllm.v1.core.kv_cache_coordinator",
    "manager": "vllm.v1.core.kv_cache_manager",
    "interface": "vllm.v1.kv_cache_interface",
    "request": "vllm.v1.request",
    "sampling_params": "vllm.sampling_params",
    "hashing": "vllm.utils.hashing",
}
#: Where a module of `_MODULES` was before the tree split it out: before 0.12.0 the hash
#: functions are in `vllm.utils` itself (0.12.0 split that module into a package of modules).
_FORMERLY = {"vllm.utils.hashing": "vllm.utils"}
_LOADED: dict[str, VllmModules] = {}


def _in_tree(root: Path, name: str) -> str:
    """`name`, or where it was before it moved (`_FORMERLY`) when the tree has no such file."""
    where = root.joinpath(*name.split("."))
    there = where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()
    return name if there else _FORMERLY.get(name, name)


def _releases() -> str:
    """`0.10.0 to 0.34.0`: the releases kvcanary drives, for a refusal."""
    return f"{OLDEST} to {SUPPORTED}"


def _is_vllm(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


def load_vllm(source: str | Path) -> VllmModules:
    """Import vLLM's KV-cache manager modules from `source` (see `find_vllm_tree`), once."""
    tree = find_vllm_tree(source)
    key = str(tree.root.resolve())
    if key in _LOADED:
        return _LOADED[key]
    if "vllm" in sys.modules:
        raise VllmUnavailableError(
            "another vLLM is already imported in this process", source=tree.label
        )
    for name in _REQUIRED:
        if importlib.util.find_spec(name) is None:
            raise VllmUnavailableError(
                f"vLLM's KV-cache manager needs {name}, which is not installed",
                source=tree.label,
                hint=TORCH_HINT if name == "torch" else f"pip install '{EXTRA}'",
            )
    missing = {name for name in _IMPORT_ONLY if name not in sys.modules}
    finder = _VllmFinder(tree.root, missing)
    before = set(sys.modules)
    sys.meta_path.insert(0, finder)
    modules: dict[str, Any] = {}
    importing = "vllm"
    try:
        # what vLLM prints or logs while it loads (0.12.0 - 0.14.1, 0.17.x, 0.18.x: two lines
        # about Triton, its log handler bound to the stdout of the moment) goes to stderr,
        # never into a report
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            for field, wanted in _MODULES.items():
                importing = name = _in_tree(tree.root, wanted)
                modules[field] = importlib.import_module(name)
    except BaseException as exc:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            if _is_vllm(name) or name.split(".")[0] in missing:
                del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        other = "" if tree.version in RELEASES else f"; kvcanary drives vLLM {_releases()}"
        raise VllmUnavailableError(
            f"importing {importing} failed: {type(exc).__name__}: {exc} (this tree is vLLM "
            f"{tree.version}{other})",
            source=tree.label,
        ) from None
    for name in set(sys.modules) - before:
        if name.split(".")[0] in missing:
            del sys.modules[name]
    finder.missing = set()
    result = VllmModules(tree=tree, **modules)
    _LOADED[key] = result
    return result
