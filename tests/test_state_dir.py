"""The state directory's database URLs (queue_service/state_dir.py): one place, the environment."""

import pytest

from queue_service.state_dir import hub_db_url, queue_db_url, with_driver


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
