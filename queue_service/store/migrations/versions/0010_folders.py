"""Storage folders, their shares, and the folders each session mounts.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "folders",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("account", sa.String(32), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("modified", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deleted", sa.DateTime(timezone=True), nullable=True),
        sa.Column("trash_name", sa.String(64), nullable=True),
    )
    op.create_index("ix_folders_owner", "folders", ["owner", "account"])
    op.create_table(
        "folder_shares",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("folder_id", sa.String(32), nullable=False),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("account", sa.String(32), nullable=False),
        sa.Column("group", sa.String(255), nullable=True),
        sa.Column("permission", sa.String(2), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_folder_shares_folder", "folder_shares", ["folder_id"])
    op.create_index("ix_folder_shares_user", "folder_shares", ["user"])
    op.create_index("ix_folder_shares_group", "folder_shares", ["group"])
    op.create_table(
        "session_mounts",
        sa.Column("session_id", sa.String(32), primary_key=True),
        sa.Column("path", sa.String(128), primary_key=True),
        sa.Column("folder_id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("read_only", sa.Boolean, nullable=False),
        sa.Column("note", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("session_mounts")
    op.drop_table("folder_shares")
    op.drop_table("folders")
