"""Fixtures of the governance tests. The Redis ones run a real redis-server (tests/redis_server.py)
on a free loopback port, stopped at the end; they skip, saying why, only when redis-server is not
installed at all (`make redis` installs it)."""
from __future__ import annotations

import pytest

from tests.redis_server import RedisServer, redis_server_path


def _need_redis():
    if redis_server_path() is None:
        pytest.skip("redis-server not found: `make redis` installs Debian's redis-server")
    pytest.importorskip("redis", reason="redis-py not installed (a pyproject.toml dependency)")


@pytest.fixture(scope="session")
def redis_server():
    """One redis-server for the session (tests isolate themselves with their own key prefix)."""
    _need_redis()
    srv = RedisServer().start()
    yield srv
    srv.close()


@pytest.fixture
def own_redis():
    """A redis-server of the test's own, which it may stop and start again (same port)."""
    _need_redis()
    srv = RedisServer().start()
    yield srv
    srv.close()


def _need_postgres():
    from tests.postgres_server import postgres_bin_dir
    if postgres_bin_dir() is None:
        pytest.skip("PostgreSQL's server binaries not found: `make postgres` installs Debian's "
                    "postgresql")
    pytest.importorskip("asyncpg", reason="asyncpg not installed (a pyproject.toml dependency)")


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL cluster for the session (tests/postgres_server.py); each test makes
    a database of its own with `postgres_server.create_database(name)`."""
    _need_postgres()
    from tests.postgres_server import PostgresServer
    srv = PostgresServer().start()
    yield srv
    srv.close()
