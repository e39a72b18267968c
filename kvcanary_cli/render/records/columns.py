"""`IntColumn` lives in `results.columns` (a result's cell column); this name goes with
`render/records`."""

from kvcanary_cli.results.columns import IntColumn

__all__ = ["IntColumn"]
