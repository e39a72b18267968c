"""`TritonPlanner`: launches the Triton plan kernels and adapts their outputs to `Plan`.

GPU semantics (see `base`): the same plan as `VectorizedPlanner(semantics=Semantics.GPU)`, field by
field, computed the way production does (docs/semantics.md §1.5): one offsets program
over the padded batch, then a 1-D grid over the verify entries. On a CUDA device the kernels
compile; elsewhere they run in the triton interpreter on numpy memory (both chosen, and the
memory made, by `triton_runtime`). Inputs are copied to a CUDA device whole, because flat
addressing may read any row of `req_to_token`; the interpreter reads the memory-mapped tables in
place.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from threading import Event, local
from types import ModuleType
from typing import Any

import numpy as np

import kvcanary_cli.planners.host_parallel as host_parallel
import kvcanary_cli.planners.triton_runtime as triton_runtime
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import (
    ClampFlag,
    ColumnFill,
    Plan,
    ProblemKind,
    ProblemRole,
    ProblemTable,
    SeedFlag,
    Semantics,
    VerifyEntries,
    assemble_plan,
    failed_plan,
    held_narrow,
    row_problems,
    skipped_plan,
)
from kvcanary_cli.planners.frame import GroupFrame, group_frame
from kvcanary_cli.planners.staging import seed_values, stage
from kvcanary_cli.planners.triton_runtime import KernelArrays, kernel_arrays, shared_host_arrays

__all__ = ["ENTRIES_PER_LAUNCH", "TritonPlanner", "bs_block", "reading_back_after"]

#: Entries one `plan_entries_kernel` launch covers; larger plans are launched in chunks.
ENTRIES_PER_LAUNCH = 1 << 24
#: Entries per program, at most. The interpreter pays per program and per operation, not per
#: element (measured on a 2.2 M-entry plan: 0.18 M entries/s with 4096-wide programs, 1.4 M/s
#: with 2^18), so it gets the widest blocks; a small plan gets the smallest power of two that
#: holds it, since masked lanes cost the interpreter as much as live ones.
_BLOCK_SIZE = {"compiled": 1024, "interpreter": 1 << 18}
_MIN_INTERPRETER_BLOCK = 1 << 10
_MIN_BS_BLOCK = 16
_I64 = np.int64


def bs_block(bs: int) -> int:
    """Lanes of the offsets program: the next power of two >= bs + 1 (at least 16)."""
    return max(_MIN_BS_BLOCK, 1 << bs.bit_length())


@dataclass(frozen=True, kw_only=True)
class _Inputs:
    """Kernel arguments in the kernels' memory (dummies of one element for absent tensors)."""

    rpi: Any
    prefix: Any
    extend: Any
    valid: Any
    table: Any
    table_numel: int
    lut: Any
    lut_len: int
    pool: Any
    pool_stride: int
    pool_numel: int
    #: the inputs are a shrunk dump's staged rows (`staging`), not the dump's own tensors.
    staged: bool = False


