"""`run_check`: the library entry point behind `kvcanary check`.

Plans every group with the reference semantics (collect mode: every problem, never a raise)
and with the kernel that stands in for production, compares them, runs every finding
detector, and attaches provenance to every finding in one pass over `req_to_token`. The
dump's report is assembled here too: its batch rows with findings (`request_summaries`) and
the derived scalars its findings rest on (`assumptions_of`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from threading import Event
from typing import Literal, cast

import numpy as np

from kvcanary_cli.analysis.bookkeeping import (
    free_list_findings,
    held_findings,
    lut_bookkeeping_findings,
    pool_leak_findings,
    reconciliation_notes,
)
from kvcanary_cli.analysis.canary_findings import canary_findings
from kvcanary_cli.analysis.cells import pieces, restricted
from kvcanary_cli.analysis.compare import compare_plans
from kvcanary_cli.analysis.coverage import (
    CANARY_REPLAY,
    HOST_FREE_LIST,
    HOST_LEAKS,
    HOST_SLOTS,
    MAMBA_LEAKS,
    MAMBA_SLOTS,
    PAGE_TABLES,
    REQUEST_ROWS,
    SWA_LUT,
    TREE_LOCKS,
    CheckFamily,
    coverage,
    runs,
)
from kvcanary_cli.analysis.diagnosis import diagnose
from kvcanary_cli.analysis.dump_pool import (
    FEWER_JOBS,
    DumpWork,
    check_in_workers,
    error_report,
    worker_count,
)
from kvcanary_cli.analysis.findings import (
    batch_findings,
    lut_findings,
    plan_findings,
    slot_findings,
    swa_findings,
)
from kvcanary_cli.analysis.hicache import (
    host_free_list_findings,
    host_leak_findings,
    host_slot_findings,
)
from kvcanary_cli.analysis.mamba import mamba_findings, mamba_leak_findings
from kvcanary_cli.analysis.provenance import (
    LiveCells,
    ProvenanceIndex,
    RowStates,
    clamp_target,
    clamped_sources,
    full_slots_mapping_to,
    live_cells,
    slot_owners,
    swa_provenance,
)
from kvcanary_cli.analysis.req_rows import req_row_findings
from kvcanary_cli.analysis.tree_locks import tree_lock_findings
from kvcanary_cli.analysis.unified import unified_findings
from kvcanary_cli.analysis.upstream_raise import (
    first_raise,
    mark_upstream_raise,
    recorded_exception,
    reference_raises,
)
from kvcanary_cli.canary.buffers import dump_buffers
from kvcanary_cli.catalog import FindingCode, Severity
from kvcanary_cli.dump.loader import KvDump, load_dump
from kvcanary_cli.dump.schema import SCALARS, Group
from kvcanary_cli.dump.tensor import fold_at
from kvcanary_cli.errors import DumpError, KvcanaryError
from kvcanary_cli.planners.base import Plan, Planner
from kvcanary_cli.planners.frame import GroupFrame, group_frame
from kvcanary_cli.planners.host_parallel import stop_children, usable_cores
from kvcanary_cli.planners.staging import StagingTooLargeError
from kvcanary_cli.planners.triton_planner import reading_back_after
from kvcanary_cli.planners.vectorized import VectorizedPlanner
from kvcanary_cli.results.cells import CellColumns, SlotProvenance, Space
from kvcanary_cli.results.check import (
    Assumption,
    CheckReport,
    DumpReport,
    Finding,
    GroupSummary,
    KernelMode,
    KernelName,
    PlanValueName,
    RequestSummary,
    ScalarOrigin,
    ScalarValue,
)
from kvcanary_cli.results.shrink import Shrunk

__all__ = [
    "CollectedFindings",
    "ProvenanceSlots",
    "attach_provenance",
    "check_dumps",
    "collect_findings",
    "group_slots",
    "provenance_slots",
    "run_check",
]


def _kernel_plan(
    kernel: Planner, dump: KvDump, group: str, read_back_after: Event | None = None
) -> Plan:
    """`kernel`'s plan of `group`; for a shrunk dump whose batch reads more rows than the
    Triton kernels' dense staging holds (every row of a production-wide pool), the plan of
    their numpy model, which reads the kept cells where they are: the small dump then checks
    like its original, whose kernels read the file's table (a note says so).

    `read_back_after`: the Triton kernels' entries come back once it is set (planned on
    another thread: after the detectors, whose peak they would add to)."""
    try:
        if read_back_after is not None:
            with reading_back_after(read_back_after):
                return kernel.plan(dump, group)
        return kernel.plan(dump, group)
    except StagingTooLargeError:
        return VectorizedPlanner(semantics=kernel.semantics).plan(dump, group)


def run_check(
    dump: KvDump,
    *,
    planner: Planner,
    kernel: Planner | None,
    groups: Sequence[str] | None = None,
) -> DumpReport:
    """Check one loaded dump and return its report.

    `planner` plans with SGLang's reference semantics (REF; in collect mode: every problem,
    never a raise); `kernel` stands in for the production GPU path (None: no comparison).
    Each planner says whose semantics it follows, and how it runs (`mode`), for the report.
    """
    found = collect_findings(dump, planner=planner, kernel=kernel, groups=groups, keep_cells=False)
    findings, summaries = found.findings, found.summaries
    raises = reference_raises(found.plans)  # all the marking needs of the plans
    stand_ins = [
        f"the {group} group's kernel plan is the {plan.backend} model of the {kernel.name} "
        "kernels: this shrunk dump's batch reads more rows than kvcanary stages dense for them"
        for group, plan in found.kernel_plans.items()
        if kernel is not None and plan.backend != kernel.name
    ]
    del found  # the plans and the live cells: freed before the table scan below
    findings = attach_provenance(dump, findings)
    raised, findings = first_raise(raises, findings)
    findings, causes = diagnose(dump, findings)
    recorded, matches = recorded_exception(dump, raised)
    requests = tuple(request_summaries(dump, findings))
    assumptions = tuple(assumptions_of(dump, findings))
    return DumpReport(
        path=str(dump.path),
        identity=dump.identity,
        bs=dump.bs,
        groups=summaries,
        findings=tuple(findings),  # the report sorts them
        notes=(*dump.notes, *reconciliation_notes(dump), *stand_ins),
        kernel_mode=cast(KernelMode | None, kernel.mode if kernel else None),
        diagnosis=causes,
        requests=requests,
        first_raise=raised,
        recorded_exception=recorded,
        recorded_exception_matches=matches,
        scalars=tuple(
            ScalarValue(
                name=s.name, value=s.value, origin=cast(ScalarOrigin, s.origin), source=s.source
            )
            for s in dump.scalars.values()
        ),
        assumptions=assumptions,
        shrunk=None if dump.shrink is None else Shrunk.of(dump.shrink, dump.path.name),
        coverage=coverage(dump, groups or dump.groups),
    )


@dataclass(frozen=True, kw_only=True)
class CollectedFindings:
    """Every finding of a dump before provenance, with the plans they came from."""

    findings: list[Finding]
    summaries: tuple[GroupSummary, ...]
    #: the reference plan of each checked group, in order.
    plans: list[Plan]
    #: the kernel's plan of each group (absent without a kernel).
    kernel_plans: dict[str, Plan]
    #: the live cells (None for a caller that reads only the findings: `keep_cells=False`).
    cells: LiveCells | None


def collect_findings(
    dump: KvDump,
    *,
    planner: Planner,
    kernel: Planner | None,
    groups: Sequence[str] | None = None,
    keep_entries: bool = True,
    keep_cells: bool = True,
) -> CollectedFindings:
    """Plan every group, compare, and run every finding detector (no provenance yet).

    `keep_entries=False`: the reference plans keep their verify entries only where a
    detector reads them (a kernel to compare with, canary buffers to replay): a caller that
    reads only the findings does not hold ten million entries it never looks at.
    `keep_cells=False`: the live cells go once no detector reads them (before the plans,
    unless an SWA group or a canary replay reads them), and are not returned."""
    chosen = tuple(groups) if groups else dump.groups
    background = ThreadPoolExecutor(1) if _runs_on_host(kernel) and _spare_core() else None
    # set once the detectors are done (or on the way out: never left waiting)
    detected = Event()
    try:
        # The kernel (interpreted Triton on a CPU: the slowest part) plans on a spare core
        # while this thread plans with REF semantics and runs the detectors; same results, in
        # the same order, as planning it in turn. One thread, one group after the other: the
        # Triton interpreter patches `triton.language` for the length of a launch, so two
        # launches at once break each other (seen: "Did you forget to add @triton.jit?").
        pending: dict[str, Future[Plan]] = {}
        if background is not None and kernel is not None:
            pending = {
                group: background.submit(_kernel_plan, kernel, dump, group, detected)
                for group in chosen
            }
        return _collect(dump, planner, kernel, chosen, pending, keep_entries, keep_cells, detected)
    except BaseException:  # stopped: the kernel's forked halves go now, not after its launch
        if background is not None:
            stop_children()
        raise
    finally:
        detected.set()
        if background is not None:
            background.shutdown(wait=True, cancel_futures=True)


#: The detector families that read the dump alone, each run where `coverage` says it runs
#: (the report's coverage is the same answer).
_FAMILY_DETECTORS: tuple[tuple[CheckFamily, Callable[[KvDump], list[Finding]]], ...] = (
    (REQUEST_ROWS, req_row_findings),
    (TREE_LOCKS, tree_lock_findings),
    (PAGE_TABLES, unified_findings),
    (MAMBA_SLOTS, mamba_findings),
    (MAMBA_LEAKS, mamba_leak_findings),
    (HOST_FREE_LIST, host_free_list_findings),
    (HOST_SLOTS, host_slot_findings),
    (HOST_LEAKS, host_leak_findings),
)


def _runs_on_host(kernel: Planner | None) -> bool:
    """A kernel that plans on this machine's CPU (interpreted Triton, the vectorized planner,
    SGLang's reference): worth a second core. A compiled or CUDA one is fast already, and
    stays on the thread that owns the device."""
    return kernel is not None and kernel.mode not in ("compiled", "cuda")


def _spare_core() -> bool:
    """True when this process may run on two cores and is not one of several checking
    workers (`check_dumps` already gives each of those a core)."""
    return usable_cores() >= 2


def _collect(
    dump: KvDump,
    planner: Planner,
    kernel: Planner | None,
    chosen: Sequence[str],
    pending: Mapping[str, Future[Plan]],
    keep_entries: bool,
    keep_cells: bool,
    detected: Event,
) -> CollectedFindings:
    cells = live_cells(dump)
    findings: list[Finding] = (
        batch_findings(dump)
        + slot_findings(dump, cells)
        + free_list_findings(dump)
        + pool_leak_findings(dump)
        + held_findings(dump)
    )
    for family, detector in _FAMILY_DETECTORS:
        if runs(dump, family):
            findings += detector(dump)
    # ten million cells of one slot: 74 MiB not held beside the plans where nothing reads them
    kept = None if not keep_cells and not _plans_read_cells(dump, chosen) else cells
    del cells
    # the kernel's entries (planned on the other core) come back from here on: beside the
    # reference plan, not on top of the detectors' peak (ten million entries: 47 MiB)
    detected.set()
    summaries: list[GroupSummary] = []
    plans: list[Plan] = []
    kernel_plans: dict[str, Plan] = {}
    gathers_seen: list[CellColumns] = []
    for group in chosen:
        read = keep_entries or kernel is not None or bool(dump_buffers(dump, group))
        plan = _reference_plan(planner, dump, group, keep_entries=read)
        plans.append(plan)
        for finding in plan_findings(dump, plan):
            if finding.code is FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE:
                # The token pool is the same for every group: report a bad gather once.
                fresh = _new_gathers(finding, gathers_seen)
                if fresh is None:
                    continue
                finding = fresh
            findings.append(finding)
        if group is Group.SWA and runs(dump, SWA_LUT, chosen):
            assert kept is not None  # `_plans_read_cells`
            findings.extend(lut_findings(dump) + swa_findings(dump, kept, plan))
            findings.extend(lut_bookkeeping_findings(dump, kept, plan))
        kernel_plan = None  # needed from here on: planned in the background, or now
        if group in pending:
            kernel_plan = pending[group].result()
        elif kernel is not None:
            kernel_plan = _kernel_plan(kernel, dump, group)
        if kernel_plan is not None:
            kernel_plans[group] = kernel_plan
        # Replay verify on the canary buffers with the plan production ran (the kernel's,
        # unless it refused the batch or there is none); a dump without canary buffers (a
        # capture without kv canary, most synthetic ones) has nothing to replay.
        if runs(dump, CANARY_REPLAY):
            ran = plan
            if kernel_plan is not None and kernel_plan.launch_error is None:
                ran = kernel_plan
            assert kept is not None  # `_plans_read_cells`
            findings.extend(canary_findings(dump, ran, kept))
        comparison = None
        if kernel_plan is not None:
            comparison = compare_plans(plan, kernel_plan)
            findings.extend(comparison.divergences)
            findings = mark_upstream_raise(findings, plan, kernel_plan)
        summaries.append(
            GroupSummary(
                group=plan.group,
                window=plan.window,
                total_verify=plan.total_verify,
                verify_capacity=plan.verify_capacity,
                enable=cast(Literal[0, 1], plan.enable),
                kernel=cast(KernelName, kernel.name if kernel else "none"),
                explained_differences=cast(
                    dict[FindingCode, int], comparison.explained if comparison else {}
                ),
                explained_by_field=cast(
                    dict[FindingCode, dict[PlanValueName, int]],
                    comparison.explained_by_field if comparison else {},
                ),
                unexplained_differences=len(comparison.divergences) if comparison else 0,
                kernel_launch_error=None if kernel_plan is None else kernel_plan.launch_error,
            )
        )
    return CollectedFindings(
        findings=findings,
        summaries=tuple(summaries),
        plans=plans,
        kernel_plans=kernel_plans,
        cells=kept,
    )


def _plans_read_cells(dump: KvDump, chosen: Sequence[str]) -> bool:
    """Whether the detectors run beside the plans read the live cells (an SWA group's LUT
    findings, a canary replay)."""
    swa = Group.SWA in chosen and runs(dump, SWA_LUT, chosen)
    return swa or runs(dump, CANARY_REPLAY)


def _reference_plan(planner: Planner, dump: KvDump, group: str, *, keep_entries: bool) -> Plan:
    """`planner`'s plan of `group`, without its entries when nothing reads them and the
    planner can leave them out (the vectorized one plans them all and keeps none)."""
    if not keep_entries and isinstance(planner, VectorizedPlanner):
        return planner.plan(dump, group, keep_entries=False)
    return planner.plan(dump, group)


def _new_gathers(finding: Finding, seen: list[CellColumns]) -> Finding | None:
    """`finding` without the (batch row, gather index) pairs an earlier group reported
    (None when nothing is left); the pairs it keeps join `seen`."""
    cells = finding.cells
    assert cells is not None
    pairs = _pairs(cells.batch_row, cells.extra["gather_index"])
    keep = np.ones(len(cells), dtype=bool)
    if seen:
        old = np.concatenate([_pairs(c.batch_row, c.extra["gather_index"]) for c in seen])
        keep = ~np.isin(pairs, old)
    if not keep.any():
        return None
    kept = restricted(finding, keep)
    assert kept.cells is not None
    seen.append(kept.cells)
    return kept


def _pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairs of int64 values as one comparable (structured) array."""
    stacked = np.ascontiguousarray(np.stack([a, b], axis=1), dtype=np.int64)
    return stacked.view([("a", np.int64), ("b", np.int64)]).ravel()


