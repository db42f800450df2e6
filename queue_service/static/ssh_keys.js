// The SSH keys page: the caller's keys (api/ssh-keys), add one from a pasted line, remove one
// after asking.
"use strict";

(function () {
  var el = fgpu.element;
  var tbody = document.querySelector("#fgpu-ssh-keys tbody");
  var errorBox = document.getElementById("fgpu-error");

  function showError(message) { fgpu.showMessage(errorBox, message); }

  function row(key) {
    var words = (key.key || "").split(/\s+/);
    var remove = el("button", { type: "button", className: "btn btn-sm btn-outline-danger fgpu-ssh-key-remove", text: "Remove" });
    remove.addEventListener("click", function () {
      fgpu.confirmAction({
        title: "Remove this key?", confirm: "Remove", keep: "Keep",
        lines: ["Logins with " + key.fingerprint + " stop working at once."],
      }).then(function (yes) {
        if (yes) fgpu.api("DELETE", "ssh-keys/" + key.id).then(load, function (e) { showError(e.message); });
      });
    });
    return el("tr", { "data-fingerprint": key.fingerprint }, [
      el("td", { "data-label": "Type", text: words[0] || "" }),
      el("td", { "data-label": "Comment", text: key.title || words.slice(2).join(" ") || "—" }),
      el("td", { "data-label": "Fingerprint", className: "font-monospace text-break", text: key.fingerprint }),
      el("td", { "data-label": "Added", text: key.created ? fgpu.time(key.created) : "—" }),
      el("td", {}, [remove]),
    ]);
  }

  function load() {
    return fgpu.api("GET", "ssh-keys").then(function (answer) {
      tbody.replaceChildren.apply(tbody, answer.keys.map(row));
      document.getElementById("fgpu-ssh-keys-none").classList.toggle("d-none", answer.keys.length > 0);
      document.getElementById("fgpu-ssh-keys").classList.toggle("d-none", !answer.keys.length);
    }, function (e) { showError(e.message); });
  }

  document.getElementById("fgpu-ssh-key-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var text = document.getElementById("fgpu-ssh-key-text");
    fgpu.api("POST", "ssh-keys", { key: text.value.trim() }).then(function () {
      showError("");
      text.value = "";
      load();
    }, function (e) { showError(e.message); });
  });
  load();
})();
