"""The state directory's database URLs (queue_service/store/state_dir.py): one place, the environment."""

import pytest

from queue_service.store.state_dir import db_url_problem, hub_db_url, queue_db_url, with_driver


def test_without_the_variables_both_databases_are_sqlite_files_in_the_state_directory():
    assert hub_db_url({}) == "sqlite:///jupyterhub.sqlite"
    assert queue_db_url({"FGPU_QUEUE_DB_URL": ""}) == "sqlite:///fgpu_queue.sqlite"


def test_the_variables_name_each_database_and_postgresql_gets_the_installed_driver():
    environ = {
        "FGPU_HUB_DB_URL": "postgresql://hub:pw@db.example/fgpu_hub",
        "FGPU_QUEUE_DB_URL": "postgres://queue:pw@db.example:5433/fgpu_queue?sslmode=require",
    }
    assert hub_db_url(environ) == "postgresql+psycopg://hub:pw@db.example/fgpu_hub"
    assert queue_db_url(environ) == (
        "postgresql+psycopg://queue:pw@db.example:5433/fgpu_queue?sslmode=require"
    )


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///jupyterhub.sqlite",
        "sqlite:////var/lib/fgpu-hub/fgpu_queue.sqlite",
        "postgresql+psycopg://u:p@h/d",
        "postgresql+psycopg2://u:p@h/d",  # a driver the site chose itself is kept
        "mysql+pymysql://u:p@h/d",
    ],
)
def test_other_urls_are_kept_as_they_are(url):
    assert with_driver(url) == url


@pytest.mark.parametrize(
    "url, words",
    [
        ("db.example/fgpu", "FGPU_QUEUE_DB_URL is not a database URL"),
        ("mysql+pymysql://u:p@h/d", "names a mysql database: SQLite or PostgreSQL only"),
        ("postgresql+psycopg://u:p@h", "FGPU_QUEUE_DB_URL names no database"),
    ],
)
def test_a_url_that_cannot_serve_is_refused_in_one_line_without_its_password(url, words):
    problem = db_url_problem(url, "FGPU_QUEUE_DB_URL")
    assert words in problem and "\n" not in problem and ":p@" not in problem


def test_sqlite_and_postgresql_urls_pass():
    assert db_url_problem("sqlite:///fgpu_queue.sqlite", "X") is None
    assert db_url_problem(with_driver("postgresql://u:p@h:5432/d?sslmode=require"), "X") is None
