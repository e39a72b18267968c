"""The values the options take, declared once: integer ranges (`Bounds`) and choice lists.

`api` checks what a caller passes against them and `cli_options` what a user types (stating
each range at the end of its option's help), so both refuse a value in the same words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcanary_cli.errors import OptionError

__all__ = ["BUFFER_CHOICES", "DRAFT_TOKENS", "EVERY", "INDEX", "PAGE_SIZE", "POSITIVE", "SLOT"]
__all__ += ["STEPS"]
__all__ += ["Bounds", "checked_choice", "checked_integer"]


def _readable(value: int) -> str:
    """An integer as a person reads a bound: `2^31-1`, `-2^31`, `2^40`, or its digits."""
    magnitude = abs(value)
    for exact, suffix in ((magnitude, ""), (magnitude + 1, "-1")):
        bits = exact.bit_length() - 1
        if bits >= 16 and exact == 1 << bits:
            return f"{'-' if value < 0 else ''}2^{bits}{suffix}"
    return str(value)


@dataclass(frozen=True)
class Bounds:
    """The integers an option takes, `low` to `high` (None: no bound that side)."""

    low: int | None = None
    high: int | None = None

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{_readable(self.low)} to {_readable(self.high)}"
        if self.low is not None:
            return f"at least {_readable(self.low)}"
        return "" if self.high is None else f"at most {_readable(self.high)}"

    def refusal(self, value: int) -> str | None:
        """Why `value` is out of range (`0 is below 1 (1 to 64)`); None when it is in."""
        both = f" ({self})" if self.low is not None and self.high is not None else ""
        if self.low is not None and value < self.low:
            return f"{value} is below {_readable(self.low)}{both}"
        if self.high is not None and value > self.high:
            return f"{value} is above {_readable(self.high)}{both}"
        return None


_INT64_MAX = (1 << 63) - 1
#: `slot`: any int64 (a bad slot is what a finding reports, not a bad option).
SLOT = Bounds(-(1 << 63), _INT64_MAX)
#: `--row`, `--positions`, `--seed`: a non-negative int64.
INDEX = Bounds(0, _INT64_MAX)
#: `--jobs`, `--max-rows`, `synth --at`: one or more.
POSITIVE = Bounds(1)
#: `synth --steps`, `--every` and `--page-size`.
STEPS, EVERY, PAGE_SIZE = Bounds(2, 64), Bounds(1, 64), Bounds(1, 4096)
#: `soak --tp`: the tensor-parallel ranks a soak runs, each a whole stack in one process.
TP_RANKS = Bounds(1, 8)
#: `soak --speculative-tokens`: the draft tokens a decode step verifies (vLLM's drafters
#: propose a handful).
DRAFT_TOKENS = Bounds(0, 16)
#: `violations --buffer`: a group's canary buffers, in the order the command line lists them.
BUFFER_CHOICES = ("head.k", "tail.k", "head.v", "tail.v")


def checked_integer(value: object, option: str, bounds: Bounds) -> int:
    """`value` when it is an int within `bounds`; else an `OptionError` naming `option` (the
    API's keyword) in the words the command line uses (the API is called with values no
    option parser saw: 2**70 was an OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
        raise OptionError(f"{shown} is not an integer", option=option)
    if (refused := bounds.refusal(value)) is not None:
        raise OptionError(refused, option=option)
    return value


def checked_choice(value: object, allowed: Sequence[str], option: str) -> str:
    """`value` when it is one of `allowed`; else an `OptionError` naming the choices."""
    if not isinstance(value, str) or value not in allowed:
        raise OptionError(f"{str(value)[:40]!r} is not one of {', '.join(allowed)}", option=option)
    return value
