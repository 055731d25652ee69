"""Initial schema: keys, blobs, files, jobs, metrics, events, checkpoints, exports.

Written by hand to match core/models.py exactly (constraint names follow the models' naming
convention); tests/core/test_migrations.py checks there is no drift.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("owner_id", sa.String(64), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_owner_id", "api_keys", ["owner_id"])

    op.create_table(
        "blobs",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("backend", sa.String(8), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("complete", sa.Boolean(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_blobs"),
    )

    op.create_table(
        "deleted_models",
        sa.Column("model_id", sa.String(200), nullable=False),
        sa.Column("owner_id", sa.String(64), nullable=False),
        _ts("deleted_at"),
        sa.PrimaryKeyConstraint("model_id", name="pk_deleted_models"),
    )

    op.create_table(
        "blob_chunks",
        sa.Column("blob_id", sa.String(40), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["blob_id"], ["blobs.id"], name="fk_blob_chunks_blob_id_blobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("blob_id", "seq", name="pk_blob_chunks"),
    )

    op.create_table(
        "files",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("owner_id", sa.String(64), nullable=False),
        sa.Column("filename", sa.String(500), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("blob_id", sa.String(40), nullable=True),
        _ts("created_at"),
        _ts("deleted_at", nullable=True),
        sa.ForeignKeyConstraint(["blob_id"], ["blobs.id"], name="fk_files_blob_id_blobs"),
        sa.PrimaryKeyConstraint("id", name="pk_files"),
    )
    op.create_index("ix_files_owner_id", "files", ["owner_id"])

    op.create_table(
        "exports",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("model_id", sa.String(200), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("blob_id", sa.String(40), nullable=False),
        sa.Column("filename", sa.String(300), nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["blob_id"], ["blobs.id"], name="fk_exports_blob_id_blobs"),
        sa.PrimaryKeyConstraint("id", name="pk_exports"),
        sa.UniqueConstraint("model_id", "format", name="uq_exports_model_format"),
    )
    op.create_index("ix_exports_model_id", "exports", ["model_id"])

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("owner_id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("base_model_id", sa.String(200), nullable=True),
        sa.Column("training_file", sa.String(40), nullable=False),
        sa.Column("validation_file", sa.String(40), nullable=True),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("hyperparameters", sa.JSON(), nullable=False),
        sa.Column("model_config", sa.JSON(), nullable=False),
        sa.Column("train_config", sa.JSON(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("suffix", sa.String(64), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("queue", sa.String(16), nullable=False),
        sa.Column("fine_tuned_model", sa.String(200), nullable=True),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_param", sa.String(64), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("pause_requested", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        _ts("lease_expires_at", nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("trained_tokens", sa.BigInteger(), nullable=False),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("val_loss", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        _ts("created_at"),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        _ts("updated_at"),
        sa.ForeignKeyConstraint(["training_file"], ["files.id"], name="fk_jobs_training_file_files"),
        sa.ForeignKeyConstraint(["validation_file"], ["files.id"], name="fk_jobs_validation_file_files"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("owner_id", "idempotency_key", name="uq_jobs_owner_idempotency"),
    )
    op.create_index("ix_jobs_owner_id", "jobs", ["owner_id"])
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])
    op.create_index("ix_jobs_status_lease", "jobs", ["status", "lease_expires_at"])

    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("owner_id", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.String(200), nullable=False),
        sa.Column("blob_id", sa.String(40), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("is_final", sa.Boolean(), nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["blob_id"], ["blobs.id"], name="fk_checkpoints_blob_id_blobs"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_checkpoints_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
        sa.UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),
        sa.UniqueConstraint("model_id", name="uq_checkpoints_model_id"),
    )
    op.create_index("ix_checkpoints_job_id", "checkpoints", ["job_id"])
    op.create_index("ix_checkpoints_owner_id", "checkpoints", ["owner_id"])

    op.create_table(
        "events",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("level", sa.String(8), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_events_job_id_jobs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("seq", name="pk_events"),
        sa.UniqueConstraint("id", name="uq_events_id"),
    )
    op.create_index("ix_events_job_id", "events", ["job_id"])

    op.create_table(
        "metrics",
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("val_loss", sa.Float(), nullable=True),
        sa.Column("lr", sa.Float(), nullable=True),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("tokens_seen", sa.BigInteger(), nullable=True),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_metrics_job_id_jobs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "step", name="pk_metrics"),
    )


def downgrade() -> None:
    # reverse dependency order; dropping a table drops its indexes and constraints
    for table in (
        "metrics",
        "events",
        "checkpoints",
        "jobs",
        "exports",
        "files",
        "blob_chunks",
        "deleted_models",
        "blobs",
        "api_keys",
    ):
        op.drop_table(table)
