"""A file's upper bound of training tokens, measured when it is uploaded (the text its records render
to, plus an EOS each): job admission and the estimate size a JSONL job by it, not by its bytes,
which count JSON syntax too (about 2x for a chat file). Rows from before have none: their bytes stand
in, a looser bound.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(sa.Column("max_tokens", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.drop_column("max_tokens")
