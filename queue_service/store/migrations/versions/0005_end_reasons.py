"""End reasons as codes, the history's indexes, and the hub's ended named servers to remove.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

#: The codes of ended records from before this revision, read from their status and the reasons
#: the service wrote then (end_reasons.py has the codes).
BACKFILL = [
    ("status = 'CANCELLED'", "cancelled"),
    ("status = 'PENDING_TIMEOUT'", "pending_timeout"),
    ("status = 'ERROR'", "error"),
    ("status = 'TERMINATED' AND reason LIKE 'superseded%'", "superseded"),
    ("status = 'TERMINATED' AND reason = 'the hub had stopped its server'", "hub_stopped"),
    ("status = 'TERMINATED' AND reason = ''", "user"),
    ("status = 'TERMINATED'", "lost"),  # the reconciler's: container stopped, node lost
]
INDEXES = [
    ("ix_sessions_ended", ["ended"]),
    ("ix_sessions_user_ended", ["user", "ended"]),
    ("ix_sessions_server_removed", ["server_removed", "ended"]),
]


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("end_reason", sa.String(32), nullable=True))
        # Left empty for old records too: their stopped named servers are removed from the hub.
        batch.add_column(sa.Column("server_removed", sa.DateTime(timezone=True), nullable=True))
    for condition, code in BACKFILL:
        op.execute(
            f"UPDATE sessions SET end_reason = '{code}' WHERE end_reason IS NULL AND {condition}"
        )
    for name, columns in INDEXES:
        op.create_index(name, "sessions", columns)


def downgrade() -> None:
    for name, _ in INDEXES:
        op.drop_index(name, "sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("server_removed")
        batch.drop_column("end_reason")
