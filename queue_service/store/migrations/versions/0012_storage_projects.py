"""Storage projects: the kernel project id of each owner account's folders (project quotas).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Empty at first: an owner gets an id when project quotas first tag one of their folders.
    op.create_table(
        "storage_projects",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("account", sa.String(32), nullable=False),
    )
    op.create_index(
        "ix_storage_projects_owner", "storage_projects", ["owner", "account"], unique=True
    )


def downgrade() -> None:
    op.drop_index("ix_storage_projects_owner", table_name="storage_projects")
    op.drop_table("storage_projects")
