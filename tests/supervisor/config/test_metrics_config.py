"""`[metrics]` in job.toml: the listen address and text file are validated like every other key,
and asking for metrics without prometheus-client names the extra to install."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from supervisor.config import metrics as metrics_config
from supervisor.config.load import parse_config
from supervisor.config.model import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

JOB_TOML = Path("/jobs/demo/job.toml")
MINIMAL = '[job]\nname = "toy"\ncommand = ["python", "train.py"]\n'


def parse_metrics(body: str) -> metrics_config.MetricsSection:
    return parse_config(tomllib.loads(MINIMAL + "[metrics]\n" + body), JOB_TOML).metrics


def problems(body: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_metrics(body)
    return str(caught.value)


@pytest.fixture
def with_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """prometheus-client present, whether or not this environment has it."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "prometheus_client" else real(name, *a),
    )


@pytest.mark.usefixtures("with_client")
@pytest.mark.parametrize(
    ("listen", "host_port"),
    [
        ("0.0.0.0:9400", ("0.0.0.0", 9400)),
        ("127.0.0.1:1", ("127.0.0.1", 1)),
        ("node-17.cluster:65535", ("node-17.cluster", 65535)),
        ("[::1]:9400", ("::1", 9400)),
    ],
)
def test_valid_listen_addresses(listen: str, host_port: tuple[str, int]) -> None:
    """HOST:PORT with a name, an IPv4 address or a bracketed IPv6 address is taken as written."""
    section = parse_metrics(f'listen = "{listen}"')
    assert section.listen == listen and section.enabled
    assert metrics_config.split_listen(listen) == host_port


@pytest.mark.usefixtures("with_client")
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('listen = "9400"', 'metrics.listen: expected "HOST:PORT"'),
        ('listen = ":9400"', 'metrics.listen: expected "HOST:PORT"'),
        ('listen = "host:0"', "metrics.listen: the port must be a number from 1 to 65535"),
        ('listen = "host:70000"', "the port must be a number from 1 to 65535, got '70000'"),
        ('listen = "host:http"', "the port must be a number from 1 to 65535"),
        ('listen = "::1:9400"', 'write an IPv6 host in brackets: "[::1]:9400"'),
        ('listen = "[zz]:9400"', "'[zz]' is not an IPv6 address"),
        ('listen = "a b:9400"', "'a b' is not a host name or address"),
        ("listen = 9400", 'metrics.listen: expected "HOST:PORT" or "off", got integer 9400'),
        ('textfile = "metrics.txt"', "node_exporter reads only files ending in .prom"),
        ('interval = "0s"', "metrics.interval: must be greater than 0"),
        ("port = 9400", "metrics.port: unknown key"),
    ],
)
def test_bad_values_are_refused_with_their_key(body: str, message: str) -> None:
    """Every bad value is reported with its dotted key and what would be right."""
    assert message in problems(body)


@pytest.mark.usefixtures("with_client")
def test_textfile_is_relative_to_workdir_and_off_is_the_default() -> None:
    """A relative text file lands under workdir; an empty section asks for nothing."""
    assert parse_metrics('textfile = "m/job.prom"').textfile == Path("/jobs/demo/m/job.prom")
    empty = parse_metrics("")
    assert (empty.listen, empty.textfile, empty.interval_s, empty.enabled) == (
        None,
        None,
        5.0,
        False,
    )


def test_metrics_without_prometheus_client_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without prometheus-client, asking for metrics is refused at load with the extra's name;
    a section that asks for nothing loads."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "prometheus_client" else real(name, *a),
    )
    text = problems('listen = "127.0.0.1:9400"')
    assert "metrics.listen: needs prometheus-client" in text and "rvsup[metrics]" in text
    assert "metrics.textfile: needs prometheus-client" in problems('textfile = "a.prom"')
    assert not parse_metrics('listen = "off"').enabled
