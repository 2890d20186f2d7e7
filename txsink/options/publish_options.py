"""The options of the publish: ``strategy`` (how a staged partition enters its target),
``publish`` (a streaming epoch's publish before its commit returns, or in the background),
``max_partitions_per_job`` (the partitions one write's rows may span) and
``carry_max_bytes`` (a small task's rows staged by the driver, ``txsink.core.carried_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from server_ext.publish import STRATEGIES as server_strategies
from server_ext.publish import Strategy
from server_ext.staging import DEFAULT_LIMIT as DEFAULT_PARTITION_LIMIT
from txsink.options.parse_util import OptionError, choice, numbers

AUTO = "auto"  # the strategy option's default: the server picks (capabilities.choose_strategy)
STRATEGIES = (AUTO, *server_strategies)
#: The option ``publish``: a streaming epoch's publish runs before its commit returns
#: (inline), or in the background while the next micro-batch runs (pipelined).
INLINE = "inline"
PIPELINED = "pipelined"
PUBLISH_CHOICES = (PIPELINED, INLINE)

#: The option ``carry_max_bytes``'s bound: one task's rows in one commit message.
MAX_CARRY_BYTES = 64 << 20

OPTION_NAMES = ("strategy", "publish", "max_partitions_per_job", "carry_max_bytes")


@dataclass(frozen=True)
class PublishOptions:
    """How the decided branches are published."""

    strategy: Strategy | Literal["auto"] = AUTO
    # the option publish: an epoch's publish after its decision (inline) or in the
    # background while the next micro-batch runs (pipelined, txsink/core/pipeline.py)
    mode: str = INLINE  # one of PUBLISH_CHOICES
    # partitions one write's rows may span (server_ext.staging.partition_bound); 0: no bound
    max_partitions_per_job: int = DEFAULT_PARTITION_LIMIT
    #: a task whose rows take at most this many Arrow bytes carries them to the driver in
    #: its commit message instead of staging them (``txsink.core.carried_rows``); 0: never
    carry_max_bytes: int = 0


def check_strategy(values: dict[str, object]) -> Strategy | Literal["auto"]:
    """The ``strategy`` option of ``values``, checked."""
    strategy = str(values.get("strategy", AUTO))
    if strategy not in STRATEGIES:
        raise OptionError(f"option strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    return AUTO if strategy == AUTO else Strategy(strategy)


def parse(values: dict[str, object]) -> PublishOptions:
    """These options of ``values``, checked, as a record."""
    strategy = check_strategy(values)
    numbers(values, (("max_partitions_per_job", int, 0, 2**31 - 1),
                     ("carry_max_bytes", int, 0, MAX_CARRY_BYTES)))
    mode = choice(values, "publish", PUBLISH_CHOICES, INLINE)
    return PublishOptions(strategy=strategy, mode=mode,
                          max_partitions_per_job=int(values.get(  # type: ignore[call-overload]
                              "max_partitions_per_job", DEFAULT_PARTITION_LIMIT)),
                          carry_max_bytes=int(values.get("carry_max_bytes", 0)))  # type: ignore[call-overload]
