"""The test run's environment, set before Django reads its settings (loaded by pytest as a
plugin, `-p tests.environment` in pyproject.toml, which runs before pytest-django).

Tests run as production does: DEBUG off, so the settings require SECRET_KEY and
FIELD_ENCRYPTION_KEY. Test-only values are set here unless the environment has its own;
the processes the tests start (tests/procs.py) inherit them, so every process of a test
encrypts and decrypts provider keys with the same key.
"""

import os

os.environ.setdefault("SECRET_KEY", "test-only-secret-key-" + "t" * 40)
os.environ.setdefault("FIELD_ENCRYPTION_KEY", "dGVzdC1vbmx5LWZlcm5ldC1rZXktMzItYnl0ZXMhISE=")
# The monitor's history is computed on every request in tests (they read it right after a change).
os.environ.setdefault("HISTORY_CACHE_SECONDS", "0")
# A test database is thrown away: its commits need not wait for the disk (PostgreSQL only;
# the processes the tests start inherit it). Isolation and locking are unchanged.
os.environ.setdefault("DB_SYNCHRONOUS_COMMIT", "off")
