"""The kv canary's own data: slot records, chain hashes, violation rows, rings and logs.

`constants` and `hashing` are leaves (the dump layer's synthesizer uses them); the rest decode
canary buffers (`records`), violation rings (`ring`) and server logs (`logs`), and replay the
verify kernel offline from a plan (`replay`). docs/canary.md is the prose behind them.
"""
