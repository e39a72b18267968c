"""kvcanary: diagnose KV-cache dumps of LLM serving engines (SGLang kv canary)."""

__version__ = "0.1.0"
