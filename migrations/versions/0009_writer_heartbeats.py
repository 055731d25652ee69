"""Who is still at work on a row, and since when it last said so: `blobs.writer`/`heartbeat_at`
(an incomplete blob whose writer went silent is a dead process's, collected at once rather than
after hours: core/blob_gc.py) and `inference_requests.worker`/`heartbeat_at` (a completion whose
worker went silent ends with `inference_worker_lost` within seconds: api/inference_liveness.py).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("blobs", "inference_requests")
WHO = {"blobs": "writer", "inference_requests": "worker"}


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column(WHO[table], sa.String(200), nullable=True))
            batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("heartbeat_at")
            batch.drop_column(WHO[table])
