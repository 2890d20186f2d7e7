"""The materialized-view tree a target feeds, and its staging copy.

A partition operation (``ATTACH PARTITION … FROM``, ``MOVE PARTITION … TO TABLE``,
``REPLACE PARTITION``) does not fire materialized views: publishing staged parts alone
would leave every MV of the target without the sink's rows. So each branch stages the
whole tree (``docs/design.md``, "The staged view tree"):

- :func:`discover` walks, before anything is staged, from the target through every MV that
  reads it (``system.tables.dependencies_*``, the same column on 18.16 and 26.x) to the
  table the MV writes into (its ``TO`` table, or its inner table: ``.inner.<view>`` on
  18.16, ``.inner_id.<uuid>`` in an Atomic database on 26.x) and on to the MVs of that
  table (chains), where the server fires a view on a view's output (26.x; 18.16 does not:
  ``capabilities.fires_view_chains``). The result is a tuple of :class:`ViewNode`,
  parents before children.
- Every node gets, per branch, a staging copy of its table and a *staging view*: the MV's
  own ``SELECT`` with its source table replaced by the source's staging table
  (:func:`staging_view_ddl`). Rows inserted into the branch's staging table therefore fire
  the staging views exactly as the real MVs would fire at insert time, block by block.
- What a node's staging table holds is published into the node's table like any staged
  branch, under the same decision, with the same strategy.

Refused by name before anything is staged (:func:`tree_problem`): a view that is not a
plain materialized view (a window or live view), a view whose table no partition can be
published into (not MergeTree-family, e.g. ``Distributed``), a view whose ``SELECT`` does
not name its source or reads it more than once (the sink cannot tell which reference is
the inserted block), and a tree deeper than :data:`MAX_DEPTH`.

Discovery and text: nothing here creates or drops anything (the chain probe is
``capabilities``').
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from server_ext.capabilities import fires_view_chains
from server_ext.client.catalog import catalog_rows
from server_ext.client.client_protocol import SqlClient
from server_ext.errors import ClickHouseError
from server_ext.publish.strategy_choice import target_engine_problem
from server_ext.sql import (
    Token,
    qualified_name,
    quote_identifier,
    sql_string,
    table_filter,
    tokenize,
)
from server_ext.types.target_table import (
    DEPENDENTS_COLUMNS,
    TargetTable,
    dependents_of,
    describe_table,
)

log = logging.getLogger(__name__)

MAX_DEPTH = 16  # levels of MVs below the target; deeper trees are refused


@dataclass(frozen=True)
class ViewNode:
    """One materialized view fed (directly or through a chain) by the target.

    ``index`` is its position in the tree (parents first); ``parent`` the index of the
    node whose table the view reads, -1 for the target itself.
    """

    index: int
    parent: int
    view: tuple[str, str]  # (database, name) of the materialized view
    source: tuple[str, str]  # the table whose inserts fire it
    table: TargetTable  # the table it writes into: its TO table or its inner table
    select: str  # its SELECT as the server stores it
    # where the SELECT yields columns the table lacks (a ``SELECT *`` whose source gained
    # a column): the table's columns among them, which the staging view keeps
    keep: tuple[str, ...] = ()

    @property
    def view_name(self) -> str:
        return f"{self.view[0]}.{self.view[1]}"


class ViewProblem(ValueError):
    """A materialized view the sink cannot stage; names the view and the reason."""


# -- discovery ----------------------------------------------------------------------------


def discover(client: SqlClient, target: TargetTable) -> tuple[ViewNode, ...]:
    """Every materialized view the target feeds, parents first (see the module doc), on
    ``client``'s server. ``target.views`` (read with its description) is taken as that
    server's: pass a table another server described with ``views=None``.

    Raises :class:`ViewProblem` for a view that cannot be staged.
    """
    nodes: list[ViewNode] = []
    pending: list[tuple[TargetTable, int, int]] = [(target, -1, 0)]
    while pending:
        table, parent, depth = pending.pop(0)
        source = (table.database, table.name)
        views = table.views if table.views is not None else _dependents(client, source)
        if views and depth > 0 and not fires_view_chains(client):
            log.info("the server does not fire views on what a view writes: %s, reading "
                     "%s.%s, get nothing from a write into %s, as from a plain INSERT",
                     ", ".join(f"{v[0]}.{v[1]}" for v in views), *source, target.qualified)
            continue
        for view in views:
            if depth >= MAX_DEPTH:
                raise ViewProblem(f"materialized view {view[0]}.{view[1]} is more than "
                                  f"{MAX_DEPTH} views below {target.database}.{target.name}")
            node = _node(client, view, source, len(nodes), parent)
            nodes.append(node)
            pending.append((node.table, node.index, depth + 1))
    return tuple(nodes)


def _dependents(client: SqlClient, table: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    rows = catalog_rows(client,
        f"SELECT {DEPENDENTS_COLUMNS} FROM system.tables "
        f"WHERE {table_filter(table[0], table[1], name_column='name')}",
        purpose=f"list the views of {table[0]}.{table[1]}")
    return dependents_of(rows[0]) if rows else ()


def _node(client: SqlClient, view: tuple[str, str], source: tuple[str, str], index: int,
          parent: int) -> ViewNode:
    name = f"{view[0]}.{view[1]}"
    rows = catalog_rows(client,
        "SELECT engine, create_table_query FROM system.tables "
        f"WHERE {table_filter(view[0], view[1], name_column='name')}",
        purpose=f"describe view {name}")
    if not rows:
        raise ViewProblem(f"view {name} reads {source[0]}.{source[1]} but cannot be described")
    engine, create = rows[0]["engine"], rows[0]["create_table_query"]
    if engine != "MaterializedView":
        raise ViewProblem(f"{name} reads {source[0]}.{source[1]} and is a {engine}, which "
                          "clickhouse_tx cannot stage; only materialized views are staged")
    tokens = tokenize(create)
    select_at = _select_start(tokens)
    if select_at is None:
        raise ViewProblem(f"cannot find the SELECT of materialized view {name}")
    table_name = _to_table(tokens[:select_at]) or _inner_table(client, view)
    table = describe_table(client, f"{qualified_name(*table_name)}")
    select = create[tokens[select_at].start:]
    _check_select(name, select, source)
    outputs = _select_outputs(client, name, select) or ()
    known = {c.name for c in table.columns}
    keep = () if set(outputs) <= known else tuple(n for n in outputs if n in known)
    return ViewNode(index, parent, view, source, table, select, keep)


def _select_outputs(client: SqlClient, view: str, select: str) -> tuple[str, ...] | None:
    """The names of the columns ``select`` yields (``DESCRIBE`` reads no data); None where
    the server cannot say. A view stored with ``SELECT *`` yields every column its source
    has now, also one added after the view: the server drops it when the view fires, but
    refuses it in a new view's CREATE, as the staging view's."""
    try:
        rows = client.query_rows(f"DESCRIBE TABLE ({select})",
                                 purpose=f"describe the SELECT of view {view}")
    except ClickHouseError:
        return None
    return tuple(row["name"] for row in rows)


def _inner_table(client: SqlClient, view: tuple[str, str]) -> tuple[str, str]:
    """The inner table of a view without ``TO``: ``.inner.<view>`` (18.16, Ordinary
    databases) or ``.inner_id.<uuid of the view>`` (Atomic databases)."""
    database, name = view
    rows = catalog_rows(client,
        "SELECT name FROM system.tables "
        f"WHERE database = {sql_string(database)} AND name LIKE '.inner%'",
        purpose=f"find the inner table of view {database}.{name}")
    names = {row["name"] for row in rows}
    if f".inner.{name}" in names:
        return database, f".inner.{name}"
    if any(n.startswith(".inner_id.") for n in names):
        uuid = catalog_rows(client,
            "SELECT toString(uuid) AS id FROM system.tables "
            f"WHERE {table_filter(database, name, name_column='name')}",
            purpose=f"find the inner table of view {database}.{name}")[0]["id"]
        if f".inner_id.{uuid}" in names:
            return database, f".inner_id.{uuid}"
    raise ViewProblem(f"cannot find the inner table of materialized view {database}.{name}")


# -- checks -------------------------------------------------------------------------------


def tree_problem(nodes: tuple[ViewNode, ...], overwrite: bool) -> str | None:
    """Why this tree cannot be staged and published (None: it can)."""
    if nodes and overwrite:
        names = ", ".join(n.view_name for n in nodes)
        return (f"mode('overwrite') replaces whole partitions, and the target feeds "
                f"materialized views ({names}) whose rows cannot be replaced by partition; "
                "write in append mode, or set materialized_views='ignore' to leave them "
                "without these rows")
    for node in nodes:
        problem = target_engine_problem(node.table, through_distributed=False)
        if problem:
            return (f"materialized view {node.view_name} writes into "
                    f"{node.table.database}.{node.table.name}: {problem}")
    return None


def _check_select(view: str, select: str, source: tuple[str, str]) -> None:
    reads = [m for m in _references(tokenize(select), source) if not m[2]]
    if not reads:
        raise ViewProblem(f"materialized view {view}: its SELECT does not name its source "
                          f"{source[0]}.{source[1]} as database.table")
    if len(reads) > 1:
        raise ViewProblem(f"materialized view {view} reads its source {source[0]}.{source[1]} "
                          "more than once; clickhouse_tx cannot tell which reference is the "
                          "inserted block")


# -- staging ------------------------------------------------------------------------------


def staging_select(node: ViewNode, source: str) -> str:
    """The node's SELECT reading ``source`` (a quoted staging table) instead of the table
    whose inserts fire it. A read without an alias gets the source table's bare name as
    its alias, so that columns the SELECT qualifies with that name (``src.id``) still
    resolve; qualifiers by the full name (``db.src.id``) name the staging table. Where
    the SELECT yields columns the view's table lacks, only the table's are kept
    (``ViewNode.keep``), as the server does when the real view fires."""
    tokens = tokenize(node.select)
    out, last = [], 0
    for start, end, qualifier in _references(tokens, node.source):
        out.append(node.select[last:start])
        out.append(source)
        if not qualifier and not _aliased(tokens, end):
            out.append(f" AS {quote_identifier(node.source[1])}")
        last = end
    out.append(node.select[last:])
    rewritten = "".join(out)
    if not node.keep:
        return rewritten
    return f"SELECT {', '.join(map(quote_identifier, node.keep))} FROM ({rewritten})"


def staging_view_ddl(node: ViewNode, view: str, source: str, into: str) -> str:
    """``CREATE MATERIALIZED VIEW`` of the staging view ``view``: the node's SELECT over
    the staging table ``source`` (its source's), into the staging table ``into`` (its
    own table's); all three quoted."""
    return (f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view} TO {into} AS "
            f"{staging_select(node, source)}")


