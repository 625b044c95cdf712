"""The memory tier: snapshots of every rank's state in host shared memory between storage
checkpoints (docs/memory-tier.md)."""
