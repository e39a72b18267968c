"""JSON output: the versioned records, serialised deterministically (sorted keys, indent 2)."""

from __future__ import annotations

from kvcanary_cli.analysis.model import CheckReport, ProvenanceReport
from kvcanary_cli.render.console import to_json
from kvcanary_cli.render.records import provenance_record, to_record

__all__ = ["check_json", "provenance_json"]


def check_json(report: CheckReport) -> str:
    """The `kvcanary.check/1` record as JSON, every finding included, with a trailing newline."""
    return to_json(to_record(report))


def provenance_json(report: ProvenanceReport) -> str:
    """The `kvcanary.provenance/1` record as JSON, with a trailing newline."""
    return to_json(provenance_record(report))
