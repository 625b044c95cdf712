"""job.toml -> a frozen, validated :class:`JobConfig`.

- :mod:`.model` — the configuration's dataclasses, one documented field per key.
- :mod:`.values` — per-key value parsers; :mod:`.durations` — ``"90s"``, ``"1h30m"``.
- :mod:`.load` — reading job.toml, unknown sections; :mod:`.sections` — each section's reader
  (resolution, cross-key checks); :mod:`.table` — one section being read (unknown keys, problems).
- :mod:`.preflight` — checks of the machine before anything is launched.
"""

from supervisor.config.load import ConfigError, load_config, render_config
from supervisor.config.model import JobConfig
from supervisor.config.preflight import preflight

__all__ = ["ConfigError", "JobConfig", "load_config", "preflight", "render_config"]