class TritonPlanner:
    """GPU-semantics planner running SGLang's plan step as Triton kernels.

    The kernels are loaded on the first `plan`, so a planner can be built (and pickled to a
    worker process) without importing triton.
    """

    name = "triton"
    semantics = Semantics.GPU

    def __init__(
        self,
        *,
        block_size: int | None = None,
        entries_per_launch: int = ENTRIES_PER_LAUNCH,
        std_scan: bool | None = None,
        host_processes: int | None = None,
    ) -> None:
        self._block_size = block_size
        if host_processes is not None and host_processes < 1:
            raise ValueError(f"host_processes must be at least 1, got {host_processes}")
        #: forked processes an interpreted entries launch is cut across; None: as many as
        #: `host_parallel.host_processes` finds worth it here.
        self._host_processes = host_processes
        if block_size is not None and (block_size < 16 or block_size & (block_size - 1)):
            raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
        self._entries_per_launch = entries_per_launch
        #: prefix sums with triton's `tl.cumsum` (True) or the kernel's own combine function;
        #: None: whichever can run here (see `triton_runtime.std_library_interpreted`).
        self._std_scan = std_scan

    @property
    def mode(self) -> triton_runtime.Mode:
        """'compiled' (CUDA) or 'interpreter' (no CUDA, or TRITON_INTERPRET=1)."""
        return triton_runtime.mode()

    def block_size(self, entries: int) -> int:
        """Entries per program of the entries kernel for a plan of `entries` (a power of two)."""
        if self._block_size is not None:
            return self._block_size
        widest = _BLOCK_SIZE[self.mode]
        if self.mode == "compiled":
            return widest
        return min(widest, max(_MIN_INTERPRETER_BLOCK, 1 << max(entries - 1, 0).bit_length()))

    def entries_per_launch(self, block: int) -> int:
        """Entries one launch of the entries kernel covers (a multiple of `block`)."""
        return max(block, self._entries_per_launch // block * block)

    def host_processes(self, entries: int) -> int:
        """Processes the entries launch of a plan of `entries` runs in (1: this one)."""
        if self.mode != "interpreter":
            return 1
        if self._host_processes is not None:
            return self._host_processes
        return host_parallel.host_processes(entries)

    def plan(self, dump: KvDump, group: str) -> Plan:
        """Plan `group` of `dump` with the kernels; the outputs come back as numpy arrays
        (within `reading_back_after`, once its event is set)."""
        frame = group_frame(dump, group)
        if frame.launch is not None:
            return failed_plan(frame, backend=self.name)
        if frame.unplannable:
            row_level = row_problems(dump, frame, gpu=True)
            return skipped_plan(
                frame, backend=self.name, semantics=self.semantics, problems=row_level
            )
        kernels = triton_runtime.load_kernels()
        memory = kernel_arrays(triton_runtime.mode())  # how the kernels were loaded
        inputs = self._inputs(dump, frame, memory)
        bs = dump.bs
        block_bs = bs_block(bs)
        verify_offsets = memory.empty(bs + 1, _I64)
        write_offsets = memory.empty(bs + 1, _I64)
        seeds = memory.empty(max(bs, 1), _I64)
        seed_raw = memory.empty(max(bs, 1), _I64)
        seed_flags = memory.empty(max(bs, 1), np.uint8)
        totals = memory.empty(3, _I64)
        kernels.plan_offsets_kernel[(1,)](
            inputs.rpi,
            inputs.prefix,
            inputs.extend,
            inputs.table,
            inputs.lut,
            verify_offsets,
            write_offsets,
            seeds,
            seed_raw,
            seed_flags,
            totals,
            bs,
            dump.max_seq_len,
            inputs.table_numel,
            inputs.lut_len,
            frame.window,
            frame.verify_capacity,
            HAS_LUT=inputs.lut_len > 0,
            BLOCK_BS=block_bs,
            STD_SCAN=(
                triton_runtime.std_library_interpreted()
                if self._std_scan is None
                else self._std_scan
            ),
            num_warps=_warps(block_bs),
        )
        total, num_valid, enable = (int(v) for v in memory.download(totals))
        buffers = self._entries(
            kernels, memory, dump, frame, inputs, verify_offsets, total if enable else 0, block_bs
        )
        staged = inputs.staged
        del inputs  # the staged rows (a shrunk table's int32 copy) go before the entries come
        waiting = getattr(_READ_BACK_AFTER, "event", None)
        if waiting is not None:
            waiting.wait()
        # back: read back one column at a time, held narrow (`held_narrow`), each buffer let
        # go once read: ten million entries are never two plans' worth of int64 columns here
        columns = {name: _read_back(memory, buffers.pop(name)) for name in list(buffers)}
        offsets_host = memory.download(verify_offsets)
        seed_flags_host = memory.download(seed_flags)[:bs]
        problems = [
            row_problems(dump, frame, gpu=True),
            _entry_lut_problems(dump, offsets_host, columns["position"], columns["clamp"]),
            _seed_lut_problems(dump, seed_flags_host, memory.download(seed_raw)[:bs], staged),
        ]
        entries = VerifyEntries(
            slot=columns["slot"],
            expected_token=columns["token"],
            position=columns["position"],
            prev_slot=columns["prev"],
            undefined=columns["undefined"],
        )
        rows = frame.write_rows
        return assemble_plan(
            frame,
            backend=self.name,
            semantics=self.semantics,
            entries=entries,
            seeds=memory.download(seeds)[:rows],
            seed_undefined=(seed_flags_host[:rows] & SeedFlag.UNDEFINED).astype(bool),
            problems=ProblemTable.concat(problems),
            kernel_totals=(total, num_valid, enable),
            verify_offsets=offsets_host,
            write_offsets=memory.download(write_offsets)[: rows + 1],
        )

    @staticmethod
    def _inputs(dump: KvDump, frame: GroupFrame, memory: KernelArrays) -> _Inputs:
        def vec(array: np.ndarray | None) -> Any:
            if array is None or array.size == 0:
                return memory.upload(np.zeros(1, dtype=_I64))
            return memory.upload(np.asarray(array, dtype=_I64))

        def table(array: np.ndarray | None) -> Any:
            if array is None or array.size == 0:
                return memory.upload(np.zeros(1, dtype=np.int32))
            return memory.upload(array)

        if not _whole(dump):  # a shrunk dump: the rows the batch reads, dense
            staged = stage(dump, frame)
            pool = dump.req_to_verify_expected_tokens
            return _Inputs(
                rpi=vec(staged.rpi),
                prefix=vec(dump.prefix_lens),
                extend=vec(dump.extend_seq_lens),
                valid=vec(dump.req_to_verify_expected_tokens_valid_lens),
                table=table(staged.table),
                table_numel=staged.table_numel,
                lut=vec(staged.lut),
                lut_len=staged.lut_len,
                pool=table(staged.pool),
                pool_stride=0 if pool is None else int(pool.shape[1]),
                pool_numel=staged.pool_numel,
                staged=True,
            )
        # whole tensors (not staged): the kernels read them in place, mapped or read
        lut = None if frame.lut is None else frame.lut.array()
        stored_pool = dump.req_to_verify_expected_tokens
        whole_pool = None if stored_pool is None else stored_pool.array()
        return _Inputs(
            rpi=vec(dump.req_pool_indices),
            prefix=vec(dump.prefix_lens),
            extend=vec(dump.extend_seq_lens),
            valid=vec(dump.req_to_verify_expected_tokens_valid_lens),
            table=table(dump.req_to_token.array()),
            table_numel=int(dump.req_to_token.size),
            lut=vec(lut),
            lut_len=0 if lut is None else int(lut.shape[0]),
            pool=table(whole_pool),
            pool_stride=0 if whole_pool is None else int(whole_pool.shape[1]),
            pool_numel=0 if whole_pool is None else int(whole_pool.size),
        )

    def _entries(
        self,
        kernels: ModuleType,
        memory: KernelArrays,
        dump: KvDump,
        frame: GroupFrame,
        inputs: _Inputs,
        verify_offsets: Any,
        entries: int,
        block_bs: int,
    ) -> dict[str, Any]:
        """Launch the entries kernel over `[0, entries)` in chunks; the output buffers back
        (`_read_back` reads them). Under the interpreter the chunks may run in forked
        processes (`host_parallel`)."""
        processes = self.host_processes(entries)
        if processes > 1:
            memory = shared_host_arrays()
        out = {name: memory.empty(entries, _I64) for name in ("slot", "prev", "token", "position")}
        out["undefined"] = memory.empty(entries, np.uint8)
        out["clamp"] = memory.empty(entries, np.uint8)
        has_pool = (
            dump.req_to_verify_expected_tokens is not None
            and dump.req_to_verify_expected_tokens_valid_lens is not None
        )
        block = self.block_size(entries)
        per_launch = self.entries_per_launch(block)

        def launch(first: int, last: int) -> None:
            for start in range(first, last, per_launch):
                launch_chunk(start, min(last, start + per_launch))

        def launch_chunk(start: int, stop: int) -> None:
            grid = (_cdiv(stop - start, block),)
            kernels.plan_entries_kernel[grid](
                inputs.rpi,
                inputs.prefix,
                inputs.valid,
                inputs.table,
                inputs.lut,
                inputs.pool,
                verify_offsets,
                out["slot"],
                out["prev"],
                out["token"],
                out["position"],
                out["undefined"],
                out["clamp"],
                start,
                stop,
                dump.bs,
                dump.max_seq_len,
                inputs.table_numel,
                inputs.lut_len,
                frame.window,
                inputs.pool_stride,
                inputs.pool_numel,
                dump.token_offset,
                HAS_LUT=inputs.lut_len > 0,
                HAS_POOL=has_pool,
                BLOCK_BS=block_bs,
                SEARCH_STEPS=block_bs.bit_length() - 1,
                BLOCK_SIZE=block,
            )

        ranges = host_parallel.split(entries, processes, block)
        if len(ranges) > 1:
            # An empty launch prepares the kernel here (the interpreter rewrites its source
            # on first use), so that the forked children do not each do it again.
            launch_chunk(0, 0)
        host_parallel.run_parts([partial(launch, first, last) for first, last in ranges])
        if self.mode == "interpreter" and entries >= _COLLECT_AT:
            # The interpreter leaves its launches' views of the buffers (`_HostStorage`) in
            # reference cycles: collected now, each buffer goes once read back, not at the
            # next collection (seen: 300 MiB of entries held past their plan). A collection
            # costs tens of ms with torch loaded: only where the buffers are worth it.
            gc.collect()
        return out


#: Per thread: the event a plan's entries wait for before they come back (`reading_back_after`).
_READ_BACK_AFTER = local()


@contextmanager
def reading_back_after(event: Event) -> Iterator[None]:
    """Within it, a plan made on this thread, launched, leaves its entries in the kernels'
    buffers (the forked children's shared pages, none of them this process's) until `event`
    is set, then reads them back: a caller planning on another thread has them come back
    after its own peak, not on top of it."""
    _READ_BACK_AFTER.event = event
    try:
        yield
    finally:
        _READ_BACK_AFTER.event = None


#: Entries of a shared buffer `_read_back` reads at a time (a multiple of a page's entries).
_READ_BACK = 1 << 20


def _read_back(memory: KernelArrays, buffer: Any) -> np.ndarray:
    """A buffer's column held narrow, as `held_narrow` holds it. A shared host buffer (the
    forked children's) is read `_READ_BACK` entries at a time, each piece's pages released
    once narrowed (`triton_runtime.release`): its ten million int64 entries are never all
    faulted in here beside their narrow copy (75 MiB a column)."""
    host = memory.download(buffer)
    if host.dtype.itemsize == 1 or not triton_runtime.releasable(buffer) or host.size == 0:
        return held_narrow(host)
    column = ColumnFill(host.size)  # each piece copied in: the column is never held twice
    for start in range(0, host.size, _READ_BACK):
        stop = min(start + _READ_BACK, host.size)
        column.put(held_narrow(host[start:stop]))
        triton_runtime.release(buffer, start, stop)
    return column.column()


#: Entries from which an interpreted plan's buffers (33 bytes an entry) are collected at once.
_COLLECT_AT = 1 << 20


def _cdiv(n: int, d: int) -> int:
    """Ceiling division (`triton.cdiv`; triton is only imported by `triton_runtime`)."""
    return -(-n // d)


def _warps(lanes: int) -> int:
    return 4 if lanes <= 1024 else 8 if lanes <= 4096 else 16


def _entry_lut_problems(
    dump: KvDump,
    offsets: np.ndarray,
    positions: np.ndarray,
    flags: np.ndarray,
) -> ProblemTable:
    """LUT_OUT_OF_RANGE for every clamped verify or prev slot the entries kernel flagged."""
    flagged = np.flatnonzero(flags)
    if flagged.size == 0:
        return ProblemTable.empty()
    rows = np.searchsorted(offsets, flagged, side="right") - 1
    rpi = dump.req_pool_indices[rows]
    pos = positions[flagged].astype(np.int64)  # held narrow: widened to compute with
    tables = []
    for bit, role, shift in (
        (ClampFlag.SLOT, ProblemRole.VERIFY, 0),
        (ClampFlag.PREV, ProblemRole.CHAIN_PREV, 1),
    ):
        hit = (flags[flagged] & bit) != 0
        if not hit.any():
            continue
        cell = pos[hit] - shift
        # A clamp implies the read was inside the table, so these cells exist.
        raw = dump.req_to_token.take(rpi[hit] * dump.max_seq_len + cell)
        tables.append(
            ProblemTable.build(
                ProblemKind.LUT_OUT_OF_RANGE,
                role,
                batch_row=rows[hit],
                pool_row=rpi[hit],
                position=cell,
                value=raw,
                entry=flagged[hit],
                raises=False,
            )
        )
    return ProblemTable.concat(tables)


def _whole(dump: KvDump) -> bool:
    """The kernels read the dump's tables directly: every planned tensor is whole (else a
    shrunk dump that did not keep every element is staged, `staging.stage`)."""
    planned = (
        dump.req_to_token,
        dump.full_to_swa_index_mapping,
        dump.req_to_verify_expected_tokens,
    )
    return all(t is None or t.complete for t in planned)


def _seed_lut_problems(
    dump: KvDump, seed_flags: np.ndarray, seed_raw: np.ndarray, staged: bool = False
) -> ProblemTable:
    """LUT_OUT_OF_RANGE for every clamped seed (entry -1)."""
    idx = np.flatnonzero(seed_flags & SeedFlag.CLAMPED)
    if idx.size == 0:
        return ProblemTable.empty()
    if staged:  # staged rows hold renumbered slots: read the seeds' slots from the dump
        seed_raw = np.zeros(seed_raw.shape, dtype=np.int64)
        seed_raw[idx] = seed_values(dump, idx)
    return ProblemTable.build(
        ProblemKind.LUT_OUT_OF_RANGE,
        ProblemRole.SEED,
        batch_row=idx,
        pool_row=dump.req_pool_indices[idx],
        position=dump.prefix_lens[idx] - 1,
        value=seed_raw[idx],
        entry=-1,
        raises=False,
    )
