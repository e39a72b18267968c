"""Audit one step of the real stack twice: kvcanary's `check` on a dump kvcanary's own capture
code records from the objects, and SGLang's own checks on the same state.

SGLang's checks are its `SchedulerInvariantChecker` (built from the real
`SchedulerPoolStatsObserver` over our scheduler's batches): `self_check_during_busy` and
`_check_kv_page_invariants` while requests run, `_check_all_pools` and `_check_req_pool`
once fully idle, and `UnifiedRadixCache.sanity_check()` then (as SGLang's `on_idle`). Each
raises (an assertion, or strict mode's `ValueError`); we keep which check it was and the
first line of what it said.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcanary_cli.capture.tree import capture_state
from kvcanary_cli.catalog import CauseCode, FindingCode
from kvcanary_cli.dump.writer import dump_contents, write_dump
from kvcanary_cli.results.check import CheckReport
from kvcanary_cli.results.ranks import Divergence
from kvcanary_cli.results.soak import AuditPoint, SGLangCheckName, SGLangCrash
from kvcanary_cli.soak.calls import row_of
from kvcanary_cli.soak.driver import Scheduler
from kvcanary_cli.soak.live import LiveAudit, read_state
from kvcanary_cli.soak.stack import MAMBA_LAYOUTS

__all__ = ["Audit", "SGLangChecks", "Said", "audit_step", "record_dump"]


@dataclass(frozen=True)
class Said:
    """One complaint of one of SGLang's checks: which, and the first line it raised."""

    check: SGLangCheckName
    message: str


@dataclass
class Audit:
    """One step's verdicts: kvcanary's finding codes (first is the top one's) and what
    SGLang's checks said (empty: silent); or SGLang's crash, with the last audited dump."""

    step: int
    mode: AuditPoint
    codes: list[str] = field(default_factory=list)
    top_cause: str | None = None
    sglang: list[Said] = field(default_factory=list)
    dump: Path | None = None
    crash: SGLangCrash | None = None
    #: SGLang's crash later in this (plan-time) audit's step, once kvcanary had flagged it
    crash_after: SGLangCrash | None = None
    #: the live audit's verdict: the first accounting fact broken (None: all held, or not
    #: run), and whether the whole `check` ran
    broken: str | None = None
    checked: bool = False
    #: with several tensor-parallel ranks (`soak --tp`): the rank this verdict is about (its
    #: own finding or crash, or the rank that diverged from rank 0), and the divergence as
    #: `kvcanary ranks` names it (with rank 0's dump of that state beside this rank's)
    rank: str | None = None
    divergence: Divergence | None = None
    reference_dump: Path | None = None

    @property
    def kvcanary_found(self) -> bool:
        """kvcanary reports an error finding."""
        return bool(self.codes) or self.divergence is not None

    @property
    def key(self) -> str | None:
        """What a shrunk workload must fail with again: the top cause, the crash's exception,
        or the ranks' divergence (`ranks <kind>`)."""
        if self.divergence is not None:
            return f"ranks {self.divergence.kind}"
        return self.top_cause if self.crash is None else f"crash {self.crash.exception}"


def running_requests(scheduler: Scheduler, batch: Any) -> list[Any]:
    """Every request holding a pool row: the batch's, the running batch's, the last prefill
    batch's (not merged yet), the chunked one; under the overlapped loop, the queued result's
    batch's too (a request the next decode left out, `_reqs_finishing_inflight`, holds its
    row until that result releases it)."""
    seen: dict[int, Any] = {}
    last = scheduler.last_batch  # a prefill batch merges into the running one next step
    queued = scheduler.inflight
    groups = [
        getattr(batch, "reqs", None) or [],
        scheduler.running.reqs,
        getattr(last, "reqs", None) or [],
        [] if queued is None else queued[0].reqs,
    ]
    if scheduler.chunked_req is not None:
        groups.append([scheduler.chunked_req])
    for group in groups:
        for req in group:
            if row_of(req) is not None:
                seen[id(req)] = req
    return list(seen.values())


