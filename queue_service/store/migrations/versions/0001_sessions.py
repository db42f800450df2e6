"""The sessions table: the queue and every allocation.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("seq", sa.Integer, nullable=False, unique=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("image", sa.String(255), nullable=False),
        sa.Column("cpu", sa.Float, nullable=False),
        sa.Column("mem", sa.BigInteger, nullable=False),
        sa.Column("fgpu", sa.Float, nullable=False),
        sa.Column("resource_group", sa.String(255), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("grant_json", sa.Text, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("skips", sa.Integer, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True)),
        sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_sessions_status", "sessions", ["status"])
    op.create_index("ix_sessions_user_server", "sessions", ["user", "server_name"])


def downgrade() -> None:
    op.drop_table("sessions")
