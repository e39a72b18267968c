"""Violation rows, read and explained (docs/canary.md §7): `collect` reads every SOURCE and
replays, `explain` holds each row against a dump, `report` is the answer they build."""
