"""Synthetic dumps: serving states built the way SGLang's allocators work (`state`), one
named scenario per bug class (`scenarios`), and the server log a canary scenario prints
(`server_log`).

It sits above `canary` (scenarios stamp canary records and rings) and below `analysis`
(`selftest` plans every scenario); the dump layer knows nothing of it.
"""
