"""ZooKeeper digest authentication for a sink's records.

A writer given credentials (``user:password``) authenticates its ZooKeeper session with
the ``digest`` scheme and creates every znode of its sink with an ACL that grants every
permission to that identity alone (``make_digest_acl``): other clients can neither read
nor change the sink's records, and ZooKeeper refuses them with ``NoAuthError``. The
shared ancestors (``<root>`` and ``<root>/sinks``) stay open so that other sinks, with
other credentials or none, can live under the same root; they hold no records. A sink
created without credentials keeps its open ACL: credentials protect what is created
with them. ClickHouse Keeper implements the same scheme.

Credentials protect only nodes created with them, so a writer with credentials checks
the ACL of every node of a sink tree it finds already made (:func:`require_acl`): a tree
someone pre-created open (or with any other ACL) is refused, naming the node and the ACL
found, instead of trusted with the sink's generation and committed epochs.

Usage::

    auth = DigestAuth.parse("etl:s3cret")
    client = KazooClient(hosts, auth_data=auth.auth_data, default_acl=auth.acl)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, make_digest_acl

from coordinator.errors import CoordinatorError
from coordinator.plumbing.nodes import NodeStore


def hosts_problem(hosts: str) -> str | None:
    """Why a ZooKeeper connection string (``host:port,...[/chroot]``) cannot be used,
    safe to show (it never repeats the string), or None.

    ZooKeeper takes no credentials in it, and kazoo reads ``user:password@host`` as
    ``host``, dropping the rest without a word: the session would run unauthenticated and
    create the sink's records open to anyone. Any ``@`` is refused (a password may hold
    ``/``, which would put its ``@`` in the chroot).
    """
    if "@" in hosts:
        return ("carries credentials (it has an '@'), which ZooKeeper does not take there: "
                "give them as zookeeper_auth (or TXSINK_ZOOKEEPER_AUTH), user:password")
    return None


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


def sink_acl(client: NodeStore) -> list[ACL] | None:
    """The ACL this client creates a sink's nodes with, when it protects them (None for an
    open client: it has nothing to check)."""
    acl = client.default_acl
    return list(acl) if acl and list(acl) != list(OPEN_ACL_UNSAFE) else None


def acl_text(acl: list[ACL]) -> str:
    """``scheme:id:perms`` per entry; a digest id shows its user only (its hash is a
    password's, which no message shows)."""
    def perms(value: int) -> str:
        return "".join(c for bit, c in ((4, "c"), (8, "d"), (1, "r"), (2, "w"), (16, "a"))
                       if value & bit) or "-"
    def who(a: ACL) -> str:
        return a.id.id.split(":")[0] if a.id.scheme == "digest" else a.id.id
    return ", ".join(f"{a.id.scheme}:{who(a)}:{perms(a.perms)}" for a in acl) or "none"


def require_acl(client: KazooClient, top: str, expected: list[ACL]) -> None:
    """Refuse the tree under ``top`` (``top`` included) unless every node carries exactly
    ``expected``; :class:`AccessDenied` names the first node found otherwise and its ACL.

    Read level by level, each level's requests pipelined: one round trip per level of the
    tree (sink, records, xids, branches, ledger), not one per node. A node deleted
    meanwhile is skipped.
    """
    want = _acl_key(expected)
    level = [top]
    while level:
        acls = [(path, client.get_acls_async(path)) for path in level]
        kids = [(path, client.get_children_async(path)) for path in level]
        for path, result in acls:
            try:
                found = list(result.get()[0])
            except NoNodeError:
                continue
            if _acl_key(found) != want:
                raise AccessDenied(
                    f"{path} carries the ACL [{acl_text(found)}], not this writer's "
                    f"[{acl_text(expected)}]: the sink's tree was made by someone else (or "
                    "without zookeeper_auth), so anyone it lets in could change its records. "
                    "Remove the tree, or write under another sink_id or zk_root "
                    "(docs/operations.md: a protected root)")
        level = []
        for path, result in kids:
            try:
                level.extend(f"{path}/{name}" for name in result.get())
            except NoNodeError:
                continue


def _acl_key(acl: list[ACL]) -> set[tuple[int, str, str]]:
    return {(a.perms, a.id.scheme, a.id.id) for a in acl}
