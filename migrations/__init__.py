"""Alembic migrations: the only thing that changes the schema. Run with `fromscratch migrate`
(core.migrate.run_migrations) or `alembic -c migrations/alembic.ini -x url=URL upgrade head`."""
