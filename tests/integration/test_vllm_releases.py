"""Every vLLM release kvcanary reads, from its release wheel in a process of its own
(`tests.vllm_release`; one vLLM per process), skipped with the download hint where the wheel is
not cached: clean histories of both models are silent on both sides, the prefix-cache map as
kvcanary lists it is the map vLLM's own `contain` answers for (both shapes: 0.34.0 keeps block
ids, and a key several blocks carry apart), each planted fault is found at its step, the assert
hook's dump of vLLM's own assert is explained by `check`, every model is silent under async
scheduling (where the release counts tokens in flight) and under speculative decoding, and
`soak --engine vllm` with `--replay` runs end to end.

Each is a process of about 6 s. The suite runs 0.34.0 (its map differs from 0.33.0's, which
the in-process tests drive), and the deep lane 0.33.0,
which repeats those tests' paths. Of the older
releases (0.10.0 to 0.32.0) the whole suite soaks 0.11.0, where the most differs: all 0.15.0
differs in (a request wanting an end-of-sequence token, no scheduler block size, no deferred
frees, no `contain` on the map, a two-value prefix lookup), and its import (`VllmConfig`
defined in `vllm.config`'s own `__init__`, the hash functions in `vllm.utils`), which it was
refused for; 0.12.0 to 0.16.0 differ from it in nothing the driver reads or calls but that
import (0.15.0 took its place here, at the same cost). The others run with
KVCANARY_EVERY_RELEASE=1 (0.11.0's import and 0.30.0 to 0.32.0's star re-exports, which they
were refused at import for, are also fast tests of their own: tests/cli/test_soak_trees.py),
0.10.0 to 0.10.2 among them, whose wheels `.ci/run` does not fetch (each differs from 0.11.0
in what fast tests of their own drive on 0.33.0: the plain-dict map and named-pair keys in
tests/engines/test_vllm_capture.py; the MLA flag, the multi-modal lists and 0.10.0's
manager-side hashing in tests/integration/test_vllm_soak.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import json_lines_of_module
from tests.lanes import DEEP
from tests.vllm_wheel import RELEASES, WHEEL_VERSION, missing_wheel, wheel_path

pytest.importorskip("torch")

#: Set to 1, every release is soaked (as for SGLang's: tests/integration/test_soak_releases.py).
EVERY_RELEASE_ENV = "KVCANARY_EVERY_RELEASE"
#: The oldest release the whole suite soaks (the oldest whose wheel `.ci/run` always fetches).
OLDEST_SOAKED = "0.11.0"
#: The first release whose Mamba group caches its states by prefix ("align" mode).
ALIGN = RELEASES.index("0.15.0")
#: The releases the whole suite soaks (6 s of CPU each).
SOAKED = (
    RELEASES
    if os.environ.get(EVERY_RELEASE_ENV) == "1"
    else (OLDEST_SOAKED, WHEEL_VERSION, RELEASES[-1])
)


def _release(version: str) -> pytest.param:  # type: ignore[valid-type]
    """A release's case: a subprocess of about 6 s CPU; the deep lane's for 0.33.0 (whose
    manager the in-process tests drive: test_vllm_soak)."""
    missing = pytest.mark.skipif(wheel_path(version) is None, reason=missing_wheel(version))
    lane = DEEP if version == WHEEL_VERSION else (pytest.mark.slow,)
    return pytest.param(version, marks=[missing, *lane])


@pytest.mark.parametrize("version", [_release(v) for v in SOAKED])
def test_release_soaks_clean_reads_its_map_and_catches_every_fault(
    version: str, tmp_path: Path
) -> None:
    wheel = str(wheel_path(version))
    first, *lines = json_lines_of_module("tests.vllm_release", wheel, str(tmp_path))
    assert first == {"case": "release", "version": version}
    cases: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        cases.setdefault(str(line["case"]), []).append(line)
    clean = {c["model"]: c for c in cases["clean"]}
    # every release kvcanary drives has chunked local attention and a Mamba group; from
    # 0.25.0 a reference sliding window
    rswa = {"hybrid-rswa"} if RELEASES.index(version) >= RELEASES.index("0.25.0") else set()
    assert set(clean) == {"full", "hybrid", "hybrid-mamba", "hybrid-chunked-local", *rswa}
    if version == "0.10.0":  # its own assert: a chunked-local hit of nulls has no hash to chain
        assert clean.pop("hybrid-chunked-local")["crash"] == "AssertionError"
    for c in clean.values():
        assert (c["findings"], c["crash"], c["denied"], c["unlisted"]) == (0, None, 0, 0), c
        assert c["audited"] == 150
        # (a Mamba group before its prefix-caching mode is served without prefix caching; with
        # it, a hit needs a state kept at the hit's last block: rare in 150 steps)
        assert bool(c["prefix_hits"]) == c["caching"] or c["model"] == "hybrid-mamba", c
        assert c["caching"] or not c["prefix_hits"], c
    assert clean["hybrid-mamba"]["caching"] == (RELEASES.index(version) >= ALIGN), version
    assert clean["hybrid"]["several"], "some key is carried by several blocks at once"
    expected = {
        "block-freed-twice": "negative-ref-count",
        "block-freed-while-held": "queued-block-held",
        "leak": "ref-count-high",
        "free-count": "free-count-mismatch",
    }
    faults = {c["fault"]: c for c in cases["fault"] if c["model"] == "full"}
    assert set(faults) == set(expected)
    hybrids = [c for c in cases["fault"] if c["model"] != "full"]
    assert {(c["model"], c["fault"]) for c in hybrids} == {
        (m, f)
        for m in ("hybrid-mamba", "hybrid-chunked-local", *rswa)
        for f in ("block-freed-twice", "leak")
    }
    for c in hybrids:
        assert c["planted"] is not None and c["found"] == c["planted"], c
        assert (c["code"], c["crash"]) == (expected[c["fault"]], None), c
    for fault, c in faults.items():
        assert c["planted"] is not None and c["found"] == c["planted"], c
        assert (c["code"], c["crash"]) == (expected[fault], None), c
    [hook] = cases["hook"]
    assert hook["crash"] == "AssertionError" and hook["dumps"] == 1, hook
    assert hook["as_without_hook"], "the hook changed nothing vLLM did"
    assert str(hook["raised_in"]).startswith("vllm/v1/core/block_pool.py:")
    assert ["negative-ref-count", True] in hook["found"], hook
    # async scheduling (soak --overlap): where the release counts tokens in flight, silent
    [flight] = cases["async"]
    counts = RELEASES.index(version) >= RELEASES.index("0.26.0")
    stale = RELEASES.index(version) >= RELEASES.index("0.27.0")
    assert flight == {
        "case": "async", "counted": counts, "findings": 0, "crashes": [], "stale": stale
    }  # fmt: skip
    # speculative decoding (soak --speculative-tokens): every model silent, drafts taken back;
    # again under async scheduling where the release counts the stale share
    assert cases["speculative"] == [
        {"case": "speculative", "findings": 0, "crashes": [], "both": True, "async": stale}
    ]
    [cli] = cases["cli"]
    assert cli == {
        "case": "cli",
        "exits": [0, 1, 1],
        "files": ["dump", "reproducer"],
        "reproduced": True,
        "errors": [],
    }
