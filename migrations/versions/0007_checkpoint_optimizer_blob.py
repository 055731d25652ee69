"""A checkpoint's optimizer state as a blob of its own (checkpoints.optimizer_blob_id), kept for
the job's newest checkpoint only (worker/checkpoint_store.py).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("optimizer_blob_id", sa.String(40), nullable=True))
        batch.create_foreign_key(
            "fk_checkpoints_optimizer_blob_id_blobs", "blobs", ["optimizer_blob_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_constraint("fk_checkpoints_optimizer_blob_id_blobs", type_="foreignkey")
        batch.drop_column("optimizer_blob_id")
