"""SGLang's real memory-cache stack on a CPU: the pools, the SWA allocator and the radix tree
of an installed SGLang, a release wheel or a source tree, without the server.

Importing `sglang` the normal way runs its `__init__` (transformers patches, FlashInfer set-up)
and needs CUDA wheels. `load_sglang` instead registers `sglang` as a bare package over the
tree's `sglang/` folder (its `__init__` never runs; `sglang.srt` is a namespace package), puts
import-time stand-ins where a module only touches a package at import (`torchvision`,
`IPython`; `triton` only when the real one is not installed), and imports the memory-cache
modules. `build_stack` then builds them the way SGLang's scheduler does: server args published
for the scheduler role, `ReqToTokenPool`, `SWAKVPool`, `SWATokenToKVPoolAllocator`,
`UnifiedRadixCache` (FULL and SWA components, the Python or the Rust tree core; 0.5.13 -
0.5.16's holds its nodes itself, with no core).

The tree is untrusted input: whatever its modules do at import or at run time (raise, fail to
compile, `sys.exit`) and whatever release it is (no Rust tree core: the Python one; other
constructors) ends in one SGLangUnavailableError naming the tree and what failed, never in
exit 3 or a verdict; wheels are unpacked by `soak.wheel`.

One SGLang per process: the modules are process-wide (`sys.modules`), so a second, different
tree is refused with an error, never mixed in. Nothing here is SGLang's code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
import traceback
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import wraps
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from kvcanary_cli.errors import TORCH_HINT, EngineUnavailableError
from kvcanary_cli.soak.environment import environment_set
from kvcanary_cli.soak.wheel import WheelRefusedError, download_hint, not_there, unpack_wheel

__all__ = [
    "CORES",
    "LAYOUTS",
    "MAMBA_EXTRA",
    "MAMBA_LAYOUTS",
    "OLDEST",
    "PATH_CAP",
    "SUPPORTED",
    "SGLangModules",
    "SGLangUnavailableError",
    "Stack",
    "StackSpec",
    "build_stack",
    "find_tree",
    "fitting",
    "drives_radix_sessions",
    "drives_streaming_sessions",
    "has_path_cap",
    "load_sglang",
    "refusing_sglang_exits",
]

#: Tree cores `UnifiedRadixCache` can run (`tree_core_backend`).
CORES = ("python", "rust")
#: Memory layouts soak builds: hybrid SWA on the paged allocators (`SWAKVPool`), unified
#: memory (`UnifiedSWAKVPool`, one virtual id space over a shared byte buffer), and hybrid
#: Mamba / linear attention (`HybridReqToTokenPool`'s Mamba slots: page size 1 without SGLang's
#: extra buffer, `mamba`; any page size with it, `mamba-extra`).
LAYOUTS = ("swa", "unified", "mamba", "mamba-extra")
#: The layouts of a hybrid Mamba model (the request pool hands out Mamba state slots).
MAMBA_LAYOUTS = ("mamba", "mamba-extra")
#: The layout that runs SGLang's extra buffer (`--mamba-radix-cache-strategy extra_buffer`).
MAMBA_EXTRA = "mamba-extra"
#: SGLang's per-path Mamba state cap (`--mamba-max-states-per-path`), as its server args
#: spell it.
PATH_CAP = "mamba_max_states_per_path"
#: Python packages the memory-cache modules import at import time (the `sglang-cpu` extra).
EXTRA = "kvcanary[sglang-cpu]"
#: The extra's distributions (and those transformers brings), by the module they install
#: where the two names differ: a missing module's hint names what to install.
_EXTRA_MODULES = {
    "PIL": "pillow",
    "zmq": "pyzmq",
    "yaml": "pyyaml",
    "tvm_ffi": "apache-tvm-ffi",
    "huggingface_hub": "huggingface-hub",
    **{
        name: name.replace("_", "-")
        for name in (
            "msgspec psutil orjson pybase64 requests starlette packaging pydantic tqdm dill "
            "loguru gguf partial_json_parser transformers sentencepiece openai regex "
            "tokenizers safetensors"
        ).split()
    },
}
#: Packages only touched at import time by SGLang's model configs (and, 0.5.20, by its
#: function-call parsers and API models: xgrammar; 0.5.17 - 0.5.18, by the DeepGEMM MoE runner
#: the quantization layers import: einops): a stand-in is enough.
#: (compressed-tensors requires torch: as a real dependency of the extra it would pull a CUDA
#: build of torch into an environment that has none.)
_STANDINS = ("torchvision", "IPython", "compressed_tensors", "xgrammar", "einops")
#: Where kv canary lives (0.5.17 and later; 0.5.13 - 0.5.16).
_CANARY_DIRS = ("kernels/ops/kv_canary", "jit_kernel/kv_canary")
_TREE = "srt/mem_cache/unified_radix_cache.py"
#: Where the tree's components live: beside a tree core (0.5.17 on), or with the tree itself
#: holding its nodes (0.5.13 - 0.5.16's `unified_cache_components`); a tree with neither is
#: of a make soak does not read.
_TREE_PARTS = ("srt/mem_cache/unified_cache", "srt/mem_cache/unified_cache_components")
#: Unified memory's pools (0.5.15 on; older trees have none).
_UNIFIED_POOLS = "srt/mem_cache/unified_memory_pool.py"
#: The Rust tree core's package (older trees have none) and its extension module.
_RUST = "srt/mem_cache/rust_tree_core"
_RUST_MODULE = "sglang.srt.mem_cache.rust_tree_core.mem_cache"
#: The release soak's stack and scheduler loop are written for, and the oldest it drives
#: (what differs between them is read from the tree: `soak.calls`).
SUPPORTED = "0.5.23"
OLDEST = "0.5.13"


class SGLangUnavailableError(EngineUnavailableError):
    """The SGLang asked for cannot run here: not an SGLang tree, no kv canary, a missing
    dependency. One line, exit 2."""


@dataclass(frozen=True)
class SGLangTree:
    """An SGLang found on disk: `root` is the folder holding the `sglang/` package."""

    root: Path
    version: str
    #: the module path of kv canary's planner package
    canary_module: str
    #: what the user named (a wheel, a folder) or where the installed one is: errors name it
    label: str

    @property
    def release(self) -> str:
        """`SGLang 0.5.23`, or what is known when the tree does not say its version."""
        return f"SGLang {self.version}" if self.version != "unknown" else "SGLang (version unknown)"


def _cache_dir() -> Path:
    base = os.environ.get("KVCANARY_CACHE") or Path.home() / ".cache" / "kvcanary"
    return Path(base) / "sglang-trees"


def _soak_imports(name: str) -> bool:
    """The members of a wheel soak unpacks: the `sglang` package (modules, and the data its
    modules look for at import: kernel sources, configs) without its native extensions but the
    Rust tree core's (0.5.23: 42 of 46 MB), and the dist-info's METADATA (its folder names the
    version)."""
    folder, _, base = name.rpartition("/")
    if name.startswith("sglang/"):
        return not base.endswith(".so") or folder == "sglang/" + _RUST
    return base == "METADATA" and folder.startswith("sglang-") and folder.endswith(".dist-info")


def _version_of(package: Path) -> str:
    """The release, from the dist-info next to the package or `_version.py` ('unknown')."""
    for info in sorted(package.parent.glob("sglang-*.dist-info")):
        return info.name.removeprefix("sglang-").removesuffix(".dist-info")
    path = package / "_version.py"
    if path.is_file():
        pattern = r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]"""
        found = re.search(pattern, path.read_text(errors="replace"))
        if found:
            return found.group(1)
    return "unknown"


