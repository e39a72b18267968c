"""`kvcanary soak`: SGLang's real memory-cache stack on CPU under a seeded random workload,
audited by kvcanary and by SGLang's own checks after every step."""
