"""What a report keeps of an SGLang check's complaint (`soak.audit._said`): its first line,
and where that line heads a list, the list's items, which say what the check found."""

from __future__ import annotations

import pytest

from kvcanary_cli.soak.audit import _SAID, _said


def _raising(message: str) -> object:
    def check() -> None:
        raise AssertionError(message)

    return check


def test_a_list_heading_keeps_its_items() -> None:
    message = (
        "Sanity check FAILED (2 violations across 78 nodes):\n"
        "  Swa host LRU mismatch at node 35: host_only=true in_lru=false\n"
        "\n"
        "  Swa host LRU: tree=17 != lru=15\n"
    )
    (said,) = _said("sanity_check", _raising(message))
    assert said.message == (
        "AssertionError: Sanity check FAILED (2 violations across 78 nodes): Swa host LRU "
        "mismatch at node 35: host_only=true in_lru=false; Swa host LRU: tree=17 != lru=15"
    )


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        (
            "Full Pool Mem Leak Detected! total=384\nnot a list item",
            "Full Pool Mem Leak Detected! total=384",
        ),
        ("", ""),
        ("\n\n", ""),
    ],
)
def test_another_first_line_is_kept_alone(message: str, kept: str) -> None:
    (said,) = _said("self_check_during_busy", _raising(message))
    assert said.message == f"AssertionError: {kept}"


def test_a_long_list_is_cut_and_a_silent_check_says_nothing() -> None:
    (said,) = _said("sanity_check", _raising("FAILED:\n" + "violation\n" * 10_000))
    assert len(said.message) == _SAID and said.message.startswith(
        "AssertionError: FAILED: violation; "
    )
    assert _said("sanity_check", lambda: None) == []
