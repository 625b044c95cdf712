"""Storage checkpoints: save, restore, commit, parallelism (DDP, FSDP), DCP, RNG, collectives;
the background writer of asynchronous saves is in :mod:`.background`."""
