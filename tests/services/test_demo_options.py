"""``./run demo``'s options (``--coordinator``, ``--without-plain``, ``--way``): the
choices, how they reach the sink, what the demo prints (fast tier).

Nothing here starts a server or Spark; the demo's runs themselves are in
``tests/services/test_demo_modern.py``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.harness import cli as harness_cli
from tests.harness import demo
from tests.harness.chaos.checker import CheckResult
from tests.harness.chaos.faults import private_services
from tests.harness.chaos.schedule import ChaosRun, RunReport


def test_demo_coordinator_defaults_to_zookeeper() -> None:
    parser = harness_cli.build_parser()
    assert parser.parse_args(["demo"]).coordinator == "zookeeper"
    assert parser.parse_args(["demo", "--coordinator", "keepermap"]).coordinator == "keepermap"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--coordinator", "etcd"])


@pytest.mark.parametrize("server_args", [[], ["--server", "18.16"]], ids=["default", "18.16"])
def test_demo_refuses_keepermap_on_clickhouse_18_16_before_starting_anything(
        server_args: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    started: list[object] = []
    monkeypatch.setattr(demo, "main", started.append)
    assert harness_cli.main(["demo", "--coordinator", "keepermap", *server_args]) == 2
    assert not started
    error = capsys.readouterr().err
    assert "--coordinator keepermap needs --server modern" in error, error
    assert "ClickHouse 18.16 has no KeeperMap table engine" in error, error


def test_private_modern_server_has_the_private_zookeeper_as_keeper_only_when_asked(
        tmp_path: Path) -> None:
    assert private_services(tmp_path, demo.PORT_BASE, "modern").clickhouse.zookeeper is None
    keeper = private_services(tmp_path, demo.PORT_BASE, "modern", keeper=True)
    assert keeper.clickhouse.zookeeper == keeper.zookeeper.hosts
    assert keeper.zookeeper.port == demo.PORT_BASE + 1


def test_with_keepermap_only_clickhouse_tx_keeps_its_records_in_the_records_table() -> None:
    assert demo.sink_options("clickhouse_tx", "keepermap") == {
        **demo.OPTIONS, "coordinator": "keepermap", "records_table": demo.RECORDS_TABLE}
    assert demo.sink_options("clickhouse_plain", "keepermap") == demo.OPTIONS
    assert demo.sink_options("clickhouse_tx", "zookeeper") == demo.OPTIONS


def test_the_verifier_reads_keepermap_records_from_the_server_not_through_the_proxy(
        tmp_path: Path) -> None:
    services = private_services(tmp_path, demo.PORT_BASE, "modern", keeper=True)
    run = ChaosRun(tmp_path / "run", services,
                   options=demo.sink_options("clickhouse_tx", "keepermap"))
    assert run.store == {"coordinator": "keepermap", "records_table": demo.RECORDS_TABLE,
                         "records_url": services.clickhouse.url}
    zookeeper_run = ChaosRun(tmp_path / "zk", services, options=dict(demo.OPTIONS))
    assert zookeeper_run.store == {}  # the verifier reads ZooKeeper, as before


def report(sink: str, duplicates: int = 0) -> RunReport:
    result = CheckResult(expected=10, found_rows=10 + duplicates, found_ids=10,
                         duplicates=duplicates, duplicated_ids=(), losses=0, lost_ids=(),
                         unexpected=0, unexpected_ids=())
    return RunReport(sink=sink, seed=0, elapsed=1.0, injected=Counter(driver_kill=1),
                     crash_points_fired=[], crash_points_unfired=[], driver_starts=2,
                     driver_exits=Counter(), watchdog_kills=0, epochs_committed=4,
                     epochs_written=4, drained=True, result=result, verifier="no anomalies",
                     staging_left=0)


def test_demo_without_plain_runs_and_shows_clickhouse_tx_alone() -> None:
    assert harness_cli.build_parser().parse_args(["demo", "--without-plain"]).without_plain
    assert not harness_cli.build_parser().parse_args(["demo"]).without_plain
    text = demo.render({"clickhouse_tx": report("clickhouse_tx")})
    assert "clickhouse_tx: EXACTLY ONCE" in text
    assert "clickhouse_plain" not in text


def test_demo_with_plain_shows_both_columns_and_plain_duplicates() -> None:
    text = demo.render({"clickhouse_tx": report("clickhouse_tx"),
                        "clickhouse_plain": report("clickhouse_plain", duplicates=3)})
    assert text.splitlines()[0].split() == ["clickhouse_tx", "clickhouse_plain"]
    assert "clickhouse_plain: 3 duplicated rows from the same faults" in text


def test_demo_way_defaults_to_the_data_source_where_pyspark_streams_through_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert harness_cli.build_parser().parse_args(["demo"]).way is None
    monkeypatch.setattr("txsink.spark.versions.has_stream_arrow_writer", lambda: True)
    assert demo.default_way() == "datasource"
    monkeypatch.setattr("txsink.spark.versions.has_stream_arrow_writer", lambda: False)
    assert demo.default_way() == "foreach_batch"


def test_demo_refuses_the_data_source_way_on_a_pyspark_without_its_stream_writer(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    started: list[object] = []
    monkeypatch.setattr(demo, "main", started.append)
    monkeypatch.setattr("txsink.spark.versions.has_stream_arrow_writer", lambda: False)
    assert harness_cli.main(["demo", "--way", "datasource"]) == 2
    assert not started
    assert "use --way foreach_batch" in capsys.readouterr().err


def test_demo_through_foreach_batch_names_both_foreach_batch_writers() -> None:
    text = demo.render({"clickhouse_tx": report("clickhouse_tx"),
                        "clickhouse_plain": report("clickhouse_plain", duplicates=3)},
                       "foreach_batch")
    assert text.splitlines()[0].split() == ["txsink.foreach_batch", "plain_foreach_batch"]
    assert "txsink.foreach_batch: EXACTLY ONCE" in text
    assert "plain_foreach_batch: 3 duplicated rows from the same faults" in text
