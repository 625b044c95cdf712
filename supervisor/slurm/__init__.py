"""Slurm: the allocation, srun, requeue, time left (:mod:`.commands`); Slurm's notations
(:mod:`.text`, pure parsers)."""

__all__ = ["commands", "lifecycle", "text"]
