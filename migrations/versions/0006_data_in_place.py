"""data sets laid out for the jobs that read them: each data set's span (how many nodes its jobs spread
over); the bytes a copy under way has moved so far

Revision ID: 0006
Revises: 0003
Create Date: 2026-12-04
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch_op:
        batch_op.add_column(sa.Column("span", sa.Integer(), nullable=False, server_default="1"))
    with op.batch_alter_table("transfers") as batch_op:
        batch_op.add_column(sa.Column("done_bytes", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("transfers") as batch_op:
        batch_op.drop_column("done_bytes")
    with op.batch_alter_table("datasets") as batch_op:
        batch_op.drop_column("span")
