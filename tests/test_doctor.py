"""`fgpu-hub doctor` against the real engine and real databases (SQLite and PostgreSQL), and its
failures made real: an engine socket that does not exist, a database file that is no database,
an unreachable PostgreSQL, a catalog image never built, a disk threshold above what is free; and
the pure parts (the report, the Swarm's nodes, the clock)."""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import shutil

import pytest
from jupyterhub import orm
from sqlalchemy import create_engine, text

from fgpu_admin import cli, doctor
from image_catalog import CatalogImage, load_catalog
from queue_service.engine.frozen_containers import freezer_file, freezer_value
from queue_service.store.db import open_database
from queue_service.store.images import ImageStore

from .conftest import MISSING_IMAGE
from .harness import TEST_LABEL, free_port

pytestmark = pytest.mark.docker
#: Thresholds any test machine meets, so only the case under test can fail.
SMALL = ["--min-free-docker", "1M", "--min-free-backup", "1M"]


def doctor_says(*args: str) -> tuple[int, dict]:
    """Run `fgpu-hub doctor --json` (the console script's own main, in this process)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["doctor", "--json", *args])
    return code, json.loads(out.getvalue())


def by_name(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"]}


def make_state(tmp_path, monkeypatch, db_url):
    """A hub's state directory: the hub's SQLite DB made by JupyterHub, the queue's DB at `db_url`
    at this version's schema with the shipped catalog seeded, simulated GPUs, and no hub running
    (a port nobody listens on)."""
    monkeypatch.chdir(tmp_path)
    for name in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "FGPU_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    orm.new_session_factory("sqlite:///jupyterhub.sqlite").kw["bind"].dispose()
    monkeypatch.setenv("FGPU_HUB_DB_URL", "sqlite:///jupyterhub.sqlite")
    db = open_database(db_url)
    ImageStore(db).seed(load_catalog())
    db.kw["bind"].dispose()
    monkeypatch.setenv("FGPU_QUEUE_DB_URL", db_url)
    monkeypatch.setenv("FGPU_SIMULATED_GPUS", "1x8GiB")
    monkeypatch.setenv("FGPU_HUB_PORT", str(free_port()))
    monkeypatch.delenv("FGPU_HUB_IP", raising=False)
    monkeypatch.delenv("FGPU_BACKUP_DIR", raising=False)
    return tmp_path


@pytest.fixture
def state(tmp_path, monkeypatch):
    """The state directory with the queue's DB in SQLite."""
    return make_state(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'fgpu_queue.sqlite'}")


@pytest.fixture
def state_on(tmp_path, monkeypatch, db_url):
    """The state directory with the queue's DB in SQLite, then in PostgreSQL."""
    return make_state(tmp_path, monkeypatch, db_url)


def test_a_sound_hub_passes_with_the_simulated_gpus_as_the_only_warning(state_on):
    code, report = doctor_says(*SMALL)
    checks = by_name(report)
    assert code == 0, report
    assert checks["engine"]["status"] == "ok" and "API 1." in checks["engine"]["message"]
    assert checks["hub db"]["status"] == "ok"
    assert checks["queue db"]["status"] == "ok"
    assert doctor.queue_head() in checks["queue db"]["message"]
    assert checks["images"]["status"] == "ok"
    assert checks["docker disk"]["status"] == "ok" and "/" in checks["docker disk"]["message"]
    assert checks["backup disk"]["status"] == "ok"
    assert checks["clock"]["status"] == "ok"
    assert checks["frozen sessions"]["status"] == "ok"
    assert checks["hami-core"] == {**checks["hami-core"], "status": "ok"}
    assert "simulated" in checks["hami-core"]["message"]
    # No GPU here: a warning with simulated GPUs, never a pass.
    assert checks["gpus"]["status"] == "warn" and "1x8GiB" in checks["gpus"]["message"]
    # No hub runs at FGPU_HUB_PORT: said, not failed.
    assert checks["queue service"]["status"] == "warn"


