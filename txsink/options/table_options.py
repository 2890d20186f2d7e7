"""The options that let a write change its target's table: ``create_table``,
``schema_evolution`` and the shape of a created table (``engine``, ``order_by``,
``partition_by``), checked with the other options before any server is asked.

An option that would do nothing is refused, not ignored: ``engine``, ``order_by`` and
``partition_by`` shape only a table the sink creates, so they need
``create_table=if_missing``.
"""

from __future__ import annotations

from server_ext.ddl import DEFAULT_ENGINE, creatable_engine_problem, expression_problem

NEVER, IF_MISSING = "never", "if_missing"
CREATE_TABLE_CHOICES = (NEVER, IF_MISSING)
NO_EVOLUTION, ADD_COLUMNS = "none", "add_columns"
SCHEMA_EVOLUTION_CHOICES = (NO_EVOLUTION, ADD_COLUMNS)
SHAPE_OPTIONS = ("engine", "order_by", "partition_by")
OPTION_NAMES = ("create_table", "schema_evolution", *SHAPE_OPTIONS)


def check(values: dict[str, object]) -> None:
    """Normalise these options in ``values`` (a parsed option map) in place; raise
    ``ValueError`` naming the option and the problem."""
    for name, choices, default in (("create_table", CREATE_TABLE_CHOICES, NEVER),
                                   ("schema_evolution", SCHEMA_EVOLUTION_CHOICES,
                                    NO_EVOLUTION)):
        value = str(values.get(name, default)).strip().lower()
        if value not in choices:
            raise ValueError(f"option {name}={value!r} is not one of {', '.join(choices)}")
        values[name] = value
    given = [name for name in SHAPE_OPTIONS if name in values]
    if given and values["create_table"] != IF_MISSING:
        raise ValueError(f"option(s) {', '.join(given)} shape a table the sink creates and "
                         "need create_table=if_missing")
    engine = str(values.get("engine", DEFAULT_ENGINE)).strip()
    problem = creatable_engine_problem(engine)
    if problem:
        raise ValueError(f"option engine={engine!r} cannot be used: {problem}")
    values["engine"] = engine
    for name in ("order_by", "partition_by"):
        if name in values:
            text = str(values[name]).strip()
            problem = expression_problem(text)
            if problem:
                raise ValueError(f"option {name}={text!r} is not one key expression: {problem}")
            values[name] = text
