"""`describe_dump`: the plain record behind `kvcanary inspect` (schema `kvcanary.inspect/2`).

A dict of JSON types only, so the table and JSON renderers show the same facts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.schema import IDENTITY_KEYS, SCALARS, SHRINK_KEY, dtype_label

__all__ = ["INSPECT_SCHEMA", "describe_dump"]

INSPECT_SCHEMA = "kvcanary.inspect/2"


def describe_dump(dump: KvDump, *, sglang_installed: str | None = None) -> dict[str, Any]:
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
        and k not in ("kvcanary.format", SHRINK_KEY)
        and k not in dump.scalars
        and k != "groups"
    }
    return {
        "schema": INSPECT_SCHEMA,
        "path": str(dump.path),
        "file_bytes": dump.file_size,
        "format": dump.metadata.get("kvcanary.format"),
        "tensors": [
            {
                "name": info.name,
                "dtype": dtype_label(info.dtype),
                "shape": list(info.shape),
                "bytes": info.nbytes,
                "role": info.role,
                "kept": info.kept,
            }
            for info in dump.tensors.values()
        ],
        "scalars": [
            {
                "name": s.name,
                "value": s.value,
                "source": s.source,
                "origin": s.origin,
                "option": SCALARS[s.name].option,
                "meaning": SCALARS[s.name].meaning,
            }
            for s in dump.scalars.values()
        ],
        "groups": [{"name": group, "window": dump.window(group)} for group in dump.groups],
        "batch": {
            "bs": dump.bs,
            "active_rows": int(active.sum()),
            "padding_rows": int((~active).sum()),
            "total_prefix_tokens": total_prefix,
            "total_extend_tokens": total_extend,
            "max_reqs": dump.max_reqs,
            "max_seq_len": dump.max_seq_len,
            "lut_len": dump.lut_len,
        },
        "identity": dump.identity,
        "shrink": None if dump.shrink is None else dump.shrink.as_record(dump.path.name),
        "sglang_installed": sglang_installed,
        "other_metadata": extra,
        "notes": notes,
    }
