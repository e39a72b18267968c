"""Analysis: provenance of slots, findings, reference-vs-kernel comparison, `run_check`."""
