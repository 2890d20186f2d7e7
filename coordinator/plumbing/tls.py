"""ZooKeeper over TLS: kazoo's settings, and one handshake tried before the session.

kazoo speaks TLS to a ZooKeeper ``secureClientPort`` (``use_ssl``), but to kazoo a
handshake that fails is a dropped connection like any other: it retries until the start
timeout and then reports a time-out, not the reason. :meth:`ZooKeeperTLS.check` makes
one handshake per host with the settings kazoo will use, so an untrusted certificate,
a certificate for another host or a plain-text port fails within seconds with the
reason, before any session (and so before anything is written).

The certificate is verified against the CA file *and* the system's default CAs (kazoo
loads both), and must name the host as written in the host list (an ``IP:`` entry for
an address). kazoo leaves the host name unchecked by default; this turns it on.

Usage::

    tls = ZooKeeperTLS("/etc/zk/ca.pem")
    tls.check("zk1:2281,zk2:2281/chroot", advice="check the zookeeper_ca_file option")
    client = KazooClient("zk1:2281,zk2:2281/chroot", **tls.kazoo_args())
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
from dataclasses import dataclass

from kazoo.hosts import collect_hosts

from coordinator.errors import CoordinatorError

log = logging.getLogger(__name__)

HANDSHAKE_SECONDS = 5.0  # per host: connect and handshake, then the reason is given


class ZooKeeperTLSError(CoordinatorError, ConnectionError):
    """TLS with ZooKeeper failed (certificate, host name, a port without TLS, the CA
    file): nothing was sent to ZooKeeper and retrying cannot help."""


@dataclass(frozen=True)
class ZooKeeperTLS:
    """TLS to ZooKeeper, the server verified with ``ca_file`` (PEM); no client certificate."""

    ca_file: str

    def kazoo_args(self) -> dict[str, object]:
        """``KazooClient`` keyword arguments for the same verification as :meth:`context`."""
        return {"use_ssl": True, "ca": self.ca_file, "verify_certs": True,
                "check_hostname": True}

    def context(self) -> ssl.SSLContext:
        """The context kazoo 2.11 builds from :meth:`kazoo_args` (``create_tcp_connection``),
        so that a handshake passing here passes there."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.options |= ssl.OP_NO_SSLv2 | ssl.OP_NO_SSLv3
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(self.ca_file)
        return context

    def check(self, hosts: str, advice: str, timeout: float = HANDSHAKE_SECONDS) -> None:
        """Raise :class:`ZooKeeperTLSError` unless a host of ``hosts`` (kazoo's
        ``host:port,...[/chroot]``) completes a verified handshake.

        Hosts that do not accept a connection at all are left to the session's own
        "did not answer" report, as without TLS; ``advice`` (what the caller can change)
        goes into the message.
        """
        try:
            context = self.context()
        except (OSError, ValueError) as exc:
            raise ZooKeeperTLSError(f"TLS with ZooKeeper cannot start: the CA file "
                                    f"{self.ca_file} cannot be loaded ({_reason(exc)}); "
                                    f"{advice}") from None
        failed: list[tuple[str, str]] = []
        for host, port in collect_hosts(hosts)[0]:
            problem = handshake_problem(context, host, port, timeout)
            if problem is None:
                for address, reason in failed:  # the session may reach these later
                    log.warning("TLS with ZooKeeper at %s failed: %s", address, reason)
                return
            if problem != UNREACHABLE:
                failed.append((_address(host, port), problem))
        if failed:
            address, reason = failed[0]
            raise ZooKeeperTLSError(f"TLS with ZooKeeper at {address} failed ({advice}): "
                                    f"{reason}")


UNREACHABLE = "unreachable"  # no TCP connection: not a TLS problem


def handshake_problem(context: ssl.SSLContext, host: str, port: int,
                      timeout: float = HANDSHAKE_SECONDS) -> str | None:
    """Why a TLS handshake with ``host:port`` fails under ``context``, :data:`UNREACHABLE`
    when not even TCP connects, or None when it succeeds."""
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return UNREACHABLE
    try:
        with context.wrap_socket(raw, server_hostname=host):
            return None
    except ssl.SSLCertVerificationError as exc:
        return f"certificate verify failed: {exc.verify_message or _reason(exc)}"
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError,
            BrokenPipeError):
        return (f"the server closed the connection during the TLS handshake: "
                f"{_address(host, port)} does not speak TLS (ZooKeeper serves TLS on its "
                "secureClientPort only)")
    except TimeoutError:
        return f"no TLS answer within {timeout:.0f}s"
    except OSError as exc:
        return _reason(exc)
    finally:
        raw.close()


def speaks_tls(host: str, port: int, timeout: float = HANDSHAKE_SECONDS) -> bool:
    """Whether ``host:port`` answers a TLS handshake (certificate not checked): why a
    plain session there never starts."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return handshake_problem(context, host, port, timeout) is None


def tls_ports(hosts: str, timeout: float = HANDSHAKE_SECONDS) -> list[str]:
    """The ``host:port`` entries of ``hosts`` that answer TLS."""
    return [_address(host, port) for host, port in collect_hosts(hosts)[0]
            if speaks_tls(host, port, timeout)]


def tls_hint(hosts: str, remedy: str) -> str:
    """Why a plain session to ``hosts`` never started, when a port answers TLS instead:
    "; <host:port> speaks TLS: <remedy>", or "" (for the end of a "did not answer")."""
    found = tls_ports(hosts)
    return f"; {', '.join(found)} speaks TLS: {remedy}" if found else ""


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reason(exc: BaseException) -> str:
    """OpenSSL's reason without its ``[LIB: CODE]`` prefix and source line."""
    text = str(exc.args[-1]) if exc.args else str(exc)
    text = re.sub(r"^\[[A-Z0-9_]+: [A-Z0-9_]+\]\s*", "", text)
    return re.sub(r"\s*\(_ssl\.c:\d+\)", "", text).strip()[:300]
