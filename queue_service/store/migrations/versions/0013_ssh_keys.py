"""SSH keys: the public keys that log an account in over SSH.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ssh_keys",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("account", sa.String(32), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("title", sa.String(255), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_ssh_keys_fingerprint", "ssh_keys", ["fingerprint"])
    op.create_index("ix_ssh_keys_owner", "ssh_keys", ["owner", "account"])


def downgrade() -> None:
    op.drop_index("ix_ssh_keys_owner", table_name="ssh_keys")
    op.drop_index("ix_ssh_keys_fingerprint", table_name="ssh_keys")
    op.drop_table("ssh_keys")
