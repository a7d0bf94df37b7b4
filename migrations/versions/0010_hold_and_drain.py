"""jobs: who holds a pending job, a revision of its spec (`gsched update`), its dependencies and
whether they are met, its place in a job array; nodes: drained and why

Revision ID: 0010
Revises: 0007
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("held_by", sa.String(64), nullable=True))
        batch_op.add_column(sa.Column("spec_rev", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("dependency", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("deps_met", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch_op.add_column(sa.Column("array_job_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("array_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("array_count", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("array_max_running", sa.Integer(), nullable=True))
        batch_op.create_index("ix_jobs_array_job_id", ["array_job_id"])
    with op.batch_alter_table("nodes") as batch_op:
        batch_op.add_column(sa.Column("drained_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("drain_reason", sa.String(200), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch_op:
        batch_op.drop_column("drain_reason")
        batch_op.drop_column("drained_at")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_index("ix_jobs_array_job_id")
        for column in ("array_max_running", "array_count", "array_index", "array_job_id"):
            batch_op.drop_column(column)
        batch_op.drop_column("deps_met")
        batch_op.drop_column("dependency")
        batch_op.drop_column("spec_rev")
        batch_op.drop_column("held_by")
