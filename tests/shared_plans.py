"""kvcanary's Triton plans of selftest's dumps, computed once per test process and shared by
the selftests of the corpus: each release's (tests/integration/test_sglang_releases.py), the
wheel's (tests/integration/test_sglang_wheel.py) and the command line's without SGLang
(tests/cli/test_sglang_cli.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.planners.base import Plan, Planner, Semantics

__all__ = ["SharedPlans", "digest_but_the_release", "sharing_triton_plans"]


def digest_but_the_release(path: Path) -> str:
    """The digest of a safetensors file but the release its metadata is stamped with (the
    one thing in selftest's dumps that differs from release to release)."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header.get("__metadata__", {}).pop("sglang.version", None)
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    digest.update(data[8 + size :])
    return digest.hexdigest()


#: kvcanary's own Triton plans of selftest's dumps, by (file digest, group), for every release
_TRITON_PLANS: dict[tuple[str, str], Plan] = {}


class SharedPlans:
    """kvcanary's Triton planner with its plans shared by every release's selftest: its
    kernels are kvcanary's own (no release is on their path) and a plan is a function of the
    dump's tensors and scalars alone, so each scenario's is computed once per process
    (interpreted: 1.3 s of the 1.9 s a release's selftest takes) and compared with each
    release's baselines as selftest compares a fresh one."""

    def __init__(self, planner: Planner) -> None:
        self._planner = planner
        self.name = planner.name
        self.semantics: Semantics = planner.semantics

    @property
    def mode(self) -> str | None:
        return self._planner.mode

    def plan(self, dump: KvDump, group: str) -> Plan:
        key = (digest_but_the_release(dump.path), group)
        if key not in _TRITON_PLANS:
            _TRITON_PLANS[key] = self._planner.plan(dump, group)
        return _TRITON_PLANS[key]


def sharing_triton_plans(planners: list[Planner]) -> list[Planner]:
    """`make_selftest_planners`' planners, its Triton one sharing its plans (`SharedPlans`)."""
    return [SharedPlans(p) if p.name == "triton" else p for p in planners]
