"""The one builder of capture dumps: every trigger (a plan call that raised, violations, the
guard, snapshots, a leak report) names, admits and writes its dump here.

A dump is `kvcanary-rank{rank}-step{n:06d}.safetensors` for a raise and
`kvcanary-rank{rank}-step{n:06d}-{trigger}.safetensors` for the others (`store.capture_dump`
finds a fresh name when it is taken). Its metadata holds `rank`, `step`, the `note`,
`kvcanary.trigger`, the trigger's own keys and the serving SGLang's release; a raise also
records its exception as data (`sglang.exception.type` and `.message`, docs/dump-format.md).
What goes into the dump is the launcher's arguments (others are left out) and the server's
context by the format's names. Importing this module costs only the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import kvcanary_cli.capture.server as server
import kvcanary_cli.capture.store as store
from kvcanary_cli.dump.schema import EXCEPTION_MESSAGE_KEY, EXCEPTION_TYPE_KEY

__all__ = ["RAISE", "PendingDump", "exception_metadata", "pending_dump"]

#: The trigger of a dump written because the plan call raised (its name has no suffix).
RAISE = "raise"


@dataclass(frozen=True, kw_only=True)
class PendingDump:
    """One dump a trigger is about to gather and write: where, for which rank and step."""

    dump_dir: Path
    rank: int
    step: int
    trigger: str

    @property
    def stem(self) -> str:
        """The file name before `.safetensors`."""
        stem = f"kvcanary-rank{self.rank}-step{self.step:06d}"
        return stem if self.trigger == RAISE else f"{stem}-{self.trigger}"

    def admit(self, estimate: Mapping[str, object]) -> bool:
        """Whether the budget lets this dump be gathered, `estimate` holding the tensors it
        will hold (`store.admit`: host integers only, nothing is read off the device)."""
        return store.admit(self.dump_dir, self.stem, estimate)

    def write(
        self,
        inputs: Mapping[str, object],
        context: Mapping[str, object],
        note: str,
        *,
        unsaved: Sequence[str] = (),
        extra: Mapping[str, object] | None = None,
    ) -> Path | None:
        """Write the dump: the launcher arguments among `inputs`, `context`, and the metadata
        every capture dump carries (`note` cut to size, then the `unsaved` arguments named)
        with the trigger's `extra` keys. None, logged, when the budget refuses it; a failed
        write raises (`store.capture_dump`)."""
        kept = {name: value for name, value in inputs.items() if name in store.PLAN_ARGUMENTS}
        text = store.short_note(note)
        if unsaved:
            text += f" (arguments not saved: {', '.join(unsaved)})"
        metadata: dict[str, object] = {
            "rank": self.rank,
            "step": self.step,
            "note": text,
            "kvcanary.trigger": self.trigger,
            **(extra or {}),
            **server.release_metadata(),
        }
        return store.capture_dump(self.dump_dir, self.stem, kept, metadata, context)


def pending_dump(
    dump_dir: Path | None, rank: int | None, step: int, trigger: str
) -> PendingDump | None:
    """The dump `trigger` writes at `step` into `dump_dir` (None: capture has nowhere to go);
    `rank` None is detected now (`store.detect_rank`)."""
    if dump_dir is None:
        return None
    rank = store.detect_rank() if rank is None else rank
    return PendingDump(dump_dir=dump_dir, rank=rank, step=step, trigger=trigger)


def exception_metadata(exc: BaseException) -> dict[str, object]:
    """The raised exception as the dump records it: its type's name and its message."""
    return {
        EXCEPTION_TYPE_KEY: type(exc).__name__,
        EXCEPTION_MESSAGE_KEY: store.short_note(str(exc)),
    }
