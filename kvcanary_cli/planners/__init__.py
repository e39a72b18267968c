"""Planners: three implementations of SGLang's kv-canary plan step behind one interface."""
