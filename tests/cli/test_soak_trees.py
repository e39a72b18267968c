"""`kvcanary soak --sglang-tree` on hostile or foreign trees and wheels: small fake SGLang trees
and wheels built here (no real SGLang). Whatever the tree does at import, whatever release it is
and whatever the wheel holds, the answer is one stderr line and exit 2, never a traceback, exit 3
or a verdict (exit 0 or 1 on empty stdout), and a refused wheel leaves nothing in the cache.

The loader registers `sglang` process-wide, so a test runs the CLI in this process only inside
`own_sglang` (this test's `sglang` modules, dropped after); the ones that need a process of
their own (its exit status, a signal, torch hidden) run `python -m kvcanary_cli`, which pays
torch's import (~3 s of CPU) each time.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvcanary_cli.cli import app
from kvcanary_cli.dump.files import sha256_of
from kvcanary_cli.soak import stack
from kvcanary_cli.soak.stack import _MODULES
from tests.torch_extra import WITHOUT_TORCH, needs_torch

#: The version the fake trees declare (`sglang/_version.py`).
FAKE_VERSION = "0.4.9"
RUST = "sglang/srt/mem_cache/rust_tree_core"


def _file_of(module: str) -> str:
    return module.replace(".", "/") + ".py"


def tree_files(overrides: dict[str, str] | None = None, *, rust: bool = True) -> dict[str, str]:
    """An SGLang tree's files that find_tree accepts: every module the loader imports (empty
    unless overridden, by module name), kv canary's folder, a version, the Rust core's
    package (unless `rust` is False)."""
    # a module by the newest tree's name (the first of those a field may have), and the
    # runtime context the loader imports where the tree has one
    names = [n if isinstance(n, str) else n[0] for n in _MODULES.values()]
    files = {_file_of(name): "" for name in (*names, "sglang.srt.runtime_context")}
    files["sglang/_version.py"] = f'__version__ = "{FAKE_VERSION}"\n'
    files["sglang/kernels/ops/kv_canary/__init__.py"] = ""
    if rust:
        files[f"{RUST}/__init__.py"] = ""
        files[f"{RUST}/mem_cache.py"] = ""
    for name, text in (overrides or {}).items():
        files[_file_of(name)] = text
    return files


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _is_sglang(name: str) -> bool:
    return name == "sglang" or name.startswith("sglang.")


@pytest.fixture
def own_sglang(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test's `sglang` in this process: whatever the worker had imported (another test's
    SGLang) is put aside and back after, and whatever this test loaded is dropped, with the
    loader's cache of loaded trees and the import hooks it added."""
    kept = {name: module for name, module in sys.modules.items() if _is_sglang(name)}
    for name in kept:
        del sys.modules[name]
    monkeypatch.setattr(stack, "_LOADED", {})
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv("KVCANARY_DEBUG", raising=False)
    try:
        yield
    finally:
        for name in [name for name in sys.modules if _is_sglang(name)]:
            del sys.modules[name]
        sys.modules.update(kept)


