"""A stand-in for SGLang's kv-canary plan modules, written for kvcanary's tests.

`write_standin(root)` writes a package `sglang` under `root` with the module path
(`sglang.kernels.ops.kv_canary.plan.api`), the keyword-only signature of
`launch_canary_plan_kernels` and `VerifyPlan` / `WritePlan` types, plus package metadata naming a
version. Its launcher is our own plain reading of docs/semantics.md §1.2 with REF's behaviour
(raise at the first bad read); options make it drift the ways a newer SGLang could. None of
this is SGLang's code.

`standin` (a fixture factory, see `install`) puts such a tree on `sys.path` for one test and
removes every `sglang` module afterwards.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

VERSION = "0.5.23+standin"

_PLANS = """
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class {name}:
{fields}

    @classmethod
    def allocate(cls, *, {capacity}: int, device: torch.device) -> "{name}":
        if {capacity} <= 0:
            raise ValueError("capacity must be positive")
        return cls(
{allocations}
        )
"""

_API = """
from __future__ import annotations

import torch

from sglang.kernels.ops.kv_canary.verify import VerifyPlan
from sglang.kernels.ops.kv_canary.write import WritePlan

{import_error}


def launch_canary_plan_kernels(
    *,
    verify_plan_out,
    write_plan_out,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    swa_window_size,
    full_to_swa_index_mapping,
    verify_capacity,
    req_to_verify_expected_tokens,
    req_to_verify_expected_tokens_valid_lens,
    {last_argument}
):
    if swa_window_size > 0 and full_to_swa_index_mapping is None:
        raise ValueError("stand-in: a window needs the LUT")
    if int(verify_plan_out.verify_slot_indices.shape[0]) != verify_capacity:
        raise ValueError("stand-in: capacity mismatch")
    offset = {offset}
    lut = None if full_to_swa_index_mapping is None else full_to_swa_index_mapping.tolist()

    def translate(slot):
        if lut is None or slot < 0:
            return slot
        if slot >= len(lut):
            {on_big_slot}
        return lut[slot]

    rows = req_pool_indices.tolist()
    prefix = prefix_lens.tolist()
    extend = extend_seq_lens.tolist()
    pool = req_to_verify_expected_tokens
    valid = req_to_verify_expected_tokens_valid_lens
    entries = []
    for r, rp in enumerate(rows):
        if rp == 0:
            continue
        start = max(0, prefix[r] - swa_window_size) if swa_window_size > 0 else 0
        for pos in range(start, prefix[r]):
            slot = translate(int(req_to_token[rp, pos]))
            prev = translate(int(req_to_token[rp, pos - 1])) if pos > 0 else -1
            token = -1
            if pool is not None and 0 <= pos + offset < int(valid[r]):
                token = int(pool[rp, pos + offset])
            entries.append((slot, token, pos, prev))
    overflow = len(entries) > verify_capacity
    if entries and not overflow:
        columns = torch.tensor(entries, dtype=torch.int64).T
        verify_plan_out.verify_slot_indices[: len(entries)] = columns[0]
        verify_plan_out.verify_expected_tokens[: len(entries)] = columns[1]
        verify_plan_out.verify_expected_positions[: len(entries)] = columns[2]
        verify_plan_out.verify_prev_slot_indices[: len(entries)] = columns[3]
    capacity = int(write_plan_out.write_seed_slot_indices.shape[0])
    lengths = [e if rp != 0 and e > 0 else 0 for rp, e in zip(rows, extend)]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    write_plan_out.write_offsets.zero_()
    kept = offsets[: capacity + 1]
    write_plan_out.write_offsets[: len(kept)] = torch.tensor(kept, dtype=torch.int64)
    for r in range(min(len(rows), capacity)):
        seed = -1
        if rows[r] != 0 and extend[r] > 0 and prefix[r] > 0:
            seed = translate(int(req_to_token[rows[r], prefix[r] - {seed_back}]))
        write_plan_out.write_seed_slot_indices[r] = seed
    write_plan_out.write_num_valid_reqs.fill_(len(rows))
    verify_plan_out.verify_num_valid.fill_(verify_capacity if overflow else len(entries))
    verify_plan_out.enable.fill_(0 if overflow else 1)
