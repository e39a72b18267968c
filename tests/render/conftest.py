"""Hand-built reports for the renderers: several codes, several dumps, bad input, no findings."""

from __future__ import annotations

import random

import pytest

from kvcanary_cli.catalog import FindingCode, Severity
from kvcanary_cli.dump.schema import Group
from kvcanary_cli.results.cells import CanaryEntry, Cell, RingRow, Role, SlotProvenance, Space
from kvcanary_cli.results.check import CheckReport, DumpReport, Finding, GroupSummary
from kvcanary_cli.results.provenance import ProvenanceReport, RowCell, RowMap

IDENTITY = {
    "sglang.version": "0.5.1",
    "sglang.commit": "abc1234",
    "model": "Qwen/Qwen3-8B",
    "rank": "0",
    "step": "1207",
    "forward_mode": "target_verify",
    "note|with pipe": "x|y",
}

#: how many lut-out-of-range findings the main dump has (more than the default 10 rows).
LUT_FINDINGS = 12


def slot_provenance(
    slot: int,
    *,
    pool_row: int = 8,
    position: int = 4,
    space: Space = Space.FULL,
    shared_with: int | None = 3,
    extra: int = 0,
) -> SlotProvenance:
    cells = [Cell(pool_row=pool_row, position=position, batch_rows=(1,), role=Role.VERIFY)]
    if shared_with is not None:
        cells.append(
            Cell(
                pool_row=shared_with,
                position=position,
                batch_rows=(0,),
                role=Role.VERIFY,
                shared=True,
            )
        )
    cells.append(
        Cell(pool_row=11, position=position + 1, batch_rows=(), role=Role.IDLE_ROW, seed=False)
    )
    return SlotProvenance(
        slot=slot,
        space=space,
        cells=tuple(cells),
        cells_total=len(cells) + extra,
        swa_slot=None if space == "swa" else 40 + slot % 7,
        translation_note=None,
        allocator="in use",
    )


def _lut_findings() -> list[Finding]:
    found = []
    for i in range(LUT_FINDINGS):
        slot = 900 + i
        prov = SlotProvenance(
            slot=slot,
            space=Space.FULL,
            cells=(
                Cell(pool_row=5, position=10 + i, batch_rows=(2,), role=Role.VERIFY, seed=i == 0),
            ),
            cells_total=1,
            swa_slot=None,
            translation_note="slot >= lut_len (512): the GPU clamps to LUT[511] = -1",
        )
        found.append(
            Finding(
                code=FindingCode.LUT_OUT_OF_RANGE,
                group=Group.SWA,
                slot=slot,
                batch_row=2,
                pool_row=5,
                position=10 + i,
                role=Role.VERIFY,
                message=f"verify slot {slot} >= lut_len 512: REF raises, GPU reads LUT[511]",
                details={"lut_len": 512, "gpu_value": -1, "cells": [5, 10 + i]},
                provenance=(prov,),
                provenance_total=1,
            )
        )
    return found


def main_findings() -> list[Finding]:
    """Findings of several codes, groups and severities, in a scrambled order."""
    dup_prov = SlotProvenance(
        slot=77,
        space=Space.FULL,
        cells=(
            Cell(pool_row=8, position=4, batch_rows=(1,), role=Role.VERIFY),
            Cell(pool_row=8, position=9, batch_rows=(1,), role=Role.PENDING_WRITE),
            Cell(pool_row=3, position=4, batch_rows=(0,), role=Role.VERIFY, shared=True),
        ),
        cells_total=5,
        swa_slot=12,
        allocator="free",
        canary=(
            CanaryEntry(
                buffer="canary.full.head.k",
                token=151643,
                position=4,
                prev_hash=123456789,
                real_kv_hash=987654321,
            ),
        ),
        violations=(RingRow(index=0, fields=(77, 4, 1, 0)),),
    )
    swa_prov = SlotProvenance(
        slot=12,
        space=Space.SWA,
        cells=(Cell(pool_row=8, position=4, batch_rows=(1,), role=Role.VERIFY),),
        cells_total=1,
        mapped_from=(77, 78),
        allocator=None,
    )
    found = [
        *_lut_findings(),
        Finding(
            code=FindingCode.DUPLICATE_SLOT_IN_ROW,
            group=Group.FULL,
            slot=77,
            batch_row=1,
            pool_row=8,
            position=4,
            role=Role.VERIFY,
            message="slot 77 is at positions 4 and 9 of pool row 8 | both live <here>",
            details={"positions": [4, 9]},
            provenance=(dup_prov,),
            provenance_total=1,
        ),
        Finding(
            code=FindingCode.SWA_SLOT_COLLISION,
            group=Group.SWA,
            slot=12,
            space=Space.SWA,
            batch_row=1,
            pool_row=8,
            position=4,
            role=Role.VERIFY,
            message="[bold]full slots 77 and 78[/bold] map to swa slot 12",
            details={"full_slot": 78},
            provenance=(swa_prov,),
            provenance_total=1,
        ),
        Finding(
            code=FindingCode.ROW_OUT_OF_RANGE,
            group=Group.FULL,
            batch_row=6,
            pool_row=4096,
            message="req_pool_indices[6] = 4096 is outside [0, 4096)",
            details={"max_reqs": 4096},
        ),
        Finding(
            code=FindingCode.NEGATIVE_LENGTH,
            group=Group.FULL,
            batch_row=5,
            pool_row=9,
            message="extend_seq_lens[5] = -1 is negative (treated as 0)",
            details={"tensor": "extend_seq_lens", "value": -1},
        ),
        Finding(
            code=FindingCode.VERIFY_CAPACITY_OVERFLOW,
            group=Group.SWA,
            message="requested 700 verify entries > capacity 512",
            details={"requested": 700, "capacity": 512},
        ),
        Finding(
            code=FindingCode.VERIFY_CAPACITY_OVERFLOW,
            group=Group.FULL,
            message="requested 900 verify entries > capacity 512",
            details={"requested": 900, "capacity": 512},
        ),
    ]
    random.Random(7).shuffle(found)
    return found


