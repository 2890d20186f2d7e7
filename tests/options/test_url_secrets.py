"""A secret in a server URL (``?user=…&password=…``, ``user:password@``) is refused
before any request carries it, and never shown: not in the error, not in the log, not in
Spark's event log.

The URLs point at a local HTTP server that records every request it gets, so "no request
was sent" is observed, not assumed; against the real ZooKeeper and Spark.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import txsink
from tests.conftest import run_sql
from tests.harness.services import SECRET_PASSWORD
from tests.sinkutil import EVENTS_DDL, driver_env, events_df
from txsink.ops import cli

ROOT = Path(__file__).resolve().parents[2]

SECRET = "Pw-3xq9-never-shown"


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str] = []

    def _record(self) -> None:
        self.seen.append(self.path)
        self.send_response(500)
        self.end_headers()

    do_GET = do_POST = _record  # noqa: N815 - http.server's naming

    def log_message(self, *args: object) -> None:  # keep the test output quiet
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[str]]]:
    """(base URL of a server that records the paths it is asked for, those paths)."""
    seen: list[str] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


SECRET_URLS = {
    "query_string": "{base}/?user=default&password=" + SECRET,
    "fragment": "{base}/#password=" + SECRET,
    "userinfo": "http://default:" + SECRET + "@{host}/",
    "userinfo_password_with_a_slash": "http://default:Pw/" + SECRET + "@{host}/",
    "userinfo_that_parses_as_a_path": "http://default:8123/" + SECRET + "@{host}/",
    "semicolon_parameter": "{base};password=" + SECRET,
}


def assert_hidden(text: str) -> None:
    assert SECRET not in text
    assert "password=" not in text


@pytest.fixture(autouse=True)
def _registered(spark) -> None:
    txsink.register(spark)


@pytest.mark.parametrize("case", SECRET_URLS)
def test_a_url_option_with_a_secret_is_refused_before_any_request_and_not_shown(
        spark, recorder, zk_hosts, zk_chroot, case):
    base, seen = recorder
    url = SECRET_URLS[case].format(base=base, host=base.partition("//")[2])
    with pytest.raises(Exception, match="option url") as err:
        (events_df(spark, 0, 10).write.format("clickhouse_tx")
         .options(url=url, table="db.t", zookeeper=zk_hosts + zk_chroot)
         .mode("append").save())
    assert_hidden(str(err.value))
    assert seen == []


def test_a_shards_option_with_a_secret_is_refused_before_any_request_and_not_shown(
        spark, recorder, zk_hosts, zk_chroot):
    base, seen = recorder
    shards = f"{base}/;http://127.0.0.2:8123/?password={SECRET}"
    with pytest.raises(Exception, match="option shards") as err:
        (events_df(spark, 0, 10).write.format("clickhouse_tx")
         .options(url=base, table="db.t", zookeeper=zk_hosts + zk_chroot, shards=shards,
                  sharding_key="id")
         .mode("append").save())
    assert_hidden(str(err.value))
    assert seen == []


def test_a_transaction_url_with_a_secret_leaves_no_trace_in_the_driver_log(
        spark, recorder, zk_hosts, zk_chroot, caplog):
    base, seen = recorder
    caplog.set_level(logging.INFO)
    with pytest.raises(Exception, match="option url") as err:  # noqa: SIM117
        with txsink.transaction(spark, url=SECRET_URLS["query_string"].format(base=base),
                                zookeeper=zk_hosts + zk_chroot, sink_id="secretive") as tx:
            tx.write(events_df(spark, 0, 10), "db.t")
    assert_hidden(str(err.value))
    assert_hidden(caplog.text)
    assert seen == []


@pytest.mark.parametrize("command", ["gc", "verify", "recover"])
def test_a_cli_url_with_a_secret_is_refused_before_any_request_and_not_shown(
        recorder, zk_hosts, zk_chroot, capsys, command):
    base, seen = recorder
    url = SECRET_URLS["query_string"].format(base=base)
    assert cli.main([command, "--zookeeper", zk_hosts + zk_chroot, "--url", url]) == 2
    out, err = capsys.readouterr()
    assert "--url" in err
    assert_hidden(out + err)
    assert seen == []


# The Python workers (where the planner and the commit run) log at INFO too.
SITECUSTOMIZE = """import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
"""


def test_credentials_never_reach_sparks_event_log_or_the_driver_log(
        clickhouse_url, ch_db, zk_hosts, zk_chroot, tmp_path):
    """Writes that succeed and writes that fail (the password in the url's query string and
    in its userinfo, an unknown table, a task's bad value) by a driver of its own whose
    Spark keeps an event log, with every log at INFO (the Python workers' too)."""
    run_sql(clickhouse_url, EVENTS_DDL.format(table=f"`{ch_db}`.`t`", engine="MergeTree()"))
    events = tmp_path / "events"
    events.mkdir()
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = driver_env(PYTHONPATH=os.pathsep.join(
        [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    job = subprocess.run(
        [sys.executable, "-m", "tests.jobs.secret_writes", clickhouse_url, zk_hosts + zk_chroot,
         ch_db, str(events)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("refused (") == 4, job.stdout[-2000:]
    logs = "".join(p.read_text(errors="replace") for p in events.rglob("*") if p.is_file())
    assert "SparkListenerSQLExecutionStart" in logs  # the event log holds the writes
    assert "must not have a query or fragment" in logs  # and the url's refusal
    assert "txsink.core.driver INFO txsink sink=" in job.stderr  # the sink's log at INFO
    for text in (logs, job.stdout, job.stderr):
        assert SECRET_PASSWORD not in text
