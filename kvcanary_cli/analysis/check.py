"""`run_check`: the library entry point behind `kvcanary check`.

Plans every group with the reference semantics (collect mode: every problem, never a raise)
and with the kernel that stands in for production, compares them, runs every finding
detector, and attaches provenance to every finding in one pass over `req_to_token`.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from kvcanary_cli.analysis.compare import compare_plans
from kvcanary_cli.analysis.findings import (
    batch_findings,
    plan_findings,
    slot_findings,
    swa_findings,
)
from kvcanary_cli.analysis.model import (
    CheckReport,
    DumpReport,
    Finding,
    FindingCode,
    GroupSummary,
    Severity,
    SlotProvenance,
)
from kvcanary_cli.analysis.provenance import (
    ProvenanceIndex,
    full_slots_mapping_to,
    live_cells,
    swa_provenance,
)
from kvcanary_cli.dump import KvDump, load_dump
from kvcanary_cli.errors import KvcanaryError, UsageError
from kvcanary_cli.planners import KERNEL_NAMES, Planner, get_planner

__all__ = ["attach_provenance", "check_dumps", "run_check"]

_CODE_ORDER = {code: i for i, code in enumerate(FindingCode)}


def _kernel_planner(kernel: str) -> Planner | None:
    if kernel not in KERNEL_NAMES:
        raise UsageError(f"unknown kernel {kernel!r} (choose one of: {', '.join(KERNEL_NAMES)})",
                         tensor="--kernel")
    if kernel == "none":
        return None
    return get_planner("torch-gpu" if kernel == "torch" else kernel)


def run_check(
    dump: KvDump,
    *,
    kernel: str = "triton",
    groups: Sequence[str] | None = None,
    reference: str = "torch",
) -> DumpReport:
    """Check one loaded dump and return its report.

    `kernel` chooses what stands in for the production GPU path: `triton` (the kernels;
    compiled on CUDA, interpreted elsewhere), `torch` (the same GPU semantics, vectorized) or
    `none`. `reference` is `torch` (vectorized, fast) or `reference` (scalar, literal).
    """
    kernel_planner = _kernel_planner(kernel)
    reference_planner = get_planner(reference)
    chosen = tuple(groups) if groups else dump.groups
    cells = live_cells(dump)
    findings: list[Finding] = batch_findings(dump) + slot_findings(dump, cells)
    summaries: list[GroupSummary] = []
    token_seen: set[tuple[object, ...]] = set()
    for group in chosen:
        plan = reference_planner.plan(dump, group)
        kernel_plan = kernel_planner.plan(dump, group) if kernel_planner else None
        for finding in plan_findings(dump, plan, kernel_plan):
            # The token pool is the same for every group: report a bad gather once.
            key = (finding.code, finding.batch_row, finding.details.get("index"))
            if finding.code is FindingCode.EXPECTED_TOKEN_OUT_OF_RANGE:
                if key in token_seen:
                    continue
                token_seen.add(key)
            findings.append(finding)
        if group == "swa":
            findings.extend(swa_findings(dump, cells, plan))
        explained: dict[str, int] = {}
        unexplained = 0
        if kernel_plan is not None:
            comparison = compare_plans(plan, kernel_plan)
            explained = comparison.explained
            unexplained = len(comparison.divergences)
            findings.extend(comparison.divergences)
        summaries.append(GroupSummary(
            group=group, window=plan.window, total_verify=plan.total_verify,
            verify_capacity=plan.verify_capacity, enable=plan.enable, kernel=kernel,
            explained_differences=explained, unexplained_differences=unexplained,
            kernel_launch_error=None if kernel_plan is None else kernel_plan.launch_error,
        ))
    mode = getattr(kernel_planner, "mode", None)
    return DumpReport(
        path=str(dump.path), identity=dump.provenance, bs=dump.bs, groups=tuple(summaries),
        findings=tuple(sorted(attach_provenance(dump, findings), key=_finding_order)),
        notes=tuple(dump.notes), kernel_mode=None if mode is None else str(mode),
    )


def _finding_order(f: Finding) -> tuple[int, int, str, int, int, int]:
    return (-f.severity.rank, _CODE_ORDER[f.code], f.group,
            -1 if f.batch_row is None else f.batch_row,
            -1 if f.position is None else f.position, -1 if f.slot is None else f.slot)


def attach_provenance(dump: KvDump, findings: list[Finding]) -> list[Finding]:
    """Give every slot-carrying finding the provenance of its slot (one table scan)."""
    swa_slots = {f.slot for f in findings if f.slot is not None and f.space == "swa"}
    swa_sources = full_slots_mapping_to(dump, swa_slots)
    wanted = {f.slot for f in findings if f.slot is not None and f.space != "swa"}
    for sources in swa_sources.values():
        wanted.update(sources)
    if not wanted and not swa_sources:
        return findings
    index = ProvenanceIndex(dump, wanted)
    out = []
    cache: dict[tuple[str, int, int], SlotProvenance] = {}
    for f in findings:
        if f.slot is None:
            out.append(f)
            continue
        window = dump.window(f.group) if f.group == "swa" else 0
        key = (f.space, f.slot, window)
        if key not in cache:
            cache[key] = (
                swa_provenance(dump, index, f.slot, swa_sources[f.slot], window=window)
                if f.space == "swa" else index.provenance(f.slot, window=window)
            )
        out.append(replace(f, provenance=cache[key]))
    return out


def _check_path(args: tuple[str, Mapping[str, int | str | None], str, tuple[str, ...] | None,
                            str]) -> DumpReport:
    path, overrides, kernel, groups, reference = args
    try:
        dump = load_dump(path, overrides=overrides)
        return run_check(dump, kernel=kernel, groups=groups, reference=reference)
    except KvcanaryError as exc:
        return DumpReport(path=path, identity={}, bs=0, groups=(), findings=(), error=str(exc))


def check_dumps(
    paths: Sequence[str | os.PathLike[str]],
    *,
    overrides: Mapping[str, int | str | None] | None = None,
    kernel: str = "triton",
    groups: Sequence[str] | None = None,
    reference: str = "torch",
    fail_on: Severity = Severity.ERROR,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CheckReport:
    """Check several dumps (one per rank, say) in parallel processes; one report each.

    A dump that cannot be read gets a report with `error` set instead of stopping the run.
    """
    if kernel not in KERNEL_NAMES:
        _kernel_planner(kernel)  # raises the usage error before any worker starts
    work = [(str(Path(p)), dict(overrides or {}), kernel, tuple(groups) if groups else None,
             reference) for p in paths]
    workers = min(len(work), jobs or os.cpu_count() or 1)
    reports: list[DumpReport] = []
    if workers <= 1:
        for i, item in enumerate(work):
            reports.append(_check_path(item))
            if progress:
                progress(i + 1, len(work))
    else:
        # spawn, not fork: forking a process that already runs torch threads can deadlock.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            for i, report in enumerate(pool.map(_check_path, work)):
                reports.append(report)
                if progress:
                    progress(i + 1, len(work))
    return CheckReport(dumps=tuple(reports), fail_on=fail_on)
