"""devices: NVML's UUID, and why a device is not healthy

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch_op:
        batch_op.add_column(sa.Column("uuid", sa.String(96), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("health", sa.String(200), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch_op:
        batch_op.drop_column("health")
        batch_op.drop_column("uuid")