def find_tree(source: str | Path | None = None) -> SGLangTree:
    """The SGLang to run: the installed one (None), a wheel, a source checkout (its `python/`
    folder holds the package), the folder holding `sglang/`, or the `sglang/` folder itself."""
    if source is None:
        spec = importlib.util.find_spec("sglang") if "sglang" not in sys.modules else None
        module = sys.modules.get("sglang")
        places = list(
            getattr(module, "__path__", None)
            or (spec.submodule_search_locations if spec is not None else None)
            or []
        )
        if not places:
            raise SGLangUnavailableError(
                "SGLang is not installed here",
                hint=f"{download_hint('sglang', SUPPORTED)}; then give --sglang-tree "
                f"wheels/sglang-{SUPPORTED}-*.whl, or your source checkout",
            )
        root = Path(places[0]).parent
        label = str(places[0])
    else:
        path = Path(source).expanduser()
        label = str(source)
        if path.is_file() and path.suffix == ".whl":
            try:
                root = unpack_wheel(
                    path,
                    _cache_dir(),
                    wanted=_soak_imports,
                    check=lambda staged: _checked_tree(staged, label),
                )
            except WheelRefusedError as exc:
                raise SGLangUnavailableError(
                    f"cannot unpack the wheel: {exc}", source=label
                ) from None
        elif path.is_dir():
            candidates = [path, path / "python", path.parent]
            found = [c for c in candidates if (c / "sglang" / "srt").is_dir()]
            if path.name == "sglang" and (path / "srt").is_dir():
                found.insert(0, path.parent)
            if not found:
                raise SGLangUnavailableError(
                    "not an SGLang tree: no sglang/srt package here or under python/",
                    source=label,
                )
            root = found[0]
        elif not path.exists():
            raise SGLangUnavailableError(
                not_there(label), source=label, hint=download_hint("sglang", SUPPORTED, label)
            )
        else:
            raise SGLangUnavailableError(
                "not an SGLang tree: neither a folder nor a .whl file", source=label
            )
    return _checked_tree(root, label)


def _checked_tree(root: Path, label: str) -> SGLangTree:
    """`root` as an SGLang tree soak can load: its package, kv canary, the radix cache."""
    package = root / "sglang"
    if not (package / "srt").is_dir():
        raise SGLangUnavailableError("not an SGLang tree: no sglang/srt package", source=label)
    version = _version_of(package)
    canary = [d for d in _CANARY_DIRS if (package / d).is_dir()]
    if not canary:
        raise SGLangUnavailableError(
            f"SGLang {version} has no kv canary (it shipped in 0.5.13)", source=label
        )
    if not (package / _TREE).is_file():
        raise SGLangUnavailableError(
            f"SGLang {version} has no UnifiedRadixCache ({_TREE})", source=label
        )
    if not any((package / parts).is_dir() for parts in _TREE_PARTS):
        raise SGLangUnavailableError(
            f"SGLang {version}'s UnifiedRadixCache has none of the tree components soak "
            f"drives (no sglang/{_TREE_PARTS[0]}, no sglang/{_TREE_PARTS[1]}): soak runs "
            f"SGLang {OLDEST} and later",
            hint="its dumps are read all the same: check, provenance and --kernel sglang take "
            "every release with kv canary, and the capture hook runs in its servers",
            source=label,
        )
    return SGLangTree(
        root=root,
        version=version,
        canary_module="sglang." + canary[0].replace("/", "."),
        label=label,
    )


