"""What an operator sees from the CLI: when there is nothing, or nobody, to talk to, and
what it shows of epochs that recovery finished."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from coordinator import Coordinator
from server_ext.staging.manifest import Manifest
from tests.conftest import free_port
from txsink.core import payload


def txsink(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txsink", *args], capture_output=True,
                          text=True, timeout=60)


def test_status_of_a_root_without_sinks_says_so(zk_hosts, zk_chroot):
    done = txsink("status", "--zookeeper", zk_hosts + zk_chroot)
    assert done.returncode == 0
    assert "no sinks under this root" in done.stdout


@pytest.mark.parametrize("command", ["status", "verify"])
def test_a_check_of_an_unknown_sink_exits_2_naming_it(zk, zk_hosts, zk_chroot,
                                                    clickhouse_url, command):
    """A mistyped ``--sink`` must not pass for "nothing wrong" in a scheduled check."""
    coord = Coordinator(zk, "nightly-other")
    coord.begin(0, coord.fence())
    done = txsink(command, "--zookeeper", zk_hosts + zk_chroot, "--url", clickhouse_url,
                  "--sink", "nightly")
    assert done.returncode == 2
    assert "UnknownSink: no sink 'nightly'" in done.stderr and "nightly-other" in done.stderr


def test_recover_of_a_sink_not_made_yet_says_so_and_succeeds(zk, zk_hosts, zk_chroot,
                                                             clickhouse_url):
    """A pipeline recovers its sink before its first write makes it."""
    coord = Coordinator(zk, "nightly-other")
    coord.begin(0, coord.fence())
    done = txsink("recover", "--zookeeper", zk_hosts + zk_chroot, "--url", clickhouse_url,
                  "--sink", "nightly")
    assert done.returncode == 0
    assert "no sink 'nightly' under this root: nothing to recover" in done.stdout


def test_unreachable_zookeeper_is_one_line_naming_the_host_within_seconds():
    port = free_port()
    started = time.monotonic()
    done = txsink("status", "--zookeeper", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 12
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"txsink status: ZooKeeperUnreachable: no answer from ZooKeeper at 127.0.0.1:{port} "
        "within 5 s (is it running, and is --zookeeper host:port[/chroot] right?)"]


def test_status_shows_rows_and_branches_of_an_epoch_finished_by_recovery(zk, zk_hosts,
                                                                          zk_chroot):
    """The driver died after its decision (publish raised), so it recorded no metrics;
    ``txsink recover`` finished the xid; ``status`` reads rows and branches from the
    winners' records."""
    coord = Coordinator(zk, "nightly")
    generation = coord.fence()
    coord.begin(0, generation)
    sources = {}
    for branch_id, rows in (("p0-a0-1", 30), ("p1-a0-1", 12)):
        coord.register_branch(0, branch_id, generation, owner={})
        sources[branch_id] = Manifest("db", "t", "txsink_staging", f"s_{branch_id}", ())
        coord.prepare_branch(0, branch_id, payload.to_record(payload.StagedBranch(
            manifest=sources[branch_id], strategy="move", staging=f"s_{branch_id}",
            server=None, rows=rows)))
    combined = payload.CombinedBranch.of(sources, staging="c", strategy="move", server=None)
    coord.register_branch(0, "combined-1", generation, owner={})
    coord.prepare_branch(0, "combined-1", payload.to_record(
        payload.CombinedBranch(**{**combined.__dict__, "rows": 42})))

    def dies(_branch):
        raise KeyboardInterrupt("the driver dies")

    with pytest.raises(KeyboardInterrupt):
        coord.commit(0, generation, ["combined-1"], publish=dies, rollback=lambda b: None)
    Coordinator(zk, "nightly").recover(publish=lambda b: None, rollback=lambda b: None,
                                       older_than_generation=0)
    done = txsink("status", "--zookeeper", zk_hosts + zk_chroot, "--sink", "nightly")
    assert done.returncode == 0, done.stderr
    assert "epoch 0: 42 rows, 2 branches, finished by recovery" in done.stdout


def test_status_claims_no_recovery_for_a_commit_without_recorded_metrics(zk, zk_hosts,
                                                                       zk_chroot):
    """A writer that committed but recorded no metrics (killed right after its
    ``Committed`` write) was not finished by recovery: status says it does not know."""
    coord = Coordinator(zk, "nightly")
    generation = coord.fence()
    coord.begin(0, generation)
    coord.commit(0, generation, [], publish=lambda b: None, rollback=lambda b: None)
    done = txsink("status", "--zookeeper", zk_hosts + zk_chroot, "--sink", "nightly")
    assert done.returncode == 0, done.stderr
    assert "finished by recovery" not in done.stdout
    assert "no timings recorded" in done.stdout


