"""The options of a sharded target: ``shards``, ``sharding_key``, ``replica_choice``, and
of a created ``Distributed`` table: ``distributed_table`` and ``cluster``, checked with the
other options before any server is asked.

With ``create_table=if_missing``, ``table`` names the shards' local table, created on
every replica of every shard of ``shards``; ``distributed_table`` names the Distributed
table created above them on the ``url`` server, over the ``cluster`` of the servers'
``remote_servers``, rows routed by ``sharding_key``. The write then goes through the
Distributed table, as a write naming an existing one does (docs/usage.md, "A Distributed
table created too"). Every one of these options is needed; one missing, or one given
without the others, is refused by name rather than guessed or ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from server_ext.ddl import expression_problem
from server_ext.sharding import ShardingError, parse_shard_urls
from server_ext.sql import split_table_name

OPTION_NAMES = ("distributed_table", "cluster")
SHARD_OPTIONS = ("shards", "sharding_key", "replica_choice")
REPLICA_CHOICES = ("round_robin", "random")
#: What each option a Distributed table needs says (for the refusal naming the missing).
NEEDED = {"cluster": "the cluster name of the servers' remote_servers",
          "shards": "the HTTP URLs of every replica of every shard, in the cluster's order",
          "sharding_key": "the expression that routes each row to its shard"}
#: The refusal of ``sharding_key`` without ``shards`` or a Distributed target, raised while
#: planning (the target's engine is known only once it is described).
SHARDING_KEY_ALONE = "option sharding_key needs the shards option or a Distributed table"


def check(values: dict[str, object]) -> None:
    """Refuse, naming the option, an incomplete or inconsistent set of these options in
    ``values`` (a parsed option map whose ``create_table`` is already normalised)."""
    table = str(values.get("distributed_table") or "").strip()
    if not table:
        if values.get("cluster"):
            raise ValueError("option cluster names the cluster of the Distributed table the "
                             "sink creates and needs distributed_table")
        values.pop("distributed_table", None)
        return
    if values.get("create_table") != "if_missing":
        raise ValueError("option distributed_table creates a Distributed table above the "
                         "local tables and needs create_table=if_missing")
    missing = [name for name in NEEDED if not str(values.get(name) or "").strip()]
    if missing:
        raise ValueError(f"option distributed_table needs {', '.join(missing)} ("
                         + "; ".join(f"{name}: {NEEDED[name]}" for name in missing) + ")")
    if values.get("schema_evolution") == "add_columns":
        raise ValueError("option distributed_table cannot be used with "
                         "schema_evolution=add_columns: a column added to the local tables "
                         "would be missing from the Distributed table")
    for name in ("distributed_table", "table"):
        problem = _name_problem(str(values.get(name) or ""))
        if problem and (name == "distributed_table" or values.get(name)):
            raise ValueError(f"option {name}={values.get(name)!r} {problem}")
    if values.get("table") and \
            split_table_name(table) == split_table_name(str(values["table"])):
        raise ValueError(f"option distributed_table={table!r} names the local table "
                         "(option table); name the Distributed table differently")
    key = str(values["sharding_key"]).strip()
    problem = expression_problem(key)
    if problem:
        raise ValueError(f"option sharding_key={key!r} is not one expression: {problem}")
    values["distributed_table"] = table
    values["cluster"] = str(values["cluster"]).strip()


@dataclass(frozen=True)
class DistributedOptions:
    """The shards the rows go to, and the Distributed table the sink may create."""

    shards: str | None = None  # the HTTP URLs of every replica of every shard
    sharding_key: str | None = None  # the expression that routes each row to its shard
    replica_choice: str = REPLICA_CHOICES[0]  # one of REPLICA_CHOICES
    distributed_table: str | None = None  # database.table, on the url server
    cluster: str | None = None  # its cluster, from the servers' remote_servers


def parse(values: dict[str, object]) -> DistributedOptions:
    """These options of ``values`` (whose ``create_table`` is already normalised), checked
    (:func:`check`, then the replica choice and the shards' URLs), as a record."""
    check(values)
    choice = str(values.get("replica_choice", REPLICA_CHOICES[0])).lower()
    if choice not in REPLICA_CHOICES:
        raise ValueError(
            f"option replica_choice={choice!r} is not one of {', '.join(REPLICA_CHOICES)}")
    if "shards" in values:
        try:
            parse_shard_urls(str(values["shards"]))
        except ShardingError as exc:
            raise ValueError(f"option shards: {exc}") from None
    return DistributedOptions(
        **{name: values[name] for name in (*OPTION_NAMES, "shards", "sharding_key")
           if name in values},  # type: ignore[arg-type]
        replica_choice=choice)


def _name_problem(name: str) -> str | None:
    """Why ``name`` is not ``database.table`` written out (None: it is)."""
    try:
        database, table = split_table_name(name, default_database="")
    except ValueError as exc:
        return f"is not database.table: {exc}"
    if not database or not table:
        return "must be database.table (the database written out)"
    return None
