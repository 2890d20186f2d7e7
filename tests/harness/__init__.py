"""The project's own test and demo harness, shipped beside the sink but never imported by it.

- ``services`` installs and supervises local ClickHouse and ZooKeeper servers;
- ``modern_server`` runs a modern ClickHouse (26.x) server from the chdb wheel;
- ``chaos`` drives Spark pipelines under injected faults and checks exactly-once;
- ``demo`` is the README's fault-injection demo.

Only ``./run services`` and ``./run demo`` load this package; what runs in Spark
drivers, executors and the operator commands does not (the import-linter contract "the
sink never imports its test harness" in ``pyproject.toml``, checked by ``./run test``).
Its extra dependencies come with ``pip install 'txsink[harness]'``.
"""