"""

_RAISE = (
    'raise ValueError(f"kv-canary: SWA slot {slot} is outside full_to_swa_index_mapping '
    'length {len(lut)}")'
)
_CLAMP = "slot = len(lut) - 1"


def _plans(name: str, capacity: str, fields: dict[str, str]) -> str:
    return _PLANS.format(
        name=name,
        capacity=capacity,
        fields="\n".join(f"    {f}: torch.Tensor" for f in fields),
        allocations="\n".join(f"            {f}={expr}," for f, expr in fields.items()),
    )


#: A radix cache module: the class SGLang builds one tree of per scheduler, with what
#: `capture.tree` reads (its pool, the slots it holds).
_TREE = """
class {name}:
    \"\"\"Stand-in radix cache: holds the slots it is given.\"\"\"

    def __init__(self, params):
        if params.held is None:
            raise ValueError("stand-in: a tree needs its slots")
        self.req_to_token_pool = params.req_to_token_pool
        self.held = list(params.held)

    def all_values_flatten(self):
        return list(self.held)
"""

#: Radix cache modules by the `tree` option of `write_standin` (capture.tree's names).
TREE_MODULES = {
    "unified": ("unified_radix_cache", "UnifiedRadixCache"),
    "swa": ("swa_radix_cache", "SWARadixCache"),
    "radix": ("radix_cache", "RadixCache"),
}


def write_standin(
    root: Path,
    *,
    version: str | None = VERSION,
    drop_argument: bool = False,
    clamp: bool = False,
    seed_back: int = 1,
    import_error: bool = False,
    launcher: bool = True,
    trees: tuple[str, ...] = (),
) -> Path:
    """Write the stand-in package under `root` and return `root` (the sys.path entry).

    `drop_argument` removes `kv_token_id_vs_position_offset` from the signature; `clamp`
    makes it clamp slots >= lut_len like the GPU instead of raising; `seed_back=2` reads the
    wrong seed cell; `import_error` makes the plan module fail to import; `launcher=False`
    writes the package without any kv-canary module (an SGLang from before the canary);
    `trees` adds radix cache modules (`TREE_MODULES`) under `sglang.srt.mem_cache`.
    """
    package = root / "sglang"
    canary = package / "kernels" / "ops" / "kv_canary"
    cache = package / "srt" / "mem_cache"
    folders = [package, package / "kernels", package / "kernels" / "ops"]
    folders += [package / "srt", cache] if trees else []
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text('"""Stand-in package level."""\n')
    for kind in trees:
        module, name = TREE_MODULES[kind]
        (cache / f"{module}.py").write_text(_TREE.format(name=name))
    if version is not None:
        info = root / f"sglang-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    if not launcher:
        return root
    (canary / "plan").mkdir(parents=True, exist_ok=True)
    (canary / "__init__.py").write_text('"""Stand-in kv canary."""\n')
    empty = "torch.empty({size}, dtype=torch.{dtype}, device=device)"
    i64 = empty.format(size="verify_capacity", dtype="int64")
    (canary / "verify.py").write_text(
        _plans(
            "VerifyPlan",
            "verify_capacity",
            {
                "verify_slot_indices": i64,
                "verify_expected_tokens": i64,
                "verify_expected_positions": i64,
                "verify_prev_slot_indices": i64,
                "verify_num_valid": empty.format(size=1, dtype="int32"),
                "enable": "torch.ones(1, dtype=torch.int32, device=device)",
            },
        )
    )
    (canary / "write.py").write_text(
        _plans(
            "WritePlan",
            "write_req_capacity",
            {
                "write_offsets": empty.format(size="write_req_capacity + 1", dtype="int64"),
                "write_seed_slot_indices": empty.format(size="write_req_capacity", dtype="int64"),
                "write_num_valid_reqs": empty.format(size=1, dtype="int32"),
            },
        )
    )
    (canary / "plan" / "__init__.py").write_text('"""Stand-in plan package."""\n')
    api = _API.format(
        import_error='raise RuntimeError("stand-in: CUDA driver missing")' if import_error else "",
        last_argument="" if drop_argument else "kv_token_id_vs_position_offset,",
        offset="0" if drop_argument else "kv_token_id_vs_position_offset",
        on_big_slot=_CLAMP if clamp else _RAISE,
        seed_back=seed_back,
    )
    (canary / "plan" / "api.py").write_text(textwrap.dedent(api))
    return root


def forget_sglang() -> None:
    """Drop every imported `sglang` module, so the next import reads the current sys.path."""
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@contextmanager
def installed(monkeypatch: pytest.MonkeyPatch, root: Path) -> Iterator[Path]:
    """`root` on sys.path (first) for the duration; every `sglang` module forgotten after."""
    forget_sglang()
    monkeypatch.syspath_prepend(str(root))
    try:
        yield root
    finally:
        forget_sglang()
