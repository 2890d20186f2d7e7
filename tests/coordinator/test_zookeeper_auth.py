"""ZooKeeper digest authentication (option ``zookeeper_auth`` / ``TXSINK_ZOOKEEPER_AUTH``)
against the real ZooKeeper 3.8: a sink written with credentials keeps its records from
every session without them (``coordinator/plumbing/auth.py``)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import OPEN_ACL_UNSAFE

import txsink
from coordinator import AccessDenied, Coordinator, DigestAuth
from tests.sinkutil import assert_exactly_once, create_events, events_df, staging_tables
from txsink.ops import cli
from txsink.options import OptionError, parse_options

CREDENTIALS = "etl:s3cret:with-colon"


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.fixture
def zk(zk_hosts: str, zk_chroot: str):
    client = KazooClient(hosts=zk_hosts + zk_chroot)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def authed(zk_hosts: str, zk_chroot: str):
    """A session with the sink's credentials; it removes the protected sink afterwards
    (nobody else may delete its nodes)."""
    auth = DigestAuth.parse(CREDENTIALS)
    client = KazooClient(hosts=zk_hosts + zk_chroot, auth_data=auth.auth_data)
    client.start(timeout=15)
    yield client
    try:
        client.delete("/txsink/sinks/guarded", recursive=True)
    except NoNodeError:
        pass
    client.stop()
    client.close()


def save(df, table: str, options: dict[str, str]) -> None:
    df.write.format("clickhouse_tx").options(**options).option("table", table) \
        .mode("append").save()


@pytest.fixture
def options(clickhouse_url: str, zk_hosts: str, zk_chroot: str, authed) -> dict[str, str]:
    return {"url": clickhouse_url, "zookeeper": zk_hosts + zk_chroot, "sink_id": "guarded"}


def test_a_sink_written_with_credentials_keeps_its_records_from_other_sessions(
        spark, clickhouse_url, ch_db, options, zk, authed):
    table = create_events(clickhouse_url, ch_db)
    save(events_df(spark, 0, 500), table, {**options, "zookeeper_auth": CREDENTIALS})
    assert_exactly_once(clickhouse_url, table, range(500))
    acls, _ = authed.get_acls("/txsink/sinks/guarded/generation")
    assert [(acl.id.scheme, acl.id.id.split(":")[0]) for acl in acls] == [("digest", "etl")]
    with pytest.raises(NoAuthError):
        zk.get("/txsink/sinks/guarded/generation")


def test_a_writer_without_the_sinks_credentials_is_refused_before_anything_is_staged(
        spark, clickhouse_url, ch_db, options):
    table = create_events(clickhouse_url, ch_db)
    save(events_df(spark, 0, 100), table, {**options, "zookeeper_auth": CREDENTIALS})
    before = staging_tables(clickhouse_url, options)
    for wrong in ({}, {"zookeeper_auth": "etl:wrong"}):
        with pytest.raises(Exception, match="refuses access to sink guarded's records") as err:
            save(events_df(spark, 100, 100), table, {**options, **wrong})
        assert "wrong" not in str(err.value) and "s3cret" not in str(err.value)
    assert staging_tables(clickhouse_url, options) == before
    assert_exactly_once(clickhouse_url, table, range(100))


def test_other_sinks_without_credentials_still_live_under_the_same_root(
        spark, clickhouse_url, ch_db, options):
    table = create_events(clickhouse_url, ch_db)
    save(events_df(spark, 0, 100), table, {**options, "zookeeper_auth": CREDENTIALS})
    save(events_df(spark, 100, 100), table, {**options, "sink_id": "open"})
    assert_exactly_once(clickhouse_url, table, range(200))


def test_the_operator_cli_reads_a_protected_sink_with_the_credential_variable(
        spark, clickhouse_url, ch_db, options, zk_hosts, zk_chroot, monkeypatch, capsys):
    table = create_events(clickhouse_url, ch_db)
    save(events_df(spark, 0, 100), table, {**options, "zookeeper_auth": CREDENTIALS})
    args = ["status", "--zookeeper", zk_hosts + zk_chroot, "--sink", "guarded"]
    assert cli.main(args) == 2
    assert "TXSINK_ZOOKEEPER_AUTH" in capsys.readouterr().err
    monkeypatch.setenv("TXSINK_ZOOKEEPER_AUTH", CREDENTIALS)
    assert cli.main(args) == 0
    assert "guarded" in capsys.readouterr().out


def test_operator_commands_over_every_sink_leave_out_protected_ones_and_say_so(
        spark, clickhouse_url, ch_db, options, zk_hosts, zk_chroot, capsys):
    table = create_events(clickhouse_url, ch_db)
    save(events_df(spark, 0, 100), table, {**options, "zookeeper_auth": CREDENTIALS})
    save(events_df(spark, 100, 100), table, {**options, "sink_id": "open"})
    zookeeper = ["--zookeeper", zk_hosts + zk_chroot]
    assert cli.main(["status", *zookeeper]) == 0
    out = capsys.readouterr().out
    assert "open: generation" in out and "left out 1 sink(s)" in out and "guarded" in out
    assert cli.main(["gc", *zookeeper, "--url", clickhouse_url, "--grace", "0"]) == 0
    assert "left out 1 sink(s)" in capsys.readouterr().out


def test_a_sink_tree_pre_created_open_is_refused_naming_the_node_and_its_acl(
        spark, clickhouse_url, ch_db, options, zk):
    """Anyone may pre-create a sink's tree under the open ancestors; a writer with
    credentials must not trust it (its records could be rewritten by anyone)."""
    table = create_events(clickhouse_url, ch_db)
    Coordinator(zk, "guarded").fence()  # an unauthenticated client makes the tree
    before = staging_tables(clickhouse_url, options)
    with pytest.raises(Exception, match=r"/txsink/sinks/guarded carries the ACL "
                                        r"\[world:anyone:cdrwa\]") as err:
        save(events_df(spark, 0, 100), table, {**options, "zookeeper_auth": CREDENTIALS})
    assert "s3cret" not in str(err.value)
    assert staging_tables(clickhouse_url, options) == before
    assert Coordinator(zk, "guarded").generation() == 1  # not fenced by the refused writer


def test_one_node_of_a_protected_tree_with_another_acl_is_refused_naming_it(
        zk_hosts, zk_chroot, authed):
    auth = DigestAuth.parse(CREDENTIALS)
    owner = KazooClient(hosts=zk_hosts + zk_chroot, auth_data=auth.auth_data,
                        default_acl=auth.acl)
    owner.start(timeout=15)
    try:
        Coordinator(owner, "guarded").fence()
        owner.set_acls("/txsink/sinks/guarded/next_epoch", OPEN_ACL_UNSAFE)
        with pytest.raises(AccessDenied, match="/txsink/sinks/guarded/next_epoch carries"):
            Coordinator(owner, "guarded").check_tree()
    finally:
        owner.stop()
        owner.close()


def test_a_root_created_for_one_tenant_takes_its_sinks_and_refuses_other_writers(
        spark, clickhouse_url, ch_db, options, zk, authed):
    """The recipe of docs/operations.md: an administrator creates ``<root>`` and
    ``<root>/sinks`` with the tenant's digest ACL; nobody else can add a sink there."""
    tenant = DigestAuth.parse(CREDENTIALS)
    zk.create("/tenant-etl/sinks", makepath=True)
    zk.set_acls("/tenant-etl/sinks", tenant.acl)
    zk.set_acls("/tenant-etl", tenant.acl)
    try:
        table = create_events(clickhouse_url, ch_db)
        mine = {**options, "zk_root": "/tenant-etl", "zookeeper_auth": CREDENTIALS}
        save(events_df(spark, 0, 100), table, mine)
        with pytest.raises(Exception, match="refuses access"):
            save(events_df(spark, 100, 100), table, {**mine, "zookeeper_auth": "other:pw"})
        assert_exactly_once(clickhouse_url, table, range(100))
        with pytest.raises(NoAuthError):
            zk.create("/tenant-etl/sinks/squatter")
    finally:
        authed.delete("/tenant-etl", recursive=True)  # only the tenant may


