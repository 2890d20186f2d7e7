"""A stream without ``sink_id`` gets the sink id docs/usage.md ("A stream's sink id")
tells users to compute from its checkpoint location."""

from __future__ import annotations

import hashlib

from txsink.options import parse_options


def stream_sink_id(checkpoint: str) -> str:
    options = parse_options({"url": "http://127.0.0.1:8123", "zookeeper": "127.0.0.1:2181",
                             "table": "db.events", "checkpointLocation": checkpoint}, env={})
    return options.transaction.resolved_sink_id(streaming=True)


def test_the_sink_id_is_the_sha1_of_the_checkpoint_location_first_16_hex_digits():
    digest = hashlib.sha1(b"/data/ckpt/events").hexdigest()
    assert stream_sink_id("/data/ckpt/events") == f"stream-{digest[:16]}"


def test_a_trailing_slash_names_the_same_sink():
    assert stream_sink_id("/data/ckpt/events/") == stream_sink_id("/data/ckpt/events")


def test_another_spelling_of_the_path_names_another_sink():
    assert stream_sink_id("file:///data/ckpt/events") != stream_sink_id("/data/ckpt/events")


def test_the_sink_id_option_wins_over_the_checkpoint():
    options = parse_options({"url": "http://127.0.0.1:8123", "zookeeper": "127.0.0.1:2181",
                             "table": "db.events", "checkpointLocation": "/data/ckpt/events",
                             "sink_id": "events"}, env={})
    assert options.transaction.resolved_sink_id(streaming=True) == "events"
