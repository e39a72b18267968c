"""The kv canary's own data: slot records, chain hashes, violation rows, rings and logs.

`constants` (the vocabulary) and `hashing` need nothing of the rest; the other modules decode
canary buffers (`buffers`), violation rings and their rows (`ring`, `ring_rows`) and server logs
(`logs`), and replay the verify kernel offline from a plan (`replay`). docs/canary.md is the
prose behind them.
"""
