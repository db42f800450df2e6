"""fgpu_admin/gpu_node.py: reading nvidia-smi (table and CSV, a plain card and one HAMi-core caps),
the driver and OS checks, the daemon.json merge, and the self-check's verdict.

The samples are nvidia-smi's output as drivers 470, 535 and 550 print it; the capped ones are what
HAMi-core's NVML hooks make nvidia-smi print inside a session granted half of an 8 GiB card.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fgpu_admin import gpu_node
from fgpu_admin.gpu_node import (
    SELFCHECK_PREFIX,
    InputError,
    check_capped,
    daemon_config_problems,
    driver_problem,
    hami_limits,
    load_daemon_config,
    merge_daemon_config,
    os_problem,
    parse_os_release,
    parse_smi,
    parse_smi_csv,
    parse_smi_table,
    selfcheck_env,
)
from fgpu_spawner.gpu_sharing import build_gpu_settings, hami_region_first_prefix
from fgpu_spawner.grant import Grant

from .harness import ROOT

TABLE_535 = """\
Tue Nov 25 14:02:11 2026
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.129.03             Driver Version: 535.129.03   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
|                                         |                      |               MIG M. |
|=========================================+======================+======================|
|   0  NVIDIA GeForce RTX 3070        Off | 00000000:01:00.0 Off |                  N/A |
|  0%   38C    P8              12W / 220W |      1MiB /  8192MiB |      0%      Default |
|                                         |                      |                  N/A |
+-----------------------------------------+----------------------+----------------------+

+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|  No running processes found                                                           |
+---------------------------------------------------------------------------------------+
"""

TABLE_470_TWO_GPUS = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 470.82.01    Driver Version: 470.82.01    CUDA Version: 11.4     |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|                               |                      |               MIG M. |
|===============================+======================+======================|
|   0  Tesla V100-SXM2...  On   | 00000000:00:1E.0 Off |                    0 |
| N/A   34C    P0    41W / 300W |   2510MiB / 32510MiB |     17%      Default |
|                               |                      |                  N/A |
+-------------------------------+----------------------+----------------------+
|   1  Tesla V100-SXM2...  On   | 00000000:00:1F.0 Off |                    0 |
| N/A   32C    P0    24W / 300W |      0MiB / 32510MiB |      0%      Default |
|                               |                      |                  N/A |
+-------------------------------+----------------------+----------------------+

+-----------------------------------------------------------------------------+
| Processes:                                                                  |
|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |
|        ID   ID                                                   Usage      |
|=============================================================================|
|    0   N/A  N/A     21734      C   python                           2507MiB |
+-----------------------------------------------------------------------------+
"""

# Inside a session granted 0.5 of the RTX 3070 above: HAMi-core's NVML hooks report the limit,
# 4096 MiB, as the card's memory (what the seeds' walk-through shows: "about 2 GB" of a 4 GB share).
CAPPED_TABLE = """\
[HAMI-core Msg(7:140352213526336:libvgpu.c:836)]: Initializing.....
Tue Nov 25 14:05:40 2026
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.129.03             Driver Version: 535.129.03   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
|                                         |                      |               MIG M. |
|=========================================+======================+======================|
|   0  NVIDIA GeForce RTX 3070        Off | 00000000:01:00.0 Off |                  N/A |
|  0%   38C    P8              12W / 220W |      0MiB /  4096MiB |      0%      Default |
|                                         |                      |                  N/A |
+-----------------------------------------+----------------------+----------------------+

+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|  No running processes found                                                           |
+---------------------------------------------------------------------------------------+
[HAMI-core Msg(7:140352213526336:multiprocess_memory_limit.c:497)]: Calling exit handler 7
"""

CSV_WITH_HEADER = """\
index, uuid, name, memory.total [MiB], memory.used [MiB], driver_version
0, GPU-1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718, NVIDIA A100-SXM4-40GB, 40960 MiB, 0 MiB, 550.54.15
1, GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4, NVIDIA A100-SXM4-40GB, 40960 MiB, 1203 MiB, 550.54.15
"""

