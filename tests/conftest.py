"""Shared pytest fixtures live in tests/fixtures/ (one module per concern):
- infra:   real PostgreSQL and Redis (started throwaway if none is reachable), settings, sessions
- service: live worker / API server processes, API keys
- throwaway_redis: a Redis server of the test's own, to kill and restart (broker faults)
- seaweedfs: a real S3 server (SeaweedFS) for the s3 blob backend, its credentials, a key prefix
"""

pytest_plugins = [
    "tests.fixtures.infra",
    "tests.fixtures.service",
    "tests.fixtures.throwaway_redis",
    "tests.fixtures.seaweedfs",
]
