"""Rendering: pure functions from records to rich renderables or strings (no printing)."""

from kvcanary_cli.render.console import OutputFormat, make_console, to_json

__all__ = ["OutputFormat", "make_console", "to_json"]