# What scripts/gpu-node queries: --query-gpu=index,uuid,memory.total,name,driver_version
SCRIPT_FIELDS = ["index", "uuid", "memory.total", "name", "driver_version"]
CSV_NOHEADER_NOUNITS = (
    "0, GPU-5a3c9e1f-6b1d-4c7e-9a3f-1e2d3c4b5a69, 8192, NVIDIA GeForce RTX 3070, 535.129.03\n"
)

# The self-check's first command in the session: --query-gpu=memory.total,noheader,nounits.
CAPPED_CSV = "4096\n"


# --- nvidia-smi ----------------------------------------------------------------------------


def test_the_table_of_driver_535_gives_driver_cuda_and_the_cards_memory():
    report = parse_smi_table(TABLE_535)
    assert report.driver_version == "535.129.03"
    assert report.cuda_version == "12.2"
    [gpu] = report.gpus
    assert (gpu.index, gpu.name, gpu.memory_used_mib, gpu.memory_total_mib) == (
        0,
        "NVIDIA GeForce RTX 3070",
        1,
        8192,
    )


def test_the_older_table_lists_each_gpu_once_and_ignores_the_process_rows():
    report = parse_smi(TABLE_470_TWO_GPUS)
    assert report.driver_version == "470.82.01"
    assert [(g.index, g.memory_used_mib, g.memory_total_mib) for g in report.gpus] == [
        (0, 2510, 32510),
        (1, 0, 32510),
    ]
    assert report.gpus[0].name == "Tesla V100-SXM2..."


def test_a_hami_capped_session_table_shows_the_limit_as_the_total():
    report = parse_smi(CAPPED_TABLE)
    [gpu] = report.gpus
    assert gpu.memory_total_mib == 4096
    assert report.driver_version == "535.129.03"


def test_csv_with_a_header_names_its_own_columns_and_units():
    report = parse_smi(CSV_WITH_HEADER)
    assert report.driver_version == "550.54.15"
    assert [(g.index, g.uuid, g.memory_total_mib, g.memory_used_mib) for g in report.gpus] == [
        (0, "GPU-1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718", 40960, 0),
        (1, "GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4", 40960, 1203),
    ]


def test_csv_without_header_or_units_takes_the_query_fields():
    report = parse_smi_csv(CSV_NOHEADER_NOUNITS, SCRIPT_FIELDS)
    [gpu] = report.gpus
    assert gpu.uuid == "GPU-5a3c9e1f-6b1d-4c7e-9a3f-1e2d3c4b5a69"
    assert gpu.memory_total_mib == 8192
    assert gpu.name == "NVIDIA GeForce RTX 3070"
    assert report.driver_version == "535.129.03"


@pytest.mark.parametrize(
    "text, fields, message",
    [
        ("", None, "no GPU"),
        ("index, name\n0, X\n", None, "no memory.total"),
        ("0, GPU-a, [N/A], X, 535.1\n", SCRIPT_FIELDS, "not a size"),
        ("0, GPU-a, 8192\n", SCRIPT_FIELDS, "has 3 fields, not 5"),
        ("0, GPU-a, 10, X, 535.1\n1, GPU-b, 10, X, 550.2\n", SCRIPT_FIELDS, "several driver"),
    ],
)
def test_output_that_is_not_what_it_should_be_is_refused_with_a_reason(text, fields, message):
    with pytest.raises(InputError, match=message):
        parse_smi(text, fields)


def test_a_table_without_header_or_gpu_rows_is_refused():
    with pytest.raises(InputError, match="not nvidia-smi's table"):
        parse_smi_table("| 1MiB / 2MiB |\n")  # not even a GPU row before it
    with pytest.raises(InputError):
        parse_smi_table("NVIDIA-SMI has failed because it couldn't communicate with the driver")


