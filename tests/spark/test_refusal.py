"""A write refused while Spark plans it names the reason on the first line of the error.

Spark puts ``[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer:``
in front of what the planner worker reports; the sink makes that the refusal itself
(``txsink/spark/refusal.py``), not a traceback whose last line holds the reason. The server
tests run on 18.16 and the modern server (``[ch18]`` / ``[ch26]``).
"""

from __future__ import annotations

import os

import pytest

import txsink
from txsink.options import OptionError
from txsink.spark.refusal import HIDE_TRACEBACK, reason_first

SPARK_PREFIX = "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: "


def first_line_of_refusal(spark, options: dict[str, str], table: str) -> str:
    txsink.register(spark)
    with pytest.raises(Exception) as caught:
        (spark.range(3).write.format("clickhouse_tx").options(**options)
            .option("table", table).mode("append").save())
    return str(caught.value).splitlines()[0]


@pytest.fixture
def options(server_options: dict[str, str]) -> dict[str, str]:
    return server_options


def test_a_missing_table_is_named_on_the_first_line(spark, options, server_db):
    line = first_line_of_refusal(spark, options, f"{server_db}.no_such_table")
    assert line.startswith(SPARK_PREFIX + "server_ext.errors.ClickHouseError: ")
    assert f"table `{server_db}`.`no_such_table` does not exist" in line


def test_a_missing_database_is_named_on_the_first_line(spark, options):
    line = first_line_of_refusal(spark, options, "no_such_db_x.events")
    assert line.startswith(SPARK_PREFIX + "server_ext.errors.ClickHouseError: ")
    assert "database `no_such_db_x` does not exist" in line


def test_a_refusal_asks_the_worker_for_its_message_alone(monkeypatch):
    monkeypatch.delenv(HIDE_TRACEBACK, raising=False)
    with pytest.raises(OptionError), reason_first():
        raise OptionError("option x is wrong")
    assert os.environ[HIDE_TRACEBACK] == "1"


def test_an_unexpected_error_keeps_its_traceback(monkeypatch):
    monkeypatch.delenv(HIDE_TRACEBACK, raising=False)
    with pytest.raises(KeyError), reason_first():
        raise KeyError("a bug")
    assert HIDE_TRACEBACK not in os.environ