def test_the_text_report_has_a_line_per_check_and_a_summary(state, capsys):
    assert cli.main(["doctor", *SMALL]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ok    engine")
    assert any(line.startswith("WARN  gpus") for line in lines)
    assert lines[-1].startswith("11 checks: ") and "0 failed" in lines[-1]


def test_an_engine_that_does_not_answer_fails_with_its_fix(state, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-such.sock'}")
    code, report = doctor_says(*SMALL)
    engine = by_name(report)["engine"]
    assert code == 1 and report["status"] == "fail"
    assert engine["status"] == "fail" and "no-such.sock" in engine["message"]
    assert "DOCKER_HOST" in engine["fix"]
    for needing_it in ("images", "docker disk", "clock"):
        assert by_name(report)[needing_it]["message"] == doctor.NO_ENGINE


def test_a_queue_db_file_that_is_no_database_fails(state, monkeypatch):
    junk = state / "junk.sqlite"
    junk.write_bytes(b"these are not the pages of a database " * 200)
    monkeypatch.setenv("FGPU_QUEUE_DB_URL", f"sqlite:///{junk}")
    code, report = doctor_says(*SMALL)
    queue_db = by_name(report)["queue db"]
    assert code == 1
    assert queue_db["status"] == "fail" and "not a database" in queue_db["message"]
    assert "FGPU_QUEUE_DB_URL" in queue_db["fix"]
    assert junk.read_bytes().startswith(b"these are not")  # left as it was


def test_an_unreachable_postgresql_fails_without_showing_its_password(state, monkeypatch):
    port = free_port()
    monkeypatch.setenv("FGPU_HUB_DB_URL", f"postgresql+psycopg://fgpu:s3cret@127.0.0.1:{port}/h")
    code, report = doctor_says(*SMALL, "--timeout", "3")
    hub_db = by_name(report)["hub db"]
    assert code == 1 and hub_db["status"] == "fail"
    assert f"127.0.0.1:{port}" in hub_db["message"]
    assert "s3cret" not in json.dumps(report)


def test_a_queue_db_behind_or_ahead_of_this_version_is_told(state_on, db_url):
    engine = create_engine(db_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '0005'"))
        code, report = doctor_says(*SMALL)
        assert code == 0 and by_name(report)["queue db"]["status"] == "warn"
        assert "upgrades it" in by_name(report)["queue db"]["fix"]
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        code, report = doctor_says(*SMALL)
        assert code == 1 and by_name(report)["queue db"]["status"] == "fail"
        assert "does not know" in by_name(report)["queue db"]["message"]
    finally:
        engine.dispose()


def test_a_catalog_image_that_is_not_on_the_engine_fails(state):
    db = open_database(f"sqlite:///{state / 'fgpu_queue.sqlite'}")
    ImageStore(db).add(CatalogImage("never-built", "Never built", MISSING_IMAGE))
    db.kw["bind"].dispose()
    code, report = doctor_says(*SMALL)
    images = by_name(report)["images"]
    assert code == 1 and images["status"] == "fail"
    assert f"never-built ({MISSING_IMAGE})" in images["message"]
    assert "build" in images["fix"]


def test_less_free_space_than_asked_fails(state):
    free = shutil.disk_usage(state).free
    code, report = doctor_says("--min-free-docker", "1M", "--min-free-backup", str(free * 2))
    backup = by_name(report)["backup disk"]
    assert code == 1 and backup["status"] == "fail"
    assert str(state) in backup["message"] and "--keep-days" in backup["fix"]


def test_hami_core_is_checked_where_gpu_sharing_is_hami(state, tmp_path):
    not_a_library = tmp_path / "libvgpu.so"
    not_a_library.write_text("nothing here")
    code, report = doctor_says(
        *SMALL, "--gpu-sharing", "hami", "--hami-library", str(not_a_library)
    )
    assert code == 1
    assert "is not a shared library" in by_name(report)["hami-core"]["message"]
    code, report = doctor_says(*SMALL, "--gpu-sharing", "hami", "--hami-library", "/nope.so")
    assert "does not exist" in by_name(report)["hami-core"]["message"]


def elf(path, mode=0o755):
    path.write_bytes(b"\x7fELF and the rest")
    path.chmod(mode)
    return str(path)


def test_hami_core_needs_its_shrreg_tool_which_starts_every_hami_session(tmp_path):
    library = elf(tmp_path / "libvgpu.so", 0o644)
    missing = doctor.check_hami("hami", library, str(tmp_path / "shrreg-tool"))
    assert missing.status == "fail"
    assert "shrreg-tool" in missing.message and "does not exist" in missing.message
    assert "scripts/gpu-node" in missing.fix
    not_runnable = doctor.check_hami("hami", library, elf(tmp_path / "tool", 0o644))
    assert (not_runnable.status, "is not executable" in not_runnable.message) == ("fail", True)
    both = doctor.check_hami("hami", library, elf(tmp_path / "shrreg-tool"))
    assert both.status == "ok" and "shrreg-tool" in both.message
    assert doctor.check_hami("simulated", library, "/nope").status == "ok"


def test_without_simulated_gpus_a_host_with_no_nvml_fails(state, monkeypatch):
    monkeypatch.delenv("FGPU_SIMULATED_GPUS")
    code, report = doctor_says(*SMALL, "--gpu-sharing", "none")
    gpus = by_name(report)["gpus"]
    assert code == 1 and gpus["status"] == "fail"
    assert "NVML" in gpus["message"] and "FGPU_SIMULATED_GPUS" in gpus["fix"]


@pytest.mark.hub
def test_the_running_services_health_is_asked(state, hub):
    code, report = doctor_says(*SMALL, "--hub-url", hub.url)
    service = by_name(report)["queue service"]
    assert service["status"] == "ok" and "/services/queue/api/health" in service["message"]


@pytest.mark.parametrize(
    "option, value", [("--min-free-docker", "lots"), ("--max-clock-skew", "-1")]
)
def test_a_bad_threshold_is_refused_by_the_options(capsys, option, value):
    with pytest.raises(SystemExit) as refused:
        cli.main(["doctor", option, value])
    assert refused.value.code == 2
    assert option in capsys.readouterr().err


# -- the pure parts ----------------------------------------------------------------------------


def node(name, state="ready", availability="active", **labels):
    return {
        "ID": name,
        "Description": {"Hostname": name, "Resources": {"NanoCPUs": 4e9, "MemoryBytes": 8 << 30}},
        "Status": {"State": state},
        "Spec": {"Availability": availability, "Labels": labels},
    }


def test_the_swarms_nodes_ready_down_and_drained():
    manager = node("mgr", **{"fgpu.role": "manager"})
    assert doctor.swarm_nodes_result([manager, node("a"), node("b")]).status == "ok"
    result = doctor.swarm_nodes_result(
        [manager, node("a"), node("b", state="down"), node("c", availability="drain")]
    )
    assert result.status == "warn"
    assert result.message == "3 node(s): 1 ready, 1 down (b), 1 drained or paused (c)"
    none_left = doctor.swarm_nodes_result([manager, node("b", state="down")])
    assert none_left.status == "fail" and "no node takes sessions" in none_left.message
    bad = doctor.swarm_nodes_result([node("a", **{"fgpu.simulated_gpus": "many"})])
    assert bad.status == "fail" and "a" in bad.message


def test_the_clock_is_compared_with_the_engines():
    engine_time = doctor.parse_engine_time("2026-11-26T04:27:07.158994782Z")
    assert engine_time == pytest.approx(1795667227.158994, abs=1e-5)
    assert doctor.parse_engine_time("2026-11-26T05:27:07.5+01:00") == engine_time - 0.158994 + 0.5
    assert doctor.clock_result(engine_time, engine_time + 1, 5).status == "ok"
    late = doctor.clock_result(engine_time, engine_time - 30, 5)
    assert late.status == "warn" and "30.0 s behind" in late.message


def test_image_references_without_a_tag_are_latest():
    present = {"fgpu/base:latest", "fgpu/x:1"}
    assert doctor.images_result({"a": "fgpu/base", "b": "fgpu/x:1"}, present, False).status == "ok"
    swarm = doctor.images_result({"c": "reg:5000/fgpu/y"}, present, True)
    assert swarm.status == "warn" and "registry" in swarm.fix


def test_the_hub_is_asked_where_the_config_makes_it_listen():
    assert doctor.default_hub_url({}) == "http://127.0.0.1:8000"
    assert doctor.default_hub_url({"FGPU_HUB_IP": "0.0.0.0", "FGPU_HUB_PORT": "80"}) == (
        "http://127.0.0.1:80"
    )
    assert doctor.default_hub_url({"FGPU_HUB_IP": "10.0.0.5"}) == "http://10.0.0.5:8000"
    assert doctor.default_hub_url({"FGPU_HUB_IP": "fd00::5"}) == "http://[fd00::5]:8000"


def test_an_engine_on_another_machine_has_its_disk_checked_there():
    assert doctor.engine_is_local(None) and doctor.engine_is_local("unix:///run/docker.sock")
    assert doctor.engine_is_local("tcp://127.0.0.1:2376")
    # TEST-NET-3 (RFC 5737): an address for documentation, which no machine here has.
    assert not doctor.engine_is_local("tcp://203.0.113.200:2376")


def test_the_report_puts_each_fix_under_its_check():
    results = [
        doctor.Result("engine", "ok", "answers"),
        doctor.Result("images", "fail", "x is missing", "build x"),
    ]
    assert doctor.format_report(results) == (
        "ok    engine  answers\n"
        "FAIL  images  x is missing\n"
        "              fix: build x\n"
        "2 checks: 1 ok, 0 warnings, 1 failed\n"
    )
    assert doctor.exit_code(results) == 1 and doctor.exit_code(results[:1]) == 0


def test_in_swarm_mode_the_labs_nodes_are_checked(state, lab, monkeypatch):
    for name, value in lab.env.items():
        monkeypatch.setenv(name, value)
    code, report = doctor_says(*SMALL)
    checks = by_name(report)
    assert (
        checks["engine"]["status"] == "ok" and lab.env["DOCKER_HOST"] in checks["engine"]["message"]
    )
    nodes = checks["swarm nodes"]
    assert nodes["status"] == "ok", nodes
    assert nodes["message"] == f"{len(lab.nodes)} node(s): {len(lab.nodes)} ready"


@pytest.mark.docker
def test_a_frozen_session_container_is_named_with_how_to_thaw_it(docker_engine):
    session_id = secrets.token_hex(8)
    container = docker_engine.containers.run(
        "fgpu/jupyter-base:py3.11",
        ["sleep", "600"],
        detach=True,
        labels={"fgpu.session_id": session_id, TEST_LABEL: "doctor-frozen"},
    )
    try:
        engine = doctor.EngineFacts.read(10)
        assert doctor.check_frozen_sessions(engine).status == "ok"
        path = freezer_file(container.id)
        path.write_text(freezer_value(path, frozen=True))
        result = doctor.check_frozen_sessions(engine)
        assert result.status == "warn"
        assert f"session {session_id} (container {container.id[:12]})" in result.message
        assert "THAWED" in result.fix
        path.write_text(freezer_value(path, frozen=False))
        container.pause()  # paused through the engine: named too
        assert session_id in doctor.check_frozen_sessions(engine).message
    finally:
        container.remove(force=True)


def _node(name, problems, stale=False):
    return {"node": name, "stale": stale, "isolation_problems": problems}


def test_a_node_whose_engine_does_not_keep_sessions_apart_fails_by_name():
    result = doctor.node_daemons_result(
        [
            _node("gpu-1", []),
            _node("gpu-2", ["icc unknown (the node's agent does not report it)"]),
            _node("gpu-3", ["icc is true: sessions reach one another"], stale=True),
        ]
    )
    assert result.status == doctor.FAIL
    assert result.message == "gpu-2: icc unknown (the node's agent does not report it)"
    assert "daemon.json" in result.fix
    # A service older than the field reports no problems at all: unknown, so it fails too.
    assert doctor.node_daemons_result([{"node": "gpu-1", "stale": False}]).status == doctor.FAIL
    assert doctor.node_daemons_result([_node("gpu-1", [])]).status == doctor.OK
    assert doctor.node_daemons_result([_node("gpu-1", [], stale=True)]).status == doctor.WARN


def test_without_an_admins_token_the_node_daemons_are_not_checked_and_it_says_how():
    result = doctor.check_node_daemons("http://127.0.0.1:1", "", 1)
    assert result.status == doctor.WARN and "FGPU_ADMIN_TOKEN" in result.fix
