"""Terminal views, one module per command, as rich renderables (never printed here).

Each view reads its command's record only, made printable first
(`safe_text.printable_record`: a dump's text cannot reach the terminal as control characters).
Every cell is a `Text` (no markup parsing); the pieces several views share are in `common`.
"""