@dataclass(frozen=True, kw_only=True)
class ProvenanceSlots:
    """The full slots whose cells findings show, and how SWA slots reach them."""

    #: every full slot whose cells a finding's provenance lists.
    wanted: set[int]
    #: per SWA slot of a finding, the full slots whose LUT entry maps to it.
    swa_sources: dict[int, tuple[int, ...]]
    #: the SWA slot the GPU clamp lands on (None when it is not a real slot) ...
    target: int | None
    #: ... and the full slots it clamps onto it.
    clamped: tuple[int, ...]


#: Distinct slots of a finding group whose provenance it carries (its example's first).
PROVENANCE_SLOTS = 4


def group_slots(finding: Finding, limit: int = PROVENANCE_SLOTS) -> tuple[list[int], int]:
    """The first `limit` distinct slots of a finding group (its example's first, then in
    report order), and how many distinct slots it has."""
    if finding.slot is None:
        return [], 0
    cells = finding.cells
    held = None if cells is None else cells.column("slot")
    if held is None:
        return [finding.slot], 1
    assert cells is not None
    ordered = _first_distinct(held, limit + 1)  # as held: the same ints
    shown = [finding.slot, *(v for v in ordered if v != finding.slot)][:limit]
    return shown, cells.distinct_count("slot")


