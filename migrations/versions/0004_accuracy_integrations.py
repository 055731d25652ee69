"""Token accuracy per logged step (metrics.train_accuracy / val_accuracy) and a job's experiment
tracker integrations (jobs.integrations, OpenAI's field).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.add_column(sa.Column("train_accuracy", sa.Float(), nullable=True))
        batch.add_column(sa.Column("val_accuracy", sa.Float(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("integrations", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("integrations")
    with op.batch_alter_table("metrics") as batch:
        batch.drop_column("val_accuracy")
        batch.drop_column("train_accuracy")