class _AnyMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return cls


class _Anything(metaclass=_AnyMeta):
    """Whatever a module asks of a stand-in package at import time: a class, a decorator,
    a constant; never used for work."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> Any:
        return _Anything()

    def __getattr__(self, name: str) -> Any:
        return _Anything()

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """A field typed by a stand-in (0.5.20's API models name xgrammar's `StructuralTag`)
        takes any value: soak never builds those models."""
        from pydantic_core import core_schema

        return core_schema.any_schema()


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


class _Standins(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import-time stand-ins for packages that are not installed (and their submodules)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        """A stand-in spec for our names, None (the next finder) otherwise."""
        if name.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        """An empty package answering any attribute."""
        module = _StandinModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run."""


@dataclass(frozen=True)
class SGLangModules:
    """The imported SGLang modules the stack and the driver use, and which tree they are."""

    tree: SGLangTree
    server_args: Any
    memory_pool: Any
    swa_memory_pool: Any
    swa_allocator: Any
    cache_init_params: Any
    unified_radix_cache: Any
    component_type: Any
    schedule_batch: Any
    schedule_policy: Any
    common: Any
    allocation: Any
    sampling_params: Any
    #: the invariant checker module (None where this release has none)
    invariant_checker: Any
    #: the runtime context module (None where this release has none: 0.5.13)
    runtime_context: Any
    #: the tree cores this install can run
    cores: tuple[str, ...]
    #: what the user should know about this tree (a tree core it lacks, and why)
    notes: tuple[str, ...] = ()
    #: every `sglang` module the load imported, by name: SGLang imports more inside its
    #: functions, which needs its package in `sys.modules`
    imported: dict[str, types.ModuleType] = field(default_factory=dict, repr=False)

    def reinstate(self) -> None:
        """Put this tree's modules back where something dropped them from `sys.modules` (a
        caller that unloads `sglang`), so SGLang's imports inside its functions resolve to
        the tree they were loaded from (never over another module of the same name)."""
        for name, module in self.imported.items():
            sys.modules.setdefault(name, module)


#: The modules `load_sglang` imports, by field.
_MODULES: dict[str, str | tuple[str, ...]] = {
    "server_args": "sglang.srt.server_args",
    "memory_pool": "sglang.srt.mem_cache.memory_pool",
    "swa_memory_pool": "sglang.srt.mem_cache.swa_memory_pool",
    "swa_allocator": "sglang.srt.mem_cache.allocator.swa",
    "cache_init_params": "sglang.srt.mem_cache.cache_init_params",
    "unified_radix_cache": "sglang.srt.mem_cache.unified_radix_cache",
    # ComponentType: beside the tree core (0.5.17 on), or in the components' package
    "component_type": (
        "sglang.srt.mem_cache.unified_cache.component_type",
        "sglang.srt.mem_cache.unified_cache_components",
    ),
    "schedule_batch": "sglang.srt.managers.schedule_batch",
    "schedule_policy": "sglang.srt.managers.schedule_policy",
    "common": "sglang.srt.mem_cache.common",
    # the scheduler's allocation functions: their own module (0.5.16 on), or `common`'s
    "allocation": ("sglang.srt.mem_cache.allocation", "sglang.srt.mem_cache.common"),
    "sampling_params": "sglang.srt.sampling.sampling_params",
}
_CHECKER = "sglang.srt.managers.scheduler_components.invariant_checker"
_CONTEXT = "sglang.srt.runtime_context"


def _first_module(names: str | tuple[str, ...]) -> str:
    """The first of `names` the tree has (the last where it has none: its import says so)."""
    if isinstance(names, str):
        return names
    for name in names[:-1]:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except ModuleNotFoundError:  # its package is not there either
            continue
    return names[-1]


_LOADED: dict[str, SGLangModules] = {}


def _register_bare_package(root: Path) -> None:
    package = types.ModuleType("sglang")
    package.__path__ = [str(root / "sglang")]
    package.__file__ = str(root / "sglang" / "__init__.py")
    package.__package__ = "sglang"
    package.__spec__ = importlib.machinery.ModuleSpec(
        "sglang", None, origin=package.__file__, is_package=True
    )
    package.__spec__.submodule_search_locations = package.__path__
    sys.modules["sglang"] = package


def _prepare_imports() -> None:
    """transformers first (it decides at import which optional packages exist: the stand-ins
    must not look installed to it), then stand-ins for what is missing."""
    try:
        importlib.import_module("transformers.utils.import_utils")
    except ImportError:
        pass  # the memory-cache import below names what is missing
    missing = {name for name in _STANDINS if importlib.util.find_spec(name) is None}
    if importlib.util.find_spec("triton") is None:
        missing.add("triton")
    if missing and not any(isinstance(f, _Standins) for f in sys.meta_path):
        sys.meta_path.append(_Standins(missing))


@contextmanager
def _tolerating_config_clashes() -> Iterator[None]:
    """Inside, a model type the installed transformers already ships is kept as its own when
    SGLang's model configs register theirs under that name without `exist_ok` (0.5.13 - 0.5.19
    register `qwen3_asr`, which transformers 5 ships, and fail at import with "already used by
    a Transformers config"). soak builds no model config: transformers' own stays, another
    name registers as SGLang asks. Only this process's registry, only while SGLang imports
    (the instance's `register` shadowed, then removed); the installed package is untouched."""
    try:
        mapping = importlib.import_module("transformers.models.auto.configuration_auto")
        registry = mapping.CONFIG_MAPPING
        own = registry._mapping
        register = registry.register
    except Exception:  # noqa: BLE001  (no transformers, another make: SGLang's import says)
        yield
        return

    def tolerant(key: str, value: Any, exist_ok: bool = False) -> None:
        if key in own and not exist_ok:
            return  # transformers' own config stays; soak never reads a model's config
        register(key, value, exist_ok=exist_ok)

    shadowed = registry.__dict__.get("register")
    registry.register = tolerant
    try:
        yield
    finally:
        if shadowed is None:
            registry.__dict__.pop("register", None)
        else:
            registry.register = shadowed


