"""`TritonPlanner`: launches the Triton plan kernels and adapts their outputs to `Plan`.

GPU semantics (see `base`): the same plan as `TorchPlanner(semantics=Semantics.GPU)`, field by
field, computed the way production does (kv-canary-semantics.md §1.6): one offsets program
over the padded batch, then a 1-D grid over the verify entries. On a CUDA device the kernels
compile; elsewhere they run in the triton interpreter (`triton_runtime`). Inputs are copied to
the kernels' device whole, because flat addressing may read any row of `req_to_token`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from kvcanary_cli.dump import KvDump
from kvcanary_cli.planners import triton_runtime
from kvcanary_cli.planners.base import (
    Plan,
    ProblemKind,
    ProblemRole,
    ProblemTable,
    Semantics,
    failed_plan,
    gpu_launch_error,
    resolve_group,
)
from kvcanary_cli.planners.rows import check_materializable, row_problems, verify_geometry

__all__ = ["ENTRIES_PER_LAUNCH", "TritonPlanner", "bs_block"]

#: Entries one `plan_entries_kernel` launch covers; larger plans are launched in chunks.
ENTRIES_PER_LAUNCH = 1 << 24
#: Entries per program. The interpreter pays per program, so it gets large blocks.
_BLOCK_SIZE = {"compiled": 1024, "interpreter": 4096}
_MIN_BS_BLOCK = 16
_I64 = torch.int64


def bs_block(bs: int) -> int:
    """Lanes of the offsets program: the next power of two >= bs + 1 (at least 16)."""
    return max(_MIN_BS_BLOCK, 1 << bs.bit_length())


@dataclass(frozen=True, kw_only=True)
class _Inputs:
    """Kernel arguments on the kernels' device (dummies of one element for absent tensors)."""

    rpi: torch.Tensor
    prefix: torch.Tensor
    extend: torch.Tensor
    valid: torch.Tensor
    table: torch.Tensor
    table_numel: int
    lut: torch.Tensor
    lut_len: int
    pool: torch.Tensor
    pool_stride: int
    pool_numel: int


