"""The Sessions page's SSH dialog (contract 9, docs/source/howto/ssh.md) in Chromium against the
shared GPU hub: each running session's row has an SSH button whose dialog shows the exact `ssh`
and `sftp` commands (`user@host`, `user-server@host` for a named server, the service's port),
and the command copied from it logs in with Debian's ssh into that very session."""

from __future__ import annotations

import secrets
import shlex

import pytest
import requests
from playwright.sync_api import Page, expect

from .browser import SESSIONS_PAGE, log_in, rows, screenshot
from .harness import QueueUser
from .test_ssh_hub import LAB, PASSWORD_ONLY, Client, askpass, by_key, new_key, session_id  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]


@pytest.fixture(scope="module")
def cara(gpu_hub):
    """A student with a running default session and a named one, `lab`."""
    user = QueueUser(gpu_hub, f"cara-{secrets.token_hex(3)}")
    for server in ("", "lab"):
        response = gpu_hub.start_server(user.name, LAB, server=server)
        assert response.status_code in (201, 202), response.text
        gpu_hub.wait_ready(user.name, server)
    user.token = user.http.headers["Authorization"].split()[1]
    yield user
    gpu_hub.stop_servers({(user.name, ""), (user.name, "lab")})


def session_row(page: Page, server: str):
    """The running default session's row, or the named `server`'s. ("lab" is in every row's
    JupyterLab button: the default row is told by its "(default)".)"""
    running = rows(page, "RUNNING")
    return (
        running.filter(has_not_text="(default)") if server else running.filter(has_text="(default)")
    )


def open_sessions(page: Page, hub, user: QueueUser) -> None:
    """The Sessions page as `user`, with their two running sessions listed."""
    log_in(page, hub, user.name)
    page.goto(f"{hub.url}{SESSIONS_PAGE}")
    expect(rows(page, "RUNNING")).to_have_count(2)


def ssh_dialog(page: Page, server: str):
    """Open the SSH dialog of the running default session's row, or the named `server`'s; its
    (ssh, sftp) commands."""
    session_row(page, server).locator("button.fgpu-ssh").click()
    expect(page.locator("#fgpu-ssh")).to_be_visible()
    return page.input_value("#fgpu-ssh-command"), page.input_value("#fgpu-sftp-command")