def soak_here(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """`kvcanary soak ARGS` in this process (inside `own_sglang`), with its own cache."""
    result = CliRunner().invoke(app, ["soak", *args], env={"KVCANARY_CACHE": str(cache)})
    return subprocess.CompletedProcess(
        ["soak", *args], result.exit_code, result.stdout, result.stderr
    )


def soak(
    *args: str, cache: Path, script: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`kvcanary soak ARGS` in a subprocess with its own cache (`KVCANARY_CACHE`); with
    `script`, the same command run by that script (after it patched something)."""
    environ = {**os.environ, "KVCANARY_CACHE": str(cache), **(env or {})}
    environ.pop("KVCANARY_DEBUG", None)
    command = [sys.executable, "-m", "kvcanary_cli", "soak", *args]
    if script is not None:
        command = [sys.executable, "-c", script, "soak", *args]
    return subprocess.run(command, capture_output=True, text=True, env=environ, timeout=120)


def soak_json(tree: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`kvcanary soak --sglang-tree TREE --format json` in this process (inside `own_sglang`),
    its --out and cache under tmp_path."""
    return soak_here(
        "--sglang-tree",
        str(tree),
        "--format",
        "json",
        "--out",
        str(tmp_path / "o"),
        cache=tmp_path / "c",
    )


def assert_one_line_exit_2(run: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert run.stdout == ""  # no verdict, in any format
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "Traceback" not in run.stderr and "kvcanary bug" not in run.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# -- a module failing at import (item 3) --------------------------------------------------


@pytest.mark.parametrize(
    ("text", "module", "what"),
    [
        ('raise RuntimeError("needs CUDA")\n', "sglang.srt.server_args", "needs CUDA"),
        ("def broken(:\n    pass\n", "sglang.srt.server_args", "SyntaxError"),
        ("import sys\nsys.exit(0)\n", "sglang.srt.server_args", "SystemExit(0)"),
        (
            "class Stop(BaseException):\n    pass\n\nraise Stop('halt')\n",
            "sglang.srt.server_args",
            "Stop",
        ),
        # a module the first one imports: the one that fails is named
        ("import sglang.srt.cuda_only\n", "sglang.srt.cuda_only", "ZeroDivisionError"),
    ],
    ids=["runtime-error", "syntax-error", "sys-exit-0", "base-exception", "nested"],
)
@pytest.mark.usefixtures("own_sglang")
@pytest.mark.slow
def test_a_module_failing_at_import_is_one_line_exit_2(
    tmp_path: Path, text: str, module: str, what: str
) -> None:
    needs_torch()  # SGLang imports torch before anything of the tree runs
    files = tree_files({"sglang.srt.server_args": text})
    files["sglang/srt/cuda_only.py"] = "1 / 0\n"
    tree = write_tree(tmp_path / "tree", files)
    run = soak_json(tree, tmp_path)
    assert_one_line_exit_2(run, str(tree), module, what, FAKE_VERSION)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # a process per tree (3 s)
def test_sys_exit_at_import_is_never_a_clean_table(tmp_path: Path) -> None:
    """The same refusal in the table format, by a process of its own: its exit status (exit 0
    with no output read as clean before)."""
    needs_torch()  # SGLang imports torch before anything of the tree runs
    tree = write_tree(
        tmp_path / "tree", tree_files({"sglang.srt.mem_cache.memory_pool": "raise SystemExit(0)\n"})
    )
    run = soak("--sglang-tree", str(tree), "--out", str(tmp_path / "o"), cache=tmp_path / "c")
    assert_one_line_exit_2(run, str(tree), "sglang.srt.mem_cache.memory_pool", "SystemExit(0)")


#: A config module as 0.5.13 - 0.5.19 write theirs: a name transformers now ships ("bert"),
#: registered without exist_ok, and one it does not, beside it.
_CLASHING_CONFIG = """from transformers import AutoConfig, PretrainedConfig


class ClashingConfig(PretrainedConfig):
    model_type = "bert"


class OwnConfig(PretrainedConfig):
    model_type = "kvcanary_own_type"


AutoConfig.register("bert", ClashingConfig)
AutoConfig.register("kvcanary_own_type", OwnConfig)
"""


def test_a_model_type_transformers_already_ships_is_tolerated_at_import(
    tmp_path: Path, own_sglang: None
) -> None:
    """0.5.17 - 0.5.19's `configs/qwen3_asr.py` registers `qwen3_asr` without `exist_ok`, a
    name transformers 5 ships: their import failed ("already used by a Transformers config").
    Now transformers' own config stays, SGLang's other names register, and once the tree is
    loaded transformers raises for a clash again (only soak's import was tolerant)."""
    needs_torch()  # SGLang imports torch before anything of the tree runs
    from transformers import AutoConfig, BertConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    files = tree_files({"sglang.srt.configs.clashing": _CLASHING_CONFIG})
    files["sglang/srt/server_args.py"] = "import sglang.srt.configs.clashing\n"
    try:
        modules = stack.load_sglang(write_tree(tmp_path / "tree", files))
        assert modules.tree.version == FAKE_VERSION
        own = sys.modules["sglang.srt.configs.clashing"].OwnConfig
        assert CONFIG_MAPPING["bert"] is BertConfig
        assert CONFIG_MAPPING["kvcanary_own_type"] is own

        again = type("Again", (PretrainedConfig,), {"model_type": "bert"})
        with pytest.raises(ValueError, match="already used"):
            AutoConfig.register("bert", again)
    finally:
        CONFIG_MAPPING._extra_content.pop("kvcanary_own_type", None)


# -- a tree of another release (item 4) ---------------------------------------------------


def test_a_tree_without_the_rust_core_runs_the_python_core_and_says_so(
    tmp_path: Path, own_sglang: None
) -> None:
    """Older trees have no `rust_tree_core`: the Python core, and a note naming what is missing
    (looking for the Rust core raised before)."""
    needs_torch()  # SGLang imports torch before anything of the tree runs
    modules = stack.load_sglang(write_tree(tmp_path / "tree", tree_files(rust=False)))
    assert modules.cores == ("python",)
    notes = modules.notes
    assert len(notes) == 1 and "Rust tree core" in notes[0] and "Python" in notes[0], notes
    # its twin with the Rust core: both cores, nothing to say (one SGLang per process)
    for name in [name for name in sys.modules if _is_sglang(name)]:
        del sys.modules[name]
    modules = stack.load_sglang(write_tree(tmp_path / "with-rust", tree_files()))
    assert (modules.cores, modules.notes) == (("python", "rust"), ())


@pytest.mark.usefixtures("own_sglang")
def test_asking_for_the_missing_rust_core_is_one_line_exit_2(tmp_path: Path) -> None:
    needs_torch()  # SGLang imports torch before anything of the tree runs
    tree = write_tree(tmp_path / "tree", tree_files(rust=False))
    run = soak_here(
        "--sglang-tree",
        str(tree),
        "--core",
        "rust",
        "--out",
        str(tmp_path / "o"),
        cache=tmp_path / "c",
    )
    assert_one_line_exit_2(run, "--core", "rust", "rust_tree_core")


_FITTING_ARGS = "class ServerArgs:\n    def __init__(self, **kwargs):\n        pass\n"
_CONTEXT = "def reset_context():\n    pass\n\n\ndef publish(*args, **kwargs):\n    pass\n"


@pytest.mark.parametrize(
    ("overrides", "what"),
    [
        (
            {
                "sglang.srt.server_args": "class ServerArgs:\n"
                "    def __init__(self, model, *, page_size):\n        pass\n"
            },
            "ServerArgs",
        ),
        (
            {
                "sglang.srt.server_args": _FITTING_ARGS,
                "sglang.srt.runtime_context": _CONTEXT,
                "sglang.srt.mem_cache.memory_pool": "class ReqToTokenPool:\n"
                "    def __init__(self, size, device):\n        pass\n",
            },
            "ReqToTokenPool",
        ),
        ({"sglang.srt.server_args": _FITTING_ARGS}, "reset_context"),
    ],
    ids=["server-args", "req-to-token-pool", "runtime-context"],
)
@pytest.mark.usefixtures("own_sglang")
def test_a_release_whose_constructors_differ_is_one_line_exit_2(
    tmp_path: Path, overrides: dict[str, str], what: str
) -> None:
    """Another release's ServerArgs, pools or context (a TypeError, an AttributeError): what
    did not fit, the tree, its version and the release soak drives."""
    needs_torch()  # SGLang imports torch before anything of the tree runs
    tree = write_tree(tmp_path / "tree", tree_files(overrides))
    run = soak_json(tree, tmp_path)
    assert_one_line_exit_2(run, str(tree), what, FAKE_VERSION, "0.5.23")


def test_a_tree_without_tree_components_is_refused_before_import(tmp_path: Path) -> None:
    """A UnifiedRadixCache with neither the tree core's components (`unified_cache`, 0.5.17
    on) nor the components the tree holds itself (`unified_cache_components`, 0.5.13 -
    0.5.16): one line naming the release, before any of its modules runs."""
    files = {k: v for k, v in tree_files().items() if "/unified_cache/" not in k}
    files["sglang/srt/server_args.py"] = "raise RuntimeError('imported')\n"
    tree = write_tree(tmp_path / "tree", files)
    run = soak_json(tree, tmp_path)
    assert_one_line_exit_2(
        run,
        str(tree),
        FAKE_VERSION,
        "unified_cache_components",
        "0.5.13",
        "its dumps are read all the same",
    )


# -- wheels (item 5) ----------------------------------------------------------------------

WHEEL_NAME = f"sglang-{FAKE_VERSION}-py3-none-any.whl"
#: a module's text long enough to deflate into a real stream
_LONG = "".join(f"VALUE_{i} = {i * 7919 % 1000}\n" for i in range(400))


def write_wheel(path: Path, files: dict[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"sglang-{FAKE_VERSION}.dist-info/METADATA", "Name: sglang\n")
    return path


def _patch(path: Path, member: str, *, local: dict[int, bytes], central: dict[int, bytes]) -> None:
    """Overwrite fields of `member`'s local header (offsets from it) and central entry."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
        start_dir = archive.start_dir
    data = bytearray(path.read_bytes())
    for offset, value in local.items():
        at = info.header_offset + offset
        data[at : at + len(value)] = value
    entry = data.index(member.encode(), start_dir) - 46
    assert data[entry : entry + 4] == b"PK\x01\x02"
    for offset, value in central.items():
        data[entry + offset : entry + offset + len(value)] = value
    path.write_bytes(bytes(data))


def _stream_start(path: Path, member: str) -> int:
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    data = path.read_bytes()
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    return int(info.header_offset + 30 + name_len + extra_len)


def _corrupt_deflate(path: Path, member: str) -> None:
    at = _stream_start(path, member)
    data = bytearray(path.read_bytes())
    data[at : at + 8] = b"\xff" * 8  # a reserved block type
    path.write_bytes(bytes(data))


def _unknown_method(path: Path, member: str) -> None:
    method = struct.pack("<H", 99)
    _patch(path, member, local={8: method}, central={10: method})


def _encrypted(path: Path, member: str) -> None:
    with zipfile.ZipFile(path) as archive:
        flags = struct.pack("<H", int(archive.getinfo(member).flag_bits) | 0x1)
    _patch(path, member, local={6: flags}, central={8: flags})


def _lying_size(path: Path, member: str) -> None:
    """Declares 100 bytes for a stream that inflates to several thousand."""
    size = struct.pack("<I", 100)
    _patch(path, member, local={22: size}, central={24: size})


def cache_entries(cache: Path) -> list[str]:
    trees = cache / "sglang-trees"
    return sorted(p.name for p in trees.iterdir()) if trees.is_dir() else []


@pytest.mark.parametrize(
    "damage",
    [_corrupt_deflate, _unknown_method, _encrypted, _lying_size],
    ids=["corrupt-deflate", "unknown-method", "encrypted", "lying-size"],
)
@pytest.mark.usefixtures("own_sglang")
def test_a_damaged_wheel_is_one_line_exit_2_and_leaves_nothing(
    tmp_path: Path, damage: Callable[[Path, str], None]
) -> None:
    member = _file_of("sglang.srt.server_args")
    wheel = write_wheel(tmp_path / WHEEL_NAME, tree_files({"sglang.srt.server_args": _LONG}))
    damage(wheel, member)
    run = soak_json(wheel, tmp_path)
    assert_one_line_exit_2(run, str(wheel), "cannot unpack")
    assert cache_entries(tmp_path / "c") == []


@pytest.mark.usefixtures("own_sglang")
def test_a_wheel_refused_as_a_tree_leaves_nothing(tmp_path: Path) -> None:
    """Unpacked, then checked: no kv canary. The staged tree is not kept."""
    files = tree_files()
    del files["sglang/kernels/ops/kv_canary/__init__.py"]
    wheel = write_wheel(tmp_path / WHEEL_NAME, files)
    run = soak_here("--sglang-tree", str(wheel), "--out", str(tmp_path / "o"), cache=tmp_path / "c")
    assert_one_line_exit_2(run, str(wheel), "no kv canary")
    assert cache_entries(tmp_path / "c") == []


@pytest.mark.usefixtures("own_sglang")
def test_a_zip_bomb_is_refused_before_it_inflates(tmp_path: Path) -> None:
    """8 MB of a module deflated into a few KB: more than the bound the wheel's real size
    sets; refused before anything is written, and nothing stays in the cache."""
    files = tree_files({"sglang.srt.server_args": 'raise RuntimeError("unpacked")\n'})
    files["sglang/srt/mem_cache/padding.py"] = "#" * (8 << 20)
    wheel = write_wheel(tmp_path / WHEEL_NAME, files)
    assert wheel.stat().st_size < 64 << 10
    run = soak_here("--sglang-tree", str(wheel), "--out", str(tmp_path / "o"), cache=tmp_path / "c")
    assert_one_line_exit_2(run, str(wheel), "unpack")
    assert cache_entries(tmp_path / "c") == []


@pytest.mark.usefixtures("own_sglang")
def test_the_cache_is_keyed_by_content_not_by_the_file_name(tmp_path: Path) -> None:
    """Two different wheels under one file name: the second runs its own code; native
    extensions soak never loads stay packed (the Rust tree core's is unpacked); no staging
    folder is left."""
    needs_torch()  # SGLang imports torch before anything of the tree runs
    wheel = tmp_path / "wheels" / WHEEL_NAME
    cache = tmp_path / "c"
    for label in ("tree A", "tree B"):
        files = tree_files({"sglang.srt.server_args": f'raise RuntimeError("{label}")\n'})
        files["sglang/srt/rust_extensions/_server.so"] = "not loaded by soak\n"
        files[f"{RUST}/mem_cache.so"] = "the Rust tree core\n"
        write_wheel(wheel, files)
        run = soak_here("--sglang-tree", str(wheel), "--out", str(tmp_path / "o"), cache=cache)
        assert_one_line_exit_2(run, str(wheel), label)
    entries = cache_entries(cache)
    assert len(entries) == 2 and not any(name.startswith(".") for name in entries), entries
    assert not list(cache.rglob("_server.so"))
    assert len(list(cache.rglob("mem_cache.so"))) == 2


def test_a_process_hashes_a_wheel_once_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache key is the wheel's content: hashed once per process for the same file (a
    vLLM wheel is hundreds of MB), and again once its bytes are rewritten, even in place and
    at the same size (its change time moves)."""
    from kvcanary_cli.soak import wheel as wheels

    hashed: list[str] = []

    def counted(handle: Any) -> str:
        hashed.append(digest := sha256_of(handle))
        return digest

    monkeypatch.setattr(wheels, "sha256_of", counted)
    monkeypatch.setattr(wheels, "_DIGESTS", {})
    path = write_wheel(tmp_path / WHEEL_NAME, {"sglang/a.py": "A = 1\n"})

    def unpack() -> Path:
        return wheels.unpack_wheel(path, tmp_path / "c", wanted=lambda _: True, check=print)

    first = unpack()
    assert unpack() == first and len(hashed) == 1
    time.sleep(0.05)  # file times tick coarsely (a jiffy): the rewrite's must differ
    other = write_wheel(tmp_path / "other" / WHEEL_NAME, {"sglang/a.py": "A = 2\n"}).read_bytes()
    assert len(other) == path.stat().st_size
    with path.open("r+b") as handle:  # same inode, same size, other bytes
        handle.write(other)
    second = unpack()
    assert len(hashed) == 2 and hashed[0] != hashed[1] and second != first


_INTERRUPTED_UNPACK = """
import os, runpy, signal, sys, zipfile

number = int(os.environ["KVCANARY_TEST_SIGNAL"])
read = zipfile.ZipExtFile.read
# what this process inherited from the test's (in the failure message), then Ctrl-C and
# SIGTERM as a terminal's process starts with them: an ignored or blocked signal is
# inherited through exec, and a test process may hold one from an earlier test
blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
print("inherited:", signal.getsignal(number), blocked, file=sys.stderr)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)


def interrupted(self, *args):
    os.kill(os.getpid(), number)
    return read(self, *args)


zipfile.ZipExtFile.read = interrupted
sys.argv[0] = "kvcanary"
runpy.run_module("kvcanary_cli", run_name="__main__")
"""


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.slow
def test_a_signal_while_unpacking_leaves_nothing(tmp_path: Path, number: int) -> None:
    wheel = write_wheel(tmp_path / WHEEL_NAME, tree_files())
    run = soak(
        "--sglang-tree",
        str(wheel),
        "--out",
        str(tmp_path / "o"),
        cache=tmp_path / "c",
        script=_INTERRUPTED_UNPACK,
        env={"KVCANARY_TEST_SIGNAL": str(int(number))},
    )
    assert run.returncode in (130, -int(number), 128 + int(number)), (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr
    assert cache_entries(tmp_path / "c") == []


def test_a_failed_import_leaves_no_sglang_behind(tmp_path: Path, own_sglang: None) -> None:
    """In one process (the API): after a tree that fails at import, another tree loads (it was
    refused as 'another SGLang is already imported' when the half-import stayed)."""
    needs_torch()  # SGLang imports torch before anything of the tree runs
    broken = tree_files({"sglang.srt.mem_cache.memory_pool": "raise RuntimeError('no')\n"})
    bad = write_tree(tmp_path / "bad", broken)
    good = write_tree(tmp_path / "good", tree_files())
    with pytest.raises(
        stack.SGLangUnavailableError, match=r"sglang\.srt\.mem_cache\.memory_pool fails at import"
    ):
        stack.load_sglang(bad)
    assert [name for name in sys.modules if _is_sglang(name)] == []
    assert stack.load_sglang(good).cores == ("python", "rust")


def test_an_exit_of_sglang_while_a_history_runs_is_refused(tmp_path: Path) -> None:
    """The run-time twin of sys.exit at import: raised by the tree's code inside a soak
    history, it is an error naming the module, never the process's exit; Ctrl-C, and an exit
    raised by code outside the tree, pass as they are."""
    import importlib.util
    from types import SimpleNamespace

    from kvcanary_cli.soak.stack import SGLangUnavailableError, find_tree, refusing_sglang_exits

    files = tree_files()
    files["sglang/srt/exiting.py"] = (
        "import sys\n\n\ndef exit_now():\n    sys.exit(0)\n\n\n"
        "def interrupt():\n    raise KeyboardInterrupt\n"
    )
    tree = find_tree(write_tree(tmp_path / "tree", files))
    spec = importlib.util.spec_from_file_location("exiting", tree.root / "sglang/srt/exiting.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    @refusing_sglang_exits
    def history(modules: object, step: Callable[[], None]) -> None:
        step()

    modules: object = SimpleNamespace(tree=tree)
    with pytest.raises(
        SGLangUnavailableError, match=r"sglang\.srt\.exiting raises SystemExit\(0\)"
    ):
        history(modules, module.exit_now)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        history(modules, module.interrupt)  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        history(modules, lambda: sys.exit(0))  # type: ignore[arg-type]


def test_soak_without_torch_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    """Without torch every tree fails at its first import: that is torch's absence, not the
    tree's fault (once: "module sglang.srt.server_args fails at import", after transformers'
    own complaint on stderr)."""
    tree = write_tree(tmp_path / "tree", tree_files({}))
    script = WITHOUT_TORCH + "from kvcanary_cli.cli import main\nmain(sys.argv[1:])\n"
    run = soak(
        "--sglang-tree",
        str(tree),
        "--out",
        str(tmp_path / "o"),
        cache=tmp_path / "c",
        script=script,
    )
    assert_one_line_exit_2(run, str(tree), "torch", "kvcanary[torch]")


def test_a_missing_module_names_what_installs_it(
    tmp_path: Path, own_sglang: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module of the extra missing at import: the hint names its distribution (pyzmq for
    zmq), not the whole extra."""
    needs_torch()
    tree = write_tree(tmp_path / "tree", tree_files({"sglang.srt.server_args": "import zmq\n"}))
    monkeypatch.setitem(sys.modules, "zmq", None)
    run = soak_here("--sglang-tree", str(tree), "--out", str(tmp_path / "o"), cache=tmp_path / "c")
    assert_one_line_exit_2(run, str(tree), "'zmq'", "pip install pyzmq (it is in kvcanary[sglang")


def test_a_module_outside_the_extra_is_said_to_be_outside_it(tmp_path: Path) -> None:
    from kvcanary_cli.soak.stack import _import_refusal, find_tree

    tree = find_tree(write_tree(tmp_path / "tree", tree_files({})))
    try:
        import kvc_no_such_module  # noqa: F401
    except ModuleNotFoundError as exc:
        refusal = _import_refusal(exc, tree, "sglang.srt.server_args")
    assert refusal is not None and refusal.hint is not None
    assert "'kvc_no_such_module'" in str(refusal)
    assert "provides the module 'kvc_no_such_module'" in refusal.hint
    assert "does not list it" in refusal.hint


@pytest.mark.parametrize(
    ("engine", "given", "folder"),
    [
        ("sglang", "wheels/sglang-0.5.23-*.whl", "wheels"),  # the shell left an unmatched glob
        ("sglang", "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", "."),
        ("sglang", "~/src/no-such-sglang", "wheels"),
        ("vllm", "dl/vllm-0.33.0-*.whl", "dl"),
    ],
)
def test_a_tree_that_is_not_there_names_the_wheels_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, given: str, folder: str
) -> None:
    """The README's route run out of order (soak before `pip download`, or the download
    failed offline): the line says the path is not there and how to fetch the release wheel,
    not that it is the wrong kind of tree."""
    from kvcanary_cli.errors import EngineUnavailableError
    from kvcanary_cli.soak import stack, vllm_stack

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    supported = {"sglang": stack.SUPPORTED, "vllm": vllm_stack.SUPPORTED}[engine]
    with pytest.raises(EngineUnavailableError) as raised:
        if engine == "sglang":
            stack.find_tree(given)
        else:
            vllm_stack.find_vllm_tree(given)
    said = str(raised.value)
    assert ("no file matches" if "*" in given else "no such file or folder") in said, said
    assert "not an" not in said
    assert raised.value.hint is not None
    assert f"pip download {engine}=={supported} --no-deps -d {folder}" in raised.value.hint


def test_no_sglang_installed_names_the_release_wheels_download(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Soak with no --sglang-tree and no SGLang installed: the fix is the README's wheel
    route (a plain `pip install sglang` pulls its server and a CUDA torch soak never uses)."""
    import importlib.util

    from kvcanary_cli.soak import stack

    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a)
    )
    with pytest.raises(stack.SGLangUnavailableError) as raised:
        stack.find_tree(None)
    hint = raised.value.hint or ""
    assert f"pip download sglang=={stack.SUPPORTED} --no-deps -d wheels" in hint, hint
    assert f"--sglang-tree wheels/sglang-{stack.SUPPORTED}-*.whl" in hint, hint


@pytest.fixture
def no_vllm_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process as if no vLLM were imported yet (another test's in-process vLLM is put
    back afterwards): `load_vllm` refuses a second one, which would hide the error tested, and
    its finder would answer for a module the tree tested lacks."""
    from kvcanary_cli.soak import vllm_stack

    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    others = [f for f in sys.meta_path if not isinstance(f, vllm_stack._VllmFinder)]
    monkeypatch.setattr(sys, "meta_path", others)


def test_vllm_without_torch_names_torch_not_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_vllm_loaded: None
) -> None:
    """The vllm-cpu extra leaves torch to the user (vLLM pins a CUDA one): its absence must
    name torch's own route, not the extra that does not install it."""
    import importlib.util

    from kvcanary_cli.soak import vllm_stack

    tree = write_tree(tmp_path / "tree", {"vllm/v1/core/kv_cache_manager.py": ""})
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(vllm_stack.VllmUnavailableError) as raised:
        vllm_stack.load_vllm(tree)
    assert "torch" in str(raised.value)
    hint = raised.value.hint or ""
    assert "kvcanary[torch]" in hint and "vllm-cpu" not in hint, hint


@pytest.mark.parametrize(
    ("version", "named"), [("0.9.2", True), ("0.10.0", False), ("0.34.0", False)]
)
def test_a_vllm_that_fails_to_import_says_which_releases_kvcanary_drives(
    version: str, named: bool, tmp_path: Path, no_vllm_loaded: None
) -> None:
    """An older vLLM's modules import what kvcanary's stand-ins do not offer: the one line
    names the tree's release, and the releases kvcanary drives when it is not one of them."""
    needs_torch()  # vLLM's manager imports torch
    from kvcanary_cli.soak import vllm_stack

    tree = write_tree(
        tmp_path / "tree",
        {
            "vllm/__init__.py": "",
            "vllm/v1/__init__.py": "",
            "vllm/v1/core/__init__.py": "",
            "vllm/v1/core/kv_cache_manager.py": "",
            "vllm/v1/core/kv_cache_utils.py": "from vllm.distributed import get_ep_group\n",
            f"vllm-{version}.dist-info/METADATA": f"Name: vllm\nVersion: {version}\n",
        },
    )
    with pytest.raises(vllm_stack.VllmUnavailableError) as raised:
        vllm_stack.load_vllm(tree)
    text = str(raised.value)
    assert "importing vllm.v1.core.kv_cache_utils failed" in text and f"vLLM {version}" in text
    assert ("kvcanary drives vLLM" in text) is named, text
    assert "kvcanary drives vLLM 0.10.0 to 0.34.0" in text or not named, text


@pytest.fixture
def vllm_unloaded_after(monkeypatch: pytest.MonkeyPatch, no_vllm_loaded: None) -> Iterator[None]:
    """As `no_vllm_loaded`, and the vLLM a test loads leaves the process afterwards (its
    modules, its finder, `load_vllm`'s memo), so that another test may load its own."""
    from kvcanary_cli.soak import vllm_stack

    monkeypatch.setattr(vllm_stack, "_LOADED", {})
    yield
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


#: the modules `load_vllm` imports, empty: a tree that loads
_LOADABLE = {
    f"vllm/{name}": ""
    for name in (
        "__init__.py",
        "v1/__init__.py",
        "v1/core/__init__.py",
        "v1/core/kv_cache_utils.py",
        "v1/core/block_pool.py",
        "v1/core/single_type_kv_cache_manager.py",
        "v1/core/kv_cache_coordinator.py",
        "v1/core/kv_cache_manager.py",
        "v1/kv_cache_interface.py",
        "v1/request.py",
        "sampling_params.py",
        "utils/__init__.py",
        "utils/hashing.py",
    )
}


def test_a_vllm_package_that_reexports_modules_whole_answers_their_names(
    tmp_path: Path, vllm_unloaded_after: None
) -> None:
    """vLLM 0.30.0 - 0.32.0's `vllm.distributed` re-exports its modules whole
    (`from .parallel_state import *`), and their KV-cache utilities import names from it:
    each resolves from the module that defines it, a stand-in where that module is one of
    kvcanary's (was: the import failed, and the release was refused)."""
    needs_torch()  # vLLM's manager imports torch
    from kvcanary_cli.soak import vllm_stack

    tree = write_tree(
        tmp_path / "tree",
        {
            **_LOADABLE,
            "vllm/distributed/__init__.py": (
                "from .communication_op import *\nfrom .parallel_state import *\n"
                "from .utils import *\n"
            ),
            "vllm/distributed/communication_op.py": "def reduce_all():\n    return 'op'\n",
            "vllm/distributed/utils.py": "helper = 'utils'\n",
            "vllm/v1/core/kv_cache_utils.py": (
                "from vllm.distributed import get_ep_group, helper, reduce_all\n"
            ),
        },
    )
    utils = vllm_stack.load_vllm(tree).kv_cache_utils
    assert (utils.helper, utils.reduce_all()) == ("utils", "op")
    assert utils.get_ep_group.__module__ == "vllm.distributed.parallel_state"


@pytest.mark.parametrize("split", [False, True], ids=["one-utils-module", "utils-package"])
def test_a_vllm_config_package_defining_its_own_config_answers_it_without_running(
    split: bool, tmp_path: Path, vllm_unloaded_after: None
) -> None:
    """vLLM 0.11.0's `vllm.config` defines `VllmConfig` and the functions reading the current
    configuration in its `__init__` itself (0.12.0 moved them to `vllm.config.vllm`, which
    kvcanary replaces), and that `__init__` imports the model and multimodal machinery: the
    names it defines are answered as the replaced module answers them, the `__init__` never
    runs, a name it neither defines nor imports is not there, and its re-exports still come
    from their modules. Its hash functions are in `vllm.utils` itself (was: the import failed,
    and 0.11.0 was refused); a tree that splits them out is read from its `vllm.utils.hashing`."""
    needs_torch()  # vLLM's manager imports torch
    from kvcanary_cli.soak import vllm_stack

    files = {
        **_LOADABLE,
        "vllm/utils/__init__.py": "def sha256(data):\n    return b'utils'\n",
        "vllm/config/__init__.py": (
            "import kvcanary_test_no_such_package  # the model machinery: must never run\n"
            "from vllm.config.cache import CacheConfig\n\n"
            "class VllmConfig:\n    pass\n\n"
            "def get_current_vllm_config():\n"
            "    from vllm.config import VllmConfig\n"
            "    return VllmConfig()\n"
        ),
        "vllm/config/cache.py": "class CacheConfig:\n    origin = 'cache'\n",
        "vllm/v1/kv_cache_interface.py": (
            "from vllm.config import CacheConfig, VllmConfig, get_current_vllm_config\n"
        ),
    }
    if split:
        files["vllm/utils/hashing.py"] = "def sha256(data):\n    return b'hashing'\n"
    else:
        del files["vllm/utils/hashing.py"]
    modules = vllm_stack.load_vllm(write_tree(tmp_path / "tree", files))
    interface = modules.interface
    assert interface.VllmConfig.__module__ == "vllm.config.vllm"
    with pytest.raises(RuntimeError, match="no engine configuration"):
        interface.get_current_vllm_config()
    assert interface.CacheConfig.origin == "cache"
    config = sys.modules["vllm.config"]
    assert not hasattr(config, "ModelConfig") and not hasattr(config, "kvcanary_test_no_such")
    assert modules.hashing.sha256(b"") == (b"hashing" if split else b"utils")


def test_what_a_vllm_prints_at_import_goes_to_stderr(
    tmp_path: Path, vllm_unloaded_after: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.17.x and 0.18.x log two lines about Triton at import, to standard output: they
    go to stderr, never into a report on stdout (`--format json`)."""
    needs_torch()  # vLLM's manager imports torch
    from kvcanary_cli.soak import vllm_stack

    tree = write_tree(
        tmp_path / "tree",
        {**_LOADABLE, "vllm/v1/core/kv_cache_utils.py": "print('INFO Triton is installed')\n"},
    )
    vllm_stack.load_vllm(tree)
    out, err = capsys.readouterr()
    assert "Triton" not in out and "INFO Triton is installed" in err


@pytest.mark.parametrize("unpacked", [True, False])
def test_only_a_wheel_soak_unpacked_writes_its_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unpacked: bool
) -> None:
    """A tree in soak's own cache (a wheel it unpacked) is imported writing its bytecode there,
    PYTHONDONTWRITEBYTECODE or not; the user's own tree as the interpreter's setting says; and
    the setting is back as it was once the import is over, raised or not."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KVCANARY_CACHE", str(cache))
    root = (cache / "sglang-trees" / "wheel-0") if unpacked else (tmp_path / "checkout")
    tree = stack.SGLangTree(root=root, version="0.5.23", canary_module="x", label=str(root))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    with stack._caching_bytecode(tree):
        assert sys.dont_write_bytecode is not unpacked
    assert sys.dont_write_bytecode is True
    with pytest.raises(KeyError), stack._caching_bytecode(tree):
        raise KeyError("an import failed")
    assert sys.dont_write_bytecode is True
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    with stack._caching_bytecode(tree):
        assert sys.dont_write_bytecode is False
