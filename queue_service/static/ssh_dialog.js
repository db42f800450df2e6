// The SSH dialog of the Sessions page: the exact `ssh` and `sftp` commands for one running
// session (contract 9: `user@host`, `user-server@host` for a named server), each with a Copy
// button. The host is the one the browser used, the port the service's ssh_port.
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

  function open(session) {
    var c = commands(session);
    document.getElementById("fgpu-ssh-command").value = c.ssh;
    document.getElementById("fgpu-sftp-command").value = c.sftp;
    document.getElementById("fgpu-ssh-token-link").href = config.tokenPage;
    // The service's own pages sit next to its api/ (the SSH keys page: "ssh").
    document.getElementById("fgpu-ssh-keys-link").href = config.api.replace(/api\/$/, "ssh");
    copied.classList.add("d-none");
    dialog.showModal();
  }

  function copy(input) {
    input.select();
    function said() {
      copied.textContent = "Copied: " + input.value;
      copied.classList.remove("d-none");
    }
    (navigator.clipboard ? navigator.clipboard.writeText(input.value) : Promise.reject())
      .then(said, function () { document.execCommand("copy"); said(); });
  }

  dialog.querySelectorAll(".fgpu-copy").forEach(function (button) {
    button.addEventListener("click", function () { copy(document.getElementById(button.dataset.copy)); });
  });

  // The button next to a running session's apps.
  function button(session) {
    var b = el("button", { type: "button", className: "btn btn-sm btn-outline-primary fgpu-ssh", text: "SSH" });
    b.addEventListener("click", function () { open(session); });
    return b;
  }

  return { button: button };
})();
