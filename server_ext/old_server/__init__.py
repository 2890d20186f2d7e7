"""The old-server wing: everything server_ext does only for ClickHouse 18.16.

18.16 reads no ArrowStream, has no ``MOVE PARTITION``, hashes few types with
``cityHash64``, fires no view on a view's output, leaves the clones of an interrupted
``ATTACH``/``REPLACE PARTITION`` behind, holds ~2 MiB per column file while inserting and
computes some functions (``%`` of a negative) unlike chdb. What answers that lives here,
each piece built on the modern modules it extends:
- ``native_encoder``  the Native INSERT body (``NATIVE``), where ArrowStream is missing;

The modern path reads straight and reaches this folder only through the choosing place,
``server_ext.capabilities`` (``Capabilities.insert_format`` ...), and the few declared
imports the import-linter contract of ``server_ext`` lists. Dropping 18.16 is deleting this
folder, its tests (``tests/server_ext/old_server/``) and those imports.
"""

from server_ext.old_server.insert_memory import memory_problem
from server_ext.old_server.native_encoder import encode_native_block

__all__ = ["encode_native_block", "memory_problem"]
