"""The fixtures the wing's tests share with the modern ones they extend."""

from tests.server_ext.test_publish import server_staging_names, staging_names  # noqa: F401