#: cells `_first_distinct` reads at a time (bounds its sort's temporaries).
_DISTINCT_CHUNK = 1 << 20


def _first_distinct(values: np.ndarray, count: int) -> list[int]:
    """The first `count` distinct values in order of first appearance, read a chunk at a time
    (a slot every cell holds is ten million cells: no index of them all is made)."""
    found: list[int] = []
    seen: set[int] = set()
    for a in range(0, values.size, _DISTINCT_CHUNK):
        part, first = np.unique(values[a : a + _DISTINCT_CHUNK], return_index=True)
        for value in part[np.argsort(first, kind="stable")].tolist():
            if value not in seen:
                seen.add(value)
                found.append(value)
                if len(found) == count:
                    return found
    return found


def provenance_slots(
    dump: KvDump, findings: list[Finding], shown_slots: list[list[int]] | None = None
) -> ProvenanceSlots:
    """Which full slots the provenance of `findings` needs the cells of (`shown_slots`: each
    finding's `group_slots`, when the caller has them)."""
    if shown_slots is None:
        shown_slots = [group_slots(f)[0] for f in findings]
    shown = list(zip(findings, shown_slots, strict=True))
    swa_slots = {s for f, slots in shown if f.space is Space.SWA for s in slots}
    swa_sources = full_slots_mapping_to(dump, swa_slots)
    target = clamp_target(dump)
    clamped = clamped_sources(dump, findings) if target in swa_slots else ()
    wanted = {s for f, slots in shown if f.space is not Space.SWA for s in slots}
    wanted.update(clamped)
    for sources in swa_sources.values():
        wanted.update(sources)
    return ProvenanceSlots(wanted=wanted, swa_sources=swa_sources, target=target, clamped=clamped)


