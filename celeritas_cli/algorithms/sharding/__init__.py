"""Data parallelism and sharded data parallelism (ZeRO / FSDP)."""
