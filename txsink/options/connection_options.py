"""The options that reach ClickHouse: ``url``, ``user``, ``password``, ``timeout``,
``retries``, ``compression``, ``ca_file``, ``insert_block_rows`` and the
``settings.<name>`` options (``txsink/options/insert_settings.py``).

Credentials come from the options or from the environment (``TXSINK_CLICKHOUSE_USER`` /
``TXSINK_CLICKHOUSE_PASSWORD``) and never appear in ``repr`` or errors. The defaults are
the client's and the staging writer's own (``server_ext.client``,
``server_ext.staging.writer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from server_ext.client import DEFAULT_RETRIES, DEFAULT_TIMEOUT, ENCODINGS, header_problem
from server_ext.sharding import shown_url, url_problem
from server_ext.staging import DEFAULT_BLOCK_ROWS
from txsink.options import insert_settings
from txsink.options.parse_util import OptionError, given, numbers, require_file

#: The environment variables the sink and the CLI take ClickHouse credentials from.
CREDENTIAL_VARIABLES = {"user": "TXSINK_CLICKHOUSE_USER",
                        "password": "TXSINK_CLICKHOUSE_PASSWORD",
                        "zookeeper_auth": "TXSINK_ZOOKEEPER_AUTH"}

OPTION_NAMES = ("url", "user", "password", "insert_block_rows", "timeout", "retries",
                "ca_file")  # and compression, settings.<name>


@dataclass(frozen=True)
class ConnectionOptions:
    """How the sink reaches its ClickHouse servers, and what its INSERTs send."""

    url: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT  # seconds per request
    retries: int = DEFAULT_RETRIES  # tries of a statement that is safe to repeat
    compression: str | None = None  # Content-Encoding of the INSERT bodies (None: none)
    ca_file: str | None = None  # CA bundle that https:// servers are verified against
    insert_settings: tuple[tuple[str, str], ...] = ()  # settings.<name> options
    insert_block_rows: int = DEFAULT_BLOCK_ROWS  # rows of one staging INSERT block

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                          if f.repr)
        return f"ConnectionOptions({shown}, password={'***' if self.password else None})"


def credentials_from(env: Mapping[str, str]) -> dict[str, str]:
    """``user``/``password``/``zookeeper_auth`` from the credential variables of ``env``
    (unset or empty: absent)."""
    return {name: env[var] for name, var in CREDENTIAL_VARIABLES.items() if env.get(var)}


def parse_settings(given: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The ``settings.<name>`` options of the (lower-cased) option map, checked by name."""
    try:
        return insert_settings.parse(given)
    except insert_settings.SettingRefused as exc:
        raise OptionError(str(exc)) from None


def parse(values: dict[str, object],
          settings: tuple[tuple[str, str], ...]) -> ConnectionOptions:
    """These options of ``values`` (credentials from the environment already in it),
    checked; ``settings`` from :func:`parse_settings`."""
    url = str(values["url"])
    if not url.startswith(("http://", "https://")):
        raise OptionError(f"option url must start with http:// or https://, got "
                          f"{shown_url(url)}")
    problem = url_problem(url)  # before any request: a query string may hold a password
    if problem:
        raise OptionError(f"option url: {problem}")
    for name in ("user", "password"):
        problem = header_problem(values.get(name))  # type: ignore[arg-type]
        if problem:
            raise OptionError(f"option {name} (or {CREDENTIAL_VARIABLES[name]}) cannot "
                              f"be used: {problem}")
    numbers(values, (("insert_block_rows", int, 1, 2**31 - 1),
                     ("timeout", float, 0.1, 86_400), ("retries", int, 0, 1_000)))
    compression = str(values.get("compression") or "none").lower()
    if compression not in ("none", *ENCODINGS):
        raise OptionError(f"option compression={compression!r} is not one of none, "
                          f"{', '.join(ENCODINGS)}")
    require_file("option ca_file", values.get("ca_file"))
    return ConnectionOptions(
        **given(values, OPTION_NAMES), insert_settings=settings,
        compression=None if compression == "none" else compression)
