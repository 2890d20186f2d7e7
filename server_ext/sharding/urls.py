"""Replica URLs: the ``shards`` option's text, and checks that keep credentials out.

A replica URL is ``http(s)://host[:port]`` without credentials, query or fragment (the
user and password are options of their own), and each is given once. Error messages show
a URL without its userinfo, query string and fragment (any of them may hold a password,
e.g. ``?user=…&password=…``, which ClickHouse reads from the query string).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from server_ext.errors import ShardingError


def parse_shard_urls(text: str) -> list[list[str]]:
    """Parse ``"http://a:8123,http://b:8123;http://c:8123"``: shards by ';', replicas by ','.

    Whitespace around parts is ignored; an empty shard or replica, a URL that is not
    http(s)://host[:port], one with credentials, or one given twice is an error.
    """
    if not text or not text.strip():
        raise ShardingError("the shard URL list is empty")
    shards: list[list[str]] = []
    for number, part in enumerate(text.split(";"), start=1):
        if not part.strip():
            raise ShardingError(f"shard {number} of the shard URL list is empty")
        replicas = []
        for replica_number, url in enumerate(part.split(","), start=1):
            if not url.strip():
                raise ShardingError(f"replica {replica_number} of shard {number} is empty")
            replicas.append(check_url(url.strip(), f"shard {number}, replica {replica_number}"))
        shards.append(replicas)
    reject_duplicates(shards)
    return shards


def check_url(url: str, where: str = "") -> str:
    """``url`` if it is http(s)://host[:port] with no credentials, query or fragment."""
    problem = url_problem(url)
    if problem:
        raise ShardingError(f"{where}: {problem}" if where else problem)
    return url


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot name a server (None if it can), safe to show: the URL appears
    as :func:`shown_url` shows it. For every option that names a server, checked before
    any request is sent with it."""
    if has_userinfo(url):
        return (f"{shown_url(url)} carries credentials; give them as the user and password "
                "options")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return f"{shown_url(url)} is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{shown_url(url)} is not an http:// or https:// URL with a host"
    if parts.query or parts.fragment:
        return (f"{shown_url(url)} must not have a query or fragment (it is not shown: it "
                "may hold credentials; give them as the user and password options)")
    return None


def has_userinfo(url: str) -> bool:
    """Whether ``url`` may carry a ``user[:password]@`` part: it has an ``@`` anywhere. A
    password may hold ``/``, ``?``, ``#``, ``;`` or ``:``, which a URL parser takes for the
    start of a path, query or port (``http://u:a/b@host`` parses as host ``u``, path
    ``/b@host``); no server URL needs an ``@``."""
    return "@" in url


_SAFE_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
_SAFE_HOST_RE = re.compile(r"[A-Za-z0-9.\-:\[\]]*")
_SAFE_PATH_RE = re.compile(r"[A-Za-z0-9/_.\-]*")


def shown_url(url: str) -> str:
    """``url`` as an error message may show it: scheme, host, port and a plain path.
    Userinfo, query, fragment and any part with characters a host or path does not have
    (a mistyped password, ``;password=…``) become ``***``. With an ``@`` anywhere, only
    what follows the last one can be a host."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # a host and port without a scheme, or anything
        return repr(url) if _SAFE_HOST_RE.fullmatch(url.rstrip("/")) else "'<redacted>'"
    if not _SAFE_SCHEME_RE.fullmatch(scheme):
        scheme = "***"
    _, at, rest = rest.rpartition("@")
    rest, cut, _ = rest.partition("?")
    rest, hashed, _ = rest.partition("#")
    netloc, slash, path = rest.partition("/")
    netloc = netloc if _SAFE_HOST_RE.fullmatch(netloc) else "***"
    path = path if _SAFE_PATH_RE.fullmatch(path) else "***"
    hidden = "?***" if cut else "#***" if hashed else ""
    return repr(f"{scheme}://{'***@' if at else ''}{netloc}{slash}{path}{hidden}")


def reject_duplicates(shard_urls: list[list[str]]) -> None:
    """Refuse a URL given twice (a trailing slash does not make it another)."""
    seen: dict[str, int] = {}
    for number, urls in enumerate(shard_urls, start=1):
        for url in urls:
            key = url.rstrip("/")
            if key in seen:
                raise ShardingError(f"{shown_url(url)} is given twice (in shard {seen[key]} "
                                    f"and in shard {number})")
            seen[key] = number


def url_host(host: str) -> str:
    """A host name as the host part of a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host