def _interpret_triton() -> None:
    """A real triton not imported yet is imported interpreted (TRITON_INTERPRET: its kernels
    run on numpy, on the host), and stays so in this process: an older release's allocator
    launches its Triton kernels on the CPU too (0.5.21's paged `alloc_extend`), where a
    compiled kernel finds no driver, and the interpreter reads the setting at each launch.
    The variable itself is set only while triton imports (a process this one starts does not
    inherit it). A triton imported before, or none (the stand-in), stays as it is
    (`triton_interpreted`)."""
    try:
        spec = importlib.util.find_spec("triton") if "triton" not in sys.modules else None
    except (ImportError, ValueError):
        spec = None
    if spec is None or isinstance(spec.loader, _Standins):
        return
    with environment_set(_INTERPRET, "1"):
        try:
            importlib.import_module("triton.language")
            knobs = importlib.import_module("triton.knobs").runtime
            knobs.__dict__["interpret"] = True  # the knob's own override, not the environment
        except Exception:  # noqa: S110  (a broken triton: SGLang's import says what fails)
            pass


_INTERPRET = "TRITON_INTERPRET"


def triton_interpreted() -> bool:
    """Whether this process's triton runs kernels interpreted (its own jit functions, such as
    `tl.sum`, are): then a kernel SGLang launches on the CPU runs."""
    language = sys.modules.get("triton.language")
    return type(getattr(language, "sum", None)).__name__ == "InterpretedFunction"


def _require_torch(tree: SGLangTree) -> None:
    """SGLang's pools are torch tensors: without torch every tree fails at its first import,
    which would read as the tree's fault (and transformers says so on stderr first)."""
    try:
        import torch  # noqa: F401  (SGLang imports it first thing anyway)
    except ImportError as exc:
        raise SGLangUnavailableError(
            f"SGLang's memory cache runs on torch, which cannot be imported here ({exc})",
            source=tree.label,
            hint=f"{TORCH_HINT}, as the README's Quick start says",
        ) from None


def load_sglang(source: str | Path | None = None) -> SGLangModules:
    """Import SGLang's memory-cache stack from `source` (see `find_tree`), once per process.

    Whatever the tree does at import (raises, fails to compile, calls `sys.exit`) is one
    SGLangUnavailableError naming the module; only Ctrl-C passes. A failed import leaves no
    `sglang` module behind."""
    tree = find_tree(source)
    key = str(tree.root.resolve())
    if key in _LOADED:
        return _LOADED[key]
    _require_torch(tree)
    loaded = sys.modules.get("sglang")
    paths = [str(Path(p).resolve()) for p in getattr(loaded, "__path__", None) or []]
    if loaded is not None and paths[:1] != [str((tree.root / "sglang").resolve())]:
        raise SGLangUnavailableError(
            f"another SGLang is already imported in this process ({paths[:1] or loaded!r})",
            source=tree.label,
        )
    before = {name for name in sys.modules if _is_sglang(name)}
    if loaded is None:
        _register_bare_package(tree.root)
    _prepare_imports()
    _interpret_triton()
    modules: dict[str, Any] = {}
    importing = "sglang"
    try:
        with warnings.catch_warnings(), _tolerating_config_clashes(), _caching_bytecode(tree):
            warnings.simplefilter("ignore")  # "only CUDA supports ..." at import, on CPU
            for field, names in _MODULES.items():
                importing = _first_module(names)
                modules[field] = importlib.import_module(importing)
            importing = _CHECKER
            try:
                modules["invariant_checker"] = importlib.import_module(_CHECKER)
            except ImportError:
                modules["invariant_checker"] = None
            importing = _CONTEXT
            try:
                modules["runtime_context"] = importlib.import_module(_CONTEXT)
            except ModuleNotFoundError as exc:
                if exc.name != _CONTEXT:
                    raise
                modules["runtime_context"] = None
            importing = _RUST_MODULE
            cores, notes = _cores(tree)
    except BaseException as exc:
        for name in set(sys.modules) - before:
            if _is_sglang(name):
                del sys.modules[name]
        refusal = _import_refusal(exc, tree, importing)
        if refusal is None:
            raise
        raise refusal from None
    imported = {name: sys.modules[name] for name in sys.modules if _is_sglang(name)}
    result = SGLangModules(tree=tree, cores=cores, notes=notes, imported=imported, **modules)
    _LOADED[key] = result
    return result


@contextmanager
def _caching_bytecode(tree: SGLangTree) -> Iterator[None]:
    """Imports from a wheel soak unpacked into its own cache write their bytecode there, even
    where PYTHONDONTWRITEBYTECODE is set: the folder is kvcanary's copy of the wheel, never
    changed once unpacked, so each later soak of that wheel imports SGLang without compiling
    it (about 2 s of CPU of the 10 an import takes). A tree of the user's, or the installed
    SGLang, is imported as the interpreter's setting says."""
    ours = tree.root.resolve().is_relative_to(_cache_dir().resolve())
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = before and not ours
    try:
        yield
    finally:
        sys.dont_write_bytecode = before


