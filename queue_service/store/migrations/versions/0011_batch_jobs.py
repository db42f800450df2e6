"""Batch jobs: a session record may be a job, with what it runs, its exit code and its log's end.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every existing record is an interactive session: all three stay NULL.
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("job_json", sa.Text(), nullable=True))
        batch.add_column(sa.Column("exit_code", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("log_tail", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("log_tail")
        batch.drop_column("exit_code")
        batch.drop_column("job_json")