# -- tokens -------------------------------------------------------------------------------


def _is_identifier(token: Token) -> bool:
    return token.kind in ("word", "quoted")


def _references(tokens: list[Token], table: tuple[str, str]) -> list[tuple[int, int, bool]]:
    """(start, end, is_qualifier) of every ``db.table`` naming ``table``; ``is_qualifier``
    when a ``.column`` follows (a column qualified by the table, not a read of it)."""
    found = []
    for i in range(len(tokens) - 2):
        a, dot, b = tokens[i], tokens[i + 1], tokens[i + 2]
        if (_is_identifier(a) and dot.text == "." and _is_identifier(b)
                and (a.text, b.text) == table
                and not (i > 0 and tokens[i - 1].text == ".")):
            qualifier = i + 3 < len(tokens) and tokens[i + 3].text == "."
            found.append((a.start, b.end, qualifier))
    return found


# Words that may follow a table in FROM or JOIN where it has no alias.
_AFTER_TABLE = frozenset({
    "FINAL", "SAMPLE", "PREWHERE", "WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "OFFSET",
    "SETTINGS", "FORMAT", "UNION", "EXCEPT", "INTERSECT", "WINDOW", "QUALIFY", "INTO",
    "JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "OUTER", "ANY", "ALL", "ASOF", "SEMI",
    "ANTI", "ARRAY", "GLOBAL", "ON", "USING", "PASTE", "WITH"})


