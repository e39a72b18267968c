"""The `kvcanary.check/1`, `kvcanary.provenance/1` and `kvcanary.violations/1` schemas, and a
small validator.

Objects list their keys exactly (no missing, no extra keys); docs/json-schema.md describes the
same shapes (tests/render/test_schema_doc.py checks that it names every key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcanary_cli.analysis.model import CauseCode, Confidence, FindingCode, Severity


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    value: Any


@dataclass(frozen=True)
class Nullable:
    inner: Any


@dataclass(frozen=True)
class OneOf:
    values: frozenset[str]


JSON_VALUE = object()  # any JSON value

CODES = OneOf(frozenset(c.value for c in FindingCode))
CAUSES = OneOf(frozenset(c.value for c in CauseCode))
SEVERITIES = OneOf(frozenset(s.value for s in Severity))
ROLES = OneOf(
    frozenset({"verify", "prefix", "chain-prev", "seed", "pending-write", "stale-tail", "idle-row"})
)
SPACES = OneOf(frozenset({"full", "swa"}))

CELL = {
    "pool_row": int,
    "position": int,
    "batch_rows": ListOf(int),
    "role": ROLES,
    "seed": bool,
    "shared": bool,
    "full_slot": Nullable(int),
}
PROVENANCE = {
    "slot": int,
    "space": SPACES,
    "cells": ListOf(CELL),
    "cells_total": int,
    "swa_slot": Nullable(int),
    "translation_note": Nullable(str),
    "mapped_from": ListOf(int),
    "clamped_from": ListOf(int),
    "allocator": Nullable(OneOf(frozenset({"free", "in use", "unknown (not kept)"}))),
    "canary": ListOf(
        {"buffer": str, "token": int, "position": int, "prev_hash": int, "real_kv_hash": int}
    ),
    "violations": ListOf({"index": int, "fields": ListOf(int)}),
    "violations_total": int,
}
FINDING = {
    "code": CODES,
    "severity": SEVERITIES,
    "group": str,
    "slot": Nullable(int),
    "space": SPACES,
    "batch_row": Nullable(int),
    "pool_row": Nullable(int),
    "position": Nullable(int),
    "cells": int,
    "spread": bool,
    "role": Nullable(str),  # a cell role, or a plan read: seed, expected-token
    "message": str,
    "details": MapOf(JSON_VALUE),
    "provenance": Nullable(PROVENANCE),
    "assumes": ListOf(str),
    "cause": Nullable(CAUSES),
    "first_raise": bool,
}
CAUSE = {
    "cause": CAUSES,
    "confidence": OneOf(frozenset(c.value for c in Confidence)),
    "summary": str,
    "evidence": ListOf(str),
    "explains": MapOf(int),
    "fix": str,
}
ORIGINS = OneOf(frozenset({"recorded", "overridden", "derived", "default", "unknown"}))
GROUP = {
    "group": str,
    "window": int,
    "total_verify": int,
    "verify_capacity": int,
    "enable": int,
    "kernel": str,
    "explained_differences": MapOf(int),
    "explained_by_field": MapOf(MapOf(int)),
    "unexplained_differences": int,
    "kernel_launch_error": Nullable(str),
}
SHRUNK = Nullable(
    {
        "source": {"name": str, "bytes": int, "sha256": str},
        "source_file": str,
        "kvcanary_version": str,
        "overrides": MapOf(int),
        "dropped_bytes": int,
        "dropped_elements": int,
        "tensors": ListOf(
            {
                "name": str,
                "shape": ListOf(int),
                "kept": int,
                "dropped": int,
                "dropped_bytes": int,
                "rows": Nullable(int),
                "kept_rows": Nullable(int),
            }
        ),
        "command": str,
        "note": str,
    }
)
DUMP = {
    "path": str,
    "identity": MapOf(str),
    "bs": int,
    "verdict": OneOf(frozenset({"clean", "warnings", "errors", "bad-input"})),
    "fails": bool,
    "error": Nullable(str),
    "kernel_mode": Nullable(str),
    "shrunk": SHRUNK,
    "notes": ListOf(str),
    "groups": ListOf(GROUP),
    "scalars": ListOf({"name": str, "value": Nullable(int), "origin": ORIGINS, "source": str}),
    "assumptions": ListOf(
        {"scalar": str, "value": Nullable(int), "source": str, "decides": MapOf(int), "advice": str}
    ),
    "diagnosis": ListOf(CAUSE),
    "first_raise": Nullable(
        {
            "group": str,
            "exception_type": str,
            "message": str,
            "code": CODES,
            "batch_row": int,
            "position": int,
        }
    ),
    "recorded_exception": Nullable(str),
    "recorded_exception_matches": Nullable(bool),
    "requests": ListOf(
        {
            "batch_row": int,
            "pool_row": int,
            "prefix_len": int,
            "extend_len": int,
            "counts": MapOf(int),
            "first_bad_position": Nullable(int),
        }
    ),
    "counts": ListOf({"code": CODES, "severity": SEVERITIES, "group": str, "count": int}),
    "findings_total": int,
    "findings": ListOf(FINDING),
}
CHECK = {
    "schema": OneOf(frozenset({"kvcanary.check/1"})),
    "kvcanary_version": str,
    "fail_on": SEVERITIES,
    "sglang_installed": Nullable(str),
    "verdict": OneOf(frozenset({"clean", "findings", "bad-input"})),
    "summary": {
        "dumps": int,
        "failed": int,
        "bad_input": int,
        "findings": int,
        "by_severity": {"error": int, "warning": int, "info": int},
        "counts": MapOf(int),
    },
    "dumps": ListOf(DUMP),
}
ROW = {
    "pool_row": int,
    "batch_rows": ListOf(int),
    "prefix_len": Nullable(int),
    "extend_len": Nullable(int),
    "window_start": Nullable(int),
    "group": str,
    "filled": int,
    "max_seq_len": int,
    "cells": ListOf(
        {
            "position": int,
            "slot": int,
            "role": ROLES,
            "seed": bool,
            "swa_slot": Nullable(int),
            "marks": ListOf(CODES),
        }
    ),
    "gaps": ListOf({"start": int, "end": int, "filled": int}),
    "positions": Nullable(ListOf(int)),
    "marks_not_shown": int,
}
PROVENANCE_REPORT = {
    "schema": OneOf(frozenset({"kvcanary.provenance/1"})),
    "kvcanary_version": str,
    "path": str,
    "identity": MapOf(str),
    "shrunk": SHRUNK,
    "slot": Nullable(PROVENANCE),
    "row": Nullable(ROW),
    "findings": ListOf(FINDING),
}


VIOLATION_ROW = {
    "kernel_kind": int,
    "slot_idx": int,
    "position": int,
    "stored_token": int,
    "expected_token": int,
    "stored_chain_hash": int,
    "expected_aux": int,
    "fail_reason_bits": int,
    "origin": OneOf(frozenset({"ring", "log", "log-message", "replay"})),
    "source": str,
    "index": int,
    "tag": str,
    "canary_kind": str,
    "group": Nullable(SPACES),
    "buffer": Nullable(OneOf(frozenset({"head.k", "head.v", "tail.k", "tail.v"}))),
    "reasons": ListOf(str),
    "is_write": bool,
    "pump": Nullable({"total_violations": int, "ring_overflow": bool, "step_when_pumped": int}),
    "entry": Nullable({"batch_row": int, "expected_position": int, "prev_slot": int}),
    "diagnosis": Nullable(str),
    "explanation": Nullable(
        {
            "cause": str,
            "space": SPACES,
            "referenced_by": Nullable(
                {"pool_row": Nullable(int), "position": Nullable(int), "batch_row": Nullable(int)}
            ),
            "owner": Nullable(
                {
                    "pool_row": Nullable(int),
                    "position": Nullable(int),
                    "where": OneOf(frozenset({"none", "live", "stale-tail", "idle-row"})),
                }
            ),
            "prev_slot": Nullable(int),
            "allocator": Nullable(OneOf(frozenset({"free", "in use", "unknown (not kept)"}))),
        }
    ),
}
VIOLATIONS = {
    "schema": OneOf(frozenset({"kvcanary.violations/1"})),
    "kvcanary_version": str,
    "verdict": OneOf(frozenset({"violations", "clean"})),
    "dump": Nullable(str),
    "identity": MapOf(str),
    "filters": {"group": Nullable(SPACES), "buffer": Nullable(str)},
    "summary": {
        "rows": int,
        "by_origin": MapOf(int),
        "by_tag": MapOf(int),
        "by_reason": MapOf(int),
        "by_cause": MapOf(int),
    },
    "sources": ListOf(
        {
            "path": str,
            "kind": OneOf(frozenset({"dump", "log"})),
            "rows": int,
            "ring": Nullable(
                {
                    "capacity": int,
                    "write_index": int,
                    "valid": int,
                    "overflow": bool,
                    "wrapped": bool,
                    "stray_rows": int,
                }
            ),
            "log": Nullable(
                {
                    "lines": int,
                    "structured": int,
                    "messages": int,
                    "rebuilt": int,
                    "unparsed": int,
                    "incomplete": int,
                    "inconsistent": int,
                    "overlong": int,
                    "swa_divergence": Nullable(
                        {
                            "samples": int,
                            "last": MapOf(int),
                            "peak_swa_full_idx_divergence": int,
                            "peak_swa_out_of_window_tokens": int,
                        }
                    ),
                }
            ),
            "notes": ListOf(str),
        }
    ),
    "replay": ListOf(
        {
            "group": SPACES,
            "buffer": str,
            "tag": str,
            "entries": int,
            "checked": int,
            "slot_zero": int,
            "chain_skipped": int,
            "outside_buffer": int,
            "undefined": int,
            "real_kv": OneOf(frozenset({"checked", "zero", "skipped"})),
            "rows": int,
        }
    ),
    "comparison": Nullable({"matched": int, "observed_only": int, "replayed_only": int}),
    "notes": ListOf(str),
    "rows_total": int,
    "rows": ListOf(VIOLATION_ROW),
    "slots": ListOf(PROVENANCE),
    "slots_total": int,
}


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def validate(value: Any, spec: Any, path: str = "$") -> list[str]:
    """Every place where `value` breaks `spec` (an empty list when it conforms)."""
    if spec is JSON_VALUE:
        return [] if _is_json(value) else [f"{path}: not a JSON value: {value!r}"]
    if isinstance(spec, Nullable):
        return [] if value is None else validate(value, spec.inner, path)
    if isinstance(spec, OneOf):
        ok = isinstance(value, str) and value in spec.values
        return [] if ok else [f"{path}: {value!r} not one of {sorted(spec.values)}"]
    if isinstance(spec, ListOf):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [e for i, v in enumerate(value) for e in validate(v, spec.item, f"{path}[{i}]")]
    if isinstance(spec, MapOf):
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        errors = [f"{path}: non-string key {k!r}" for k in value if not isinstance(k, str)]
        return errors + [
            e for k, v in value.items() for e in validate(v, spec.value, f"{path}.{k}")
        ]
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        errors = [f"{path}: missing key {k!r}" for k in spec if k not in value]
        errors += [f"{path}: unexpected key {k!r}" for k in value if k not in spec]
        return errors + [
            e for k in spec if k in value for e in validate(value[k], spec[k], f"{path}.{k}")
        ]
    if spec is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, spec)
    return [] if ok else [f"{path}: expected {spec.__name__}, got {value!r}"]


FIELD_STATUS = OneOf(frozenset({"agree", "differ", "n/a"}))
SELFTEST_FIELDS = (
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_num_valid",
    "enable",
    "write_offsets",
    "write_seed_slot_indices",
    "write_num_valid_reqs",
    "raise",
)
DIFFERENCE = {
    "field": OneOf(frozenset(SELFTEST_FIELDS)),
    "index": Nullable(int),
    "baseline": JSON_VALUE,
    "planner": JSON_VALUE,
}
COMPARISON = {
    "planner": str,
    "baseline": str,
    "semantics": OneOf(frozenset({"reference", "gpu"})),
    "agree": bool,
    "fields": {name: FIELD_STATUS for name in SELFTEST_FIELDS},
    "differences": ListOf(DIFFERENCE),
    "expected_raise": Nullable(str),
    "raised": Nullable(str),
    "not_launched": Nullable(str),
}
REF_RAISE = {
    "error": str,
    "kind": str,
    "role": str,
    "batch_row": int,
    "pool_row": int,
    "position": int,
    "value": int,
}
SELFTEST = {
    "schema": OneOf(frozenset({"kvcanary.selftest/1"})),
    "kvcanary_version": str,
    "size": str,
    "seed": int,
    "fields": ListOf(OneOf(frozenset(SELFTEST_FIELDS))),
    "planners": ListOf(
        {
            "name": str,
            "semantics": OneOf(frozenset({"reference", "gpu"})),
            "mode": Nullable(str),
            "baseline": str,
        }
    ),
    "sglang": {
        "installed": Nullable(str),
        "run": bool,
        "mode": Nullable(OneOf(frozenset({"reference", "cuda"}))),
        "verified": ListOf(str),
    },
    "verdict": OneOf(frozenset({"agree", "disagree"})),
    "summary": {
        "scenarios": int,
        "groups": int,
        "comparisons": int,
        "disagreements": int,
        "by_planner": MapOf({"comparisons": int, "disagreements": int}),
    },
    "scenarios": ListOf(
        {
            "scenario": str,
            "summary": str,
            "clean": bool,
            "expected_findings": ListOf(str),
            "groups": ListOf(
                {
                    "group": OneOf(frozenset({"full", "swa"})),
                    "ref_raise": Nullable(REF_RAISE),
                    "comparisons": ListOf(COMPARISON),
                }
            ),
        }
    ),
}
