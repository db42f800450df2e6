"""A private image belongs to its owner's hub account, not to whoever has that name later.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing private images stay with their owner's name (empty: not bound to an account).
    with op.batch_alter_table("images") as batch:
        batch.add_column(sa.Column("owner_created", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("images") as batch:
        batch.drop_column("owner_created")
