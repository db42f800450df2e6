"""Sessions and usage days belong to a hub account, not to whoever has that name later.

Existing rows are kept, with `account = ''`: they belong to the account of that name that was
there when they were written (queue_service/store/accounts.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

FIGURES = ("cpu_hours", "mem_gib_hours", "fgpu_hours")
KEPT = "usage_days_kept"


def usage_days_table(name: str, with_account: bool) -> None:
    """`usage_days` as 0006 made it, or with `account` in its key; `name` may be a holding
    table, which needs no key."""
    keys = ["day", "user", "account", "resource_group"] if with_account else None
    columns = [
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        *([sa.Column("account", sa.String(32), nullable=False)] if with_account else []),
        sa.Column("resource_group", sa.String(255), nullable=False),
        *(sa.Column(figure, sa.Float(), nullable=False) for figure in FIGURES),
    ]
    if name == "usage_days":
        columns.append(sa.PrimaryKeyConstraint(*(keys or ["day", "user", "resource_group"])))
    op.create_table(name, *columns)


def move_rows(source: str, target: str, account: str | None, group: bool = False) -> None:
    """Copy `source`'s rows into `target` in SQL (a year of figures never passes through
    Python); `account` is the value it gets (None: the target has no such column), and `group`
    sums the figures per day, user and resource group."""
    keys = 'day, "user", resource_group'
    figures = ", ".join(f"SUM({f})" if group else f for f in FIGURES)
    into = f"{keys}, account" if account is not None else keys
    picked = f"{keys}, '{account}'" if account is not None else keys
    grouping = f" GROUP BY {keys}" if group else ""
    op.execute(
        f"INSERT INTO {target} ({into}, {', '.join(FIGURES)}) "
        f"SELECT {picked}, {figures} FROM {source}{grouping}"
    )


def remake_usage_days(with_account: bool, group: bool) -> None:
    """The key changes: the rows move aside, the table is made again, and they move back."""
    usage_days_table(KEPT, with_account=False)
    move_rows("usage_days", KEPT, None, group=group)
    op.drop_index("ix_usage_days_user_day", table_name="usage_days")
    op.drop_table("usage_days")
    usage_days_table("usage_days", with_account=with_account)
    move_rows(KEPT, "usage_days", "" if with_account else None)
    op.drop_table(KEPT)
    op.create_index("ix_usage_days_user_day", "usage_days", ["user", "day"])


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("account", sa.String(32), nullable=False, server_default=""))
    remake_usage_days(with_account=True, group=False)


def downgrade() -> None:
    # A name's accounts are added up again, as the older release keyed the figures.
    remake_usage_days(with_account=False, group=True)
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("account")
