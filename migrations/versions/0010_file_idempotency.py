"""An upload's Idempotency-Key (issue 25 finding 9): unique per owner, so a retried upload gets the
file its first attempt stored instead of storing it twice.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(200), nullable=True))
        batch.create_unique_constraint("uq_files_owner_idempotency", ["owner_id", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_constraint("uq_files_owner_idempotency", type_="unique")
        batch.drop_column("idempotency_key")
