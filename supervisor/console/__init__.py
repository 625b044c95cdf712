"""What the command line shows: a rank's logs (:mod:`.logs`), the live status (:mod:`.status_view`),
the version (:mod:`.version`) and the shell completion script (:mod:`.completion`). Read-only:
nothing here changes a job."""

__all__ = ["completion", "logs", "status_view", "version"]
