"""What an operator sees from the CLI when there is nothing, or nobody, to talk to."""

from __future__ import annotations

import socket
import subprocess
import sys
import time


def txsink(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txsink", *args], capture_output=True,
                          text=True, timeout=60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_status_of_a_root_without_sinks_says_so(zk_hosts, zk_chroot):
    done = txsink("status", "--zookeeper", zk_hosts + zk_chroot)
    assert done.returncode == 0
    assert "no sinks under this root" in done.stdout


def test_status_of_an_unknown_sink_exits_2_naming_it(zk_hosts, zk_chroot):
    done = txsink("status", "--zookeeper", zk_hosts + zk_chroot, "--sink", "nightly")
    assert done.returncode == 2
    assert "no sink 'nightly'" in done.stderr


def test_unreachable_zookeeper_is_one_line_naming_the_host_within_seconds():
    port = free_port()
    started = time.monotonic()
    done = txsink("status", "--zookeeper", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 12
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"txsink status: ZooKeeperUnreachable: no answer from ZooKeeper at 127.0.0.1:{port} "
        "within 5 s (is it running, and is --zookeeper host:port[/chroot] right?)"]
