"""Cluster utilization over time: a sample of capacity, allocation and use per resource type.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

FIELDS = [
    f"{resource}_{series}"
    for resource in ("cpu", "mem", "fgpu")
    for series in ("capacity", "allocated", "used")
]


def upgrade() -> None:
    op.create_table(
        "utilization_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=True) for name in FIELDS),
    )
    op.create_index("ix_utilization_samples_at", "utilization_samples", ["at"])


def downgrade() -> None:
    op.drop_index("ix_utilization_samples_at", table_name="utilization_samples")
    op.drop_table("utilization_samples")
