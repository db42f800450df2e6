"""Usage accounting: per-day figures of ended sessions, and which sessions they hold already.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_days",
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("user", sa.String(255), primary_key=True),
        sa.Column("resource_group", sa.String(255), primary_key=True),
        sa.Column("cpu_hours", sa.Float(), nullable=False, server_default="0"),
        sa.Column("mem_gib_hours", sa.Float(), nullable=False, server_default="0"),
        sa.Column("fgpu_hours", sa.Float(), nullable=False, server_default="0"),
    )
    op.create_index("ix_usage_days_user_day", "usage_days", ["user", "day"])
    op.create_table(
        "usage_recorded",
        sa.Column("session_id", sa.String(32), primary_key=True),
    )
    # Sessions that ended before this revision are not in usage_days: the service counts them
    # from their records (usage_store.py) and files them on its first write.


def downgrade() -> None:
    op.drop_table("usage_recorded")
    op.drop_index("ix_usage_days_user_day", table_name="usage_days")
    op.drop_table("usage_days")
