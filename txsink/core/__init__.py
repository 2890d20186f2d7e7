"""The write core, independent of how Spark calls it.

The driver plans (``plan``, which makes a ``write_plan.WritePlan``) before any task runs;
each task attempt stages, seals and prepares its branches (``attempt``) and returns a
commit message (``messages``); the driver decides and publishes (``driver``, ``combine``,
``publisher``). Every way in of :mod:`txsink.spark` reaches the protocol through these
modules only. (The folder is not called ``write``: ``txsink.write(df, ...)`` is the public
batch write.)
"""
