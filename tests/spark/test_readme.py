"""The README's examples, run as written: each ``python`` block of it on this PySpark.

A block says in its first line which PySpark it needs ("every PySpark from 3.5",
"PySpark 4.0 and later", "PySpark 4.1 and later"); a block this PySpark cannot run is
skipped. Only the addresses, the database and the checkpoint folder are replaced, by the
test's own; the block's names (``df``, ``sdf``, ``facts``, ``daily``, ``staged_events``)
are given rows with unique ids, and every table it names must hold each of them once. Under
``./run test`` these run in each PySpark's virtualenv from a regular install (the wheel),
as a new user would run them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import txsink
from tests.sinkutil import assert_exactly_once, create_events, events_df
from txsink.spark.versions import has_data_source, has_stream_arrow_writer

every_spark = pytest.mark.every_spark

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
NEEDS = {"every PySpark from 3.5": lambda: True, "PySpark 4.0 and later": has_data_source,
         "PySpark 4.1 and later": has_stream_arrow_writer}
#: The rows each name of a block stands for: (first id, count).
SOURCES = {"df": (0, 1000), "sdf": (10_000, 600), "facts": (20_000, 500),
           "daily": (30_000, 300), "staged_events": (40_000, 700)}


def needs(block: str) -> str:
    first = block.splitlines()[0]
    return next(need for need in NEEDS if first.startswith(f"# {need}"))


def test_every_readme_block_says_which_pyspark_it_needs():
    assert BLOCKS
    for block in BLOCKS:
        assert needs(block)


@every_spark
def test_the_tests_run_the_installed_wheel_where_the_harness_installed_it():
    if os.environ.get("TXSINK_TEST_INSTALLED") != "1":
        pytest.skip("the main environment runs the checkout (editable install)")
    assert ROOT not in Path(txsink.__file__).resolve().parents
    assert "site-packages" in Path(txsink.__file__).parts


@every_spark
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_block_runs_as_written_and_writes_every_row_once(
        spark, server_url, server_db, zk_hosts, zk_chroot, tmp_path, index):
    block = BLOCKS[index]
    if not NEEDS[needs(block)]():
        pytest.skip(f"{needs(block)}: not this PySpark")
    code = (block.replace("http://127.0.0.1:8123", server_url)
            .replace("127.0.0.1:2181", zk_hosts + zk_chroot)
            .replace("db.", f"{server_db}.").replace("/data/ckpt/events", str(tmp_path / "ck")))
    tables = sorted(set(re.findall(rf"{re.escape(server_db)}\.(\w+)", code)))
    for table in tables:
        create_events(server_url, server_db, table)
    used = {name: rows for name, rows in SOURCES.items() if re.search(rf"\b{name}\b", code)}
    names = {name: events_df(spark, *rows) for name, rows in used.items() if name != "sdf"}
    if "sdf" in used:
        folder = tmp_path / "in"
        events_df(spark, *SOURCES["sdf"]).write.parquet(str(folder))
        names["sdf"] = spark.readStream.schema(events_df(spark, 0, 1).schema).parquet(
            str(folder))
    if "staged_events" in used:
        names.pop("staged_events").createOrReplaceTempView("staged_events")
    if has_data_source():
        txsink.register(spark)  # a second call, before the block's own
    exec(compile(code, f"README.md block {index}", "exec"), {"spark": spark, **names})
    for query in spark.streams.active:
        query.processAllAvailable()
        query.stop()
    # the block's tables and the sources that write each (one table: all of them)
    for table in tables:
        ids = [range(first, first + count) for name, (first, count) in used.items()
               if len(tables) == 1 or re.search(rf"\b{name}\b.*{table}", code)]
        assert_exactly_once(server_url, f"{server_db}.{table}", [i for r in ids for i in r])
