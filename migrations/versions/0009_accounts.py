"""accounts: the fair-share tree (root -> accounts -> sub-accounts -> users)

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("parent", sa.String(64), nullable=True),
        sa.Column("shares", sa.Float, nullable=False, server_default="1.0"),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    with op.batch_alter_table("users") as batch_op:
        batch_op.add_column(sa.Column("account", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("users") as batch_op:
        batch_op.drop_column("account")
    op.drop_table("accounts")