GROUPS = (
    GroupSummary(
        group=Group.FULL,
        window=0,
        total_verify=900,
        verify_capacity=512,
        enable=0,
        kernel="triton",
    ),
    GroupSummary(
        group=Group.SWA,
        window=128,
        total_verify=700,
        verify_capacity=512,
        enable=0,
        kernel="triton",
        explained_differences={
            FindingCode.LUT_OUT_OF_RANGE: 17,
            FindingCode.KERNEL_DIVERGENCE: 1,
        },
        unexplained_differences=2,
        kernel_launch_error=None,
    ),
)


def make_dump(path: str, findings: list[Finding], notes: tuple[str, ...] = ()) -> DumpReport:
    return DumpReport(
        path=path,
        identity=dict(IDENTITY),
        bs=8,
        groups=GROUPS,
        findings=tuple(findings),
        kernel_mode="interpreter",
        notes=notes,
    )


@pytest.fixture
def findings_dump() -> DumpReport:
    return make_dump(
        "dumps/step1207|rank0.safetensors",
        main_findings(),
        notes=("no out_cache_loc: write-to-live-slot not checked",),
    )


@pytest.fixture
def clean_dump() -> DumpReport:
    return make_dump("dumps/clean.safetensors", [])


@pytest.fixture
def warning_dump() -> DumpReport:
    return make_dump(
        "dumps/warn.safetensors", [f for f in main_findings() if f.severity is Severity.WARNING]
    )


@pytest.fixture
def bad_dump() -> DumpReport:
    return DumpReport(
        path="dumps/broken.safetensors",
        identity={},
        bs=0,
        groups=(),
        findings=(),
        error="missing tensor `req_to_token` (needed by every plan)",
    )


@pytest.fixture
def single_report(findings_dump: DumpReport) -> CheckReport:
    return CheckReport(dumps=(findings_dump,))


@pytest.fixture
def clean_report(clean_dump: DumpReport) -> CheckReport:
    return CheckReport(dumps=(clean_dump,))


@pytest.fixture
def multi_report(
    findings_dump: DumpReport,
    clean_dump: DumpReport,
    warning_dump: DumpReport,
    bad_dump: DumpReport,
) -> CheckReport:
    return CheckReport(dumps=(findings_dump, clean_dump, warning_dump, bad_dump))


@pytest.fixture(params=["single", "clean", "multi", "empty"])
def any_report(request: pytest.FixtureRequest) -> CheckReport:
    if request.param == "empty":
        return CheckReport(dumps=())
    report: CheckReport = request.getfixturevalue(f"{request.param}_report")
    return report


@pytest.fixture
def slot_report() -> ProvenanceReport:
    findings = [f for f in main_findings() if f.slot == 77]
    (prov,) = findings[0].provenance
    return ProvenanceReport(
        path="dumps/step1207|rank0.safetensors",
        identity=dict(IDENTITY),
        slot=prov,
        findings=tuple(findings),
    )


@pytest.fixture
def row_report() -> ProvenanceReport:
    cells = tuple(
        RowCell(
            position=p,
            slot=0 if p == 2 else 100 + p,
            role=Role.PREFIX
            if p < 3
            else Role.VERIFY
            if p < 6
            else Role.PENDING_WRITE
            if p < 8
            else Role.STALE_TAIL,
            seed=p == 5,
            swa_slot=None if p >= 8 else 10 + p,
            marks=(FindingCode.PADDING_SLOT_IN_LIVE_RANGE,)
            if p == 2
            else (FindingCode.SWA_UNMAPPED_IN_WINDOW, FindingCode.DUPLICATE_SLOT_IN_ROW)
            if p == 4
            else (),
        )
        for p in range(10)
    )
    row = RowMap(
        pool_row=8,
        batch_rows=(1,),
        prefix_len=6,
        extend_len=2,
        window_start=3,
        group=Group.SWA,
        cells=cells,
        filled=9,
        max_seq_len=4096,
    )
    findings = (
        Finding(
            code=FindingCode.PADDING_SLOT_IN_LIVE_RANGE,
            group=Group.FULL,
            slot=0,
            batch_row=1,
            pool_row=8,
            position=2,
            role=Role.PREFIX,
            message="live prefix position 2 of pool row 8 holds slot 0",
        ),
        Finding(
            code=FindingCode.SWA_UNMAPPED_IN_WINDOW,
            group=Group.SWA,
            slot=104,
            batch_row=1,
            pool_row=8,
            position=4,
            role=Role.VERIFY,
            message="LUT[104] == 0 in the window",
        ),
    )
    return ProvenanceReport(path="dumps/row.safetensors", identity={}, row=row, findings=findings)


@pytest.fixture(params=["slot", "row"])
def any_provenance(request: pytest.FixtureRequest) -> ProvenanceReport:
    report: ProvenanceReport = request.getfixturevalue(f"{request.param}_report")
    return report
