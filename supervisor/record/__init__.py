"""The job's history: its events defined once (:mod:`.schema`), written as JSON lines
(:mod:`.events`), read back as entries (:mod:`.entries`) and as rows (:mod:`.history`)."""

__all__ = ["entries", "events", "history", "rundir", "schema", "summary", "typed_json"]