def record_dump(
    scheduler: Scheduler,
    batch: Any,
    path: Path,
    rank: str | None = None,
    step: int | None = None,
) -> Path:
    """The state as a format-v1 dump at `path`, recorded by `capture.tree` (with `rank`: as
    that tensor-parallel rank's; with `step`: as that step's, not the scheduler's count, which
    a finished step has moved on)."""
    stack = scheduler.stack
    tensors, metadata = capture_state(
        req_to_token_pool=stack.req_to_token_pool,
        allocator=stack.allocator,
        tree=stack.tree,
        batch=batch,
        requests=running_requests(scheduler, batch),
        window=None if stack.spec.layout in MAMBA_LAYOUTS else stack.spec.window,
        waiting=scheduler.waiting,
    )
    metadata.update(
        {
            "sglang.version": stack.modules.tree.version,
            "step": str(scheduler.step_no if step is None else step),
            "note": f"kvcanary soak, seed {scheduler.workload.seed}, core {stack.spec.core}",
        }
    )
    if rank is not None:
        metadata["rank"] = rank
    return write_dump(path, dump_contents(metadata, tensors))


class SGLangChecks:
    """SGLang's invariant checker over our scheduler (see the module docstring)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        stack = scheduler.stack
        m = stack.modules
        self.checker: Any = None
        checker_module = m.invariant_checker
        if checker_module is None:
            return
        from importlib import import_module

        observer_module = import_module(
            "sglang.srt.managers.scheduler_components.pool_stats_observer"
        )
        disagg = import_module("sglang.srt.disaggregation.utils")
        spec = stack.spec
        common = {
            "tree_cache": stack.tree,
            "token_to_kv_pool_allocator": stack.allocator,
            "req_to_token_pool": stack.req_to_token_pool,
            "is_hybrid_swa": spec.layout not in MAMBA_LAYOUTS,
            "is_hybrid_ssm": spec.layout in MAMBA_LAYOUTS,
            "full_tokens_per_layer": spec.full_tokens,
            "swa_tokens_per_layer": spec.swa_tokens,
            "max_total_num_tokens": spec.full_tokens,
            "get_last_batch": lambda: scheduler.last_batch,
            "get_running_batch": lambda: scheduler.running,
            "get_chunked_req": lambda: scheduler.chunked_req,
            "server_args": stack.server_args,  # (0.5.17 - 0.5.18's checker takes them)
        }
        try:
            observer = _build(
                observer_module.SchedulerPoolStatsObserver,
                common,
                session_controller=scheduler.session_controller,
                hisparse_coordinator=None,
                enable_hisparse=False,
            )
            self.checker = _build(
                checker_module.SchedulerInvariantChecker,
                common,
                disaggregation_mode=disagg.DisaggregationMode.NULL,
                page_size=spec.page_size,
                pool_stats_observer=observer,
                scheduler_stage_metrics=None,
            )
        except TypeError:  # a release whose checker needs more than we can give: tree only
            self.checker = None

    def busy(self) -> list[Said]:
        """`self_check_during_busy` and `_check_kv_page_invariants` (where the release has
        it: 0.5.15 on)."""
        if self.checker is None:
            return []
        said = _said("self_check_during_busy", self.checker.self_check_during_busy)
        pages = getattr(self.checker, "_check_kv_page_invariants", None)
        return said if pages is None else said + _said("_check_kv_page_invariants", pages)

    def idle(self) -> list[Said]:
        """`_check_all_pools` (strict: a leak raises), `_check_req_pool`, the tree's
        `sanity_check`; only where the scheduler is fully idle (`Scheduler.fully_idle`), as
        SGLang's `on_idle` runs them: a step with no batch while a request waits or a chunk
        sits parked runs none."""
        said: list[Said] = []
        if not self.scheduler.fully_idle:
            return said
        if self.checker is not None:
            checker = self.checker

            def pools() -> None:
                stats = checker.pool_stats_observer.get_pool_stats()
                leak, messages = checker._check_all_pools(stats)
                if leak:
                    checker._report_leak("pool", " ".join(m for m in messages if m))

            said += _said("_check_all_pools", pools)
            said += _said("_check_req_pool", checker._check_req_pool)
        said += _said("sanity_check", self.scheduler.stack.tree.sanity_check)
        return said


def _build(cls: Any, common: dict[str, Any], **own: Any) -> Any:
    """`cls(...)` with the arguments this release's signature takes (releases add and drop
    keyword arguments of the observer and the checker)."""
    import inspect

    accepted = inspect.signature(cls).parameters
    given = {**common, **own}
    return cls(**{name: value for name, value in given.items() if name in accepted})


def _said(name: SGLangCheckName, check: Any) -> list[Said]:
    """What check `name` raised, or nothing: its first line, and where that line heads a list
    (`Sanity check FAILED (3 violations across 78 nodes):`), the list's items after it, for
    what the check found is in them; `_SAID` characters at most."""
    try:
        check()
    except Exception as exc:  # SGLang's checks raise AssertionError or ValueError
        text = str(exc)[: 4 * _SAID]
        lines = [line.strip() for line in text.splitlines() if line.strip()] or [""]
        said = lines[0]
        if said.endswith(":") and len(lines) > 1:
            said += " " + "; ".join(lines[1:])
        return [Said(name, f"{type(exc).__name__}: {said}"[:_SAID])]
    return []


#: The most characters of a check's complaint a report keeps.
_SAID = 300


def audit_step(
    scheduler: Scheduler,
    batch: Any,
    checks: SGLangChecks | None,
    *,
    idle: bool,
    folder: Path | None = None,
    live: LiveAudit | None = None,
    full: bool = False,
) -> Audit:
    """Audit the state with kvcanary, and run SGLang's checks on the same state.

    With `live`, the live objects are held to the accounting of `soak.live` first, and the
    whole `check` runs only where a fact breaks (or with `full`: always, to compare); without
    it, the state is recorded and checked. With a `folder`, each state is recorded there
    (the last one is what a failure keeps: a crash's is the state audited before it)."""
    audit = Audit(step=scheduler.step_no, mode="idle" if idle else "plan")
    if live is not None:
        state = read_state(scheduler, batch, running_requests(scheduler, batch), live.readers)
        audit.broken = live.broken(state, idle=idle)
    if live is None or full or audit.broken is not None:
        _check_whole(audit, scheduler, batch, folder)
        if live is not None and audit.broken is not None and not audit.codes:
            if live.lock_excess:
                # a lock count above the running requests' locks: a lock never released,
                # which a dump's locked slots show only once no running row holds them
                audit.codes.append(FindingCode.TREE_LOCK_LEAKED.value)
                audit.top_cause = CauseCode.TREE_LOCK_LEAK.value
            else:
                live.fallbacks += 1
    elif folder is not None:  # the live audit held: recorded only
        audit.dump = record_dump(scheduler, batch, folder / "state.safetensors")
    if checks is not None:
        audit.sglang = checks.idle() if idle else checks.busy()
    return audit


def _check_whole(audit: Audit, scheduler: Scheduler, batch: Any, folder: Path | None) -> None:
    """Record the state as a dump and check it (reference planner, no GPU kernel); the dump
    is kept only in `folder`."""
    from kvcanary_cli.api import check

    audit.checked = True
    with tempfile.TemporaryDirectory(prefix="kvcanary-soak-") as scratch:
        path = record_dump(scheduler, batch, Path(folder or scratch) / "state.safetensors")
        report = check([path], kernel="none")
        assert isinstance(report, CheckReport)  # recorded from SGLang's stack
        dump = report.dumps[0]
        if dump.error:
            audit.codes.append(f"error: {dump.error}")
        errors = [f for f in dump.findings if f.severity.value == "error"]
        audit.codes += [f.code.value for f in errors]
        if dump.diagnosis:
            audit.top_cause = str(dump.diagnosis[0].code.value)
        if folder is not None:
            audit.dump = path
