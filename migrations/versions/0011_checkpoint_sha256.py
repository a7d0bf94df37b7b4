"""checkpoints: the sha256 of each checkpoint's bytes, as the agent that wrote it reported them
(a resumed job's copies are verified against it before they are loaded)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.add_column(sa.Column("sha256", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.drop_column("sha256")
