"""Shared pytest fixtures live in tests/fixtures/ (one module per concern):
- infra:   real PostgreSQL and Redis (started throwaway if none is reachable), settings, sessions
- service: live worker / API server processes, API keys
- throwaway_redis: a Redis server of the test's own, to kill and restart (broker faults)
"""

pytest_plugins = ["tests.fixtures.infra", "tests.fixtures.service", "tests.fixtures.throwaway_redis"]
