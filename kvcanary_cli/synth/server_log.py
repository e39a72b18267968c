"""The server log of a synthetic canary scenario: what SGLang prints when it pumps the
scenario's violation ring (docs/canary.md §8), for `kvcanary synth --log`."""

from __future__ import annotations

from kvcanary_cli.canary.logs import format_pump, log_text
from kvcanary_cli.errors import OptionError
from kvcanary_cli.synth.state import SynthDump

__all__ = ["LOG_PREFIX", "scenario_log"]

#: what precedes the first line of each message in a synthetic log (SGLang's logging format).
LOG_PREFIX = "[2025-06-01 12:00:00 TP0] "


def scenario_log(state: SynthDump) -> bytes:
    """The server log of a canary scenario: one pump of its violation ring, logged the step
    after the dump's (docs/canary.md §8), between ordinary log lines."""
    return log_text(_log_lines(state), prefix=LOG_PREFIX)


def _log_lines(state: SynthDump) -> list[str]:
    ring = state.tensors.get("violation_ring")
    index = state.tensors.get("violation_write_index")
    if ring is None or index is None:
        raise OptionError(
            "this scenario records no violation ring (choose a canary-* scenario)", option="log"
        )
    step = int(state.metadata.get("step", "0")) + 1
    messages = format_pump(ring, int(index.reshape(-1)[0]), step_when_pumped=step)
    return [
        "Decode batch. #running-req: 4, #token: 96, token usage: 0.01, gen throughput: 80.0",
        *messages,
        f"[canary] step={step} protected_tokens=4096 sweep_passes=0 violations={len(messages)} "
        "launch_tags_active=4/12",
    ]