# --- driver and OS --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, ok",
    [
        ("535.129.03", True),
        ("525.60.13", True),
        ("550.54.15", True),
        ("570.86.15", True),
        ("525.60.12", False),
        ("470.82.01", False),
    ],
)
def test_the_driver_must_be_at_least_cuda_12s_minimum(version, ok):
    problem = driver_problem(version)
    assert (problem is None) is ok
    if not ok:
        assert version in problem and "525.60.13" in problem


def test_no_driver_version_and_a_garbled_one_are_problems():
    assert "without a driver version" in driver_problem(None)
    with pytest.raises(InputError, match="not a version"):
        driver_problem("535.x")


DEBIAN_12 = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'
UBUNTU_2204 = 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n'


@pytest.mark.parametrize(
    "text, problem",
    [
        (DEBIAN_12, None),
        (UBUNTU_2204, None),
        ('ID=ubuntu\nVERSION_ID="20.04"\n', None),
        ('ID=debian\nVERSION_ID="10"\nPRETTY_NAME="Debian GNU/Linux 10 (buster)"\n', "too old"),
        ('ID=ubuntu\nVERSION_ID="18.04"\n', "ubuntu 20.04 or newer"),
        (
            'ID=fedora\nVERSION_ID=40\nPRETTY_NAME="Fedora Linux 40"\n',
            "Fedora Linux 40 is not Debian",
        ),
        ('ID=debian\nPRETTY_NAME="Debian GNU/Linux trixie/sid"\n', "no VERSION_ID"),
    ],
)
def test_debian_11_and_ubuntu_20_04_or_newer_are_supported(text, problem):
    found = os_problem(parse_os_release(text))
    if problem is None:
        assert found is None
    else:
        assert problem in found


# --- daemon.json ----------------------------------------------------------------------------

SITE_DAEMON_JSON = {
    "default-runtime": "nvidia",
    "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    "log-driver": "json-file",
    "log-opts": {"max-size": "10m"},
    "icc": True,
}


def test_the_merge_sets_the_two_settings_and_keeps_every_other_key():
    merged, changes = merge_daemon_config(SITE_DAEMON_JSON)
    assert merged == {**SITE_DAEMON_JSON, "icc": False, "no-new-privileges": True}
    assert changes == ["no-new-privileges: unset -> true", "icc: true -> false"]
    assert SITE_DAEMON_JSON["icc"] is True  # the input is not changed


def test_merging_a_merged_config_changes_nothing():
    merged, _ = merge_daemon_config(SITE_DAEMON_JSON)
    again, changes = merge_daemon_config(merged)
    assert again == merged and changes == []


def test_a_truthy_value_that_is_not_the_boolean_is_corrected():
    merged, changes = merge_daemon_config({"no-new-privileges": 1, "icc": 0})
    assert merged == {"no-new-privileges": True, "icc": False}
    assert len(changes) == 2


def test_the_problems_of_a_config_name_what_is_missing():
    assert (
        daemon_config_problems({**SITE_DAEMON_JSON, "icc": False, "no-new-privileges": True}) == []
    )
    problems = daemon_config_problems({"log-driver": "journald"})
    assert len(problems) == 4
    assert any('"default-runtime" is null' in p for p in problems)
    assert any('"icc" is unset, not false' in p for p in problems)
    assert daemon_config_problems({"log-driver": "journald"}, runtime_only=True) == problems[:2]


@pytest.mark.parametrize("text", ["{", "[1, 2]", '"nvidia"'])
def test_a_daemon_json_that_is_no_object_is_refused(text):
    with pytest.raises(InputError, match="fix it by hand first"):
        load_daemon_config(text)


def test_an_empty_daemon_json_is_an_empty_config():
    assert load_daemon_config("") == {} and load_daemon_config("  \n") == {}