#: Cells shown in a finding's provenance.
_FINDING_CELLS = 16
#: Threads that scan the table for the findings' provenance (2x faster on 2 cores).
_SCAN_THREADS = 4


def attach_provenance(
    dump: KvDump, findings: list[Finding], *, index: ProvenanceIndex | None = None
) -> list[Finding]:
    """Give every slot-carrying finding the provenance of its first distinct slots (one
    table scan, none when `index` already scanned for every slot needed).

    The SWA slot a truncated LUT ends in also lists the slots the GPU clamps onto it.
    """
    grouped = [group_slots(f) for f in findings]
    slots = provenance_slots(dump, findings, [shown for shown, _ in grouped])
    wanted, swa_sources = slots.wanted, slots.swa_sources
    target, clamped = slots.target, slots.clamped
    if not wanted and not swa_sources:
        return findings
    if index is not None and index.max_cells >= _FINDING_CELLS and index.slots >= set(wanted):
        index = index.narrowed(_FINDING_CELLS)
    else:
        # the kernels are done by now: the scan may use every core this process may run on
        index = ProvenanceIndex(
            dump, wanted, max_cells=_FINDING_CELLS, threads=min(usable_cores(), _SCAN_THREADS)
        )
    frames: dict[str, GroupFrame] = {}
    out = []
    cache: dict[tuple[str, int, str], SlotProvenance] = {}
    rows = RowStates(dump)
    for f, (shown, total) in zip(findings, grouped, strict=True):
        if not shown:
            out.append(f)
            continue
        if f.group not in frames:
            frames[f.group] = group_frame(dump, f.group)
        frame = frames[f.group]
        provenance = []
        for slot in shown:
            key = (f.space, slot, f.group)
            if key not in cache:
                cache[key] = (
                    swa_provenance(
                        dump,
                        index,
                        slot,
                        swa_sources[slot],
                        frame,
                        clamped_from=clamped if slot == target else (),
                    )
                    if f.space is Space.SWA
                    else index.provenance(slot, frame)
                )
            provenance.append(cache[key])
        out.append(
            replace(
                f,
                provenance=tuple(provenance),
                provenance_total=total,
                owners=slot_owners(provenance, rows),
            )
        )
    return out


