"""A file's upper bound of the tokens the loss covers (completions, assistant turns and the EOS each
trains), measured at upload: a job that trains on what the model should write (no train_on_inputs)
is refused at creation when it is 0, instead of failing in its worker. Null for plain text (every
token trains) and for rows from before (not measured).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("max_trained_tokens", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("max_trained_tokens")
