"""The old-server wing's probes against the real 18.16 server: no MOVE PARTITION, no view
fired on a view's output, and no probe table left behind."""

from __future__ import annotations

import uuid

from server_ext.capabilities import detect_capabilities, fires_view_chains
from server_ext.client.catalog import catalog_value
from server_ext.client.http_client import ClickHouseClient
from server_ext.old_server import probes
from server_ext.sql import SCRATCH_DATABASE


def test_the_move_probe_leaves_no_table_behind(clickhouse_url: str, monkeypatch) -> None:
    marker = uuid.UUID("00000000-0000-4000-8000-00000000beef")
    monkeypatch.setattr(probes.uuid, "uuid4", lambda: marker)
    client = ClickHouseClient(clickhouse_url)
    detect_capabilities(client, refresh=True)
    leftovers = catalog_value(client,
        f"SELECT count() FROM system.tables WHERE database = '{SCRATCH_DATABASE}' "
        f"AND name LIKE '%{marker.hex[:12]}'", purpose="count probe tables")
    assert leftovers == "0"


def test_18_16_fires_no_view_on_a_views_output(clickhouse_url: str) -> None:
    assert fires_view_chains(ClickHouseClient(clickhouse_url)) is False
