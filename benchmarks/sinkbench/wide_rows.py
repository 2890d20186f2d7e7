"""Wide event rows: the column types of a modern event table, and the table they go into.

Each row has a millisecond ``DateTime64(3)`` time, a ``UUID`` (from a Spark string), a
``LowCardinality(String)`` kind, an ``Enum8`` status (from its label), a
``Map(String, String)`` of attributes, an ``Array(Tuple(String, Float64))`` of 1 to 3
items and a ``Nullable(Decimal(18, 4))`` amount (null in one row of ten). The rows are
computed by Spark from ``range`` like ``workload.rows_frame``'s, so every variant reads the
same rows and pays the same generation cost; the times spread over ``workload.DAYS`` days
and the table is partitioned by day. The items' struct fields are named ``1`` and ``2``:
an ArrowStream INSERT matches struct fields with Tuple elements by name (an unmatched
element gets its default), so clickhouse-connect's ``insert_arrow`` needs those names to
write the same values; ``clickhouse_tx`` takes an unnamed Tuple's fields by position.

Same interface as ``workload`` (``create_target``, ``rows_frame``, ``count``), so
``rounds.Bench`` runs either.
"""

from __future__ import annotations

from server_ext.sql import qualified_name
from sinkbench.environment import sql
from sinkbench.workload import DAYS, FIRST_DAY, count

__all__ = ["COLUMNS_DDL", "count", "create_target", "rows_frame"]

COLUMNS_DDL = ("ts DateTime64(3), id UUID, kind LowCardinality(String), "
               "status Enum8('new' = 1, 'done' = 2, 'failed' = 3), "
               "attrs Map(String, String), items Array(Tuple(String, Float64)), "
               "amount Nullable(Decimal(18, 4))")


def create_target(url: str, table: str) -> None:
    """(Re)create the target: a MergeTree partitioned by day, ordered by kind and time."""
    qualified = qualified_name(*table.split(".", 1))
    sql(url, f"DROP TABLE IF EXISTS {qualified}")
    sql(url, f"CREATE TABLE {qualified} ({COLUMNS_DDL}) ENGINE = MergeTree() "
             "PARTITION BY toYYYYMMDD(ts) ORDER BY (kind, ts)")


def rows_frame(spark, rows: int, partitions: int, days: int = DAYS):
    """``rows`` wide event rows in ``partitions`` Spark partitions."""
    return spark.range(0, rows, 1, partitions).selectExpr(*row_expressions("id", days))


def row_expressions(n: str, days: int = DAYS) -> list[str]:
    """The SQL expressions that turn an id column ``n`` into the wide event columns."""
    item = ("named_struct('1', concat('sku-', cast(({n} + {k}) % 500 AS string)), "
            "'2', cast(({n} * {k}) % 10000 AS double) / 8)")
    return [
        f"timestamp_millis(({FIRST_DAY} + ({n} % {days}) * 86400 + {n} % 86400) * 1000 "
        f"+ {n} % 1000) AS ts",
        f"concat(lpad(hex({n}), 8, '0'), '-', lpad(hex({n} % 65536), 4, '0'), '-4000-8',"
        f" lpad(hex({n} % 4096), 3, '0'), '-', lpad(hex({n} * 2654435761 % 281474976710656),"
        " 12, '0')) AS id",
        f"element_at(array('click', 'view', 'buy', 'scroll', 'share'), "
        f"cast({n} % 5 + 1 AS int)) AS kind",
        f"element_at(array('new', 'done', 'failed'), cast({n} % 3 + 1 AS int)) AS status",
        f"map('country', element_at(array('de', 'fr', 'jp', 'us'), cast({n} % 4 + 1 AS int)),"
        f" 'device', concat('d', cast({n} % 37 AS string))) AS attrs",
        f"slice(array({item.format(n=n, k=1)}, {item.format(n=n, k=2)}, "
        f"{item.format(n=n, k=3)}), 1, cast({n} % 3 + 1 AS int)) AS items",
        f"if({n} % 10 = 0, NULL, cast(({n} % 1000000) / 16 AS decimal(18, 4))) AS amount",
    ]