def request_summaries(dump: KvDump, findings: list[Finding]) -> list[RequestSummary]:
    """One summary per batch row with findings, in batch order (counted per cell)."""
    bs = dump.bs
    codes = list(FindingCode)
    counts = np.zeros((len(codes), bs), dtype=np.int64)
    first_bad = np.full(bs, np.iinfo(np.int64).max, dtype=np.int64)
    for f in findings:
        if f.cells is None:
            if f.batch_row is None or not 0 <= f.batch_row < bs:
                continue
            counts[f.code.order, f.batch_row] += 1
            if f.position is not None:
                first_bad[f.batch_row] = min(first_bad[f.batch_row], f.position)
            continue
        _count_cells(f.cells, counts[f.code.order], first_bad)
    rpi, prefix, extend = dump.req_pool_indices, dump.prefix_lens, dump.extend_seq_lens
    out = []
    for batch_row in np.flatnonzero(counts.any(axis=0)).tolist():  # rows with findings
        per_code = counts[:, batch_row]
        bad = int(first_bad[batch_row])
        out.append(
            RequestSummary(
                batch_row=batch_row,
                pool_row=int(rpi[batch_row]),
                prefix_len=int(prefix[batch_row]),
                extend_len=int(extend[batch_row]),
                counts={codes[c]: int(per_code[c]) for c in np.flatnonzero(per_code)},
                first_bad_position=None if bad == np.iinfo(np.int64).max else bad,
            )
        )
    return out