def _aliased(tokens: list[Token], end: int) -> bool:
    """Whether the table reference ending at offset ``end`` is followed by an alias."""
    following = next((t for t in tokens if t.start >= end), None)
    if following is None:
        return False
    if following.kind == "quoted":
        return True
    return following.kind == "word" and following.text.upper() not in _AFTER_TABLE


def _select_start(tokens: list[Token]) -> int | None:
    """Index of the first token of the view's query: after the first top-level ``AS``."""
    depth = 0
    for i, token in enumerate(tokens):
        if token.kind == "punct" and token.text in "([":
            depth += 1
        elif token.kind == "punct" and token.text in ")]":
            depth -= 1
        elif (depth == 0 and token.kind == "word" and token.text.upper() == "AS"
              and i + 1 < len(tokens)):
            return i + 1
    return None


def _to_table(tokens: list[Token]) -> tuple[str, str] | None:
    """The ``TO db.table`` of a view's CREATE before its query, if it has one."""
    for i, token in enumerate(tokens[:-3]):
        if (token.kind == "word" and token.text.upper() == "TO" and _is_identifier(tokens[i + 1])
                and tokens[i + 2].text == "." and _is_identifier(tokens[i + 3])):
            return tokens[i + 1].text, tokens[i + 3].text
    return None