def test_malformed_credentials_are_refused_without_showing_them():
    with pytest.raises(OptionError, match="user:password") as err:
        parse_options({"url": "http://h:8123", "table": "db.t", "zookeeper": "z:2181",
                       "zookeeper_auth": "no-colon-secret"})
    assert "no-colon-secret" not in str(err.value)
    parsed = parse_options({"url": "http://h:8123", "table": "db.t", "zookeeper": "z:2181",
                            "zookeeper_auth": CREDENTIALS})
    assert "s3cret" not in repr(parsed)


@pytest.mark.parametrize("hosts", ["etl:s3cret@{hosts}", "etl:s3/cret@{hosts}"])
def test_credentials_in_the_zookeeper_option_are_refused_before_any_session_and_not_shown(
        spark, clickhouse_url, ch_db, zk_hosts, zk_chroot, zk, hosts):
    """kazoo would drop them silently and the sink's records would be open to anyone."""
    table = create_events(clickhouse_url, ch_db)
    zookeeper = hosts.format(hosts=zk_hosts) + zk_chroot
    with pytest.raises(Exception, match="option zookeeper carries credentials") as err:
        save(events_df(spark, 0, 100), table, {"url": clickhouse_url, "zookeeper": zookeeper,
                                               "sink_id": "guarded"})
    assert "s3" not in str(err.value) and "cret" not in str(err.value)
    assert zk.get_children("/") == []
    assert staging_tables(clickhouse_url, {"sink_id": "guarded",
                                           "zookeeper": zk_hosts + zk_chroot}) == []


def test_credentials_in_an_operator_commands_zookeeper_address_are_refused(capsys):
    assert cli.main(["status", "--zookeeper", "etl:s3cret@127.0.0.1:2181"]) != 0
    err = capsys.readouterr().err
    assert "--zookeeper carries credentials" in err and "s3cret" not in err
