"""Alembic environment for the queue service's database.

Every pending revision runs in one transaction, so a revision that fails rolls back the ones
before it too and the database stays as it was (db_upgrade.py takes a backup first as well).
PostgreSQL rolls back DDL; so does SQLite, but alembic does not count on it there, and Python's
sqlite3 driver commits DDL on its own unless it leaves transactions alone and the BEGIN is ours.
"""

from alembic import context
from sqlalchemy import engine_from_config, event, pool

from queue_service.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    if connectable.dialect.name == "sqlite":
        _sqlite_transactions_of_our_own(connectable)
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            transaction_per_migration=False,
            # Alembic takes SQLite for a database without transactional DDL, and would commit
            # after each revision.
            transactional_ddl=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    connectable.dispose()


def _sqlite_transactions_of_our_own(engine) -> None:
    """The recipe in SQLAlchemy's pysqlite notes ("Serializable isolation / Savepoints /
    Transactional DDL"): the driver issues no BEGIN or COMMIT of its own, SQLAlchemy's begin
    emits one. IMMEDIATE takes the write lock at once: no other writer slips in between."""

    @event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection, _record):
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
