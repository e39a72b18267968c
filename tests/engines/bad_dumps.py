"""vLLM dumps broken in the ways both `check` and `inspect` must refuse in one line, exit 2."""

from __future__ import annotations

from typing import Any

from kvcanary_cli.engines.vllm.synth import build


def broken_vllm_contents(**meta: str) -> dict[str, tuple[dict[str, Any], dict[str, str]]]:
    """(tensors, metadata) by case: a required tensor missing, a table index with a gap, the
    groups' metadata unreadable, and one case per `meta` key set to its value."""
    tensors, base = build("vllm-clean", seed=1).contents()
    gap = dict(tensors, **{"vllm.table_index": tensors["vllm.table_index"] + 1})
    cases = {
        "missing": ({k: v for k, v in tensors.items() if k != "vllm.ref_cnt"}, base),
        "gap": (gap, base),
        "groups": (tensors, dict(base, **{"vllm.groups": "[{"})),
    }
    for key, value in meta.items():
        cases[key] = (tensors, dict(base, **{key: value}))
    return cases
