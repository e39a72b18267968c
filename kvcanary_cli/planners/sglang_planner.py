"""`SGLangPlanner`: the installed SGLang's own plan launcher, run on a dump.

It does what SGLang does with the same call: off CUDA, `launch_canary_plan_kernels` runs its
torch reference (REF semantics: it raises at the first bad read); on CUDA, its Triton offsets
kernel and JIT CUDA entries kernel (GPU semantics). The planner passes the dump's inputs as the
launcher takes them in production (canonical dtypes, on the device), allocates SGLang's own
`VerifyPlan` and `WritePlan`, and reads what upstream defines (docs/semantics.md §1.3) back into
a `Plan`. An exception from SGLang becomes the plan's `launch_error` (text and type), for
`check` to tie to the finding where kvcanary predicts that raise.

On CUDA, a batch whose reads fall outside `req_to_token` or the expected-token pool is not
launched (`NOT_LAUNCHED`): the GPU path reads such memory unchecked, which can fault the
device; kvcanary reports those rows as findings instead.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from kvcanary_cli.dump.loader import KvDump
from kvcanary_cli.dump.tensor import StoredTensor
from kvcanary_cli.errors import OptionError, PlanTooLargeError
from kvcanary_cli.planners.base import (
    NOT_LAUNCHED,
    Plan,
    ProblemKind,
    ProblemTable,
    Semantics,
    VerifyEntries,
    assemble_plan,
    raised_plan,
    row_problems,
)
from kvcanary_cli.planners.frame import MAX_MATERIALIZED_ENTRIES, GroupFrame, group_frame
from kvcanary_cli.planners.sglang_runtime import (
    VERIFY_ENTRY_FIELDS,
    SGLangLauncher,
    load_launcher,
    require_torch,
)

if TYPE_CHECKING:
    import torch

__all__ = ["UNWRITTEN", "SGLangPlanner", "plan_arguments"]

#: What output buffers hold before SGLang fills them ("kvcanary" in ASCII, negated), so that
#: a value upstream leaves unwritten is recognisable instead of whatever memory held.
UNWRITTEN = -0x6B7663616E617279


class SGLangPlanner:
    """The installed SGLang's `launch_canary_plan_kernels` behind kvcanary's `Planner`.

    `device` (default: CUDA when available, else the CPU) decides what SGLang runs: its
    kernels on CUDA (semantics GPU, mode "cuda"), its torch reference elsewhere (semantics
    reference, mode "reference"). SGLang is imported on the first `plan` (or `load`), never
    when the planner is built, so the planner pickles to worker processes.
    """

    name = "sglang"

    def __init__(self, *, device: str | None = None, option: str = "--kernel sglang") -> None:
        torch = require_torch(option)  # SGLang's launcher runs on torch tensors

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.semantics = Semantics.GPU if self.device.type == "cuda" else Semantics.REFERENCE
        #: the command-line option named by errors about the installed SGLang.
        self.option = option

    @property
    def mode(self) -> str:
        """'cuda' (SGLang's kernels) or 'reference' (its torch reference)."""
        return "cuda" if self.semantics is Semantics.GPU else "reference"

    def load(self) -> SGLangLauncher:
        """The installed launcher; `PlannerUnavailableError` when missing or mismatched."""
        return load_launcher(option=self.option, device=self.device.type)

    def plan(self, dump: KvDump, group: str) -> Plan:
        """Run SGLang's launcher on `group` of `dump`; its exception becomes `launch_error`."""
        if dump.shrunk:
            raise OptionError(
                "needs the whole dump, and this one is shrunk (SGLang reads its tables dense)",
                option=self.option,
                hint="run it on the original dump, or use --kernel triton/vectorized here",
            )
        frame = group_frame(dump, group)
        launcher = self.load()
        refusal = None
        if frame.unplannable:  # never hand SGLang a claimed size to allocate
            refusal = f"kvcanary did not run SGLang's plan: {frame.unplannable}"
        elif self.semantics is Semantics.GPU:
            refusal = _device_fault_risk(dump, frame)
        if refusal is not None:
            return raised_plan(
                frame,
                backend=self.name,
                semantics=self.semantics,
                message=refusal,
                exception_type=NOT_LAUNCHED,
            )
        arguments = plan_arguments(launcher, dump, frame, self.device)
        try:
            launcher.launch(**arguments)
        except Exception as exc:  # upstream's raise is the result, whatever its type
            return raised_plan(
                frame,
                backend=self.name,
                semantics=self.semantics,
                message=str(exc) or type(exc).__name__,
                exception_type=type(exc).__name__,
            )
        return self._read_back(frame, arguments["verify_plan_out"], arguments["write_plan_out"])

    def _read_back(self, frame: GroupFrame, verify: Any, write: Any) -> Plan:
        """The parts of SGLang's outputs upstream defines, as a `Plan` (numpy arrays)."""
        import torch

        num_valid = int(verify.verify_num_valid.reshape(-1)[0])
        enable = int(verify.enable.reshape(-1)[0])
        n = min(max(num_valid, 0), frame.verify_capacity) if enable == 1 else 0

        def column(tensor: torch.Tensor, length: int) -> np.ndarray:
            # a copy: the plan must not share SGLang's output buffers
            return np.array(tensor[:length].to(device="cpu", dtype=torch.int64).numpy())

        rows = frame.write_rows
        return assemble_plan(
            frame,
            backend=self.name,
            semantics=self.semantics,
            entries=VerifyEntries(
                slot=column(verify.verify_slot_indices, n),
                expected_token=column(verify.verify_expected_tokens, n),
                position=column(verify.verify_expected_positions, n),
                prev_slot=column(verify.verify_prev_slot_indices, n),
                undefined=np.zeros(n, dtype=np.uint8),
            ),
            seeds=column(write.write_seed_slot_indices, rows),
            seed_undefined=np.zeros(rows, dtype=bool),
            problems=ProblemTable.empty(),
            # SGLang does not report the entries requested on overflow; the frame knows them.
            kernel_totals=(num_valid if enable == 1 else frame.total_verify, num_valid, enable),
            write_offsets=column(write.write_offsets, rows + 1),
            write_num_valid_reqs=int(write.write_num_valid_reqs.reshape(-1)[0]),
        )


def plan_arguments(
    launcher: SGLangLauncher, dump: KvDump, frame: GroupFrame, device: torch.device
) -> dict[str, Any]:
    """The keyword arguments of one launcher call planning `frame` of `dump` on `device`.

    Inputs are the dump's numpy arrays as torch tensors, in the dtypes production passes on
    CUDA (int32 tables there; on the CPU the reference takes any integer dtype, so tables keep
    theirs and share the dump's memory, not copied); the outputs are fresh `VerifyPlan` /
    `WritePlan` of the frame's capacities, filled with `UNWRITTEN`. Benchmarks time
    `launcher.launch(**plan_arguments(...))`.
    """
    import torch

    if max(frame.total_verify, frame.verify_capacity) > MAX_MATERIALIZED_ENTRIES:
        raise PlanTooLargeError(
            f"the batch asks for {frame.total_verify} verify entries with a capacity of "
            f"{frame.verify_capacity}, more than kvcanary hands SGLang "
            f"({MAX_MATERIALIZED_ENTRIES})",
            field="prefix_lens",
            path=str(dump.path),
            hint="the lengths or verify_capacity look corrupt",
        )
    gpu = device.type == "cuda"

    def tensor(array: np.ndarray) -> torch.Tensor:
        if not array.flags.writeable:  # torch.from_numpy warns on memory it may not write
            array = array.copy()
        return torch.from_numpy(np.ascontiguousarray(array))  # >= 1-d: kept as it is

    def vector(array: np.ndarray | None) -> torch.Tensor | None:
        if array is None:
            return None
        return tensor(array).to(device=device, dtype=torch.int64).contiguous()

    def table(stored: StoredTensor | None) -> torch.Tensor | None:
        if stored is None:
            return None
        host = tensor(stored.array())  # whole: `plan` refuses a shrunk dump before this
        return host.to(device=device, dtype=torch.int32 if gpu else host.dtype).contiguous()

    pool = dump.req_to_verify_expected_tokens
    return {
        "verify_plan_out": _verify_plan(launcher, frame.verify_capacity, device),
        "write_plan_out": _write_plan(launcher, frame.write_req_capacity, device),
        "req_pool_indices": vector(dump.req_pool_indices),
        "prefix_lens": vector(dump.prefix_lens),
        "extend_seq_lens": vector(dump.extend_seq_lens),
        "req_to_token": table(dump.req_to_token),
        "swa_window_size": frame.window,
        "full_to_swa_index_mapping": vector(None if frame.lut is None else frame.lut.array()),
        "verify_capacity": frame.verify_capacity,
        "req_to_verify_expected_tokens": table(pool),
        "req_to_verify_expected_tokens_valid_lens": (
            None if pool is None else vector(dump.req_to_verify_expected_tokens_valid_lens)
        ),
        "kv_token_id_vs_position_offset": dump.token_offset,
    }


def _verify_plan(launcher: SGLangLauncher, capacity: int, device: torch.device) -> Any:
    """SGLang's `VerifyPlan.allocate`; a capacity of 0 (which it refuses) gets empty entries."""
    plan = launcher.verify_plan.allocate(verify_capacity=max(capacity, 1), device=device)
    for name in VERIFY_ENTRY_FIELDS:
        getattr(plan, name).fill_(UNWRITTEN)
    plan.verify_num_valid.fill_(-1)
    if capacity == 0:
        plan = dataclasses.replace(plan, **{n: getattr(plan, n)[:0] for n in VERIFY_ENTRY_FIELDS})
    return plan


def _write_plan(launcher: SGLangLauncher, capacity: int, device: torch.device) -> Any:
    """SGLang's `WritePlan.allocate`; a capacity of 0 (which it refuses) gets no seeds."""
    plan = launcher.write_plan.allocate(write_req_capacity=max(capacity, 1), device=device)
    plan.write_offsets.fill_(UNWRITTEN)
    plan.write_seed_slot_indices.fill_(UNWRITTEN)
    plan.write_num_valid_reqs.fill_(-1)
    if capacity == 0:
        plan = dataclasses.replace(
            plan,
            write_offsets=plan.write_offsets[:1],
            write_seed_slot_indices=plan.write_seed_slot_indices[:0],
        )
    return plan


def _device_fault_risk(dump: KvDump, frame: GroupFrame) -> str | None:
    """Why SGLang's CUDA kernels would read outside their tensors on this batch (None: safe)."""
    problems = row_problems(dump, frame, gpu=True)
    if len(problems) == 0:
        return None
    first = problems.rows_at(0)
    tensor = (
        "the expected-token pool"
        if first.kind is ProblemKind.EXPECTED_TOKEN_OUT_OF_RANGE
        else "req_to_token"
    )
    return (
        f"kvcanary did not launch SGLang's CUDA kernels: batch row {first.batch_row} would "
        f"read outside {tensor} ({first.kind.code}), which can fault the device"
    )
