"""The old-server wing: everything server_ext does only for ClickHouse 18.16.

18.16 reads no ArrowStream, has no ``MOVE PARTITION``, hashes few types with
``cityHash64``, fires no view on a view's output, creates LowCardinality columns only
with an experimental setting, leaves the clones of an interrupted ``ATTACH``/``REPLACE
PARTITION`` behind, holds ~2 MiB per column file while inserting and computes some
functions (``%`` of a negative) unlike chdb. What answers that lives here, each piece
built on the modern modules it extends:
- ``native_encoder``   the Native INSERT body (``NATIVE``), where ArrowStream is missing;
- ``hash_arguments``   the content digest's row hash for a ``cityHash64`` that takes few
  types, and the probe that tells;
- ``probes``           the ``MOVE PARTITION`` and view-chain probes;
- ``attach_marked``    the publish strategy where MOVE is missing (a watermark decides a
  repeat); ``leftover_clones``, its statements (and the overwrite's) repeated past the
  clones a crash left;
- ``low_cardinality``  the setting 18.16's staging DDL needs for LowCardinality columns;
- ``insert_memory``    the refusal of a target too wide for one INSERT within the server's
  memory limit (``memory_problem``, for the sink's checks before staging);
- ``key_probe``        the check that chdb routes an expression key as the server does.

Where the choice is made: ``server_ext.capabilities``, from what the server itself reports
(``Capabilities.insert_format``, ``Capabilities.hash_argument``, ``row_hash_argument``,
``fires_view_chains``, ``move_partition`` for ``publish.strategy_choice``). The guards that
run on every server (the memory check, the key probe, the clone repeat, the DDL setting)
are reached from their one call site each; the import-linter contract of ``server_ext``
(``pyproject.toml``) declares every import into this folder, so a new one fails the check.
Dropping 18.16 is deleting this folder, its tests (``tests/server_ext/old_server/``; the
memory check's end-to-end ones stay in ``tests/core/test_wide_tables.py``, whose targets
are wide for either server) and those declared imports with the branches that chose them.
"""

from server_ext.old_server.insert_memory import memory_problem
from server_ext.old_server.native_encoder import encode_native_block

__all__ = ["encode_native_block", "memory_problem"]
