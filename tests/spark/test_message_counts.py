"""An epoch's metrics count the messages its writer sent (``txsink.core.message_count``).

The sink talks to the servers through relaying proxies (``tests/harness/wire.py``), which
count every ZooKeeper request and every ClickHouse statement of every process; the
epoch's recorded ``store_requests`` and ``statements`` must be exactly those sent up to
and including the xid's ``Committed`` write (the multi-op that deletes its open marker).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

import txsink
from coordinator import Coordinator, SinkAdmin, XidState
from tests.harness.wire import ClickHouseProxy, Request, ZooKeeperProxy
from tests.sinkutil import SHORT_SESSION, assert_exactly_once, create_events, events_df, save
from txsink.core.payload import staging_place
from txsink.ops import cli

NOT_REQUESTS = ("connect", "ping", "closeSession")


@pytest.fixture(params=["ch18", pytest.param("ch26", marks=pytest.mark.second_server)])
def server(request) -> str:
    return request.param


@pytest.fixture
def proxies(server_url: str, zk_hosts: str) -> Iterator[tuple[ZooKeeperProxy, ClickHouseProxy]]:
    host, port = zk_hosts.split(",")[0].rsplit(":", 1)
    url = urlsplit(server_url)
    zk, ch = ZooKeeperProxy((host, int(port))), ClickHouseProxy((url.hostname, url.port))
    yield zk, ch
    zk.close()
    ch.close()


def proxied_options(proxies: tuple[ZooKeeperProxy, ClickHouseProxy], zk_chroot: str
                    ) -> dict[str, str]:
    zk, ch = proxies
    return {"url": f"http://127.0.0.1:{ch.port}", "zookeeper": f"127.0.0.1:{zk.port}{zk_chroot}",
            **SHORT_SESSION}


def sent_until_committed(proxies: tuple[ZooKeeperProxy, ClickHouseProxy], coord: Coordinator,
                         epoch: int) -> tuple[list[Request], list[Request]]:
    """The ZooKeeper requests and ClickHouse statements sent for ``epoch`` up to its final
    write, but for two kinds the count leaves out: the background drops of its published
    winners' staging, and an earlier batch job's keeper check of that job's xid."""
    zk, ch = proxies
    older = tuple(coord.layout.xid(e) for e in range(epoch))
    requests = [r for r in zk.log.requests if r.kind.split(" ")[0] not in NOT_REQUESTS
                and not r.kind.endswith(older)]
    final = max(i for i, r in enumerate(requests)
                if r.kind.startswith("multi") and "delete" in r.kind and "/open/" in r.kind)
    record = coord.xid(epoch)
    released = [place.staging.split(".")[-1].strip("`") for place in (
        staging_place(b) for b in coord.winner_records(epoch, record.winners))
        if place is not None]
    statements = [s for s in ch.log.requests if s.at <= requests[final].at]
    for name in released:  # its DROP after the CREATE (one before it makes room)
        created = next(i for i, s in enumerate(statements)
                       if s.kind.startswith("http CREATE") and name in s.kind)
        statements[created:] = [s for s in statements[created:]
                                if not (s.kind.startswith("http DROP") and name in s.kind)]
    return requests[:final + 1], statements


@pytest.mark.parametrize("way", ["txsink.write", "df.write"])
def test_a_batch_jobs_metrics_count_every_message_it_sent_until_committed(
        spark, server_url, server_db, zk, zk_chroot, proxies, way):
    target = create_events(server_url, server_db)
    options = proxied_options(proxies, zk_chroot)
    txsink.register(spark)
    for start in (0, 2000):  # the second job's epoch: the sink is set up
        for proxy in proxies:
            proxy.log.requests.clear()
        rows = events_df(spark, start, 2000, partitions=2)
        if way == "txsink.write":
            txsink.write(rows, table=target, sink_id="counted", **options)
        else:
            save(rows, options, target, sink_id="counted")
    coord = Coordinator(zk, "counted")
    epoch = SinkAdmin(coord).last_committed()
    requests, statements = sent_until_committed(proxies, coord, epoch)
    metrics = coord.xid(epoch).metrics
    assert (metrics["store_requests"], metrics["statements"]) == (len(requests), len(statements))


def open_listings_in(requests: list[Request]) -> list[Request]:
    """The listings of the sink's open xids among ``requests``."""
    return [r for r in requests if r.kind.startswith("getChildren") and r.kind.endswith("/open")]


def open_listings(proxies: tuple[ZooKeeperProxy, ClickHouseProxy]) -> list[Request]:
    """The listings of the sink's open xids sent since the proxies' log was cleared."""
    return open_listings_in(proxies[0].log.requests)


def test_a_batch_job_after_one_this_process_committed_lists_no_open_xid(
        spark, server_url, server_db, zk_chroot, proxies):
    target = create_events(server_url, server_db)
    options = proxied_options(proxies, zk_chroot)
    txsink.write(events_df(spark, 0, 500, partitions=2), table=target, sink_id="listed",
                 **options)
    proxies[0].log.requests.clear()
    txsink.write(events_df(spark, 500, 500, partitions=2), table=target, sink_id="listed",
                 **options)
    assert open_listings(proxies) == []


def test_a_batch_job_after_another_writer_fenced_finishes_what_that_writer_decided(
        spark, server_url, server_db, zk, zk_chroot, proxies):
    target = create_events(server_url, server_db)
    options = proxied_options(proxies, zk_chroot)
    txsink.write(events_df(spark, 0, 500, partitions=2), table=target, sink_id="listed",
                 **options)
    other = Coordinator(zk, "listed")  # another writer, which dies after its decision
    generation = other.fence()
    epoch = other.allocate_epoch()
    other.begin(epoch, generation)
    other.decide(epoch, generation, [])
    txsink.write(events_df(spark, 500, 500, partitions=2), table=target, sink_id="listed",
                 **options)
    assert other.xid(epoch).state is XidState.COMMITTED
    assert_exactly_once(server_url, target, range(1000))


