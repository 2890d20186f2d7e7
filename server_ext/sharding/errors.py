"""The one error of shard layouts, shard URL options and sharding keys."""

from __future__ import annotations


class ShardingError(ValueError):
    """A shard layout, a shard URL option or a sharding key cannot be used.

    A ``ValueError`` like the sink's option errors: it is raised before anything is staged.
    Messages name the bad part but never a URL's credentials.
    """
