"""The named steps a decided xid passes, handed to the coordinator's ``on_step`` hook.

Crash tests arm them by name (``txsink/core/crashpoints.py`` is the one registry of every
point, from here, from ``server_ext`` and from the tasks); unarmed, a step costs a call.
"""

COMMIT_AFTER_DECISION = "commit.after_decision"  # xid Committing, nothing published
COMMIT_AFTER_BRANCH_PUBLISHED = "commit.after_branch_published"  # one winner published
COMMIT_AFTER_PUBLISH = "commit.after_publish"  # every winner published, xid Committing
COMMIT_AFTER_COMMITTED = "commit.after_committed"  # xid Committed, non-winners not dropped
ABORT_AFTER_DECISION = "abort.after_decision"  # xid Aborting, staging not dropped
ABORT_AFTER_ROLLBACK = "abort.after_rollback"  # staging dropped, xid not yet Aborted
RETAIN_AFTER_FOLD = "retain.after_fold"  # old xids folded into pruned/summary, none deleted
RETAIN_AFTER_DELETE = "retain.after_delete"  # one folded xid deleted (passed per xid)

COMMIT_STEPS = (COMMIT_AFTER_DECISION, COMMIT_AFTER_BRANCH_PUBLISHED, COMMIT_AFTER_PUBLISH,
                COMMIT_AFTER_COMMITTED)
ABORT_STEPS = (ABORT_AFTER_DECISION, ABORT_AFTER_ROLLBACK)
RETAIN_STEPS = (RETAIN_AFTER_FOLD, RETAIN_AFTER_DELETE)
