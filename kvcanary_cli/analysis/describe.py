"""`describe_dump`: what a dump holds, as `kvcanary inspect` shows it (a `DumpDescription`,
the `kvcanary.inspect/2` record). It reads the loaded dump's header facts, scalars and
per-batch vectors only (numpy; no table is touched).
"""

from __future__ import annotations

from typing import cast

import numpy as np

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import (
    IDENTITY_KEYS,
    ORIGINAL_DTYPES_KEY,
    SCALARS,
    SHRINK_KEY,
    dtype_label,
)
from kvcanary_cli.results.check import ScalarOrigin
from kvcanary_cli.results.inspect import (
    BatchDescription,
    DumpDescription,
    GroupDescription,
    ScalarDescription,
    ScalarSource,
    TensorDescription,
)
from kvcanary_cli.results.shrink import ShrinkSummary

__all__ = ["describe_dump"]


def describe_dump(dump: KvDump, *, sglang_installed: str | None = None) -> DumpDescription:
    """Tensors, scalars with their source, groups, batch summary, identity keys and notes.

    `sglang_installed` is the SGLang version installed here (None: not installed), shown next
    to the version the dump records (`identity["sglang.version"]`).
    """
    rpi, prefix, extend = (dump.req_pool_indices, dump.prefix_lens, dump.extend_seq_lens)
    active = rpi != 0
    # Python ints: claimed lengths near 2^63 would overflow a numpy sum
    total_prefix = sum(np.clip(prefix[active], 0, None).tolist())
    total_extend = sum(np.clip(extend[active], 0, None).tolist())
    notes = list(dump.notes)
    notes.extend(
        f"{note.tensor} is {dtype_label(note.found)}: accepted, but the production GPU path "
        f"requires {dtype_label(note.expected)}"
        for note in dump.dtype_notes
    )
    extra = {
        k: v
        for k, v in sorted(dump.metadata.items())
        if k not in IDENTITY_KEYS
        and k not in ("kvcanary.format", SHRINK_KEY, ORIGINAL_DTYPES_KEY)
        and k not in dump.scalars
        and k != "groups"
    }
    return DumpDescription(
        path=str(dump.path),
        file_bytes=dump.file_size,
        format=dump.metadata.get("kvcanary.format"),
        tensors=tuple(
            TensorDescription(
                name=info.name,
                dtype=dtype_label(info.dtype),
                shape=tuple(info.shape),
                bytes=info.nbytes,
                role=info.role,
                kept=info.kept,
            )
            for info in dump.tensors.values()
        ),
        scalars=tuple(
            ScalarDescription(
                name=s.name,
                value=s.value,
                source=cast(ScalarSource, s.source),
                origin=cast(ScalarOrigin, s.origin),
                option=SCALARS[s.name].option,
                meaning=SCALARS[s.name].meaning,
            )
            for s in dump.scalars.values()
        ),
        groups=tuple(GroupDescription(name=g, window=dump.window(g)) for g in dump.groups),
        batch=BatchDescription(
            bs=dump.bs,
            active_rows=int(active.sum()),
            padding_rows=int((~active).sum()),
            total_prefix_tokens=total_prefix,
            total_extend_tokens=total_extend,
            max_reqs=dump.max_reqs,
            max_seq_len=dump.max_seq_len,
            lut_len=dump.lut_len,
        ),
        identity=dump.identity,
        shrink=None if dump.shrink is None else ShrinkSummary.of(dump.shrink, dump.path.name),
        sglang_installed=sglang_installed,
        other_metadata=extra,
        notes=tuple(notes),
    )
