"""Shard layout discovery and row routing for writes that span the shards of a cluster.

Why: a transaction over a sharded table stages each shard's rows on a server of that shard
and publishes them there, instead of inserting through the ``Distributed`` table (whose
inserts are neither atomic nor idempotent). For reads through the ``Distributed`` table to
stay correct (``optimize_skip_unused_shards``, per-shard joins and aggregations), every row
must land on the shard the server itself would have chosen. ``ShardRouter`` reproduces the
server's choice; ``layout_from_distributed`` reads the layout from the server so that it
cannot drift from the cluster config.

The routing rule (``createBlockSelector`` in ClickHouse; checked by inserting through a
``Distributed`` table on a ClickHouse 18.16 server with shard weights [1, 2, 4]):

- the sharding key must evaluate to UInt8..UInt64 or Int8..Int64 (not Nullable, Date,
  Float, ...): anything else makes the server refuse the insert;
- a key value becomes unsigned as C++ casts it: Int8/Int16/Int32 values are sign-extended
  to 32 bits (``-1`` is ``4294967295``), Int64 values to 64 bits; a *constant* key uses the
  unsigned type of its own width (``toInt16(-1)`` is ``65535``);
- that value modulo the total weight is a slot; slots are handed out in cluster order,
  ``weight`` consecutive slots per shard (weights [1, 2]: slot 0 -> shard 0, 1-2 -> 1).

Keys: a bare integer column is computed here with numpy (vectorised); ``rand()`` (or no
key) lets rows go anywhere, so they are cut into contiguous weighted slices; any other
expression (``cityHash64(user_id)``, ``intHash64(id)``, ``id % 3``) is evaluated by the
ClickHouse engine embedded in ``chdb``. chdb is trusted to agree with an older server
because ClickHouse keeps its hash functions stable (a changed hash would re-shard every
existing cluster): cityHash64, intHash32/64, sipHash64, halfMD5, metroHash64 and
murmurHash2_32 were compared between the 18.16 server and chdb (engine 26.9), see
tests/server_ext/test_sharding.py. Exceptions found: ``farmHash64`` changed after 18.16, and
``xxHash64``/``javaHash`` do not exist on 18.16. Result *types* may differ too (18.16 types
``Int64 % 3`` as Int8, 26.9 as Int16); the router uses chdb's type, which gives the same
shard whenever both types are at most 32 bits wide or both are 64 bits wide. Values may
differ too (18.16: ``toInt32(-8) % 70001`` is 55933): the old-server wing's ``key_probe``
(``server_ext.old_server``) compares both engines over probe rows before the first row and
refuses a key they route differently.

Pass the target's column types (``describe_table(...).columns``) to ``ShardRouter`` when
the Arrow types may differ from the table's: the server hashes its own column type
(``cityHash64`` of an Int32 differs from that of the same Int64).

Limits: chdb runs in the process's one chdb session (``ChdbClient.for_process()``), so a
process that routes by an expression cannot later open chdb at another path; functions
that depend on a time zone (``toYYYYMM`` of a DateTime without one) use chdb's, not the
server's; ``weight`` 0 (a shard excluded from inserts) is not supported.

Modules, one job each:
- ``shard_layout`` ``Shard``, ``ShardLayout``, ``layout_from_urls``: what a sharded target is;
- ``urls``        ``parse_shard_urls`` and the URL checks (no credentials in URLs, none shown);
- ``engine_args`` the tokenizer for engine arguments, names and literals in SQL text;
- ``discovery``   ``layout_from_distributed``: the layout read from a Distributed table;
- ``routing``     ``ShardRouter``: each row's shard, as the server chooses it;
- ``key_values``  unsigned key values and the bare-integer-column key (numpy);
- ``chdb_key``    expression keys evaluated by chdb, once ``old_server.key_probe`` found
  that chdb routes the key as the server does.

Their one error is ``server_ext.errors.ShardingError``.
"""

from server_ext.errors import ShardingError
from server_ext.sharding.discovery import layout_from_distributed
from server_ext.sharding.engine_args import engine_arguments, name_value
from server_ext.sharding.key_values import unsigned_key_values
from server_ext.sharding.routing import ShardRouter
from server_ext.sharding.shard_layout import Shard, ShardLayout, layout_from_urls, table_text
from server_ext.sharding.urls import has_userinfo, parse_shard_urls, shown_url, url_problem

__all__ = [
    "Shard",
    "ShardLayout",
    "ShardRouter",
    "ShardingError",
    "engine_arguments",
    "has_userinfo",
    "layout_from_distributed",
    "layout_from_urls",
    "name_value",
    "parse_shard_urls",
    "shown_url",
    "table_text",
    "unsigned_key_values",
    "url_problem",
]