def _is_sglang(name: str) -> bool:
    return name == "sglang" or name.startswith("sglang.")


def _cores(tree: SGLangTree) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tree cores this tree can run, and why the Rust one is missing where it is: older
    trees have no `rust_tree_core`, a source checkout may not have built its extension."""
    where = f"sglang/{_RUST}"
    if not (tree.root / where).is_dir():
        return ("python",), (
            f"{tree.release} has no Rust tree core (no {where}): the Python core only",
        )
    try:
        spec = importlib.util.find_spec(_RUST_MODULE)
    except ModuleNotFoundError as exc:
        if not _RUST_MODULE.startswith(exc.name or "?"):
            raise
        spec = None
    if spec is None:
        return ("python",), (
            f"{tree.release}'s Rust tree core is not built for this Python (no mem_cache "
            f"extension in {where}): the Python core only",
        )
    return CORES, ()


def _import_refusal(
    exc: BaseException, tree: SGLangTree, importing: str
) -> SGLangUnavailableError | None:
    """What to say when importing `importing` raised `exc`; None: let it pass (Ctrl-C, or an
    exception that SGLang's code did not raise, such as a signal handler's)."""
    if isinstance(exc, ModuleNotFoundError):
        missing = exc.name or str(exc)
        if missing.startswith("sglang"):
            return SGLangUnavailableError(
                f"{tree.release} lacks the module {missing} this stack needs", source=tree.label
            )
        return SGLangUnavailableError(
            f"{tree.release} needs the Python module {missing!r} at import",
            source=tree.label,
            hint=_install_hint(missing),
        )
    if isinstance(exc, ImportError):
        return SGLangUnavailableError(
            f"{tree.release} does not import here ({_shown(exc)})",
            source=tree.label,
            hint=f"pip install '{EXTRA}'",
        )
    module = _module_at_fault(exc, tree) or importing
    if isinstance(exc, Exception):
        return SGLangUnavailableError(
            f"{tree.release}'s module {module} fails at import ({_shown(exc)})", source=tree.label
        )
    if isinstance(exc, KeyboardInterrupt) or not _raised_by_sglang(exc, tree):
        return None
    return SGLangUnavailableError(
        f"{tree.release}'s module {module} raises {_shown(exc)} at import: {_NO_VERDICT}",
        source=tree.label,
    )


def _install_hint(module: str) -> str:
    """What installs `module`: the extra's distribution that provides it, torch's own route,
    or, for a module the extra does not list, the module's package named as such."""
    top = module.partition(".")[0]
    if top == "torch":
        return TORCH_HINT
    if top in _EXTRA_MODULES:
        return f"pip install {_EXTRA_MODULES[top]} (it is in {EXTRA})"
    return (
        f"install the package that provides the module {top!r}: {EXTRA} does not list it, "
        "this SGLang needs more than 0.5.23 did"
    )


_NO_VERDICT = "soak never takes an exit of SGLang's for a verdict"


def _shown(exc: BaseException) -> str:
    """`Type: first line` (`SystemExit(0)` for an exit), at most 300 characters."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r})"
    text = (str(exc).strip().splitlines() or [""])[0]
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:300]


def _module_of(filename: str, tree: SGLangTree) -> str | None:
    """The dotted name of a file of the tree's package; None for any other file."""
    try:
        relative = Path(filename).resolve().relative_to(tree.root.resolve())
    except (ValueError, OSError):
        return None
    parts = list(relative.with_suffix("").parts)
    if not parts or parts[0] != "sglang" or relative.suffix != ".py":
        return None
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_at_fault(exc: BaseException, tree: SGLangTree) -> str | None:
    """The tree's module that raised `exc` (for a SyntaxError, the one that did not compile)."""
    files = [exc.filename] if isinstance(exc, SyntaxError) and exc.filename else []
    files += [frame.filename for frame in reversed(traceback.extract_tb(exc.__traceback__))]
    return next((m for m in (_module_of(f, tree) for f in files) if m), None)


