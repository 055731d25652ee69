"""Compute off the API: exports produced by workers (a status per export), completions asked of
inference workers through `inference_requests`, result files per job, and OpenAI's event level
`warn` (was `warning`).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _time(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def upgrade() -> None:
    with op.batch_alter_table("exports") as batch:
        batch.add_column(sa.Column("owner_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("status", sa.String(16), nullable=False, server_default="ready"))
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))
        batch.add_column(_time("updated_at"))
        batch.alter_column("blob_id", existing_type=sa.String(40), nullable=True)
    with op.batch_alter_table("exports") as batch:  # the defaults served the rows already there
        batch.alter_column("status", server_default=None, existing_type=sa.String(16))
        batch.alter_column("updated_at", server_default=None, existing_type=sa.DateTime(timezone=True))

    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("result_files", sa.JSON(), nullable=False, server_default="[]"))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("result_files", server_default=None, existing_type=sa.JSON())

    op.execute("UPDATE events SET level = 'warn' WHERE level = 'warning'")

    op.create_table(
        "inference_requests",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("owner_id", sa.String(64), nullable=False),
        sa.Column("model_id", sa.String(200), nullable=False),
        sa.Column("blob_id", sa.String(40), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("piece_lengths", sa.Text(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_inference_requests"),
    )
    op.create_index("ix_inference_requests_owner_id", "inference_requests", ["owner_id"])
    op.create_index("ix_inference_requests_created_at", "inference_requests", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_inference_requests_created_at", table_name="inference_requests")
    op.drop_index("ix_inference_requests_owner_id", table_name="inference_requests")
    op.drop_table("inference_requests")
    op.execute("UPDATE events SET level = 'warning' WHERE level = 'warn'")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("result_files")
    op.execute("DELETE FROM exports WHERE status != 'ready' OR blob_id IS NULL")
    with op.batch_alter_table("exports") as batch:
        batch.alter_column("blob_id", existing_type=sa.String(40), nullable=False)
        batch.drop_column("updated_at")
        batch.drop_column("error")
        batch.drop_column("status")
        batch.drop_column("owner_id")
