"""The job's history: written as JSON lines (:mod:`.events`), read back as rows (:mod:`.history`)."""