def _raised_by_sglang(exc: BaseException, tree: SGLangTree) -> bool:
    """Whether SGLang's code raised `exc` (a frame of the tree's, and the last frame not one of
    kvcanary's: a signal handler of kvcanary's raises in its own frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or "kvcanary_cli" in Path(frames[-1].filename).parts:
        return False
    return any(_module_of(frame.filename, tree) for frame in frames)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def refusing_sglang_exits(
    run: Callable[Concatenate[SGLangModules, _P], _R],
) -> Callable[Concatenate[SGLangModules, _P], _R]:
    """For a function running the SGLangModules it is given first: an exit of SGLang's
    there (`sys.exit`, another BaseException that is not Ctrl-C) is an error line, exit 2,
    never the process's exit or a verdict."""

    @wraps(run)
    def guarded(modules: SGLangModules, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if isinstance(modules, SGLangModules):  # a test's stand-in holds no loaded modules
            modules.reinstate()
        try:
            return run(modules, *args, **kwargs)
        except Exception:
            raise
        except BaseException as exc:
            tree = modules.tree
            if isinstance(exc, KeyboardInterrupt) or not _raised_by_sglang(exc, tree):
                raise
            module = _module_at_fault(exc, tree) or "its code"
            raise SGLangUnavailableError(
                f"{tree.release}'s {module} raises {_shown(exc)} while soak runs it: "
                + _NO_VERDICT,
                source=tree.label,
            ) from None

    return guarded


@contextmanager
def fitting(tree: SGLangTree, what: str) -> Iterator[None]:
    """Build `what` of SGLang's inside: a failure (another release's signature, a class it
    lacks) is an error line, exit 2, naming it, the tree and the release soak drives."""
    try:
        yield
    except SGLangUnavailableError:
        raise
    except Exception as exc:
        raise SGLangUnavailableError(
            f"{tree.release}'s {what} does not fit soak ({_shown(exc)}); soak drives "
            f"SGLang {OLDEST} to {SUPPORTED}",
            source=tree.label,
        ) from None


@dataclass(frozen=True, kw_only=True)
class StackSpec:
    """The shape of one stack: what a scheduler would size from the model and the flags."""

    page_size: int = 1
    window: int = 32
    #: full-pool tokens (`size`) and SWA-pool tokens (`size_swa`)
    full_tokens: int = 1024
    swa_tokens: int = 512
    max_reqs: int = 24
    max_context_len: int = 256
    chunked_prefill_size: int = 64
    core: str = "python"
    #: one of LAYOUTS
    layout: str = "swa"

    @classmethod
    def pressured(cls, page_size: int, core: str, layout: str = "swa") -> StackSpec:
        """The shape soak runs: pools small enough for the random workload to bring eviction,
        retraction and tombstones within a few dozen steps. Where a page is large the pools
        hold at least 8 full and 4 SWA pages, and a chunk is at least a page (shorter, it
        admits nothing); the window stays 16 tokens, shorter than a page from 32 up. The Mamba
        layout's full pool is as small as the SWA pool here (its only token pool: decode
        outgrows it and retracts)."""
        return cls(
            page_size=page_size,
            core=core,
            full_tokens=max(192, 12 * page_size)
            if layout in MAMBA_LAYOUTS
            else max(384, 8 * page_size),
            swa_tokens=max(192, 4 * page_size),
            max_reqs=12,
            window=16,
            chunked_prefill_size=max(32, page_size),
            max_context_len=max(256, 4 * page_size),
            layout=layout,
        )


@dataclass
class Stack:
    """The real objects, as a scheduler holds them."""

    modules: SGLangModules
    spec: StackSpec
    server_args: Any
    req_to_token_pool: Any
    kv_pool: Any
    allocator: Any
    tree: Any
    #: times a planted fault (`soak.faults`) did its wrong thing: 0 while its code path has
    #: not run, when there is nothing to find
    fault_acted: int = 0
    #: the host tier's storage tier (`soak.storage`): its folder and pump; None: none
    storage: Any = None

    def close(self) -> None:
        """Remove what the stack keeps outside the process (the storage tier's folder)."""
        if self.storage is not None:
            self.storage.close()


def build_stack(
    modules: SGLangModules,
    spec: StackSpec,
    *,
    need_sort: bool = False,
    lazy_compaction: bool = False,
    mamba_max_states_per_path: int | None = None,
    hicache_write_policy: str | None = None,
    mamba_track_slots: int | None = None,
    radix_sessions: bool = False,
    hicache_storage: str | None = None,
    rank: int = 0,
    ranks: int = 1,
    storage_folder: Any = None,
    overlap: bool = False,
    mamba_lazy: bool = False,
) -> Stack:
    """Build the pools, the allocator and the tree on CPU, in the scheduler's order (another
    release's constructors: an error line naming the one that did not fit, see `fitting`);
    `need_sort` builds the allocators as SGLang does under prefill-decode disaggregation,
    `lazy_compaction` unified memory's as SGLang does by default, `mamba_max_states_per_path`
    with SGLang's per-path Mamba state cap on the server args (a release without it: an error
    line), `mamba_track_slots` the extra buffer's ping-pong slots per request (`mamba-extra`
    only; None: two), `hicache_write_policy` with SGLang's host tier under that write policy
    (`soak.hicache`; a release whose tree takes none: an error line), `radix_sessions` with
    SGLang's radix sessions (`--enable-session-radix-cache`; a release or tree core without
    them: an error line, `drives_radix_sessions`), `hicache_storage` with the host tier's
    storage tier behind it under that prefetch policy (`soak.storage`: the file backend in a
    folder of its own, which `Stack.close` removes; the host tier needed), as tensor-parallel
    rank `rank` of `ranks` (its pages named for that rank) in `storage_folder` where given (a
    `soak.storage.storage_folder` the history's ranks share), with `overlap` the server args
    of SGLang's overlapped loop (`disable_overlap_schedule` off), with `mamba_lazy` (the
    overlapped loop's `mamba-extra` only) the extra buffer's lazy strategy. The tree's modules are
    put back first (`reinstate`): SGLang's constructors import more of it as they run."""
    modules.reinstate()
    tree = modules.tree
    capped = {} if mamba_max_states_per_path is None else {PATH_CAP: mamba_max_states_per_path}
    if capped and not has_path_cap(modules):
        raise SGLangUnavailableError(
            f"{tree.release}'s server args have no {PATH_CAP} (SGLang's "
            "--mamba-max-states-per-path), which this workload sets: run it on a release "
            "that has it",
            source=tree.label,
        )
    hicache: dict[str, Any] = {}
    if hicache_write_policy is not None:
        from kvcanary_cli.soak.hicache import has_hicache, server_args_fields

        if spec.layout == "unified" or not has_hicache(
            modules.unified_radix_cache.UnifiedRadixCache
        ):
            raise SGLangUnavailableError(
                "soak drives SGLang's host tier (HiCache) on the swa, mamba and mamba-extra "
                f"layouts of a release whose unified tree takes one; not {tree.release}'s "
                f"{spec.layout}",
                source=tree.label,
            )
        hicache = server_args_fields(hicache_write_policy, mamba=spec.layout in MAMBA_LAYOUTS)
    storage = None
    if hicache_storage is not None:
        from kvcanary_cli.soak import storage as tier

        if not hicache or not tier.has_storage(modules.unified_radix_cache.UnifiedRadixCache):
            raise SGLangUnavailableError(
                "soak drives SGLang's storage tier behind its host tier (--hicache), on a "
                f"release whose unified tree takes one the way 0.5.23's does; not {tree.release}",
                source=tree.label,
            )
        folder = storage_folder if storage_folder is not None else tier.storage_folder()
        storage = tier.StorageTier(folder, rank=rank, ranks=ranks)
        hicache.update(tier.server_args_fields(storage.folder.name, hicache_storage))
    if spec.core not in modules.cores:
        raise SGLangUnavailableError(
            f"tree core {spec.core!r} is not available in {tree.release} "
            f"(available: {', '.join(modules.cores)})",
            source=tree.label,
        )
    if radix_sessions and not drives_radix_sessions(modules, spec.core):
        raise SGLangUnavailableError(
            f"{tree.release}'s unified tree ({spec.core} core) has no radix sessions "
            "(--enable-session-radix-cache: SGLang 0.5.17 on, the Python tree core)",
            source=tree.label,
        )
    if spec.layout == MAMBA_EXTRA:
        from kvcanary_cli.soak.mamba import extra_buffer_args

        capped.update(extra_buffer_args(modules, spec, lazy=mamba_lazy))
    with fitting(tree, "ServerArgs"):
        server_args = modules.server_args.ServerArgs(
            model_path="dummy",
            page_size=spec.page_size,
            device="cpu",
            attention_backend="torch_native",
            chunked_prefill_size=spec.chunked_prefill_size,
            disable_overlap_schedule=not overlap,
            **capped,
            **hicache,
        )
    with fitting(tree, "runtime context (reset_context, publish)"):
        _publish(modules, server_args)
    import torch  # SGLang's pools import it anyway

    if spec.layout in MAMBA_LAYOUTS:
        from kvcanary_cli.soak.mamba import build_mamba_pools

        if spec.page_size != 1 and spec.layout != MAMBA_EXTRA:
            raise SGLangUnavailableError(
                f"the Mamba layout runs at page size 1 only (asked: {spec.page_size}): "
                "SGLang's Mamba tree component needs it without the extra buffer "
                "(--layout mamba-extra runs it, at any page size)",
                source=tree.label,
            )
        with fitting(tree, "Mamba pools (HybridReqToTokenPool, HybridLinearKVPool)"):
            req_to_token_pool, kv_pool, allocator = build_mamba_pools(
                modules,
                spec,
                server_args,
                need_sort=need_sort,
                track_slots=mamba_track_slots or 2,
                lazy=mamba_lazy,
            )
    else:
        with fitting(tree, "ReqToTokenPool"):
            req_to_token_pool = modules.memory_pool.ReqToTokenPool(
                size=spec.max_reqs,
                max_context_len=spec.max_context_len,
                device="cpu",
                enable_memory_saver=False,
            )
        if spec.layout == "unified":
            from kvcanary_cli.soak.unified import build_unified_pools

            if not (tree.root / "sglang" / _UNIFIED_POOLS).is_file():
                raise SGLangUnavailableError(
                    f"{tree.release} has no unified memory (no sglang/{_UNIFIED_POOLS}), "
                    "which the unified layout runs on: --layout swa or mamba",
                    source=tree.label,
                )

            with fitting(tree, "unified memory pool (init_unified_swa_pools)"):
                kv_pool, allocator = build_unified_pools(
                    spec, lazy=lazy_compaction, need_sort=need_sort
                )
        else:
            kv_pool, allocator = _swa_pools(modules, spec, torch, need_sort)
    _require_kernels(tree, spec, allocator)
    with fitting(tree, f"UnifiedRadixCache ({spec.core} core)"):
        kinds = modules.component_type.ComponentType
        second = kinds.MAMBA if spec.layout in MAMBA_LAYOUTS else kinds.SWA
        init = modules.cache_init_params.CacheInitParams
        # the tree core: a parameter (0.5.21 on), or the environment at construction (older)
        by_param = "tree_core_backend" in inspect.signature(init).parameters
        params = init(
            disable=False,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator,
            page_size=spec.page_size,
            sliding_window_size=None if spec.layout in MAMBA_LAYOUTS else spec.window,
            chunked_prefill_size=spec.chunked_prefill_size,
            tree_components=(kinds.FULL, second),
            **({"enable_mamba_extra_buffer": True} if spec.layout == MAMBA_EXTRA else {}),
            **({"tree_core_backend": spec.core} if by_param else {}),
            **({"enable_session_radix_cache": True} if radix_sessions else {}),
        )
        with nullcontext() if by_param else environment_set(_CORE_ENV, spec.core):
            radix = modules.unified_radix_cache.UnifiedRadixCache(params)
    if hicache:
        from kvcanary_cli.soak.hicache import attach_hicache

        with fitting(tree, "host tier (UnifiedRadixCache.init_hicache)"):
            attach_hicache(radix, server_args, params, storage)
    return Stack(
        modules=modules,
        spec=spec,
        server_args=server_args,
        req_to_token_pool=req_to_token_pool,
        kv_pool=kv_pool,
        allocator=allocator,
        tree=radix,
        storage=storage,
    )


#: The argument through which SGLang's busy check counts the chunked request parked between
#: chunks (its `SchedulerInvariantChecker`'s `get_chunked_req`, 0.5.20 on).
PARKED_CHUNK_GETTER = "get_chunked_req"


def drives_streaming_sessions(modules: SGLangModules) -> bool:
    """Whether soak opens streaming sessions on this release: where SGLang's busy check counts
    a chunked request parked between chunks (`PARKED_CHUNK_GETTER`), or the tree has no such
    check. Before 0.5.20 the check sums the uncached KV of the last and running batches only,
    so a chunk the prefill adder parks for want of SWA room (its hybrid-SWA early return)
    reads as that many tokens leaked on a correct state; in soak's histories only the KV that
    streaming sessions hold leaves a chunk parked (docs/soak.md, Streaming sessions)."""
    checker = getattr(modules, "invariant_checker", None)
    if checker is None:
        return True
    parameters = inspect.signature(checker.SchedulerInvariantChecker).parameters
    return PARKED_CHUNK_GETTER in parameters


def drives_radix_sessions(modules: SGLangModules, core: str = "python") -> bool:
    """Whether soak can run SGLang's radix sessions on this release's unified tree with tree
    core `core`: the tree tags sessions (`open_radix_session`, `ensure_session_generation`,
    `release_radix_session`: 0.5.17 on; 0.5.15 - 0.5.16 tag only the full-attention
    `RadixCache`, which soak does not run) and its build takes the switch, on the Python
    core (SGLang refuses radix sessions on the Rust one, or builds the Python one instead)."""
    tree = modules.unified_radix_cache.UnifiedRadixCache
    named = ("open_radix_session", "ensure_session_generation", "release_radix_session")
    params = inspect.signature(modules.cache_init_params.CacheInitParams).parameters
    return (
        core == "python"
        and all(callable(getattr(tree, name, None)) for name in named)
        and "enable_session_radix_cache" in params
    )


def has_path_cap(modules: SGLangModules) -> bool:
    """Whether this release's server args take the per-path Mamba state cap."""
    return PATH_CAP in inspect.signature(modules.server_args.ServerArgs).parameters


def _publish(modules: SGLangModules, server_args: Any) -> None:
    """Publish `server_args` as a scheduler's, on a fresh runtime context: `publish` with
    its role where the context has it, else the context's own setter (0.5.15 - 0.5.16), else
    (0.5.13 - 0.5.14: a context of parallel state only, or none) the server args module's
    global (`set_global_server_args_for_scheduler`)."""
    context = modules.runtime_context
    reset = getattr(context, "reset_context", None)
    if callable(reset):
        reset()
    publish = getattr(context, "publish", None)
    holder = getattr(context, "get_context", None)
    if callable(publish):
        publish(server_args, role="scheduler")
    elif callable(holder) and callable(getattr(holder(), "set_server_args", None)):
        holder().set_server_args(server_args)
    else:
        modules.server_args.set_global_server_args_for_scheduler(server_args)


#: Where 0.5.19 and 0.5.20 read the tree core to build (their `CacheInitParams` has no field).
_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"


def _require_kernels(tree: SGLangTree, spec: StackSpec, allocator: Any) -> None:
    """A paged allocator without a CPU path (no `use_triton_kernels` switch; unified memory's
    without SGLang's torch kernels to point at: 0.5.21) launches its Triton kernels on the
    CPU: they run interpreted (see `_interpret_triton`) or not at all, and then the page
    size is refused here, never run into a crash that is soak's."""
    if spec.layout == "unified":
        from kvcanary_cli.soak.unified import on_torch

        cpu_path = on_torch()
    else:
        full = getattr(allocator, "full_attn_allocator", allocator)
        cpu_path = hasattr(full, "use_triton_kernels")
    if spec.page_size == 1 or cpu_path or triton_interpreted():
        return
    raise SGLangUnavailableError(
        f"{tree.release}'s {spec.layout} allocator launches Triton kernels on the CPU too, "
        "and this process's triton cannot run them (none installed, or imported before soak, "
        f"not interpreted): page size {spec.page_size} needs them",
        source=tree.label,
        hint="pip install triton (soak runs its kernels interpreted), or --page-size 1",
    )


def _swa_pools(
    modules: SGLangModules, spec: StackSpec, torch: Any, need_sort: bool
) -> tuple[Any, Any]:
    """The hybrid SWA layout's pool and allocator (`SWAKVPool`, `SWATokenToKVPoolAllocator`)."""
    tree = modules.tree
    pool = modules.swa_memory_pool.SWAKVPool
    # a switch older pools take without a default (0.5.13 - 0.5.14): off, as SGLang's is
    extra = (
        {"enable_kvcache_transpose": False}
        if "enable_kvcache_transpose" in inspect.signature(pool).parameters
        else {}
    )
    with fitting(tree, "SWAKVPool"):
        kv_pool = pool(
            size=spec.full_tokens,
            size_swa=spec.swa_tokens,
            page_size=spec.page_size,
            dtype=torch.bfloat16,
            head_num=1,
            head_dim=4,
            swa_attention_layer_ids=[0],
            full_attention_layer_ids=[1],
            device="cpu",
            **extra,
        )
    with fitting(tree, "SWATokenToKVPoolAllocator"):
        allocator = modules.swa_allocator.SWATokenToKVPoolAllocator(
            spec.full_tokens,
            spec.swa_tokens,
            spec.page_size,
            torch.bfloat16,
            "cpu",
            kv_pool,
            need_sort,
        )
    return kv_pool, allocator
