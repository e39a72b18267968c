"""A tiny GitHub-table reader for the Markdown tests (parse the output, never grep it)."""

from __future__ import annotations

import re

_SPLIT = re.compile(r"(?<!\\)\|")


def _cell(text: str) -> str:
    text = text.strip().replace("\\|", "|")
    if text.startswith("`") and text.endswith("`"):
        text = text.strip("`").strip()
    return text


def tables(markdown: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(the paragraph before the table, header cells, body rows) for every table."""
    found = []
    blocks = markdown.split("\n\n")
    for i, block in enumerate(blocks):
        lines = block.strip("\n").splitlines()
        if len(lines) < 2 or not lines[0].startswith("|") or not lines[1].startswith("| ---"):
            continue
        rows = [[_cell(c) for c in _SPLIT.split(line.strip())[1:-1]] for line in lines]
        found.append((blocks[i - 1] if i else "", rows[0], rows[2:]))
    return found
