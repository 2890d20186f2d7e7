"""Capability detection against the real 18.16 server, and the strategy choice."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from server_ext.capabilities import Capabilities, detect_capabilities
from server_ext.client.http_client import ClickHouseClient
from server_ext.publish.strategy_choice import choose_strategy


@pytest.fixture
def caps(clickhouse_url: str) -> Capabilities:
    return detect_capabilities(ClickHouseClient(clickhouse_url), refresh=True)


@dataclass
class Target:
    replicated: bool


def test_version_is_read_from_the_server(caps: Capabilities) -> None:
    assert caps.version[:2] == (18, 16) and caps.version_text.startswith("18.16")


def test_18_16_has_no_move_partition(caps: Capabilities) -> None:
    assert caps.move_partition is False


def test_18_16_reads_native_but_not_arrow_stream(caps: Capabilities) -> None:
    assert (caps.native, caps.arrow_stream) == (True, False)


def test_18_16_has_low_cardinality_and_keeper_but_no_dedup_token(caps: Capabilities) -> None:
    assert caps.low_cardinality and caps.keeper
    assert not caps.insert_deduplication_token
    assert not caps.non_replicated_deduplication_window


def test_18_16_has_no_async_insert_setting(caps: Capabilities) -> None:
    # Staging inserts send async_insert=0 only where the setting exists: 18.16 would refuse
    # the INSERT for an unknown setting.
    assert not caps.async_insert


def test_detection_is_cached_per_url(clickhouse_url: str) -> None:
    first = detect_capabilities(ClickHouseClient(clickhouse_url))
    assert detect_capabilities(ClickHouseClient(clickhouse_url)) is first


def test_overrides_replace_detected_values(caps: Capabilities) -> None:
    forced = caps.with_overrides(move_partition=True)
    assert forced.move_partition and not caps.move_partition
    with pytest.raises(TypeError):
        caps.with_overrides(no_such_capability=True)


def test_plain_target_on_18_16_gets_attach_marked(caps: Capabilities) -> None:
    assert choose_strategy(caps, Target(replicated=False)) == "attach_marked"


def test_replicated_target_gets_attach_replicated_even_with_move(caps: Capabilities) -> None:
    assert choose_strategy(caps.with_overrides(move_partition=True),
                           Target(replicated=True)) == "attach_replicated"


def test_plain_target_gets_move_where_the_server_has_it(caps: Capabilities) -> None:
    assert choose_strategy(caps.with_overrides(move_partition=True),
                           Target(replicated=False)) == "move"