def test_the_ssh_dialog_shows_commands_that_log_in_to_that_session(
    gpu_hub,
    page,
    cara,
    askpass,  # noqa: F811
):
    port = gpu_hub.env["FGPU_SSH_PORT"]
    open_sessions(page, gpu_hub, cara)
    for server, login in (("", cara.name), ("lab", f"{cara.name}-lab")):
        ssh, sftp = ssh_dialog(page, server)
        assert ssh == f"ssh -p {port} {login}@127.0.0.1"
        assert sftp == f"sftp -P {port} {cara.name}@127.0.0.1"
        page.click("#fgpu-ssh .fgpu-copy[data-copy=fgpu-ssh-command]")
        expect(page.locator("#fgpu-ssh-copied")).to_have_text(f"Copied: {ssh}")
        token_link = page.get_attribute("#fgpu-ssh-token-link", "href")
        assert token_link.endswith("/hub/token")
        if not server:
            screenshot(page, "ssh-dialog")
        page.click("#fgpu-ssh-close")
        expect(page.locator("#fgpu-ssh")).to_be_hidden()
        # The command as copied, run by Debian's ssh with the hub token as its password.
        argv = shlex.split(ssh)
        client = Client(gpu_hub, askpass, login, cara.token)
        run = client._run(
            [argv[0].replace("ssh", "/usr/bin/ssh"), "-T", *PASSWORD_ONLY, *argv[1:],
             "whoami; echo $FGPU_SESSION_ID"],
            "",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[1] == session_id(cara, server)


def test_the_ssh_buttons_wrap_with_the_apps_at_800_px(gpu_hub, page, cara):
    page.set_viewport_size({"width": 800, "height": 900})
    open_sessions(page, gpu_hub, cara)
    buttons = page.locator("button.fgpu-ssh")
    expect(buttons).to_have_count(2)
    for i in range(2):  # inside the page's width: nothing to scroll sideways for
        box = buttons.nth(i).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 800, box
    screenshot(page, "ssh-sessions-800")
    ssh_dialog(page, "lab")
    screenshot(page, "ssh-dialog-800")


def test_a_key_added_on_the_keys_page_logs_in_until_it_is_removed(gpu_hub, page, cara, tmp_path):
    key, public = new_key(tmp_path, "laptop")
    log_in(page, gpu_hub, cara.name)
    page.goto(f"{gpu_hub.url}{SESSIONS_PAGE}")
    ssh_dialog(page, "")
    page.click("#fgpu-ssh-keys-link")
    expect(page.locator("h1")).to_have_text("Your SSH keys")
    page.fill("#fgpu-ssh-key-text", public)
    page.click("#fgpu-ssh-key-add")
    listed = page.locator("#fgpu-ssh-keys tbody tr")
    expect(listed).to_have_count(1)
    expect(listed).to_contain_text("ssh-ed25519")
    expect(listed).to_contain_text("SHA256:")
    screenshot(page, "ssh-keys")
    page.set_viewport_size({"width": 800, "height": 900})
    screenshot(page, "ssh-keys-800")
    run = by_key(gpu_hub, cara.name, key, "echo $FGPU_SESSION_ID")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [session_id(cara)]

    page.click(".fgpu-ssh-key-remove")
    expect(page.locator("#fgpu-confirm")).to_contain_text("Remove this key?")
    page.click("#fgpu-confirm-go")
    expect(listed).to_have_count(0)
    assert by_key(gpu_hub, cara.name, key, "true").returncode == 255


def test_a_bad_key_shows_the_services_reason_and_adds_nothing(gpu_hub, page, cara):
    log_in(page, gpu_hub, cara.name)
    page.goto(f"{gpu_hub.url}{SESSIONS_PAGE.rstrip('/')}/ssh")
    page.fill("#fgpu-ssh-key-text", "ssh-ed25519 not-a-key me@laptop")
    page.click("#fgpu-ssh-key-add")
    error = page.locator("#fgpu-error")
    expect(error).to_be_visible()
    answer = cara.call("POST", "ssh-keys", json={"key": "ssh-ed25519 not-a-key me@laptop"})
    assert answer.status_code == 400
    expect(error).to_have_text(answer.json()["message"])
    expect(page.locator("#fgpu-ssh-keys tbody tr")).to_have_count(0)
    screenshot(page, "ssh-keys-refused")


def test_the_keys_page_sends_a_stranger_to_the_login_and_shows_only_ones_own_keys(
    gpu_hub, page, cara, tmp_path
):
    anonymous = requests.get(f"{gpu_hub.url}/services/queue/ssh", allow_redirects=False, timeout=60)
    assert anonymous.status_code == 302
    _, public = new_key(tmp_path, "cara")
    assert cara.call("POST", "ssh-keys", json={"key": public}).status_code == 201
    other = QueueUser(gpu_hub, f"dan-{secrets.token_hex(3)}")
    log_in(page, gpu_hub, other.name)
    page.goto(f"{gpu_hub.url}/services/queue/ssh")
    expect(page.locator("#fgpu-ssh-keys-none")).to_be_visible()
    expect(page.locator("#fgpu-ssh-keys tbody tr")).to_have_count(0)


def vscode_dialog(page: Page, server: str) -> tuple[str, str]:
    """Open the VS Code part of the dialog from the default session's row, or the named
    `server`'s; its (config block, link)."""
    session_row(page, server).locator("button.fgpu-vscode").click()
    expect(page.locator("#fgpu-ssh-title")).to_have_text("VS Code")
    expect(page.locator("#fgpu-vscode-part")).to_be_visible()
    expect(page.locator("#fgpu-ssh-part")).to_be_hidden()
    return page.input_value("#fgpu-vscode-config"), page.get_attribute("#fgpu-vscode-link", "href")


def test_the_vs_code_button_gives_the_ssh_config_that_vs_code_logs_in_with(
    gpu_hub,
    page,
    cara,
    askpass,  # noqa: F811
    tmp_path,
):
    """The block, as copied into an SSH config file, takes Debian's ssh into that session the
    way VS Code's Remote-SSH goes in: `ssh -T <alias> bash`, its script on the input."""
    port = gpu_hub.env["FGPU_SSH_PORT"]
    open_sessions(page, gpu_hub, cara)
    for server, login in (("", cara.name), ("lab", f"{cara.name}-lab")):
        block, link = vscode_dialog(page, server)
        alias = f"127.0.0.1-{login}"
        assert block == f"Host {alias}\n  HostName 127.0.0.1\n  Port {port}\n  User {login}"
        assert link == f"vscode://vscode-remote/ssh-remote+{alias}/home/jovyan"
        page.click("#fgpu-ssh .fgpu-copy[data-copy=fgpu-vscode-config]")
        expect(page.locator("#fgpu-ssh-copied")).to_contain_text(f"Host {alias}")
        if not server:
            screenshot(page, "vscode-dialog")
            page.set_viewport_size({"width": 800, "height": 900})
            screenshot(page, "vscode-dialog-800")
            page.set_viewport_size({"width": 1280, "height": 900})
            screenshot(page, "vscode-dialog-1280")
        page.click("#fgpu-ssh-close")
        # The SSH button still opens the SSH part.
        ssh, _ = ssh_dialog(page, server)
        expect(page.locator("#fgpu-ssh-title")).to_have_text("SSH and SFTP")
        expect(page.locator("#fgpu-vscode-part")).to_be_hidden()
        page.click("#fgpu-ssh-close")
        config = tmp_path / f"config-{server or 'default'}"
        config.write_text(block + "\n")
        client = Client(gpu_hub, askpass, login, cara.token)
        run = client._run(
            ["/usr/bin/ssh", "-F", str(config), "-T", *PASSWORD_ONLY, alias, "bash"],
            'echo "$(whoami) $FGPU_SESSION_ID"\nexit 3\n',
        )
        assert run.returncode == 3, run.stderr
        assert run.stdout.split() == ["jovyan", session_id(cara, server)]
