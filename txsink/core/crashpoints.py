"""The protocol's named steps, and the hook each passes: where fault tests crash it.

Every step an epoch passes where a crash leaves a distinct state has a name here (the
tasks' own) or in the module that owns it (the coordinator's ``coordinator.formats.steps``,
publish's ``server_ext.publish.publish_steps``, ``server_ext.publish.combined``). The product calls
:func:`hit` at each; what happens there is up to the hook that the environment variable
``TXSINK_STEP_HOOK`` (``module:function``) names, loaded once per process. Fault tests
name ``tests.harness.crash_arming``, which kills the process at armed points; nothing of
it is imported otherwise. Without the variable, :func:`hit` is one comparison.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from coordinator.formats import steps
from server_ext.publish import COMBINE_STEPS, PUBLISH_STEPS, Strategy

BRANCH_AFTER_REGISTER = "branch.after_register"  # task: branch recorded, nothing staged
BRANCH_AFTER_VIEWS = "branch.after_views"  # task: staging and its staging views made, no row
BRANCH_AFTER_STAGING_WRITE = "branch.after_staging_write"  # task: rows staged, not sealed
BRANCH_AFTER_SEAL = "branch.after_seal"  # task: manifest built, not recorded
BRANCH_AFTER_CONTRIBUTE = "branch.after_contribute"  # task: parts in pre-combined, not recorded
BRANCH_AFTER_PREPARE = "branch.after_prepare"  # task: branch Prepared, no message yet
#: a ``foreachBatch`` driver (``driver.begin_micro_batch``): the micro-batch's xid
#: Initialized, no task started
DRIVER_AFTER_BEGIN = "driver.after_begin"
#: a pipelined commit (``txsink.core.pipeline``): its commit returned with the xid decided
#: (Committing, lease held), the background publish not begun
PIPELINE_BEFORE_PUBLISH = "pipeline.before_publish"
#: the next epoch's pipelined commit, before it waits for the previous epoch's publish
#: (which may be in flight) and before its own decision
PIPELINE_BEFORE_SETTLE = "pipeline.before_settle"

#: Every crash point a batch job passes, in the order an epoch passes them: the tasks' own,
#: then those the coordinator and ``server_ext`` declare (their modules say what each
#: means); ``publish.*`` are passed once per winner, the combined branch first;
#: ``retain.*`` after a ``Committed`` write, by the pass that removes older finished xids.
CRASH_POINTS: tuple[str, ...] = (
    BRANCH_AFTER_REGISTER, BRANCH_AFTER_VIEWS, BRANCH_AFTER_STAGING_WRITE, BRANCH_AFTER_SEAL,
    BRANCH_AFTER_CONTRIBUTE, BRANCH_AFTER_PREPARE,
    steps.COMMIT_AFTER_DECISION,
    *COMBINE_STEPS,
    *PUBLISH_STEPS[Strategy.ATTACH_MARKED],
    *steps.COMMIT_STEPS[1:],
    *steps.ABORT_STEPS,
    *steps.RETAIN_STEPS,
)

#: The points only a pipelined streaming commit passes (a batch job never does); the
#: background publish then passes ``combine.*``, ``publish.*`` and ``commit.*`` after
#: ``commit.after_decision`` as an inline one does.
PIPELINE_POINTS: tuple[str, ...] = (PIPELINE_BEFORE_PUBLISH, PIPELINE_BEFORE_SETTLE)

#: Every named point: what fault tests may arm.
ALL_POINTS: tuple[str, ...] = (*CRASH_POINTS, *PIPELINE_POINTS, DRIVER_AFTER_BEGIN)


HOOK_VARIABLE = "TXSINK_STEP_HOOK"


def _load_hook() -> Callable[[str], None] | None:
    """The step hook ``TXSINK_STEP_HOOK`` names (``module:function``), or None."""
    spec = os.environ.get(HOOK_VARIABLE, "")
    if not spec:
        return None
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute or "hit")


#: The hook, loaded at the first step (not at import: the hook's module may import this
#: one); ``False`` until then.
_hook: Callable[[str], None] | None | bool = False


def hit(name: str) -> None:
    """The protocol passed step ``name``: call the hook, if the environment named one."""
    global _hook
    if _hook is False:
        _hook = _load_hook()
    if _hook is not None:
        _hook(name)
