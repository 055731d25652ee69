"""Shared pytest fixtures live in tests/fixtures/ (one module per concern):
- infra:   real PostgreSQL and Redis (started throwaway if none is reachable), settings, sessions
- service: live worker / API server processes, API keys
"""

pytest_plugins = ["tests.fixtures.infra", "tests.fixtures.service"]
