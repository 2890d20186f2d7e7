"""Replica URLs: the ``shards`` option's text, and checks that keep credentials out.

A replica URL is ``http(s)://host[:port]`` without credentials, query or fragment (the
user and password are options of their own), and each is given once. Error messages show
a URL with any ``user:password@`` replaced.
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
    prefix = f"{where}: " if where else ""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ShardingError(f"{prefix}{shown_url(url)} is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ShardingError(f"{prefix}{shown_url(url)} is not an http:// or https:// URL "
                            "with a host")
    if parts.username is not None or parts.password is not None:
        raise ShardingError(f"{prefix}{shown_url(url)} carries credentials; give them as "
                            "the user and password options")
    if parts.query or parts.fragment:
        raise ShardingError(f"{prefix}{shown_url(url)} must not have a query or fragment")
    return url


def shown_url(url: str) -> str:
    """``url`` with any ``user:password@`` replaced, safe for an error message."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return repr(url) if "@" not in url else "'<redacted>'"
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return repr(f"{scheme}://{netloc}{slash}{path}")


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