def test_every_option_of_every_command_has_help_text():
    from txsink.ops.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    missing = [f"{name} {'/'.join(action.option_strings) or action.dest}"
               for name, command in commands.items() for action in command._actions
               if not action.help and action.dest != "help"]
    assert missing == []


def test_commands_that_reach_clickhouse_name_the_credential_variables():
    for command in ("recover", "gc", "verify", "resolve"):
        done = txsink(command, "--help")
        assert "TXSINK_CLICKHOUSE_USER" in done.stdout, command
        assert "TXSINK_CLICKHOUSE_PASSWORD" in done.stdout, command


BAD_FLAGS = {
    "grace_nan": (["gc", "--grace", "nan"], "argument --grace: 'nan' must be a finite"),
    "grace_inf": (["gc", "--grace", "inf"], "argument --grace: 'inf' must be a finite"),
    "negative_prune_age": (["gc", "--prune-older-than", "-1"], "at least 0"),
    "committing_older_than_nan": (["verify", "--committing-older-than", "nan"],
                                  "must be a finite"),
    "negative_epoch": (["recover", "--sink", "s", "--epoch", "-3"], "'-3' must be at least 0"),
    "zk_root_slash": (["status", "--zk-root", "/"], "other than '/'"),
    "zk_root_reserved": (["status", "--zk-root", "/zookeeper/x"], "reserved tree"),
    "zk_root_control_character": (["status", "--zk-root", "/tx\x07sink"], "printable"),
}


@pytest.mark.parametrize("case", BAD_FLAGS, ids=list(BAD_FLAGS))
def test_a_flag_out_of_range_is_refused_by_name_before_any_connection(case):
    args, expected = BAD_FLAGS[case]
    done = txsink(*args, "--zookeeper", f"127.0.0.1:{free_port()}")  # nothing listens
    assert done.returncode == 2
    assert expected in done.stderr
    assert "no answer from ZooKeeper" not in done.stderr


def committed_sink(zk, sink_id: str, open_epoch: bool = False) -> None:
    coord = Coordinator(zk, sink_id)
    generation = coord.fence()
    coord.begin(0, generation)
    coord.commit(0, generation, [], publish=lambda b: None, rollback=lambda b: None)
    if open_epoch:
        coord.begin(1, generation)


def gc_forgetting(zk_hosts, zk_chroot, clickhouse_url, after: str) -> subprocess.CompletedProcess:
    return txsink("gc", "--zookeeper", zk_hosts + zk_chroot, "--url", clickhouse_url,
                  "--forget-one-off-sinks-after", after)


def test_gc_forgets_an_idle_one_off_sink_and_keeps_named_and_open_ones(
        zk, zk_hosts, zk_chroot, clickhouse_url):
    committed_sink(zk, "batch-0123456789abcdef")
    committed_sink(zk, "batch-fedcba9876543210", open_epoch=True)
    committed_sink(zk, "nightly")
    time.sleep(0.2)
    done = gc_forgetting(zk_hosts, zk_chroot, clickhouse_url, "0.1")
    assert done.returncode == 0, done.stderr
    assert "forgot one-off sink batch-0123456789abcdef" in done.stdout
    status = txsink("status", "--zookeeper", zk_hosts + zk_chroot).stdout
    assert "batch-0123456789abcdef" not in status
    assert "batch-fedcba9876543210" in status and "nightly" in status


def test_gc_keeps_one_off_sinks_younger_than_the_age(zk, zk_hosts, zk_chroot, clickhouse_url):
    committed_sink(zk, "batch-0123456789abcdef")
    done = gc_forgetting(zk_hosts, zk_chroot, clickhouse_url, "3600")
    assert done.returncode == 0, done.stderr
    assert "batch-0123456789abcdef" in txsink("status", "--zookeeper",
                                               zk_hosts + zk_chroot).stdout


def test_reset_of_a_sink_the_root_does_not_hold_says_it_was_created(zk_hosts, zk_chroot):
    done = txsink("reset", "--zookeeper", zk_hosts + zk_chroot, "--sink", "nightly",
                  "--committed-through", "2")
    assert done.returncode == 0
    assert "NOTE: the root held no sink nightly; it was created now" in done.stdout
    again = txsink("reset", "--zookeeper", zk_hosts + zk_chroot, "--sink", "nightly",
                   "--committed-through", "2")
    assert again.returncode == 0 and "NOTE" not in again.stdout