def run_module(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """The command line as scripts/gpu-node calls it: the system's python3 and the repo on
    PYTHONPATH, no virtualenv."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        ["python3", "-s", "-m", "fgpu_admin.gpu_node", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=30,
    )


def test_merge_daemon_json_twice_leaves_the_same_file(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps(SITE_DAEMON_JSON))
    path.chmod(0o600)
    first = run_module("merge-daemon-json", str(path))
    assert first.returncode == 0, first.stderr
    assert "icc: true -> false" in first.stdout
    after_first = path.read_bytes()
    assert json.loads(after_first) == {**SITE_DAEMON_JSON, "icc": False, "no-new-privileges": True}
    stat_first = path.stat()
    second = run_module("merge-daemon-json", str(path))
    assert second.returncode == 0 and second.stdout.strip().endswith("unchanged")
    assert path.read_bytes() == after_first
    assert path.stat().st_mtime_ns == stat_first.st_mtime_ns  # not even rewritten
    assert oct(path.stat().st_mode & 0o777) == "0o600"  # the file keeps its mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json"]  # no temporary left


def test_merge_daemon_json_creates_a_missing_file(tmp_path):
    path = tmp_path / "docker" / "daemon.json"
    result = run_module("merge-daemon-json", str(path))
    assert result.returncode == 0, result.stderr
    assert json.loads(path.read_text()) == {"no-new-privileges": True, "icc": False}


def test_merge_daemon_json_refuses_broken_json_and_leaves_it_alone(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"icc": true,')
    result = run_module("merge-daemon-json", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith("error: daemon.json is not valid JSON")
    assert len(result.stderr.strip().splitlines()) == 1
    assert path.read_text() == '{"icc": true,'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json"]


# --- the self-check ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "memory_mib, fraction",
    [(8192, 0.5), (40960, 0.5), (32510, 0.2), (24564, 0.25), (8192, 1.0), (8192, 0.001)],
)
def test_the_self_checks_limits_are_the_spawners(memory_mib, fraction):
    """The self-check sets up its session with gpu_node's numbers; a `hami` session gets the
    spawner's. They must be the same, or the check proves nothing about real sessions."""
    uuid = "GPU-5a3c9e1f-6b1d-4c7e-9a3f-1e2d3c4b5a69"
    spawner = build_gpu_settings(
        Grant("sess-1", "node1", {uuid: fraction}), {uuid: memory_mib * 1024**2}, "hami"
    ).env
    ours = selfcheck_env(memory_mib, fraction, uuid)
    assert {k: spawner[k] for k in ours} == ours


def test_the_self_check_starts_its_command_as_the_spawner_starts_a_hami_session():
    assert list(SELFCHECK_PREFIX) == hami_region_first_prefix()


def test_the_selfcheck_prefix_command_prints_the_prefix_one_argument_a_line(capsys):
    assert gpu_node.main(["selfcheck-prefix"]) == 0
    assert capsys.readouterr().out.splitlines() == list(SELFCHECK_PREFIX)


def test_half_an_8_gib_card_is_4096_mib_and_50_percent():
    assert hami_limits(8192, 0.5) == (4096, 50)
    with pytest.raises(InputError):
        hami_limits(8192, 1.5)


def test_a_capped_table_passes_the_self_check():
    result = check_capped(CAPPED_TABLE, expected_mib=4096, card_mib=8192)
    assert result.ok, result.message
    assert "4096 MiB of the card's 8192 MiB" in result.message


def test_the_self_checks_csv_and_table_together_pass():
    assert check_capped(CAPPED_CSV + CAPPED_TABLE, 4096, 8192).ok


def test_the_whole_card_in_the_session_means_hami_core_is_not_loaded():
    result = check_capped(TABLE_535, expected_mib=4096, card_mib=8192)
    assert not result.ok
    assert "whole card (8192 MiB)" in result.message and "not loaded" in result.message
    assert not check_capped("8192\n", 4096, 8192).ok


def test_another_total_than_the_grant_fails():
    result = check_capped("2048\n", 4096, 8192)
    assert not result.ok and "2048 MiB; expected 4096" in result.message


def test_a_hami_core_error_fails_the_self_check_even_with_the_capped_figure():
    output = (
        "[HAMI-core ERROR (pid:7 thread=140352213526336 multiprocess_memory_limit.c:1092)]: "
        "Fail to open shrreg /usr/local/vgpu/cache/cudevshr.cache: errno=13\n" + CAPPED_TABLE
    )
    result = check_capped(output, 4096, 8192)
    assert not result.ok
    assert "Fail to open shrreg" in result.message


def test_no_gpu_in_the_session_fails():
    result = check_capped("No devices were found\n", 4096, 8192)
    assert not result.ok and "listed no GPU" in result.message


def test_check_capped_on_the_command_line_exits_by_the_verdict():
    ok = run_module("check-capped", "--card-mib", "8192", stdin=CAPPED_CSV + CAPPED_TABLE)
    assert ok.returncode == 0 and "capped" in ok.stdout
    uncapped = run_module("check-capped", "--card-mib", "8192", stdin=TABLE_535)
    assert uncapped.returncode == 1 and "not loaded" in uncapped.stderr


def test_driver_check_on_the_command_line_lists_gpus_or_stops():
    fields = ",".join(SCRIPT_FIELDS)
    ok = run_module("driver-check", "--fields", fields, stdin=CSV_NOHEADER_NOUNITS)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == (
        "0\tGPU-5a3c9e1f-6b1d-4c7e-9a3f-1e2d3c4b5a69\t8192\tNVIDIA GeForce RTX 3070\n"
    )
    old = CSV_NOHEADER_NOUNITS.replace("535.129.03", "470.82.01")
    too_old = run_module("driver-check", "--fields", fields, stdin=old)
    assert too_old.returncode == gpu_node.EXIT_NOT_READY and "470.82.01" in too_old.stderr
    garbled = run_module("driver-check", "--fields", fields, stdin="0, GPU-a\n")
    assert garbled.returncode == 2 and garbled.stderr.startswith("error: ")


def test_parse_smi_prints_json_for_a_person_to_read():
    result = run_module("parse-smi", stdin=CSV_WITH_HEADER)
    assert result.returncode == 0
    assert json.loads(result.stdout)["gpus"][1]["memory_used_mib"] == 1203


def test_the_module_needs_nothing_but_the_standard_library():
    """A GPU node has the system's python3 and no virtualenv: importing the module must pull in
    no third-party package and nothing else of the project."""
    code = (
        "import sys, fgpu_admin.gpu_node; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'fgpu_spawner', 'queue_service', 'image_catalog', 'docker', 'yaml', 'jupyterhub'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd="/",
        check=True,
    )
    assert result.stdout.strip() == "[]"


def test_the_registry_rule_rejects_the_containers_traffic_to_it_first_in_docker_user():
    assert gpu_node.parse_registry("registry.example.org:5000") == ("registry.example.org", 5000)
    for bad in ("registry.example.org", ":5000", "r:0", "r:http", "https://r:5000"):
        with pytest.raises(gpu_node.InputError, match="--registry takes HOST:PORT"):
            gpu_node.parse_registry(bad)
    dropin = gpu_node.registry_dropin(["10.0.0.6", "10.0.0.5", "10.0.0.6"], 5000)
    rule = "-d 10.0.0.5/32 -p tcp --dport 5000 -j REJECT --reject-with tcp-reset"
    assert "[Service]" in dropin.splitlines()
    commands = [line for line in dropin.splitlines() if line.startswith("ExecStartPost=")]
    assert commands == [
        f"ExecStartPost=/bin/sh -c 'iptables -C DOCKER-USER {rule} 2>/dev/null || "
        f"iptables -I DOCKER-USER 1 {rule}'",
        "ExecStartPost=/bin/sh -c 'iptables -C DOCKER-USER "
        + rule.replace("10.0.0.5", "10.0.0.6")
        + " 2>/dev/null || iptables -I DOCKER-USER 1 "
        + rule.replace("10.0.0.5", "10.0.0.6")
        + "'",
    ]
