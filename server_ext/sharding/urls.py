"""Replica URLs: the ``shards`` option's text, and checks that keep credentials out.

A replica URL is ``http(s)://host[:port]`` without credentials, query or fragment (the
user and password are options of their own), and each is given once. Error messages show
a URL without its userinfo, query string and fragment (any of them may hold a password,
e.g. ``?user=…&password=…``, which ClickHouse reads from the query string).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from server_ext.sharding.errors import ShardingError


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
    without userinfo, query or fragment. For every option that names a server, checked
    before any request is sent with it."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return f"{shown_url(url)} is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{shown_url(url)} is not an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return (f"{shown_url(url)} carries credentials; give them as the user and password "
                "options")
    if parts.query or parts.fragment:
        return (f"{shown_url(url)} must not have a query or fragment (it is not shown: it "
                "may hold credentials; give them as the user and password options)")
    return None


def shown_url(url: str) -> str:
    """``url`` without userinfo, query string and fragment, safe for an error message."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "'<redacted>'" if any(c in url for c in "@?#") else repr(url)
    rest, cut, _ = rest.partition("?")
    rest, hashed, _ = rest.partition("#")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    hidden = "?***" if cut else "#***" if hashed else ""
    return repr(f"{scheme}://{netloc}{slash}{path}{hidden}")


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
