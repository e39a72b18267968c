"""Dump I/O: the format as data (`schema`), reading (`loader`, `tensor`), writing (`writer`).

Import from the submodules (`kvcanary_cli.dump.loader.load_dump`, ...): this package module stays
empty so that `kvcanary_cli.dump.schema` imports without torch.
"""
