"""replicas: last_read_at, when a job last read the copy where it lies (the binder writes it): the
node cache keeps the copies read most recently (scheduler/server/replication.py)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("last_read_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("last_read_at")
