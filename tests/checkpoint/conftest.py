"""The storage backends every contract test runs against (tests/support/storage.py)."""

from tests.support.storage import backend, memory_backend  # noqa: F401  (fixtures)
