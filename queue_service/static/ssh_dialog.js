// The SSH dialog of the Sessions page: the exact `ssh` and `sftp` commands for one running
// session (contract 9: `user@host`, `user-server@host` for a named server), each with a Copy
// button. The host is the one the browser used, the port the service's ssh_port. Its VS Code
// part (the launcher's "VS Code" button): the `Host` block for ~/.ssh/config and the link that
// opens VS Code's Remote-SSH on that host, which reaches the session through the SSH service
// (a shell, then a forward from inside the session: queue_service/ssh/forwarding.py).
"use strict";

var fgpuSsh = (function () {
  var config = fgpu.config, el = fgpu.element;
  var dialog = document.getElementById("fgpu-ssh");
  var copied = document.getElementById("fgpu-ssh-copied");

  function login(session) {
    return session.user + (session.server_name ? "-" + session.server_name : "");
  }

  function commands(session) {
    var host = "@" + window.location.hostname;
    // SFTP reaches the user's files, whichever session: the plain user name.
    return { ssh: "ssh -p " + config.sshPort + " " + login(session) + host, sftp: "sftp -P " + config.sshPort + " " + session.user + host };
  }

  // The name VS Code knows the session by: the host and the login, in the letters an SSH alias
  // and VS Code's `ssh-remote+` address both take (an `@` there would split user from host).
  function alias(session) {
    return (window.location.hostname + "-" + login(session)).replace(/[^A-Za-z0-9._-]/g, "-");
  }

  function vscodeConfig(session) {
    return ["Host " + alias(session), "  HostName " + window.location.hostname,
      "  Port " + config.sshPort, "  User " + login(session)].join("\n");
  }

  function open(session, vscode) {
    var c = commands(session);
    document.getElementById("fgpu-ssh-title").textContent = vscode ? "VS Code" : "SSH and SFTP";
    document.getElementById("fgpu-ssh-part").classList.toggle("d-none", vscode);
    document.getElementById("fgpu-vscode-part").classList.toggle("d-none", !vscode);
    document.getElementById("fgpu-ssh-command").value = c.ssh;
    document.getElementById("fgpu-sftp-command").value = c.sftp;
    document.getElementById("fgpu-vscode-config").value = vscodeConfig(session);
    document.getElementById("fgpu-vscode-host").textContent = alias(session);
    document.getElementById("fgpu-vscode-link").href =
      "vscode://vscode-remote/ssh-remote+" + alias(session) + "/home/jovyan";
    document.getElementById("fgpu-ssh-token-link").href = config.tokenPage;
    // The service's own pages sit next to its api/ (the SSH keys page: "ssh").
    document.getElementById("fgpu-ssh-keys-link").href = config.api.replace(/api\/$/, "ssh");
    copied.classList.add("d-none");
    dialog.showModal();
  }

  function copy(input) {
    input.select();
    function said() {
      // A block of lines: its first, which names it.
      var lines = input.value.split("\n");
      copied.textContent = "Copied: " + lines[0] + (lines.length > 1 ? " …" : "");
      copied.classList.remove("d-none");
    }
    (navigator.clipboard ? navigator.clipboard.writeText(input.value) : Promise.reject())
      .then(said, function () { document.execCommand("copy"); said(); });
  }

  dialog.querySelectorAll(".fgpu-copy").forEach(function (button) {
    button.addEventListener("click", function () { copy(document.getElementById(button.dataset.copy)); });
  });

  // The buttons next to a running session's apps: SSH, and VS Code (the dialog's VS Code part).
  function button(session) {
    var b = el("button", { type: "button", className: "btn btn-sm btn-outline-primary fgpu-ssh", text: "SSH" });
    b.addEventListener("click", function () { open(session, false); });
    return b;
  }

  function vscodeButton(session) {
    var b = el("button", { type: "button", className: "btn btn-sm btn-outline-primary fgpu-vscode", text: "VS Code" });
    b.addEventListener("click", function () { open(session, true); });
    return b;
  }

  return { button: button, vscodeButton: vscodeButton };
})();
