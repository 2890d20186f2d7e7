"""A KeeperMap table of string keys and values: the SQL of the coordinator's records table.

The ``keepermap`` coordinator store (``coordinator/plumbing/keepermap/``) keeps its records in a
ClickHouse ``KeeperMap`` table, ``(k String, v String) PRIMARY KEY k``, through this small
key-value API, so that all SQL text stays in ``server_ext`` and the coordinator knows no
SQL. What the server guarantees, as measured on 26.9 over ZooKeeper 3.8 and as
``StorageKeeperMap`` is written:

- an INSERT with ``keeper_map_strict_mode = 1`` is one Keeper multi of ``create`` requests:
  all its keys are written or none, and a key that exists fails it (code 999, "Node
  exists"): :meth:`KeeperMapTable.create_new` is an atomic create-if-absent of several keys;
- a SELECT with ``k IN (...)`` reads those keys by point lookups (no scan);
- a mutation (``ALTER … UPDATE/DELETE``) reads its rows first and writes them in a later
  multi; a row that does not match its condition is skipped silently, so an ``UPDATE …
  WHERE _version = n`` cannot tell its caller whether it applied. The store therefore
  writes only by :meth:`create_new`; :meth:`delete` is for garbage only.

Usage::

    table = KeeperMapTable(client, "txsink", "records")
    table.create("/txsink_records")            # once (an operator's step)
    problem = table.problem()                  # None when usable
    table.create_new({"a": "1", "b": "2"})     # True, or False: a key existed
    table.get_many(["a", "c"])                 # {"a": "1"}
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from server_ext.client.catalog import catalog_rows
from server_ext.client.client_protocol import SqlClient
from server_ext.errors import KEEPER_EXCEPTION, UNKNOWN_DATABASE, UNKNOWN_TABLE, ClickHouseError
from server_ext.sharding.urls import shown_url
from server_ext.sql import qualified_name, quote_identifier, sql_string, table_filter

STRICT = {"keeper_map_strict_mode": 1}
COLUMNS = [("k", "String"), ("v", "String")]
FORMAT_KEY = "format"
#: the format row a records table holds; another value means a table of another format
FORMAT = {"format": "txsink-coordinator-records", "version": 1}
READ_BATCH = 256  # keys per point-lookup SELECT


class KeeperMapTable:
    """One KeeperMap table of string keys and values (see the module docstring)."""

    def __init__(self, client: SqlClient, database: str, table: str) -> None:
        self.client = client
        self.database = database
        self.table = table
        self.name = qualified_name(database, table)

    def __repr__(self) -> str:
        return f"KeeperMapTable({self.database}.{self.table} at {shown_url(self.client.url)})"

    def operator_flags(self) -> str:
        """The ``txsink`` command-line flags that reach this table, for messages that tell
        an operator what to run (the URL shown without credentials)."""
        return (f"--coordinator keepermap --records-url {shown_url(self.client.url)} "
                f"--records-table {self.database}.{self.table}")

    # -- the key-value API --------------------------------------------------------------

    def get_many(self, keys: Iterable[str]) -> dict[str, str]:
        """The values of those of ``keys`` that exist."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        for start in range(0, len(wanted), READ_BATCH):
            batch = wanted[start:start + READ_BATCH]
            rows = self.client.query_rows(
                f"SELECT k, v FROM {self.name} WHERE k IN "
                f"({', '.join(sql_string(k) for k in batch)})",
                purpose="read coordinator records", settings=STRICT)
            found.update({row["k"]: row["v"] for row in rows})
        return found

    def create_new(self, rows: dict[str, str]) -> bool:
        """Create every key of ``rows`` or none: False when one of them exists already.

        One strict INSERT, i.e. one Keeper multi of creates. Any other failure raises;
        one whose outcome is unknown is marked ``retryable`` (the caller reads again and
        finds out whether its keys were written)."""
        values = ", ".join(f"({sql_string(k)}, {sql_string(v)})" for k, v in rows.items())
        try:
            self.client.execute(f"INSERT INTO {self.name} (k, v) VALUES {values}",
                                purpose="write coordinator records", settings=STRICT,
                                retry=False)
        except ClickHouseError as exc:
            if exc.code == KEEPER_EXCEPTION and "Node exists" in exc.server_message:
                return False
            if exc.code == KEEPER_EXCEPTION:
                exc.retryable = True  # e.g. the server's own Keeper session was lost
            raise
        return True

    def put(self, key: str, value: str) -> None:
        """Write ``key`` whether or not it exists (not a compare-and-set)."""
        self.client.execute(
            f"INSERT INTO {self.name} (k, v) VALUES ({sql_string(key)}, {sql_string(value)})",
            purpose="write a coordinator index record", settings={"keeper_map_strict_mode": 0})

    def keys_with_prefix(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix`` (a scan of the whole table)."""
        rows = self.client.query_rows(
            f"SELECT k FROM {self.name} WHERE startsWith(k, {sql_string(prefix)})",
            purpose="list coordinator records")
        return sorted(row["k"] for row in rows)

    def delete(self, keys: Iterable[str]) -> None:
        """Remove ``keys`` (those that exist); for garbage, never for a state change."""
        wanted = list(dict.fromkeys(keys))
        for start in range(0, len(wanted), READ_BATCH):
            batch = wanted[start:start + READ_BATCH]
            self.client.execute(
                f"ALTER TABLE {self.name} DELETE WHERE k IN "
                f"({', '.join(sql_string(k) for k in batch)})",
                purpose="remove coordinator records", settings={"keeper_map_strict_mode": 0})

    # -- the table itself ---------------------------------------------------------------

    def create(self, keeper_path: str) -> None:
        """Create the table (and its database) at ``keeper_path`` with its format row;
        idempotent. A server without KeeperMap or without Keeper refuses it by name."""
        self.client.execute(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(self.database)}",
                            purpose="create the coordinator records database")
        self.client.execute(
            f"CREATE TABLE IF NOT EXISTS {self.name} (k String, v String) "
            f"ENGINE = KeeperMap({sql_string(keeper_path)}) PRIMARY KEY k",
            purpose="create the coordinator records table")
        if not self.get_many([FORMAT_KEY]):
            self.create_new({FORMAT_KEY: json.dumps(FORMAT, sort_keys=True)})

    def problem(self) -> str | None:
        """Why this table cannot hold coordinator records (None: it can): a server
        without the KeeperMap engine, a missing table, a table of another engine or
        columns, a table whose format row is missing or another format's, or a Keeper
        the server cannot reach."""
        where = f"{self.database}.{self.table} on {self.client.url}"
        engines = self.client.query_rows(
            "SELECT name FROM system.table_engines WHERE name = 'KeeperMap'",
            purpose="check the KeeperMap engine")
        if not engines:
            return (f"the ClickHouse server at {self.client.url} has no KeeperMap table "
                    "engine (a server older than 22.8): keep the coordinator's records in "
                    "ZooKeeper (coordinator=zookeeper)")
        found = catalog_rows(self.client,
            f"SELECT engine, engine_full FROM system.tables WHERE "
            f"{table_filter(self.database, self.table, name_column='name')}",
            purpose="describe the coordinator records table")
        if not found:
            return (f"the coordinator records table {where} does not exist: create it with "
                    f"`txsink records create` or CREATE TABLE {self.name} (k String, v String) "
                    "ENGINE = KeeperMap('<keeper path>') PRIMARY KEY k (the server needs a "
                    "<zookeeper> section and <keeper_map_path_prefix>)")
        if found[0]["engine"] != "KeeperMap":
            return (f"{where} is a {found[0]['engine']} table, not a KeeperMap table of "
                    "coordinator records")
        columns = self.client.query_rows(
            f"SELECT name, type, is_in_primary_key FROM system.columns WHERE "
            f"{table_filter(self.database, self.table)} ORDER BY position",
            purpose="describe the coordinator records table")
        shape = [(c["name"], c["type"]) for c in columns]
        if shape != COLUMNS or not int(columns[0]["is_in_primary_key"]):
            return (f"{where} has columns {shape}, not (k String, v String) with primary key "
                    "k: it is not a table of coordinator records")
        try:
            row = self.get_many([FORMAT_KEY]).get(FORMAT_KEY)
        except ClickHouseError as exc:
            return (f"{where} cannot be read ({exc.name}: {exc.server_message}); is the "
                    "server's Keeper (its <zookeeper> section) reachable?")
        try:
            fmt = json.loads(row) if row is not None else None
        except ValueError:
            fmt = row
        if fmt != FORMAT:
            return (f"{where} holds no coordinator records of format {FORMAT['version']} "
                    f"(its {FORMAT_KEY!r} row is {row!r}): a table of another format or "
                    "another use")
        return None


def missing_table(exc: ClickHouseError) -> bool:
    """Whether ``exc`` says the table or its database does not exist."""
    return exc.code in (UNKNOWN_TABLE, UNKNOWN_DATABASE)
