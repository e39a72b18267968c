"""Markdown views, one module per command, ready to paste into a GitHub issue.

Each view reads its command's record only (made printable first, `safe_text.printable_record`);
escaping lives in `blocks`, the pieces several views share in `common`.
"""
