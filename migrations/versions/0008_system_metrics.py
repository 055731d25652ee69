"""The system metrics the worker samples on each metrics flush (the registry's `system` phase:
trainer/config/metrics.py): process CPU %, resident memory, device utilization and device memory.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("cpu_percent", "rss_bytes", "gpu_utilization", "gpu_memory_bytes")


def upgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
