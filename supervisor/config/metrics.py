"""``[metrics]`` of job.toml: where the daemon's Prometheus metrics go (docs/metrics.md).

The section is read here, beside its converters; the metrics themselves need
``prometheus-client``, the optional extra ``rvsup[metrics]``: a section that asks for metrics
without it is refused when job.toml is loaded, naming the extra.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from supervisor.config.values import InvalidValueError, describe, duration

__all__ = [
    "EXTRA_MISSING",
    "MetricsSection",
    "MetricsStartError",
    "listen_address",
    "read_metrics",
    "split_listen",
]

_T = TypeVar("_T")

EXTRA_MISSING: Final = (
    "needs prometheus-client, which is not installed: pip install 'rvsup[metrics]'"
)


class MetricsStartError(RuntimeError):
    """``[metrics]`` cannot be served: the port is taken, the text file's folder cannot be made."""


@dataclass(frozen=True, slots=True)
class MetricsSection:
    """``[metrics]``: the job's metrics for Prometheus (docs/metrics.md); needs the extra
    ``rvsup[metrics]`` (prometheus-client).

    - ``listen`` (default ``"off"``): ``"HOST:PORT"`` where the daemon serves the metrics at
      ``/metrics`` (``"127.0.0.1:9400"``, ``"[::1]:9400"``, ``"node17:9400"``); the port
      must be free when the job starts.
    - ``textfile`` (default ``"off"``, relative to workdir): a file the metrics are written
      to, replaced atomically, for node_exporter's textfile collector (its name must end in
      ``.prom``).
    - ``interval`` (default ``"5s"``, > 0): how often the metrics are refreshed and the file
      rewritten.
    """

    listen: str | None = None
    textfile: Path | None = None
    interval_s: float = 5.0

    @property
    def enabled(self) -> bool:
        return self.listen is not None or self.textfile is not None


def split_listen(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> (host, port); brackets around an IPv6 host are removed."""
    host, _, port = text.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def listen_address(value: Any) -> str | None:
    """``"HOST:PORT"`` (port 1 to 65535), or ``"off"`` meaning None."""
    if not isinstance(value, str):
        raise InvalidValueError(f'expected "HOST:PORT" or "off", got {describe(value)}')
    if value == "off":
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise InvalidValueError(f'expected "HOST:PORT" (like "127.0.0.1:9400"), got {value!r}')
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidValueError(f"the port must be a number from 1 to 65535, got {port!r}")
    bare = host.removeprefix("[").removesuffix("]")
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            raise InvalidValueError(f"{host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise InvalidValueError(f'write an IPv6 host in brackets: "[{host}]:{port}"')
    elif not all(c.isalnum() or c in ".-_" for c in host) or not host.isascii():
        raise InvalidValueError(f"{host!r} is not a host name or address")
    return value


class _Reader(Protocol):
    """What :func:`read_metrics` needs of the loader's table."""

    table: Any

    def read(self, key: str, default: object, convert: Callable[[Any], _T]) -> _T: ...

    def report(self, key: str, message: str) -> None: ...


def _textfile(value: Any) -> str | None:
    if not isinstance(value, str):
        raise InvalidValueError(f'expected a path or "off", got {describe(value)}')
    if value == "off":
        return None
    if not value or "\0" in value:
        raise InvalidValueError("must be a non-empty path without NUL characters")
    if not value.endswith(".prom"):
        raise InvalidValueError(f"node_exporter reads only files ending in .prom, got {value!r}")
    return value


def read_metrics(t: _Reader, workdir: Path) -> MetricsSection:
    """The ``[metrics]`` section; asking for metrics without prometheus-client is a problem."""
    listen = t.read("listen", "off", listen_address)
    textfile = t.read("textfile", "off", _textfile)
    interval = t.read("interval", "5s", duration(positive=True))
    path = None
    if textfile is not None:
        path = Path(os.path.abspath(os.path.join(workdir, os.path.expanduser(textfile))))
    section = MetricsSection(listen, path, interval)
    if section.enabled and importlib.util.find_spec("prometheus_client") is None:
        t.report("listen" if listen is not None else "textfile", EXTRA_MISSING)
    return section
