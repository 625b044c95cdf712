"""What the command line shows: a rank's logs (:mod:`.logs`), the live status (:mod:`.status_view`)
and the version (:mod:`.version`). Read-only: nothing here changes a job."""

__all__ = ["logs", "status_view", "version"]
