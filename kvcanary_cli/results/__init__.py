"""The commands' typed results: what `check`, `provenance`, `timeline`, `violations`,
`selftest`, `plan`, `inspect` and `soak` answer, one module per command (`cells`: the slots
and cells they share).

Frozen and logic-free (beyond small derived properties), so renderers can rely on them and
tests can build them by hand; the analysis computes them. Codes and severities are the
catalog's (`kvcanary_cli.catalog`). Importing this package loads none of its modules.
"""