def write_ids(folder, first: int, count: int) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{first}.json").write_text(
        "".join(f'{{"id": {i}, "day": "2026-01-{1 + i % 28:02d}", "name": "e{i}", '
                f'"value": {i / 2}}}\n' for i in range(first, first + count)))


def started_stream(spark, tmp_path, way: str, target: str, options: dict[str, str]):
    """A file stream of ``tmp_path/in`` (checkpoint ``tmp_path/cp``) into ``target``."""
    rows = (spark.readStream.schema("id long, day date, name string, value double")
            .json(str(tmp_path / "in")).writeStream
            .option("checkpointLocation", str(tmp_path / "cp")))
    if way == "foreachBatch":
        return rows.foreachBatch(txsink.foreach_batch(table=target, **options)).start()
    return rows.format("clickhouse_tx").options(table=target, **options).start()


def second_micro_batch(spark, server_url, server_db, zk, zk_chroot, proxies, tmp_path,
                       way: str) -> tuple[Coordinator, list[Request], list[Request]]:
    """A stream's second micro-batch (epoch 1; epoch 0 sets the sink up): the sink's
    coordinator and what was sent for the epoch until its ``Committed`` write."""
    target = create_events(server_url, server_db)
    options = {**proxied_options(proxies, zk_chroot), "sink_id": "counted"}
    txsink.register(spark)
    source = tmp_path / "in"
    write_ids(source, 0, 300)
    stream = started_stream(spark, tmp_path, way, target, options)
    try:
        stream.processAllAvailable()
        for proxy in proxies:
            proxy.log.requests.clear()
        write_ids(source, 1000, 300)
        stream.processAllAvailable()
    finally:
        stream.stop()
    coord = Coordinator(zk, "counted")
    return coord, *sent_until_committed(proxies, coord, 1)


@pytest.mark.parametrize("way", ["foreachBatch", "writeStream"])
def test_a_micro_batchs_metrics_count_every_message_it_sent_until_committed(
        spark, server_url, server_db, zk, zk_chroot, proxies, tmp_path, way):
    coord, requests, statements = second_micro_batch(spark, server_url, server_db, zk,
                                                     zk_chroot, proxies, tmp_path, way)
    if way == "writeStream":  # Spark plans it twice; the other call's check (its listing and
        # the last_committed it hands the tasks) is not counted
        listings = open_listings_in(requests)
        handed = [next(r for r in requests if r.at > listing.at and r.kind.startswith(
            "getData") and r.kind.endswith("/last_committed")) for listing in listings]
        requests = [r for r in requests if r not in listings and r not in handed]
        statements.remove(next(s for s in statements if "system.tables" in s.kind))
    metrics = coord.xid(1).metrics
    assert (metrics["store_requests"], metrics["statements"]) == (len(requests), len(statements))


@pytest.mark.parametrize(("way", "listings"), [("foreachBatch", 0), ("writeStream", 1)])
def test_a_micro_batch_after_one_this_process_committed_lists_no_open_xid(
        spark, server_url, server_db, zk, zk_chroot, proxies, tmp_path, way, listings):
    """``writeStream``: Spark's task-side plan runs in a Python worker that commits
    nothing, so it never knows the sink settled; the committing side lists nothing."""
    _, requests, _ = second_micro_batch(spark, server_url, server_db, zk, zk_chroot, proxies,
                                        tmp_path, way)
    assert len(open_listings_in(requests)) == listings


@pytest.mark.parametrize("way", ["foreachBatch", "writeStream"])
def test_a_new_run_of_the_query_in_this_process_rolls_decided_xids_forward_first(
        spark, server_url, server_db, zk_chroot, proxies, tmp_path, way):
    target = create_events(server_url, server_db)
    options = {**proxied_options(proxies, zk_chroot), "sink_id": "rerun"}
    txsink.register(spark)
    source = tmp_path / "in"
    for first in (0, 1000):  # the second run: the same checkpoint, a new run id
        write_ids(source, first, 300)
        proxies[0].log.requests.clear()
        stream = started_stream(spark, tmp_path, way, target, options)
        try:
            stream.processAllAvailable()
        finally:
            stream.stop()
    listed = open_listings(proxies)
    decision = next(r for r in proxies[0].log.requests
                    if r.kind.startswith("multi") and "generation; setData" in r.kind)
    assert listed and listed[0].at < decision.at
    assert_exactly_once(server_url, target, [*range(300), *range(1000, 1300)])


def test_status_shows_each_epochs_store_requests_and_statements(
        spark, server_url, server_db, zk_hosts, zk_chroot, capsys):
    target = create_events(server_url, server_db)
    options = {"url": server_url, "zookeeper": zk_hosts + zk_chroot, **SHORT_SESSION}
    txsink.write(events_df(spark, 0, 500, partitions=2), table=target, sink_id="shown", **options)
    assert cli.main(["status", "--zookeeper", zk_hosts + zk_chroot, "--json"]) == 0
    (sink,) = json.loads(capsys.readouterr().out)["sinks"]
    (recorded,) = sink["recent"]
    assert cli.main(["status", "--zookeeper", zk_hosts + zk_chroot]) == 0
    assert (f"{recorded['store_requests']} store requests and {recorded['statements']} "
            "statements") in capsys.readouterr().out
