"""Swarm mode: each image is pinned to the registry digest its tag had when first found there.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing images are pinned at the service's next look at the registry.
    with op.batch_alter_table("images") as batch:
        batch.add_column(sa.Column("digest", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("images") as batch:
        batch.drop_column("digest")
