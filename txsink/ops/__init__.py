"""Operator commands behind ``txsink status | recover | resolve | gc | verify | reset``.

One module per command, each a mixin of :class:`~txsink.ops.session.Session` (one session
of the coordinator's store and the ClickHouse clients of one command) with a ``render`` of
its result; :class:`~txsink.ops.commands.Operations` is all of them. None of them fences a
sink: ``recover`` (and ``gc``, first) finishes ``Committing`` xids and rolls back
undecided xids that are abandoned (``coordinator/protocol/liveness.py``: of an older
generation, or whose writer's liveness holders are all gone), so it is safe while a writer
runs; a live writer's in-flight xid is left alone. The write path imports none of this (an
import-linter contract).
"""
