"""The image catalog: the images table, and what catalog.yaml last seeded.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "images",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(63), nullable=False, unique=True),
        sa.Column("display_name", sa.String(255), nullable=False),
        sa.Column("image", sa.String(255), nullable=False),
        sa.Column("framework", sa.String(100), nullable=False),
        sa.Column("version", sa.String(100), nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("resources_json", sa.Text, nullable=False),
        sa.Column("gpu", sa.Boolean, nullable=False),
        sa.Column("groups_json", sa.Text, nullable=False),
        sa.Column("hidden", sa.Boolean, nullable=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("source", sa.String(20), nullable=False),
        sa.Column("check_ok", sa.Boolean, nullable=True),
        sa.Column("check_message", sa.Text, nullable=False),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created", sa.DateTime(timezone=True)),
        sa.Column("updated", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "image_seeds",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("entry_json", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("image_seeds")
    op.drop_table("images")
