"""The job's history: its events defined once (:mod:`.schema`), written as JSON lines
(:mod:`.events`), read back as rows (:mod:`.history`)."""

__all__ = ["events", "history", "rundir", "schema", "typed_json"]