def _count_cells(cells: CellColumns, counts: np.ndarray, first_bad: np.ndarray) -> None:
    """Add a finding group's cells to `counts` per batch row, and their positions to
    `first_bad` (in place), a piece of cells at a time."""
    # counted and compared only: the columns as held
    held_row, held_position = cells.column("batch_row"), cells.column("position")
    assert held_row is not None and held_position is not None
    inside = (held_row >= 0) & (held_row < counts.size)
    for part, rows, positions in pieces(inside, held_row, held_position):
        row = rows[part]
        counts += np.bincount(row, minlength=counts.size)
        fold_at(np.minimum, first_bad, row, positions[part])


def assumptions_of(dump: KvDump, findings: list[Finding]) -> list[Assumption]:
    """The derived scalars findings rest on, with what to record to decide them."""
    decides: dict[str, Counter[FindingCode]] = {}
    for f in findings:
        for name in f.assumes:
            decides.setdefault(name, Counter())[f.code] += f.count
    out = []
    for name, counts in decides.items():
        scalar = dump.scalars[name]
        spec = SCALARS[name]
        out.append(
            Assumption(
                scalar=name,
                value=scalar.value,
                source=scalar.source,
                decides=dict(counts),
                advice=f"record {name} ({spec.meaning}) in the dump's metadata, or pass "
                f"{spec.option}, to turn these into facts",
            )
        )
    return out


def _check_path(item: DumpWork) -> DumpReport:
    """Check one dump (in a worker process or here): its report, or its error's."""
    try:
        dump = load_dump(item.path, overrides=item.overrides)
        return run_check(dump, planner=item.planner, kernel=item.kernel, groups=item.groups)
    except KvcanaryError as exc:
        return error_report(item.path, exc)
    except MemoryError:  # this dump's outcome; the other dumps still get theirs
        message = "ran out of memory while kvcanary checked it"
        return error_report(item.path, DumpError(message, path=item.path, hint=FEWER_JOBS))


def check_dumps(
    paths: Sequence[str | os.PathLike[str]],
    *,
    planner: Planner,
    kernel: Planner | None,
    overrides: Mapping[str, int | str | None] | None = None,
    groups: Sequence[str] | None = None,
    fail_on: Severity = Severity.ERROR,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    sglang_installed: str | None = None,
) -> CheckReport:
    """Check dumps (one per rank, say), several in parallel processes; one report each.

    A dump that cannot be read, or whose check runs out of memory or dies with its process,
    gets a report with `error` set instead of stopping the run.
    Planners are pickled to the worker processes (`dump_pool` runs them). `sglang_installed`
    is recorded in the report as the SGLang version installed here.
    """
    work = [
        DumpWork(
            path=str(Path(p)),
            overrides=dict(overrides or {}),
            planner=planner,
            kernel=kernel,
            groups=tuple(groups) if groups else None,
        )
        for p in paths
    ]
    # one dump is checked here: no pool to size
    workers = worker_count(len(work), jobs, [Path(p) for p in paths]) if len(work) > 1 else 1
    reports: list[DumpReport] = []
    if workers <= 1:
        for i, item in enumerate(work):
            reports.append(_check_path(item))
            if progress:
                progress(i + 1, len(work))
    else:
        reports = check_in_workers(_check_path, work, workers, progress)
    return CheckReport(dumps=tuple(reports), fail_on=fail_on, sglang_installed=sglang_installed)
