"""The options that let a write change its target's table: ``create_table``,
``schema_evolution`` and the shape of a created table (``engine``, ``order_by``,
``partition_by``), and ``materialized_views`` (what happens to the views the target
feeds), checked with the other options before any server is asked.

An option that would do nothing is refused, not ignored: ``engine``, ``order_by`` and
``partition_by`` shape only a table the sink creates, so they need
``create_table=if_missing``.
"""

from __future__ import annotations

from dataclasses import dataclass

from server_ext.ddl import DEFAULT_ENGINE, creatable_engine_problem, expression_problem

NEVER, IF_MISSING = "never", "if_missing"
CREATE_TABLE_CHOICES = (NEVER, IF_MISSING)
NO_EVOLUTION, ADD_COLUMNS = "none", "add_columns"
SCHEMA_EVOLUTION_CHOICES = (NO_EVOLUTION, ADD_COLUMNS)
SHAPE_OPTIONS = ("engine", "order_by", "partition_by")
#: What happens to the materialized views the target feeds: staged and published with
#: the target's rows (``server_ext.ddl.views``), or left without them (logged at WARNING).
VIEW_CHOICES = ("stage", "ignore")
OPTION_NAMES = ("create_table", "schema_evolution", *SHAPE_OPTIONS)


@dataclass(frozen=True)
class TargetOptions:
    """What the write may do to its target's table, and to the views it feeds."""

    create_table: str = NEVER  # or IF_MISSING (txsink/core/target_setup.py)
    schema_evolution: str = NO_EVOLUTION  # or ADD_COLUMNS
    engine: str = DEFAULT_ENGINE  # a created table's engine clause
    order_by: str | None = None  # a created table's sorting key (None: tuple())
    partition_by: str | None = None  # a created table's partition key (None: none)
    materialized_views: str = VIEW_CHOICES[0]  # one of VIEW_CHOICES


def parse(values: dict[str, object]) -> TargetOptions:
    """These options of ``values``, checked (:func:`check`, which normalises them in
    place: the options of a Distributed table read them), as a record."""
    check(values)
    views = str(values.get("materialized_views", VIEW_CHOICES[0])).lower()
    if views not in VIEW_CHOICES:
        raise ValueError(f"option materialized_views={views!r} is not one of "
                         f"{', '.join(VIEW_CHOICES)}")
    return TargetOptions(**{name: values[name] for name in OPTION_NAMES
                            if name in values},  # type: ignore[arg-type]
                         materialized_views=views)


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
