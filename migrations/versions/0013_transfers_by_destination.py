"""transfers: an index on (dst, state), so that a heartbeat finds the open orders to its node (and the
quiet heartbeat learns there are none) without reading every transfer ever made

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""
from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_transfers_dst_state", "transfers", ["dst", "state"])


def downgrade() -> None:
    op.drop_index("ix_transfers_dst_state", table_name="transfers")
