"""leader lease for standby servers; which server ran each cycle

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("cluster_samples") as batch_op:
        batch_op.add_column(sa.Column("leader", sa.String(length=64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("cluster_samples") as batch_op:
        batch_op.drop_column("leader")
    op.drop_table("leases")
