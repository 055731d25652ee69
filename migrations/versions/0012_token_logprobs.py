"""Completions with logprobs: the inference worker appends each reported token's logprobs (a JSON
line) to the request's row beside its text, which the API relays. Empty for requests without them.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("inference_requests") as batch:
        batch.add_column(sa.Column("token_logprobs", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("inference_requests") as batch:
        batch.drop_column("token_logprobs")
