"""Reference vs kernel: exact comparison of two plans, with every difference explained or not.

Plans are integers, so there is no tolerance. A difference is *explained* when a problem of
either plan accounts for it (a clamp at a slot >= lut_len is `LUT_OUT_OF_RANGE`, a masked
read of a bad pool row is `ROW_OUT_OF_RANGE`, ...); anything else is a `KERNEL_DIVERGENCE`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from kvcanary_cli.analysis.upstream_raise import launch_divergences
from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.tensor import fold_at
from kvcanary_cli.planners.base import Plan, ProblemKind, ProblemRole, ProblemTable, Undefined
from kvcanary_cli.results.check import Finding, JsonValue

__all__ = ["PlanComparison", "compare_plans"]

_ROW_LEVEL = [kind for kind in ProblemKind if kind.row_level]
#: (plan field, undefined bit, problem role, label) of the three per-entry values.
_FIELDS = (
    ("verify_slot_indices", Undefined.SLOT, ProblemRole.VERIFY, "verify slot"),
    ("verify_prev_slot_indices", Undefined.PREV, ProblemRole.CHAIN_PREV, "prev slot"),
    ("verify_expected_tokens", Undefined.TOKEN, ProblemRole.EXPECTED_TOKEN, "expected token"),
)


@dataclass(frozen=True, kw_only=True)
class PlanComparison:
    """Differences between a reference plan and a kernel plan of the same group."""

    #: finding code -> plan values that differ because of it.
    explained: dict[str, int] = field(default_factory=dict)
    #: finding code -> plan field ("verify slot", "prev slot", ...) -> values.
    explained_by_field: dict[str, dict[str, int]] = field(default_factory=dict)
    divergences: list[Finding] = field(default_factory=list)

    def explain(self, code: str, what: str, count: int) -> None:
        """Count `count` differing values of field `what` as explained by `code`."""
        self.explained[code] = self.explained.get(code, 0) + count
        fields = self.explained_by_field.setdefault(code, {})
        fields[what] = fields.get(what, 0) + count


def _both(reference: Plan, kernel: Plan) -> ProblemTable:
    """Both plans' problems, unordered (what reads them here needs no order, or orders the
    few rows it needs)."""
    return ProblemTable.joined([reference.problems, kernel.problems])


def _entry_explanations(problems: ProblemTable, plan: Plan) -> dict[ProblemRole, np.ndarray]:
    """Per field role, the index (into `FindingCode`) of the code explaining each entry, or -1.

    LUT problems explain their own entry; row-level problems explain every later entry of
    their batch row (a bad row or a prefix past the row spoils the rest of the row).
    """
    n = plan.entries
    rows = plan.entry_batch_rows()
    entry_ids = np.arange(n)
    with_entry = problems.entry >= 0
    out: dict[ProblemRole, np.ndarray] = {}
    for _, _, role, _ in _FIELDS:
        why = np.full(n, -1, dtype=np.int64)
        lut = (
            with_entry
            & (problems.kind == ProblemKind.LUT_OUT_OF_RANGE)
            & (problems.role == role)
            & (problems.entry < n)
        )
        why[problems.entry[lut]] = _code_index(ProblemKind.LUT_OUT_OF_RANGE)
        spoilers = (
            [ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE]
            if role is ProblemRole.EXPECTED_TOKEN
            else _ROW_LEVEL
        )
        for kind in spoilers:
            mask = with_entry & (problems.kind == kind)
            if not mask.any():
                continue
            first = np.full(plan.bs, np.iinfo(np.int64).max, dtype=np.int64)
            fold_at(np.minimum, first, problems.batch_row[mask], problems.entry[mask])
            hit = (entry_ids >= first[rows]) & (why < 0)
            why[hit] = _code_index(kind)
        out[role] = why
    return out


def _code_index(kind: ProblemKind) -> int:
    """Index into `FindingCode` of the code a problem kind is reported under."""
    return FindingCode(kind.code).order


def compare_plans(reference: Plan, kernel: Plan) -> PlanComparison:
    """Compare on what both define; explain each difference or report a divergence.

    A kernel's raise (or a raise it misses) is held against the reference's prediction first.
    """
    reference, kernel = reference.entry_arrays(), kernel.entry_arrays()
    result = PlanComparison(divergences=launch_divergences(reference, kernel))
    if kernel.launch_error is not None:
        return result
    group = reference.group

    def diverge(
        what: str,
        ref_value: object,
        kernel_value: object,
        *,
        batch_row: int | None = None,
        position: int | None = None,
    ) -> None:
        """Record one unexplained difference."""
        result.divergences.append(
            Finding(
                code=FindingCode.KERNEL_DIVERGENCE,
                group=group,
                message=f"{what}: reference {ref_value}, kernel {kernel_value}",
                details=cast(
                    dict[str, JsonValue],
                    {"field": what, "reference": ref_value, "kernel": kernel_value},
                ),
                batch_row=batch_row,
                position=position,
            )
        )

    for name in ("verify_num_valid", "enable", "write_num_valid_reqs"):
        ref_v, ker_v = getattr(reference, name), getattr(kernel, name)
        if ref_v != ker_v:
            diverge(name, ref_v, ker_v)
    problems = _both(reference, kernel)
    codes = list(FindingCode)  # indexed by FindingCode.order
    if reference.entries and reference.entries == kernel.entries:
        compared = []
        for name, bit, role, label in _FIELDS:
            if not _field_differs(reference, kernel, name, bit):
                continue  # the common case: read a piece at a time, nothing held
            ref_def = (reference.verify_undefined & int(bit)) == 0
            ker_def = (kernel.verify_undefined & int(bit)) == 0
            ref_val, ker_val = getattr(reference, name), getattr(kernel, name)
            differs = (ref_def != ker_def) | (ref_def & ker_def & (ref_val != ker_val))
            if differs.any():  # a field that agrees everywhere holds nothing past here
                compared.append((role, label, ref_def, ker_def, ref_val, ker_val, differs))
            del ref_def, ker_def, differs
        # Explanations cost a pass per field: only when something differs.
        any_differs = bool(compared)
        why = _entry_explanations(problems, reference) if any_differs else {}
        rows = reference.entry_batch_rows() if any_differs else np.zeros(0, dtype=np.int64)
        positions = reference.verify_expected_positions
        for role, label, ref_def, ker_def, ref_val, ker_val, differs in compared:
            if not differs.any():
                continue
            reasons = why[role][differs]
            for index, count in enumerate(np.bincount(reasons[reasons >= 0], minlength=len(codes))):
                if count:
                    result.explain(codes[index].value, label, int(count))
            for k in np.flatnonzero(differs & (why[role] < 0)).tolist():  # unexplained only
                diverge(
                    label,
                    int(ref_val[k]) if ref_def[k] else "undefined",
                    int(ker_val[k]) if ker_def[k] else "undefined",
                    batch_row=int(rows[k]),
                    position=int(positions[k]),
                )
    elif reference.entries != kernel.entries:
        diverge("materialized entries", reference.entries, kernel.entries)
    _compare_write(reference, kernel, problems, result, diverge)
    return result


#: Entries `_field_differs` compares at a time (bounds its temporaries).
_PIECE = 1 << 20


def _field_differs(reference: Plan, kernel: Plan, name: str, bit: Undefined) -> bool:
    """Whether field `name` differs at any entry both plans hold (defined in one plan only, or
    defined in both with another value), compared `_PIECE` entries at a time: two plans of
    ten million equal entries make no mask of every entry."""
    ref_flags, ker_flags = reference.verify_undefined, kernel.verify_undefined
    ref_values, ker_values = getattr(reference, name), getattr(kernel, name)
    for a in range(0, reference.entries, _PIECE):
        b = a + _PIECE
        ref_def = (ref_flags[a:b] & int(bit)) == 0
        ker_def = (ker_flags[a:b] & int(bit)) == 0
        if (
            (ref_def != ker_def) | (ref_def & ker_def & (ref_values[a:b] != ker_values[a:b]))
        ).any():
            return True
    return False


def _compare_write(
    reference: Plan,
    kernel: Plan,
    problems: ProblemTable,
    result: PlanComparison,
    diverge: Callable[..., None],
) -> None:
    n = min(reference.write_seed_slot_indices.shape[0], kernel.write_seed_slot_indices.shape[0])
    ref_def = ~reference.seed_undefined[:n]
    ker_def = ~kernel.seed_undefined[:n]
    ref_val = reference.write_seed_slot_indices[:n]
    ker_val = kernel.write_seed_slot_indices[:n]
    differs = (ref_def != ker_def) | (ref_def & ker_def & (ref_val != ker_val))
    bad_rows = np.flatnonzero(differs)
    if bad_rows.size:
        # per batch row, once: a seed LUT problem, or the first row-level problem's kind
        in_rows = (problems.batch_row >= 0) & (problems.batch_row < n)
        seed_lut = np.zeros(n, dtype=bool)
        lut = (
            in_rows
            & (problems.kind == ProblemKind.LUT_OUT_OF_RANGE)
            & (problems.role == ProblemRole.SEED)
        )
        seed_lut[problems.batch_row[lut]] = True
        row_kind = np.full(n, -1, dtype=np.int64)
        level = np.flatnonzero(in_rows & np.isin(problems.kind, [int(k) for k in _ROW_LEVEL]))
        level = problems.canonical_order(level)
        for i in level[::-1].tolist():  # the first problem of a row wins
            row_kind[problems.batch_row[i]] = problems.kind[i]
        for r in bad_rows.tolist():
            if seed_lut[r]:
                code = ProblemKind.LUT_OUT_OF_RANGE.code
            elif row_kind[r] >= 0:
                code = ProblemKind(int(row_kind[r])).code
            else:
                diverge(
                    "write seed",
                    int(ref_val[r]) if ref_def[r] else "undefined",
                    int(ker_val[r]) if ker_def[r] else "undefined",
                    batch_row=r,
                )
                continue
            result.explain(code, "write seed", 1)
    m = min(reference.write_offsets.shape[0], kernel.write_offsets.shape[0])
    bad = np.flatnonzero(reference.write_offsets[:m] != kernel.write_offsets[:m])
    for r in bad.tolist():
        diverge(
            "write offset",
            int(reference.write_offsets[r]),
            int(kernel.write_offsets[r]),
            batch_row=r,
        )
