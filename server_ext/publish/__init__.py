"""Publishing sealed branches into their target exactly once: one module per strategy
over a shared run, the strategy choice, dynamic overwrite, the combined branch, and the
publish ledger's records."""

from server_ext.publish.combined import (
    COMBINE_STEPS,
    DEFAULT_LIMITS,
    SizeLimits,
    attach_to_precombined,
    combine_key,
    create_precombined,
    publish_combined,
)
from server_ext.publish.move import IntentWriter, move_apart, move_together
from server_ext.publish.overwrite import publish_overwrite
from server_ext.publish.publish_branch import publish
from server_ext.publish.publish_ledger import (
    COMBINED,
    MemoryLedger,
    PublishLedger,
    PublishRecord,
    ledger_key,
    resolve_partition,
)
from server_ext.publish.publish_steps import PUBLISH_STEPS, PublishReport
from server_ext.publish.strategy_choice import (
    STRATEGIES,
    Strategy,
    StrategyProblem,
    choose_strategy,
    strategy_problem,
    supported_strategies,
    target_engine_problem,
)

__all__ = [
    "publish",
    "publish_overwrite",
    "move_apart",
    "move_together",
    "IntentWriter",
    "PUBLISH_STEPS",
    "PublishReport",
    "STRATEGIES",
    "Strategy",
    "StrategyProblem",
    "choose_strategy",
    "strategy_problem",
    "supported_strategies",
    "target_engine_problem",
    "COMBINED",
    "MemoryLedger",
    "PublishLedger",
    "PublishRecord",
    "ledger_key",
    "resolve_partition",
    "COMBINE_STEPS",
    "DEFAULT_LIMITS",
    "SizeLimits",
    "combine_key",
    "attach_to_precombined",
    "create_precombined",
    "publish_combined",
]
