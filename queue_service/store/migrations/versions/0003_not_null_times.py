"""Creation and update times are never empty, as the models say.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

COLUMNS = [("sessions", "created"), ("images", "created"), ("images", "updated")]


def upgrade() -> None:
    # Rows from before always had these set by the models; fill any gap from outside edits first.
    for table, column in COLUMNS:
        op.execute(f"UPDATE {table} SET {column} = CURRENT_TIMESTAMP WHERE {column} IS NULL")
    _alter(nullable=False)


def downgrade() -> None:
    _alter(nullable=True)


def _alter(nullable: bool) -> None:
    # Batch mode, so that SQLite (which cannot alter a column) copies the table.
    for table in ("sessions", "images"):
        with op.batch_alter_table(table) as batch:
            for column in (c for t, c in COLUMNS if t == table):
                batch.alter_column(
                    column, existing_type=sa.DateTime(timezone=True), nullable=nullable
                )
