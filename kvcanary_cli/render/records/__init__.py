"""The machine records, one module per command: each declares its record as `TypedDict`s and
builds it in one function from the command's typed result; `common` holds what several share.

The JSON, Markdown and table views only read these records, so mypy sees every key they read.
docs/json-schema.md's key tables are generated from the declarations.
"""
