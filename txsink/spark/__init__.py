"""The ways Spark reaches the sink: thin adapters over :mod:`txsink.core`.

- ``datasource`` — the ``clickhouse_tx`` Python data source (batch and streaming);
- ``plain`` — ``clickhouse_plain``, the at-least-once baseline;
- ``registration`` and ``pyspark_txsink`` — how Spark finds the two sources;
- ``transaction`` — ``txsink.transaction()``: several writes, one xid;
- ``refusal`` — a refusal in planning shown as one line.

An adapter plans on the driver (``core.plan``), runs the attempts in the tasks
(``core.attempt``) and hands their messages to the commit (``core.driver``); it holds no
protocol logic of its own.
"""
