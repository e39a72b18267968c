"""SGLang's real memory-cache stack on a CPU: the pools, the SWA allocator and the radix tree
of an installed SGLang, a release wheel or a source tree, without the server.

Importing `sglang` the normal way runs its `__init__` (transformers patches, FlashInfer set-up)
and needs CUDA wheels. `load_sglang` instead registers `sglang` as a bare package over the
tree's `sglang/` folder (its `__init__` never runs; `sglang.srt` is a namespace package), puts
import-time stand-ins where a module only touches a package at import (`torchvision`,
`IPython`; `triton` only when the real one is not installed), and imports the memory-cache
modules. `build_stack` then builds them the way SGLang's scheduler does: server args published
for the scheduler role, `ReqToTokenPool`, `SWAKVPool`, `SWATokenToKVPoolAllocator`,
`UnifiedRadixCache` (FULL and SWA components, the Python or the Rust tree core).

One SGLang per process: the modules are process-wide (`sys.modules`), so a second, different
tree is refused with an error, never mixed in. Nothing here is SGLang's code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import types
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcanary_cli.errors import KvcanaryError

__all__ = [
    "CORES",
    "SGLangModules",
    "SGLangUnavailableError",
    "Stack",
    "StackSpec",
    "build_stack",
    "find_tree",
    "load_sglang",
]

#: Tree cores `UnifiedRadixCache` can run (`tree_core_backend`).
CORES = ("python", "rust")
#: Python packages the memory-cache modules import at import time (the `sglang-cpu` extra).
EXTRA = "kvcanary[sglang-cpu]"
#: Packages only touched at import time by SGLang's model configs: a stand-in is enough.
#: (compressed-tensors requires torch: as a real dependency of the extra it would pull a CUDA
#: build of torch into an environment that has none.)
_STANDINS = ("torchvision", "IPython", "compressed_tensors")
#: Where kv canary lives (0.5.20 and later; 0.5.13 - 0.5.16).
_CANARY_DIRS = ("kernels/ops/kv_canary", "jit_kernel/kv_canary")
_TREE = "srt/mem_cache/unified_radix_cache.py"


class SGLangUnavailableError(KvcanaryError):
    """The SGLang asked for cannot run here: not an SGLang tree, no kv canary, a missing
    dependency. One line, exit 2."""

    def __init__(self, message: str, *, source: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.source = source

    def subject(self) -> str | None:
        """The tree or wheel at fault, when one was named."""
        return self.source


@dataclass(frozen=True)
class SGLangTree:
    """An SGLang found on disk: `root` is the folder holding the `sglang/` package."""

    root: Path
    version: str
    #: the module path of kv canary's planner package
    canary_module: str


def _cache_dir() -> Path:
    base = os.environ.get("KVCANARY_CACHE") or Path.home() / ".cache" / "kvcanary"
    return Path(base) / "sglang-trees"


def _unpack_wheel(wheel: Path) -> Path:
    """The wheel unpacked once into kvcanary's cache (a marker file says it is complete)."""
    target = _cache_dir() / wheel.stem
    marker = target / ".kvcanary-unpacked"
    if marker.is_file():
        return target
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.startswith("sglang")]
            if not any(n.startswith("sglang/") for n in names):
                raise SGLangUnavailableError(
                    "this wheel holds no sglang package", source=str(wheel)
                )
            archive.extractall(target, members=names)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SGLangUnavailableError(
            f"cannot unpack the wheel ({type(exc).__name__}: {exc})", source=str(wheel)
        ) from None
    marker.write_text("ok\n")
    return target


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
                hint="install it, or give --sglang-tree PATH (a source tree or a release wheel)",
            )
        root = Path(places[0]).parent
        label = str(places[0])
    else:
        path = Path(source).expanduser()
        label = str(source)
        if path.is_file() and path.suffix == ".whl":
            root = _unpack_wheel(path)
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
        else:
            raise SGLangUnavailableError(
                "not an SGLang tree: neither a folder nor a .whl file", source=label
            )
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
    return SGLangTree(
        root=root, version=version, canary_module="sglang." + canary[0].replace("/", ".")
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
    runtime_context: Any
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
    #: the tree cores this install can run
    cores: tuple[str, ...]


#: The modules `load_sglang` imports, by field.
_MODULES = {
    "server_args": "sglang.srt.server_args",
    "runtime_context": "sglang.srt.runtime_context",
    "memory_pool": "sglang.srt.mem_cache.memory_pool",
    "swa_memory_pool": "sglang.srt.mem_cache.swa_memory_pool",
    "swa_allocator": "sglang.srt.mem_cache.allocator.swa",
    "cache_init_params": "sglang.srt.mem_cache.cache_init_params",
    "unified_radix_cache": "sglang.srt.mem_cache.unified_radix_cache",
    "component_type": "sglang.srt.mem_cache.unified_cache.component_type",
    "schedule_batch": "sglang.srt.managers.schedule_batch",
    "schedule_policy": "sglang.srt.managers.schedule_policy",
    "common": "sglang.srt.mem_cache.common",
    "allocation": "sglang.srt.mem_cache.allocation",
    "sampling_params": "sglang.srt.sampling.sampling_params",
}
_CHECKER = "sglang.srt.managers.scheduler_components.invariant_checker"

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


def load_sglang(source: str | Path | None = None) -> SGLangModules:
    """Import SGLang's memory-cache stack from `source` (see `find_tree`), once per process."""
    tree = find_tree(source)
    key = str(tree.root.resolve())
    if key in _LOADED:
        return _LOADED[key]
    loaded = sys.modules.get("sglang")
    paths = [str(Path(p).resolve()) for p in getattr(loaded, "__path__", None) or []]
    if loaded is not None and paths[:1] != [str((tree.root / "sglang").resolve())]:
        raise SGLangUnavailableError(
            f"another SGLang is already imported in this process ({paths[:1] or loaded!r})",
            source=str(source or tree.root),
        )
    if loaded is None:
        _register_bare_package(tree.root)
    _prepare_imports()
    modules: dict[str, Any] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "only CUDA supports ..." at import, on CPU
            for field, name in _MODULES.items():
                modules[field] = importlib.import_module(name)
            try:
                modules["invariant_checker"] = importlib.import_module(_CHECKER)
            except ImportError:
                modules["invariant_checker"] = None
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        if missing.startswith("sglang"):
            raise SGLangUnavailableError(
                f"SGLang {tree.version} lacks the module {missing} this stack needs",
                source=str(source or tree.root),
            ) from None
        raise SGLangUnavailableError(
            f"SGLang {tree.version} needs the Python package {missing!r} at import",
            source=str(source or tree.root),
            hint=f"pip install '{EXTRA}'",
        ) from None
    except ImportError as exc:
        raise SGLangUnavailableError(
            f"SGLang {tree.version} does not import here ({type(exc).__name__}: {exc})",
            source=str(source or tree.root),
            hint=f"pip install '{EXTRA}'",
        ) from None
    cores = ["python"]
    if importlib.util.find_spec("sglang.srt.mem_cache.rust_tree_core.mem_cache") is not None:
        cores.append("rust")
    result = SGLangModules(tree=tree, cores=tuple(cores), **modules)
    _LOADED[key] = result
    return result


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

    @classmethod
    def pressured(cls, page_size: int, core: str) -> StackSpec:
        """The shape soak runs: pools small enough for the random workload to bring eviction,
        retraction and tombstones within a few dozen steps."""
        return cls(
            page_size=page_size,
            core=core,
            full_tokens=384,
            swa_tokens=192,
            max_reqs=12,
            window=16,
            chunked_prefill_size=32,
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


def build_stack(modules: SGLangModules, spec: StackSpec) -> Stack:
    """Build the pools, the allocator and the tree on CPU, in the scheduler's order."""
    import torch

    if spec.core not in modules.cores:
        raise SGLangUnavailableError(
            f"tree core {spec.core!r} is not available in SGLang {modules.tree.version} "
            f"(available: {', '.join(modules.cores)})"
        )
    rc = modules.runtime_context
    server_args = modules.server_args.ServerArgs(
        model_path="dummy",
        page_size=spec.page_size,
        device="cpu",
        attention_backend="torch_native",
        chunked_prefill_size=spec.chunked_prefill_size,
        disable_overlap_schedule=True,
    )
    rc.reset_context()
    rc.publish(server_args, role="scheduler")
    req_to_token_pool = modules.memory_pool.ReqToTokenPool(
        size=spec.max_reqs,
        max_context_len=spec.max_context_len,
        device="cpu",
        enable_memory_saver=False,
    )
    kv_pool = modules.swa_memory_pool.SWAKVPool(
        size=spec.full_tokens,
        size_swa=spec.swa_tokens,
        page_size=spec.page_size,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=4,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device="cpu",
    )
    allocator = modules.swa_allocator.SWATokenToKVPoolAllocator(
        spec.full_tokens,
        spec.swa_tokens,
        spec.page_size,
        torch.bfloat16,
        "cpu",
        kv_pool,
        False,
    )
    kinds = modules.component_type.ComponentType
    params = modules.cache_init_params.CacheInitParams(
        disable=False,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=spec.page_size,
        sliding_window_size=spec.window,
        chunked_prefill_size=spec.chunked_prefill_size,
        tree_components=(kinds.FULL, kinds.SWA),
        tree_core_backend=spec.core,
    )
    tree = modules.unified_radix_cache.UnifiedRadixCache(params)
    return Stack(
        modules=modules,
        spec=spec,
        server_args=server_args,
        req_to_token_pool=req_to_token_pool,
        kv_pool=kv_pool,
        allocator=allocator,
        tree=tree,
    )
