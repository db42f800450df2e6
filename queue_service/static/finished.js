// The Sessions page's Finished tab: ended sessions, newest first, a page at a time, from
// api/sessions?finished=1 (the service's DB); admins filter by user, everyone by reason.
"use strict";

(function () {
  var config = fgpu.config, el = fgpu.element;
  var PAGE = 50;
  var tabs = { active: document.getElementById("fgpu-tab-active"), finished: document.getElementById("fgpu-tab-finished") };
  var panes = { active: document.getElementById("fgpu-active-pane"), finished: document.getElementById("fgpu-finished-pane") };
  var table = document.getElementById("fgpu-finished");
  var tbody = table.querySelector("tbody");
  var reasonSelect = document.getElementById("fgpu-finished-reason");
  var userInput = document.getElementById("fgpu-finished-user");
  var errorBox = document.getElementById("fgpu-finished-error");
  var older = document.getElementById("fgpu-finished-older"), newer = document.getElementById("fgpu-finished-newer");
  var offset = 0, timer = null, round = 0;

  function show(name) {
    Object.keys(tabs).forEach(function (key) {
      tabs[key].classList.toggle("active", key === name);
      tabs[key].setAttribute("aria-selected", String(key === name));
      panes[key].classList.toggle("d-none", key !== name);
    });
    // The Active tab's user filter (admins) does not apply here: the Finished tab has its own.
    [document.getElementById("fgpu-user-filter"), document.querySelector('label[for="fgpu-user-filter"]')]
      .forEach(function (node) { if (node) node.classList.toggle("d-none", name !== "active"); });
    clearTimeout(timer);
    if (name === "finished") load();
  }

  function seconds(total) {
    if (total === null || total === undefined) return "—";
    var s = Math.floor(total), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return h + ":" + String(m).padStart(2, "0") + ":" + String(s % 60).padStart(2, "0");
  }

  function query() {
    var parts = ["finished=1", "limit=" + PAGE, "offset=" + offset];
    if (userInput && userInput.value.trim()) parts.push("user=" + encodeURIComponent(userInput.value.trim()));
    if (reasonSelect.value) parts.push("reason=" + encodeURIComponent(reasonSelect.value));
    return "sessions?" + parts.join("&");
  }

  // A batch job's reason without its leading code: "failed: the job exited with code 3; …" reads
  // "The job exited with code 3; …" under the label "Job failed".
  function jobReason(s) {
    var text = s.reason || "";
    if (s.end_reason && text.indexOf(s.end_reason + ": ") === 0) text = text.slice(s.end_reason.length + 2);
    return text ? text.charAt(0).toUpperCase() + text.slice(1) : "";
  }

  function reasonCell(s) {
    var children = [el("span", { className: "fgpu-end-reason", text: s.end_reason_label || s.end_reason || "—" })];
    var job = s.type === "batch";
    if (job && s.exit_code !== null && s.exit_code !== undefined && s.exit_code !== 0) {
      children.push(el("span", { className: "fgpu-exit-code", text: "exit code " + s.exit_code }));
    }
    // The words beside the code, when they say more than its label (a node's name, an exit code).
    var words = job ? jobReason(s) : s.reason;
    if (words) children.push(el("div", { className: "fgpu-pending-detail fgpu-end-detail", text: words }));
    return el("td", { "data-reason": s.end_reason || "" }, children);
  }

  // A job's name with its badge and what it ran (the whole of it on hover).
  function nameCell(s) {
    var cell = fgpu.nameCell(s.server_name || "(default)");
    if (s.type !== "batch" || !s.job) return cell;
    var what = s.job.command !== undefined ? "Command: " + s.job.command : "Notebook: " + s.job.notebook +
      (s.job.parameters && Object.keys(s.job.parameters).length ? " with " + Object.keys(s.job.parameters).map(function (name) {
        return name + " = " + JSON.stringify(s.job.parameters[name]);
      }).join(", ") : "");
    cell.appendChild(el("div", {}, [el("span", { className: "badge fgpu-job-badge", text: "Batch job" })]));
    var shown = what.replace(/\s+/g, " ");
    cell.appendChild(el("div", { className: "fgpu-job-what", title: what, text: shown.length > 60 ? shown.slice(0, 59) + "…" : shown }));
    return cell;
  }

  function row(s) {
    var cells = [
      el("td", { className: "fgpu-id", title: s.id, text: s.id.slice(0, 8) }),
      nameCell(s),
      config.admin ? el("td", { className: "fgpu-user", text: s.user }) : null,
      fgpu.nameCell(s.image),
      el("td", { text: fgpu.trim(s.cpu) }),
      el("td", { text: fgpu.size(s.mem) }),
      el("td", { text: fgpu.trim(s.fgpu) }),
      el("td", { className: "fgpu-started", text: fgpu.time(s.started) }),
      el("td", { className: "fgpu-ended", text: fgpu.time(s.ended) }),
      el("td", { className: "fgpu-duration", text: seconds(s.duration) }),
      reasonCell(s),
    ];
    return el("tr", { "data-session": s.id, "data-user": s.user, "data-end-reason": s.end_reason || "", "data-type": s.type || "interactive" }, cells);
  }

  function offerReasons(reasons) {
    if (reasonSelect.options.length > 1) return;
    Object.keys(reasons || {}).forEach(function (code) {
      reasonSelect.appendChild(el("option", { value: code, text: reasons[code] }));
    });
  }

  function render(data) {
    offerReasons(data.reasons);
    tbody.replaceChildren.apply(tbody, data.sessions.map(row));
    document.getElementById("fgpu-finished-empty").classList.toggle("d-none", data.sessions.length > 0);
    older.disabled = data.next_offset === null || data.next_offset === undefined;
    newer.disabled = offset === 0;
    errorBox.classList.add("d-none");
    table.setAttribute("data-updated", String(Date.now()));
  }

  // Read now, then again every 10 s while the tab is open (sessions keep ending). Only the
  // latest read is shown: the answer to the tab's first read, slow under load, came after the
  // one to a filter applied meanwhile and showed everyone's sessions under that filter.
  function load() {
    var mine = ++round;
    clearTimeout(timer);
    fgpu.api("GET", query()).then(function (data) {
      if (mine === round) render(data);
    }, function (e) {
      if (mine !== round) return;
      errorBox.textContent = "Could not read the finished sessions: " + e.message;
      errorBox.classList.remove("d-none");
    }).then(function () {
      if (mine === round && !panes.finished.classList.contains("d-none")) timer = setTimeout(load, 10000);
    });
  }

  tabs.active.addEventListener("click", function () { show("active"); });
  tabs.finished.addEventListener("click", function () { show("finished"); });
  document.getElementById("fgpu-finished-filters").addEventListener("submit", function (event) {
    event.preventDefault();
    offset = 0;
    load();
  });
  reasonSelect.addEventListener("change", function () { offset = 0; load(); });
  older.addEventListener("click", function () { offset += PAGE; load(); });
  newer.addEventListener("click", function () { offset = Math.max(0, offset - PAGE); load(); });
})();
