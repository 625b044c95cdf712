"""job.toml -> a frozen, validated :class:`~supervisor.config.model.JobConfig`.

- :mod:`.model` — the configuration's dataclasses, one documented field per key.
- :mod:`.values` — per-key value parsers; :mod:`.durations` — ``"90s"``, ``"1h30m"``.
- :mod:`.load` — reading job.toml, unknown sections; :mod:`.sections` — each section's reader
  (resolution, cross-key checks); :mod:`.table` — one section being read (unknown keys, problems).
- :mod:`.preflight` — checks of the machine before anything is launched; :mod:`.render` — the
  resolved configuration as TOML.

Each name is imported from the module that defines it.
"""
