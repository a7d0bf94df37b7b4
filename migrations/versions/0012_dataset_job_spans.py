"""datasets: how many nodes each of a data set's latest jobs spanned (written when a job is bound), so
the cycle can re-balance its layout toward the shape its jobs actually have

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch_op:
        batch_op.add_column(sa.Column("job_spans", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch_op:
        batch_op.drop_column("job_spans")
