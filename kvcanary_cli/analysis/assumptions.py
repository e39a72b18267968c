"""`assumptions_of`: the derived scalars a check's findings rest on, and how to turn them into
facts (the `assumptions` of a `DumpReport`)."""

from __future__ import annotations

from collections import Counter

from kvcanary_cli.catalog import FindingCode
from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import SCALARS
from kvcanary_cli.results.check import Assumption, Finding

__all__ = ["assumptions_of"]


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