class TritonPlanner:
    """GPU-semantics planner running SGLang's plan step as Triton kernels."""

    name = "triton"
    semantics = Semantics.GPU

    def __init__(
        self, *, block_size: int | None = None, entries_per_launch: int = ENTRIES_PER_LAUNCH
    ) -> None:
        self._kernels: ModuleType = triton_runtime.load_kernels()
        #: 'compiled' (CUDA) or 'interpreter' (no CUDA, or TRITON_INTERPRET=1).
        self.mode: triton_runtime.Mode = triton_runtime.mode()
        self.device = triton_runtime.device()
        #: False when triton's standard library cannot run here (see `triton_runtime`).
        self.std_scan = triton_runtime.std_library_interpreted()
        #: entries per program of the entries kernel (a power of two).
        self.block_size = block_size or _BLOCK_SIZE[self.mode]
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 16, got {self.block_size}")
        self.entries_per_launch = max(self.block_size,
                                      entries_per_launch // self.block_size * self.block_size)

    def plan(self, dump: KvDump, group: str) -> Plan:
        """Plan `group` of `dump` with the kernels; tensors come back on the CPU."""
        window, lut = resolve_group(dump, group)
        bs = dump.bs
        capacity_given = dump.scalar("verify_capacity")
        write_capacity = dump.write_req_capacity
        error = gpu_launch_error(bs, write_capacity)
        if error:
            total = int(verify_geometry(dump, window)[1].sum())
            capacity = total if capacity_given is None else capacity_given
            return failed_plan(backend=self.name, group=group, window=window,
                               translated=lut is not None, bs=bs, verify_capacity=capacity,
                               write_req_capacity=write_capacity, launch_error=error)
        inputs = self._inputs(dump, lut)
        k = self._kernels
        block_bs = bs_block(bs)
        verify_offsets = torch.empty(bs + 1, dtype=_I64, device=self.device)
        write_offsets = torch.empty(bs + 1, dtype=_I64, device=self.device)
        seeds = torch.empty(max(bs, 1), dtype=_I64, device=self.device)
        seed_raw = torch.empty_like(seeds)
        seed_flags = torch.empty(max(bs, 1), dtype=torch.uint8, device=self.device)
        totals = torch.empty(3, dtype=_I64, device=self.device)
        k.plan_offsets_kernel[(1,)](
            inputs.rpi, inputs.prefix, inputs.extend, inputs.table, inputs.lut,
            verify_offsets, write_offsets, seeds, seed_raw, seed_flags, totals,
            bs, dump.max_seq_len, inputs.table_numel, inputs.lut_len, window,
            -1 if capacity_given is None else capacity_given,
            HAS_LUT=lut is not None, BLOCK_BS=block_bs, STD_SCAN=self.std_scan,
            num_warps=_warps(block_bs),
        )
        total, num_valid, enable = (int(v) for v in totals.cpu())
        capacity = total if capacity_given is None else capacity_given
        if enable:
            check_materializable(total)
        entries = total if enable else 0
        columns = self._entries(dump, inputs, verify_offsets, window, entries, block_bs)
        offsets_cpu = verify_offsets.cpu()
        seeds_cpu = seeds[:bs].cpu()
        seed_flags_np = seed_flags[:bs].cpu().numpy()
        problems = [
            row_problems(dump, window, offsets_cpu, gpu=True),
            _entry_lut_problems(dump, offsets_cpu, columns["position"], columns["clamp"],
                                self._kernels),
            _seed_lut_problems(dump, seed_flags_np, seed_raw[:bs].cpu().numpy(),
                               self._kernels.SEED_CLAMPED),
        ]
        return Plan(
            backend=self.name, semantics=self.semantics, group=group, window=window,
            translated=lut is not None, bs=bs, verify_capacity=capacity,
            write_req_capacity=write_capacity, total_verify=total,
            verify_num_valid=num_valid, enable=enable,
            verify_offsets=offsets_cpu, verify_slot_indices=columns["slot"],
            verify_expected_tokens=columns["token"],
            verify_expected_positions=columns["position"],
            verify_prev_slot_indices=columns["prev"], verify_undefined=columns["undefined"],
            write_offsets=write_offsets.cpu(), write_seed_slot_indices=seeds_cpu,
            seed_undefined=torch.from_numpy(
                (seed_flags_np & self._kernels.SEED_UNDEFINED).astype(bool)),
            write_num_valid_reqs=bs, problems=ProblemTable.concat(problems),
        )

    def _inputs(self, dump: KvDump, lut: torch.Tensor | None) -> _Inputs:
        dev = self.device

        def vec(t: torch.Tensor | None) -> torch.Tensor:
            if t is None or t.numel() == 0:
                return torch.zeros(1, dtype=_I64, device=dev)
            return t.to(device=dev, dtype=_I64).contiguous()

        def table(t: torch.Tensor | None) -> torch.Tensor:
            if t is None or t.numel() == 0:
                return torch.zeros(1, dtype=torch.int32, device=dev)
            return t.to(device=dev).contiguous()

        pool = dump.req_to_verify_expected_tokens
        return _Inputs(
            rpi=vec(dump.req_pool_indices), prefix=vec(dump.prefix_lens),
            extend=vec(dump.extend_seq_lens),
            valid=vec(dump.req_to_verify_expected_tokens_valid_lens),
            table=table(dump.req_to_token), table_numel=int(dump.req_to_token.numel()),
            lut=vec(lut), lut_len=0 if lut is None else int(lut.shape[0]),
            pool=table(pool), pool_stride=0 if pool is None else int(pool.shape[1]),
            pool_numel=0 if pool is None else int(pool.numel()),
        )

    def _entries(
        self, dump: KvDump, inputs: _Inputs, verify_offsets: torch.Tensor, window: int,
        entries: int, block_bs: int,
    ) -> dict[str, torch.Tensor]:
        """Launch the entries kernel over `[0, entries)` in chunks; CPU columns back."""
        dev = self.device
        out = {name: torch.empty(entries, dtype=_I64, device=dev)
               for name in ("slot", "prev", "token", "position")}
        out["undefined"] = torch.empty(entries, dtype=torch.uint8, device=dev)
        out["clamp"] = torch.empty(entries, dtype=torch.uint8, device=dev)
        has_pool = (dump.req_to_verify_expected_tokens is not None
                    and dump.req_to_verify_expected_tokens_valid_lens is not None)
        for start in range(0, entries, self.entries_per_launch):
            stop = min(entries, start + self.entries_per_launch)
            grid = (_cdiv(stop - start, self.block_size),)
            self._kernels.plan_entries_kernel[grid](
                inputs.rpi, inputs.prefix, inputs.valid, inputs.table, inputs.lut, inputs.pool,
                verify_offsets, out["slot"], out["prev"], out["token"], out["position"],
                out["undefined"], out["clamp"],
                start, stop, dump.bs, dump.max_seq_len, inputs.table_numel, inputs.lut_len,
                window, inputs.pool_stride, inputs.pool_numel, dump.token_offset,
                HAS_LUT=inputs.lut_len > 0, HAS_POOL=has_pool, BLOCK_BS=block_bs,
                SEARCH_STEPS=block_bs.bit_length() - 1, BLOCK_SIZE=self.block_size,
            )
        return {name: t.cpu() for name, t in out.items()}


def _cdiv(n: int, d: int) -> int:
    """Ceiling division (`triton.cdiv`; triton is only imported by `triton_runtime`)."""
    return -(-n // d)


def _warps(lanes: int) -> int:
    return 4 if lanes <= 1024 else 8 if lanes <= 4096 else 16


def _entry_lut_problems(
    dump: KvDump, offsets: torch.Tensor, positions: torch.Tensor, clamp: torch.Tensor,
    kernels: ModuleType,
) -> ProblemTable:
    """LUT_OUT_OF_RANGE for every clamped verify or prev slot the entries kernel flagged."""
    flags = clamp.numpy()
    flagged = np.flatnonzero(flags)
    if flagged.size == 0:
        return ProblemTable.empty()
    rows = np.searchsorted(offsets.numpy(), flagged, side="right") - 1
    rpi = dump.req_pool_indices.numpy()[rows]
    pos = positions.numpy()[flagged]
    table = dump.req_to_token.reshape(-1)
    tables = []
    for bit, role, shift in ((kernels.CLAMP_SLOT, ProblemRole.VERIFY, 0),
                             (kernels.CLAMP_PREV, ProblemRole.CHAIN_PREV, 1)):
        hit = (flags[flagged] & bit) != 0
        if not hit.any():
            continue
        cell = pos[hit] - shift
        # A clamp implies the read was inside the table, so these cells exist.
        raw = table[torch.from_numpy(rpi[hit] * dump.max_seq_len + cell)].to(_I64).numpy()
        tables.append(ProblemTable.build(
            ProblemKind.LUT_OUT_OF_RANGE, role, batch_row=rows[hit], pool_row=rpi[hit],
            position=cell, value=raw, entry=flagged[hit], raises=False))
    return ProblemTable.concat(tables)


def _seed_lut_problems(
    dump: KvDump, seed_flags: np.ndarray, seed_raw: np.ndarray, clamped_bit: int
) -> ProblemTable:
    """LUT_OUT_OF_RANGE for every clamped seed (entry -1)."""
    idx = np.flatnonzero(seed_flags & clamped_bit)
    if idx.size == 0:
        return ProblemTable.empty()
    return ProblemTable.build(
        ProblemKind.LUT_OUT_OF_RANGE, ProblemRole.SEED, batch_row=idx,
        pool_row=dump.req_pool_indices.numpy()[idx],
        position=dump.prefix_lens.numpy()[idx] - 1, value=seed_raw[idx], entry=-1,
        raises=False)
