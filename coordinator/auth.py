"""ZooKeeper digest authentication for a sink's records.

A writer given credentials (``user:password``) authenticates its ZooKeeper session with
the ``digest`` scheme and creates every znode of its sink with an ACL that grants every
permission to that identity alone (``make_digest_acl``): other clients can neither read
nor change the sink's records, and ZooKeeper refuses them with ``NoAuthError``. The
shared ancestors (``<root>`` and ``<root>/sinks``) stay open so that other sinks, with
other credentials or none, can live under the same root; they hold no records. A sink
created without credentials keeps its open ACL: credentials protect what is created
with them. ClickHouse Keeper implements the same scheme.

Usage::

    auth = DigestAuth.parse("etl:s3cret")
    client = KazooClient(hosts, auth_data=auth.auth_data, default_acl=auth.acl)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kazoo.security import ACL, make_digest_acl

from coordinator.errors import CoordinatorError


class AccessDenied(CoordinatorError):
    """ZooKeeper refused this session access to a sink's records (their ACL)."""


@dataclass(frozen=True)
class DigestAuth:
    """Credentials of the ``digest`` scheme; the password never appears in ``repr``."""

    user: str
    password: str = field(repr=False)

    @classmethod
    def parse(cls, text: str) -> DigestAuth:
        """``user:password`` (the password may hold ``:``); ValueError naming the form."""
        user, colon, password = text.partition(":")
        if not colon or not user or not password:
            raise ValueError("ZooKeeper credentials must have the form user:password")
        return cls(user, password)

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """kazoo's ``auth_data``: sent when the session starts and on every reconnect."""
        return [("digest", f"{self.user}:{self.password}")]

    @property
    def acl(self) -> list[ACL]:
        """kazoo's ``default_acl``: every permission for this identity, none for others."""
        return [make_digest_acl(self.user, self.password, all=True)]
