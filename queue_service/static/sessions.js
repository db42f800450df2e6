// The Sessions page: the list (polled from api/sessions), the indicator (api/resources), the
// launch dialog (POST api/sessions, in the resource group picked there) and each running
// session's app launcher.
"use strict";

(function () {
  var config = fgpu.config, el = fgpu.element;
  var tbody = document.querySelector("#fgpu-sessions tbody");
  var filter = document.getElementById("fgpu-user-filter");
  var errorBox = document.getElementById("fgpu-error");
  var latest = { sessions: [], resources: null };

  // The apps every image serves behind the hub's proxy (see image_catalog/recipes/jupyter-base).
  var APPS = [
    { name: "JupyterLab", path: "lab" },
    { name: "Notebook", path: "tree" },
    { name: "Terminal", path: "terminals/1" },
    { name: "TensorBoard", path: "tensorboard/" },
  ];

  function serverUrl(session) {
    var name = session.server_name ? encodeURIComponent(session.server_name) + "/" : "";
    return config.userPrefix + encodeURIComponent(session.user) + "/" + name;
  }

  function showError(message) {
    errorBox.textContent = message || "";
    errorBox.classList.toggle("d-none", !message);
  }

  function statusCell(s) {
    var children = [el("span", { className: "fgpu-status fgpu-status-" + s.status, text: s.status })];
    if (s.status === "PENDING") {
      var where = s.position ? fgpu.ordinal(s.position) + " in line" : "waiting";
      // A job deferred to its start_after has no place in line yet: the time, in the reader's
      // clock (the service's reason says the same in UTC, which a student abroad would misread).
      var deferred = !s.position && s.start_after;
      if (deferred) where = "starts " + localTime(s.start_after) + " at the earliest, as you asked; until then it holds nothing";
      children.push(el("div", { className: "fgpu-pending-detail fgpu-position", text: where }));
      if (s.reason && !deferred) children.push(el("div", { className: "fgpu-pending-detail fgpu-reason", text: s.reason }));
    }
    if (s.status === "RUNNING" && s.ends) children.push(endsLine(s.ends));
    return el("td", {}, children);
  }

  // An ISO time as the reader's clock says it: "Sat 28 Nov, 03:00".
  function localTime(iso) {
    var moment = new Date(iso);
    if (isNaN(moment)) return iso;
    return moment.toLocaleString([], { weekday: "short", day: "numeric", month: "short", hour: "2-digit", minute: "2-digit" });
  }

  // A datetime-local input's value ("2026-11-28T03:00") with the browser's offset at that
  // moment ("2026-11-28T03:00:00+01:00"): the service takes no time without one.
  function withOffset(local) {
    var moment = new Date(local);
    if (!/^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d)?$/.test(local) || isNaN(moment)) return local;
    var minutes = -moment.getTimezoneOffset(), sign = minutes < 0 ? "-" : "+";
    minutes = Math.abs(minutes);
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return local + (local.length === 16 ? ":00" : "") + sign + two(Math.floor(minutes / 60)) + ":" + two(minutes % 60);
  }

  // When and why a running session will end by itself (api/sessions `ends`); highlighted once
  // its warning is due.
  function endsLine(ends) {
    var idle = ends.why === "idle", timeout = ends.why === "timeout";
    var parts = [];
    if (ends.at) parts.push((idle ? "Stops if unused from " : timeout ? "Ends by " : "Ends at ") + fgpu.time(ends.at) + (timeout ? " at the latest" : "") + " (" + ends.text + ")");
    // Idle past its group's limit, kept while no waiting request needs its resources.
    if (ends.kept_idle) parts.push("Idle: kept while nobody waits for its resources");
    return el("div", {
      className: "fgpu-pending-detail fgpu-ends" + (ends.warning ? " fgpu-ends-soon" : ""),
      text: parts.join(". "), "data-why": ends.why || "kept",
    });
  }

  // Live usage from the service's stats sampler (api/sessions `usage`); "—" until it reports.
  function usageText(usage) {
    if (!usage) return "—";
    var parts = [];
    if (usage.cpu_percent !== undefined && usage.cpu_percent !== null) parts.push("CPU " + fgpu.trim(usage.cpu_percent) + "%");
    if (usage.mem_bytes !== undefined && usage.mem_bytes !== null) {
      parts.push("RAM " + fgpu.size(usage.mem_bytes) + (usage.mem_limit_bytes ? " / " + fgpu.size(usage.mem_limit_bytes) : ""));
    }
    if (usage.gpu_mem_bytes !== undefined && usage.gpu_mem_bytes !== null) parts.push("GPU mem " + fgpu.size(usage.gpu_mem_bytes));
    if (usage.gpu_util_percent !== undefined && usage.gpu_util_percent !== null) parts.push("GPU " + fgpu.trim(usage.gpu_util_percent) + "%");
    return parts.length ? parts.join(", ") : "—";
  }

  function end(session, button) {
    fgpu.endSession(session, button, session.user === config.user,
      function () { showError(""); refresh(); },
      function (e) { showError(e.message); });
  }

  function actionsCell(s) {
    if (s.type === "batch") return jobActionsCell(s);
    var cell = el("td", { className: "fgpu-actions" });
    // Save image and Stop side by side with a gap, never touching, never wrapped apart.
    var buttons = el("div", { className: "fgpu-buttons" });
    if (s.status === "RUNNING") {
      var apps = el("div", { className: "fgpu-apps" }, APPS.map(function (app) {
        return el("a", {
          className: "btn btn-sm btn-outline-primary fgpu-app",
          href: serverUrl(s) + app.path, target: "_blank", rel: "noopener", "data-app": app.name,
          text: app.name,
        });
      }));
      if (config.sshPort) apps.append(fgpuSsh.vscodeButton(s), fgpuSsh.button(s));
      cell.appendChild(apps);
    }
    if (config.admin && s.status === "RUNNING") {
      var save = el("button", { type: "button", className: "btn btn-sm btn-outline-secondary fgpu-save-image", text: "Save image" });
      save.addEventListener("click", function () { openSave(s); });
      buttons.appendChild(save);
    }
    if (s.status === "PENDING") {
      var cancel = el("button", { type: "button", className: "btn btn-sm btn-outline-danger fgpu-cancel", text: "Cancel" });
      cancel.addEventListener("click", function () { end(s, cancel); });
      buttons.appendChild(cancel);
    } else {
      var stop = el("button", { type: "button", className: "btn btn-sm btn-danger fgpu-stop", text: "Stop" });
      stop.addEventListener("click", function () { end(s, stop); });
      buttons.appendChild(stop);
    }
    cell.appendChild(buttons);
    return cell;
  }

  // The name, and the storage folders the session mounts when its record lists them (`mounts`:
  // names, or {name, read_only}).
  function mountsCell(s) {
    var cell = fgpu.nameCell(s.server_name || "(default)");
    if (s.type === "batch") jobNameLines(s).forEach(function (node) { cell.appendChild(node); });
    var mounts = Array.isArray(s.mounts) ? s.mounts : [];
    if (mounts.length) {
      var names = mounts.map(function (m) {
        if (typeof m === "string") return m;
        return (m.name || m.path || "?") + (m.read_only ? " (read-only)" : "");
      });
      cell.appendChild(el("div", { className: "fgpu-mounts", text: "Folders: " + names.join(", ") }));
    }
    return cell;
  }

  function row(s) {
    var started = s.started || null;
    var usageTime = s.status === "PENDING" ? "waiting " + fgpu.duration(s.created) : fgpu.duration(started);
    var cells = [
      el("td", { className: "fgpu-id", title: s.id, text: s.id.slice(0, 8) }),
      mountsCell(s),
      config.admin ? el("td", { className: "fgpu-user", text: s.user }) : null,
      statusCell(s),
      fgpu.nameCell(s.image),
      el("td", { text: fgpu.trim(s.cpu) }),
      el("td", { text: fgpu.size(s.mem) }),
      el("td", { text: fgpu.trim(s.fgpu) + (config.simulated && s.fgpu ? " (simulated)" : "") }),
      el("td", { text: fgpu.time(started) }),
      el("td", { text: started || s.status === "PENDING" ? usageTime : "—" }),
      el("td", { className: "fgpu-usage", text: usageText(s.usage) }),
      actionsCell(s),
    ];
    return el("tr", { "data-session": s.id, "data-status": s.status, "data-user": s.user }, cells);
  }

  function renderSessions(data) {
    latest.sessions = data.sessions;
    if (filter) {
      var users = Array.from(new Set(data.sessions.map(function (s) { return s.user; }))).sort();
      var chosen = filter.value;
      var known = Array.from(filter.options).map(function (o) { return o.value; });
      users.forEach(function (u) { if (known.indexOf(u) < 0) filter.appendChild(el("option", { value: u, text: u })); });
      filter.value = chosen;
    }
    var shown = data.sessions.filter(function (s) { return !filter || !filter.value || s.user === filter.value; });
    var rowsShown = [];
    shown.forEach(function (s) {
      rowsShown.push(row(s));
      if (s.type === "batch") rowsShown.push(jobLogRow(s));
    });
    tbody.replaceChildren.apply(tbody, rowsShown);
    followJobs(shown);  // a row filtered away stops its reading too
    document.getElementById("fgpu-empty").classList.toggle("d-none", shown.length > 0);
    document.getElementById("fgpu-sessions").setAttribute("data-updated", String(Date.now()));
  }

  // ---- batch jobs in the list: a "Batch job" badge and what it runs under the name, a Cancel
  // that asks, and a row below with the log's last lines, followed live while the job runs
  // (GET api/sessions/{id}/logs?follow=1, read as a stream). A job's output is its owner's data:
  // it goes into the page as text (textContent), never as HTML.
  var LOG_KEEP = 200;  // lines kept and shown (the box scrolls); the whole log is in ~/jobs
  // A browser keeps six connections to the hub: a few logs are streamed, the others read again
  // every few seconds (?tail=), and a long list's rest shows none (the polls must get through).
  var LIVE_MOST = 3, LOGS_MOST = 10, READ_AGAIN_MS = 3000;
  var RUNNER = "[fgpu job]";
  var jobLogs = {};  // session id → its log box and its stream

  function shorten(text, most) {
    text = String(text).replace(/\s+/g, " ").trim();
    return text.length > most ? text.slice(0, most - 1) + "…" : text;
  }

  // What a job runs, in one line: "Command: python train.py", "Notebook: a.ipynb {"epochs": 3}".
  function jobWhat(job) {
    if (!job) return "";
    if (job.command !== undefined) return "Command: " + job.command;
    var params = job.parameters && Object.keys(job.parameters).length ? " with " + assignments(job.parameters) : "";
    return "Notebook: " + job.notebook + params + (job.output ? " → " + job.output + "/" : "");
  }

  // A notebook's parameters as the injected cell sets them: "epochs = 3, lr = 0.01".
  function assignments(parameters) {
    return Object.keys(parameters).map(function (name) { return name + " = " + JSON.stringify(parameters[name]); }).join(", ");
  }

  function jobNameLines(s) {
    var what = jobWhat(s.job);
    return [
      el("div", {}, [el("span", { className: "badge fgpu-job-badge", text: "Batch job" })]),
      el("div", { className: "fgpu-job-what", title: what, text: shorten(what, 60) }),
    ];
  }

  // Seconds as people say them: 3600 → "1 h", 5400 → "1 h 30 min" (automatic_ends.describe).
  function spoken(seconds) {
    seconds = Math.floor(Number(seconds));
    var h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), sec = seconds % 60;
    var parts = [h ? h + " h" : "", m ? m + " min" : "", sec ? sec + " s" : ""].filter(Boolean);
    return parts.join(" ") || "0 s";
  }

  function jobQuestion(s) {
    var name = "“" + s.server_name + "”";
    var whose = s.user === config.user ? "job " + name : s.user + "’s job " + name;
    if (s.status === "PENDING") {
      var place = s.position ? " (" + fgpu.ordinal(s.position) + " in line)" : "";
      var deferred = !s.position && s.start_after;
      return {
        title: "Cancel " + whose + "?",
        lines: [
          deferred
            ? "It does not start " + localTime(s.start_after) + " as asked, and never runs."
            : "It gives up its place in the queue" + place + " and never runs. Submitting it again later puts it at the back of the line.",
          "Nothing has run yet, so nothing is lost.",
        ],
        confirm: "Cancel job", keep: "Keep waiting",
      };
    }
    return {
      title: "Cancel " + whose + "?",
      lines: [
        "It is stopped now and ends as cancelled: the work it is doing at this moment is lost.",
        "Files it has already written stay where it wrote them, and its log so far stays in ~/jobs.",
        "Its " + fgpu.cores(s.cpu) + ", " + fgpu.size(s.mem) + " memory" + (Number(s.fgpu) ? " and " + fgpu.trim(s.fgpu) + " fGPU" : "") + " go back to the pool.",
      ],
      confirm: "Cancel job", keep: "Let it run",
    };
  }

  function jobActionsCell(s) {
    var cancel = el("button", { type: "button", className: "btn btn-sm btn-outline-danger fgpu-cancel fgpu-job-cancel", text: "Cancel" });
    cancel.addEventListener("click", function () {
      fgpu.confirmAction(jobQuestion(s)).then(function (yes) {
        if (!yes) return;
        cancel.disabled = true;
        return fgpu.api("DELETE", "sessions/" + s.id).then(function () { showError(""); refresh(); },
          function (e) { cancel.disabled = false; showError(e.message); });
      });
    });
    return el("td", { className: "fgpu-actions" }, [el("div", { className: "fgpu-buttons" }, [cancel])]);
  }

  // A cookie's read needs the XSRF token too (fgpu.headers); the answer is text.
  function logHeaders() {
    return Object.assign(fgpu.headers(), { Accept: "text/plain" });
  }

  function jobLog(id) {
    if (!jobLogs[id]) {
      jobLogs[id] = {
        id: id, text: "", stream: null, live: false, shown: true, error: null, lastTry: 0,
        pre: el("pre", { className: "fgpu-job-log", "data-session": id, tabindex: "0", "aria-label": "The job's log, last lines" }),
        head: el("div", { className: "fgpu-job-log-head" }),
        outputs: el("div", { className: "fgpu-job-outputs" }),
      };
    }
    return jobLogs[id];
  }

  // The runner's own lines say where the outputs are: the whole log, a notebook's executed copy.
  function outputsOf(text) {
    var kept = /^\[fgpu job\] .*this log is kept in (~\/\S+)/m.exec(text);
    var copy = /^\[fgpu job\] executed copy: (~\/.+)$/m.exec(text);
    return { log: kept ? kept[1] : null, copy: copy ? copy[1].trim() : null };
  }

  // Where the outputs are, as links: the whole log through api/sessions/{id}/logs (a page's
  // link carries the XSRF token itself, as the Usage page's CSV link does), a file of the home
  // folder in JupyterLab when a session of the owner's runs to open it in.
  function outputLines(found, s) {
    var logUrl = config.api + "sessions/" + encodeURIComponent(s.id) + "/logs?tail=5000&_xsrf=" + encodeURIComponent(config.xsrf || "");
    var lines = [el("div", { className: "fgpu-job-log-path" }, [
      "Full log: ", el("a", { href: logUrl, target: "_blank", rel: "noopener", title: "Its last 5,000 lines here; the whole log is this file in your home folder" }, [
        el("code", { text: found.log || "~/jobs/" + s.server_name + "-….log" }),
      ]),
    ])];
    if (found.copy) {
      var lab = inLab(s.user, found.copy), path = el("code", { text: found.copy });
      lines.push(el("div", { className: "fgpu-job-copy" }, [
        "Executed copy: ", lab ? el("a", { href: lab, target: "_blank", rel: "noopener", title: "Open in JupyterLab" }, [path]) : path,
        lab ? "" : " (open it in JupyterLab from a running session)",
      ]));
    }
    return lines;
  }

  // A home folder file (`~/…`) in JupyterLab of one of `user`'s running sessions, or null.
  function inLab(user, homePath) {
    var session = latest.sessions.filter(function (x) {
      return x.user === user && x.type !== "batch" && x.status === "RUNNING";
    })[0];
    if (!session || homePath.indexOf("~/") !== 0) return null;
    return serverUrl(session) + "lab/tree/" + homePath.slice(2).split("/").map(encodeURIComponent).join("/");
  }

  function logHead(log, s) {
    if (s.status === "PENDING") return "The log starts when the job does.";
    if (s.status !== "RUNNING") return "Starting…";
    if (log.error) return "The log cannot be read now: " + log.error;
    if (!log.shown) return "Log: too many jobs at once to show them all; each one’s whole log is in ~/jobs.";
    if (!log.text.trim()) return "Log: nothing printed yet.";
    return "Log, last lines (updated as it runs):";
  }

  function showHead(log, s) {
    log.head.textContent = logHead(log, s);
    var some = s.status === "RUNNING" && log.shown && !!log.text.trim();
    log.pre.classList.toggle("d-none", !some);
    log.outputs.classList.toggle("d-none", !some);
  }

  function showLog(log, s) {
    var pre = log.pre, atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    log.error = null;
    showHead(log, s);
    var lines = log.text.split("\n");
    if (lines.length > LOG_KEEP + 1) log.text = lines.slice(-LOG_KEEP - 1).join("\n");
    pre.textContent = log.text.replace(/\n$/, "");
    // Kept at its end while the reader is there; left alone once they scroll up to read.
    if (atEnd) pre.scrollTop = pre.scrollHeight;
    var found = outputsOf(log.text);
    log.found = { log: found.log || (log.found && log.found.log), copy: found.copy || (log.found && log.found.copy) };
    log.outputs.replaceChildren.apply(log.outputs, outputLines(log.found, s));
  }

  function follow(log, s, live) {
    if (log.stream || Date.now() - log.lastTry < READ_AGAIN_MS) return;
    var controller = new AbortController();
    log.stream = controller;
    log.lastTry = Date.now();
    fetch(config.api + "sessions/" + s.id + "/logs?" + (live ? "follow=1&" : "") + "tail=" + LOG_KEEP, {
      credentials: "same-origin", headers: logHeaders(), signal: controller.signal,
    }).then(function (response) {
      if (!response.ok) {
        return response.text().then(function (text) {
          var message;
          try { message = JSON.parse(text).message; } catch (e) { message = text; }
          throw new Error(message || response.status + " " + response.statusText);
        });
      }
      var reader = response.body.getReader(), decoder = new TextDecoder();
      log.text = "";  // each answer starts again from the log's last lines
      function more() {
        return reader.read().then(function (part) {
          log.text += decoder.decode(part.value || new Uint8Array(), { stream: !part.done });
          showLog(log, s);
          if (!part.done) return more();
        });
      }
      return more();
    }).catch(function (e) {
      if (e.name !== "AbortError") { log.error = e.message; showHead(log, s); }
    }).then(function () {
      if (log.stream === controller) { log.stream = null; log.live = false; }
    });
  }

  function jobLogRow(s) {
    var log = jobLog(s.id), columns = document.querySelectorAll("#fgpu-sessions thead th").length;
    showHead(log, s);
    var cell = el("td", { colspan: String(columns) }, [log.head, log.pre, log.outputs]);
    return el("tr", { className: "fgpu-job-log-row", "data-log-for": s.id }, [cell]);
  }

  // Follow each running job's log; stop reading those that ended or left the list.
  function followJobs(sessions) {
    var now = {}, running = sessions.filter(function (s) { return s.type === "batch" && s.status === "RUNNING"; });
    sessions.forEach(function (s) { if (s.type === "batch") now[s.id] = s; });
    // Those streamed stay streamed; the first others take the free streams.
    var live = running.filter(function (s) { return jobLogs[s.id] && jobLogs[s.id].live; }).length;
    running.forEach(function (s, i) {
      var log = jobLog(s.id);
      log.shown = i < LOGS_MOST;
      if (!log.shown) { showHead(log, s); return; }
      if (log.stream || Date.now() - log.lastTry < READ_AGAIN_MS) return;
      var stream = live < LIVE_MOST;
      if (stream) { live++; log.live = true; }
      follow(log, s, stream);
    });
    var gone = false;
    Object.keys(jobLogs).forEach(function (id) {
      var s = now[id];
      if (s && s.status !== "RUNNING" && s.status !== "PENDING" && s.status !== "SCHEDULED") s = null;
      if (s) return;
      if (jobLogs[id].stream) jobLogs[id].stream.abort();
      delete jobLogs[id];
      gone = true;
    });
    if (gone && endedJobsPoll) endedJobsPoll.now();
  }

  // ---- jobs that ended lately (from api/sessions?finished=1, the last day's, five at most):
  // how each ended in words, the exit code, the log's end and where the outputs are. "Hide"
  // puts one away (in this browser).
  var ENDED_SHOWN = 5, ENDED_WITHIN_MS = 24 * 3600 * 1000;
  var HIDDEN_KEY = "fgpu-hidden-jobs:" + config.user;
  var endedCards = {}, endedJobsPoll = null;

  function hiddenJobs() {
    try { return JSON.parse(localStorage.getItem(HIDDEN_KEY)) || []; } catch (e) { return []; }
  }

  function hideJob(id) {
    var kept = [id].concat(hiddenJobs().filter(function (h) { return h !== id; })).slice(0, 100);
    try { localStorage.setItem(HIDDEN_KEY, JSON.stringify(kept)); } catch (e) { /* full or off */ }
  }

  // The record's reason without its leading code ("failed: the job exited…" → "The job exited…").
  function reasonWords(s) {
    var text = s.reason || "";
    if (s.end_reason && text.indexOf(s.end_reason + ": ") === 0) text = text.slice(s.end_reason.length + 2);
    return text ? text.charAt(0).toUpperCase() + text.slice(1) : "";
  }

  function endedCard(s, labels) {
    var log = { text: "", pre: el("pre", { className: "fgpu-job-log d-none", tabindex: "0", "aria-label": "The end of the job's log" }),
      outputs: el("div", { className: "fgpu-job-outputs" }),
      label: el("div", { className: "fgpu-job-log-head d-none", text: "End of the log:" }) };
    var hide = el("button", { type: "button", className: "btn btn-sm btn-link fgpu-job-hide", text: "Hide" });
    hide.addEventListener("click", function () { hideJob(s.id); endedJobsPoll.now(); });
    var failed = s.exit_code !== null && s.exit_code !== undefined && s.exit_code !== 0;
    var head = el("div", { className: "fgpu-ended-job-head" }, [
      el("span", { className: "badge fgpu-job-badge", text: "Batch job" }),
      el("strong", { className: "fgpu-ended-job-name", text: s.server_name }),
      el("span", { className: "fgpu-end-label fgpu-end-" + (s.end_reason || "other"),
        text: s.end_reason_label || labels[s.end_reason] || s.end_reason || "Ended" }),
      failed ? el("span", { className: "fgpu-exit-code", text: "exit code " + s.exit_code }) : null,
      el("span", { className: "fgpu-pending-detail", text: "ended " + fgpu.time(s.ended) +
        (s.started ? ", ran " + spoken(s.duration !== undefined && s.duration !== null ? s.duration : (new Date(s.ended) - new Date(s.started)) / 1000) : ", never started") }),
      hide,
    ]);
    var words = reasonWords(s);
    var card = el("div", { className: "fgpu-ended-job", "data-session": s.id, "data-end-reason": s.end_reason || "" }, [
      head,
      words ? el("div", { className: "fgpu-end-detail", text: words }) : null,
      el("div", { className: "fgpu-job-what", text: shorten(jobWhat(s.job), 200) }),
      log.outputs, log.label, log.pre,
    ]);
    if (!s.started) { log.pre.classList.add("d-none"); log.outputs.classList.add("d-none"); }
    else {
      // The end of the log that the service kept with the record (the whole one is in ~/jobs).
      fetch(config.api + "sessions/" + s.id + "/logs", { credentials: "same-origin", headers: logHeaders() })
        .then(function (response) { return response.ok ? response.text() : ""; })
        .then(function (text) {
          var lines = text.replace(/\n$/, "").split("\n");
          log.pre.textContent = lines.slice(-LOG_KEEP).join("\n");
          log.pre.classList.toggle("d-none", !text);
          log.label.classList.toggle("d-none", !text);
          log.outputs.replaceChildren.apply(log.outputs, outputLines(outputsOf(text), s));
          log.pre.scrollTop = log.pre.scrollHeight;
        }, function () { /* the next poll's card is the same; the log stays unread */ });
    }
    return card;
  }

  function renderEndedJobs(data) {
    var hidden = hiddenJobs(), now = Date.now();
    var jobs = data.sessions.filter(function (s) {
      return s.type === "batch" && s.ended && now - new Date(s.ended) < ENDED_WITHIN_MS && hidden.indexOf(s.id) < 0;
    }).slice(0, ENDED_SHOWN);
    var cards = jobs.map(function (s) {
      if (!endedCards[s.id]) endedCards[s.id] = endedCard(s, data.reasons || {});
      return endedCards[s.id];
    });
    var list = document.getElementById("fgpu-ended-jobs-list");
    list.replaceChildren.apply(list, cards);
    document.getElementById("fgpu-ended-jobs").classList.toggle("d-none", cards.length === 0);
  }

  endedJobsPoll = fgpu.poll("sessions?finished=1&limit=20" + (config.admin ? "&user=" + encodeURIComponent(config.user) : ""),
    10, renderEndedJobs);

  function renderResources(resources) {
    latest.resources = resources;
    renderGroups(resources);
    // The indicator's upper bars follow the group picked in the launch dialog.
    if (chosenGroup) resources.resource_group = chosenGroup;
    fgpu.renderIndicator(document.getElementById("fgpu-indicator"), resources);
    updateLaunchAdvice();
  }

  var sessionsPoll = fgpu.poll(config.admin ? "sessions?all=1" : "sessions", 2, renderSessions,
    function (e) { showError("Could not read the sessions: " + e.message); });
  var resourcesPoll = fgpu.poll("resources", 2, renderResources);
  function refresh() { sessionsPoll.now(); resourcesPoll.now(); }
  if (filter) filter.addEventListener("change", function () { renderSessions({ sessions: latest.sessions }); });

  // ---- the launch dialog ---------------------------------------------------------------------
  var dialog = document.getElementById("fgpu-launch");
  var form = document.getElementById("fgpu-launch-form");
  // A dialog's elements share an id prefix: fieldsOf("fgpu-launch-")("cpu") is #fgpu-launch-cpu.
  function fieldsOf(prefix) { return function (name) { return document.getElementById(prefix + name); }; }
  var field = fieldsOf("fgpu-launch-");
  var warning = field("warning"), launchError = field("error");
  var images = [];
  // The resource group picked in the dialog (kept while the page is open); the first the user
  // may use until they pick one.
  var chosenGroup = null;

  // The groups this user may use, in the service's order, with what is free there for them.
  function offeredGroups(resources) {
    var groups = (resources && resources.resource_groups) || {};
    return Object.keys(groups).filter(function (name) { return groups[name].allowed; })
      .map(function (name) { return { name: name, group: groups[name] }; });
  }

  function oneDecimal(n) { return String(Math.round(Number(n) * 10) / 10); }

  // As on the hub's spawn form (fgpu_spawner/resource_groups.py): "gpu-a100 — 3 fGPU, 12 CPU, 40 GiB free".
  // Where a quota leaves nothing, the group's own free figures, said to be none of them yours
  // (the free lines below name the quota).
  function groupLabel(offer) {
    var mine = offer.group.allocatable, parts = [];
    var none = offer.group.free && !(mine.cpu > 0 || mine.mem > 0 || mine.fgpu > 0);
    var free = none ? offer.group.free : mine;
    if (offer.group.capacity.fgpu > 0) parts.push(oneDecimal(Math.max(0, free.fgpu)) + " fGPU");
    parts.push(oneDecimal(Math.max(0, free.cpu)) + " CPU");
    parts.push(fgpu.size(Math.max(0, free.mem)) + " free");
    return offer.name + " — " + parts.join(", ") + (none ? "; none for you now" : "");
  }

  // A choice with two groups or more; one group is named, not offered, and not sent.
  function renderGroups(resources) {
    var offered = offeredGroups(resources), select = field("group"), line = field("group-line");
    var names = offered.map(function (o) { return o.name; });
    if (names.indexOf(chosenGroup) < 0) chosenGroup = names.length > 1 ? names[0] : null;
    field("group-row").classList.toggle("d-none", offered.length === 0);
    select.classList.toggle("d-none", offered.length < 2);
    line.classList.toggle("d-none", offered.length > 1);
    line.textContent = offered.length === 1 ? groupLabel(offered[0]) : "";
    var shown = Array.from(select.options).map(function (o) { return o.value; });
    if (shown.join("\n") !== names.join("\n")) {
      select.replaceChildren.apply(select, names.map(function (n) { return el("option", { value: n }); }));
    }
    // In place: a poll must not close the list a user has open.
    offered.forEach(function (offer, i) { select.options[i].textContent = groupLabel(offer); });
    if (chosenGroup) select.value = chosenGroup;
  }

  // What the launch is measured against: the picked group's figures, or the user's total.
  function scopeOf(resources) {
    var group = chosenGroup && resources.resource_groups[chosenGroup];
    if (!group) return { name: null, allocatable: resources.allocatable, free: resources.free, capacity: resources.capacity, nodes: resources.nodes };
    var nodes = resources.nodes && resources.nodes.filter(function (n) { return n.resource_group === chosenGroup; });
    return { name: chosenGroup, allocatable: group.allocatable, free: group.free, capacity: group.capacity, nodes: nodes };
  }

  function loadImages() {
    // The catalog's own API when it exists; else the list the page was rendered with.
    return fgpu.api("GET", "images").then(
      function (data) { return (data.images || data).filter(function (i) { return !i.hidden; }); },
      function () { return config.images; }
    ).then(function (list) {
      images = list;
      var select = field("image");
      select.replaceChildren.apply(select, list.map(function (i) {
        return el("option", { value: i.name, text: i.display_name || i.name });
      }));
      // The image a launch that names none gets (contract 3), where it is offered.
      var marked = config.sessionLimits.default_image_name;
      if (list.some(function (i) { return i.name === marked; })) select.value = marked;
      describeImage();
    });
  }

  function describeImage() {
    var chosen = images.filter(function (i) { return i.name === field("image").value; })[0];
    field("image-desc").textContent = chosen ? chosen.description || "" : "";
  }

  // ---- presets (api/presets): a radio each beside "Custom"; one the user may not have is shown
  // disabled with the service's reason. Picking one sets the sliders to its slots, and the launch
  // names the preset instead of sending cpu, mem and fgpu (docs/source/explanation/sessions-and-queue.md, "Launch options").
  var presets = [];

  function chosenPreset() {
    var picked = form.querySelector("input[name=preset]:checked");
    var name = picked ? picked.value : "";
    return presets.filter(function (p) { return p.name === name; })[0] || null;
  }

  function presetSlots(p) {
    return fgpu.cores(p.cpu) + ", " + fgpu.size(p.mem) + (Number(p.fgpu) ? ", " + fgpu.trim(p.fgpu) + " fGPU" : "");
  }

  function renderPresets(list) {
    presets = list;
    var holder = field("preset-list");
    holder.replaceChildren.apply(holder, list.map(function (p, i) {
      var id = "fgpu-launch-preset-" + i;
      var label = el("label", { className: "form-check-label", for: id, text: p.name + " — " + presetSlots(p) });
      if (!p.available) label.appendChild(el("span", { className: "fgpu-preset-reason", text: "Not available: " + p.reason }));
      var radio = { className: "form-check-input", type: "radio", name: "preset", id: id, value: p.name };
      if (!p.available) radio.disabled = "disabled";
      return el("div", { className: "form-check", "data-preset": p.name, "data-available": String(p.available) },
        [el("input", radio), label]);
    }));
    // A lone "Custom" choice says nothing: the group shows only where the site has presets.
    field("presets").classList.toggle("d-none", list.length === 0);
  }

  // ---- folders (api/folders): a box to tick for each storage folder the user may mount, their
  // own first, then those shared with them. Their own automount folders (".local") are in every
  // session anyway: named, not offered. The launch sends the ticked ids as `folders`.
  var folders = [];

  function offeredFolders() {
    var offered = folders.filter(function (f) { return !(f.own && f.automount); });
    return offered.sort(function (a, b) {
      var ka = [a.own ? 0 : 1, a.own ? "" : a.owner, a.name], kb = [b.own ? 0 : 1, b.own ? "" : b.owner, b.name];
      for (var i = 0; i < ka.length; i++) if (ka[i] !== kb[i]) return ka[i] < kb[i] ? -1 : 1;
      return 0;
    });
  }

  function chosenFolders() {
    return Array.from(form.querySelectorAll("input[name=folders]:checked")).map(function (b) { return b.value; });
  }

  function folderDetail(f) {
    var parts = f.own ? [] : ["shared by " + f.owner];
    if (f.permission !== "rw") parts.push("read-only");
    return parts.join(", ");
  }

  // `list` null: the service did not list them (`why`).
  function renderFolders(list, why) {
    var ticked = chosenFolders();
    folders = list || [];
    var offered = offeredFolders(), holder = field("folder-list");
    holder.replaceChildren.apply(holder, offered.map(function (f, i) {
      var id = "fgpu-launch-folder-" + i, detail = folderDetail(f);
      var label = el("label", { className: "form-check-label", for: id, text: f.name });
      if (detail) label.appendChild(el("span", { className: "fgpu-folder-detail", text: " (" + detail + ")" }));
      var box = { className: "form-check-input", type: "checkbox", name: "folders", id: id, value: f.id };
      if (ticked.indexOf(f.id) >= 0) box.checked = "checked";
      var holderAttrs = { className: "form-check", "data-folder": f.name };
      if (f.own) holderAttrs["data-own"] = "";
      return el("div", holderAttrs, [el("input", box), label]);
    }));
    var note = list === null ? "Your storage folders cannot be listed now" + (why ? " (" + why + ")" : "") + "; the session can start without them."
      : offered.length ? "Each folder you tick appears in the session at ~/folders/<name>."
      : "You have no storage folders to mount.";
    field("folder-note").textContent = note;
    var always = folders.filter(function (f) { return f.own && f.automount; }).map(function (f) { return f.name; }).sort();
    field("folder-always").textContent = always.length ? "Always mounted: " + always.join(", ") +
      " (at " + always.map(function (n) { return "~/" + n; }).join(", ") + ")" : "";
    field("folder-always").classList.toggle("d-none", always.length === 0);
  }

  function loadFolders() {
    return fgpu.api("GET", "folders").then(function (data) { renderFolders(data.folders); },
      function (e) { renderFolders(null, e.message); });
  }

  function folderName(id) {
    var f = folders.filter(function (f) { return f.id === id || f.name === id; })[0];
    return f ? f.name : id;
  }

  // Launching with no folder ticked while some are offered: what is and is not kept, said as it is
  // here (the home folder is kept too), and a way back to the list.
  function noFolderQuestion() {
    var always = folders.filter(function (f) { return f.own && f.automount; }).map(function (f) { return f.name; });
    return {
      title: "Launch without a storage folder?",
      lines: [
        "No storage folder is chosen, so none is mounted under ~/folders." +
          (always.length ? (always.length > 1 ? " Your folders " : " Your folder ") + always.sort().join(", ") + (always.length > 1 ? " are" : " is") + " mounted as always." : ""),
        "That loses nothing: your home folder (/home/jovyan) is kept between sessions, but only your own sessions see it. " +
          "Files in a storage folder can also be shared with others, and browsed, uploaded and downloaded on the Storage page without a session running.",
      ],
      confirm: "Launch without storage folder", keep: "Choose folders", tone: "btn-warning",
    };
  }

  function loadPresets() {
    return fgpu.api("GET", "presets").then(function (data) { renderPresets(data.presets); },
      function () { renderPresets([]); });
  }

  function followPreset() {
    var p = chosenPreset();
    ["cpu", "mem", "fgpu"].forEach(function (k) { field(k).disabled = !!p || (k === "fgpu" && field(k).dataset.none === "1"); });
    if (!p) return;
    field("cpu").value = String(p.cpu);
    field("mem").value = String(p.mem / Math.pow(1024, 3));
    field("fgpu").value = String(p.fgpu);
  }

  // "SEED=42" lines → {SEED: "42"}; the service checks names and sizes (and says what is wrong).
  function envOf(text) {
    var env = {};
    text.split("\n").forEach(function (line) {
      if (!line.trim()) return;
      var at = line.indexOf("=");
      env[(at < 0 ? line : line.slice(0, at)).trim()] = at < 0 ? "" : line.slice(at + 1);
    });
    return env;
  }

  function request() {
    var r = {
      image: field("image").value,
      cpu: Number(field("cpu").value),
      mem: Math.round(Number(field("mem").value) * 1024 * 1024 * 1024),
      fgpu: Number(field("fgpu").value),
      count: Number(field("count").value),
    };
    if (chosenGroup) r.resource_group = chosenGroup;
    return r;
  }

  // What is sent: the preset's name in place of its slots, the name and env when given.
  function launchBody() {
    var r = request(), p = chosenPreset(), name = field("name").value.trim();
    var env = envOf(field("env").value);
    if (p) { delete r.cpu; delete r.mem; delete r.fgpu; r.preset = p.name; }
    if (name) r.name = name;
    if (Object.keys(env).length) r.env = env;
    var chosen = chosenFolders();
    if (chosen.length) r.folders = chosen;
    if (batchMode()) Object.assign(r, jobFields());
    return r;
  }

  // ---- batch mode: "Interactive session | Batch job". A job takes the same image, resources,
  // folders, env and preset, and what it runs: a notebook (with parameters and an output folder)
  // or a command, and a time limit. The service checks them all and says what is wrong
  // (image_catalog/job_options.py): the text is sent as typed.
  function batchMode() { return form.querySelector("input[name=type]:checked").value === "batch"; }
  function jobKind() { return form.querySelector("input[name=job_kind]:checked").value; }

  // How many more jobs of the user's may wait now (null when the page was not told the limit).
  function jobRoom() {
    var limit = config.jobLimits && config.jobLimits.waiting_per_user;
    if (limit === undefined || limit === null) return null;
    var waiting = latest.sessions.filter(function (s) {
      return s.type === "batch" && s.user === config.user && (s.status === "PENDING" || s.status === "SCHEDULED");
    }).length;
    return Math.max(0, limit - waiting);
  }

  function jobFields() {
    var job = { type: "batch" };
    if (jobKind() === "command") job.command = field("command").value;
    else {
      job.notebook = field("notebook").value.trim();
      if (field("parameters").value.trim()) job.parameters = field("parameters").value.trim();
      if (field("output").value.trim()) job.output = field("output").value.trim();
    }
    if (field("time-limit").value.trim()) job.time_limit = field("time-limit").value.trim();
    if (field("start-after").value) job.start_after = withOffset(field("start-after").value);
    return job;
  }

  function submitLabel() { return batchMode() ? "Submit job" : "Launch"; }

  function showMode() {
    var batch = batchMode(), notebook = jobKind() === "notebook";
    field("job").classList.toggle("d-none", !batch);
    field("notebook-fields").classList.toggle("d-none", !notebook);
    field("command-fields").classList.toggle("d-none", notebook);
    field("title").textContent = batch ? "Submit a batch job" : "Start a session";
    field("mode-about").textContent = batch
      ? "Runs a notebook or a command on a slice of its own. It waits in the same queue as sessions, ends by itself when the run is over and gives the slice back at once. You may close this page meanwhile."
      : "JupyterLab, a terminal and TensorBoard, until you stop it.";
    field("name-label").textContent = batch ? "Job name" : "Session name";
    document.querySelector('label[for="fgpu-launch-count"]').textContent = batch ? "Jobs" : "Sessions";
    if (!field("submit").disabled) field("submit").textContent = submitLabel();
    if (!batch) field("from").classList.add("d-none");
  }

  // The time limit's note: the site's default and maximum when the page was given them.
  function timeLimitNote() {
    var limits = config.jobLimits;
    if (!limits) return;
    var fallback = Math.min(limits.time_limit, limits.time_limit_max);
    // The rule in the words the service's refusals use (image_catalog/job_options.py).
    field("time-limit-note").textContent = "Without one: the hub’s default, " + spoken(fallback) +
      ". A job’s time limit is from " + spoken(limits.time_limit_min) + " to " + spoken(limits.time_limit_max) +
      " on this hub. A job still running at its limit is stopped.";
    if (limits.start_after_max) {
      var days = limits.start_after_max / 86400;
      field("start-after-note").textContent = "Your local time, at most " +
        (days >= 2 && days === Math.floor(days) ? days + " days" : spoken(limits.start_after_max)) +
        " ahead. Until then the job waits, holding no resources and no place in line; at that time it joins the line like a new request.";
    }
  }

  // A notebook under folders/<name>/ needs that folder mounted: its box is ticked for the student,
  // when the folder is their own. Anyone may share a folder with anyone, and a link may name a
  // notebook in it: someone else's folder is never ticked for them (fromNote says whose it is).
  function notebookFolderName() {
    var named = /^(?:\.\/)?folders\/([^/]+)\//.exec(field("notebook").value.trim());
    return named && named[1];
  }

  function tickNotebookFolder() {
    var name = notebookFolderName();
    if (!name) return;
    Array.from(form.querySelectorAll("[data-folder][data-own]")).forEach(function (holder) {
      var box = holder.querySelector("input[name=folders]");
      if (holder.getAttribute("data-folder") === name && box && !box.checked) box.checked = true;
    });
  }

  // The owner of the shared folder a notebook path names, when the user has no folder of that name.
  function notebookFolderOwner() {
    var name = notebookFolderName();
    var same = folders.filter(function (f) { return f.name === name; });
    if (!name || !same.length || same.some(function (f) { return f.own; })) return null;
    return { name: name, owner: same[0].owner };
  }

  // ---- recent launches: the last five bodies sent, in this browser's localStorage, per user.
  // Kept in the browser, not the service: they hold the exact body (env included) and need no
  // schema; a student on another machine simply starts with none.
  var RECENT_KEY = "fgpu-recent-launches:" + config.user, RECENT_MAX = 5;

  function recentLaunches() {
    try { return JSON.parse(localStorage.getItem(RECENT_KEY)) || []; } catch (e) { return []; }
  }

  function remember(body) {
    var text = JSON.stringify(body);
    var kept = recentLaunches().filter(function (b) { return JSON.stringify(b) !== text; });
    try { localStorage.setItem(RECENT_KEY, JSON.stringify([body].concat(kept).slice(0, RECENT_MAX))); } catch (e) { /* full or off */ }
  }

  function describeLaunch(b) {
    var parts = [b.image, b.preset ? "preset " + b.preset : presetSlots(b)];
    if (b.type === "batch") parts.unshift("Job: " + shorten(b.command !== undefined ? b.command : b.notebook || "", 40));
    if (b.name) parts.push("named " + b.name);
    if (b.count > 1) parts.push(b.count + " sessions");
    if (b.env) parts.push(Object.keys(b.env).length + " env");
    if (b.folders) parts.push((b.folders.length === 1 ? "folder " : "folders ") + b.folders.map(folderName).join(", "));
    return parts.join(" · ");
  }

  function renderRecent() {
    var list = recentLaunches(), holder = field("recent");
    field("recent-row").classList.toggle("d-none", list.length === 0);
    holder.replaceChildren.apply(holder, list.map(function (b) {
      var button = el("button", { type: "button", className: "btn btn-sm btn-outline-secondary fgpu-relaunch", text: describeLaunch(b) });
      button.addEventListener("click", function () { launch(b); });
      return button;
    }));
  }

  function showValues() {
    var r = request();
    field("cpu-value").value = fgpu.cores(r.cpu);
    field("mem-value").value = fgpu.size(r.mem);
    field("fgpu-value").value = fgpu.trim(r.fgpu) + " fGPU";
    var unit = batchMode() ? ["job", "jobs"] : ["session", "sessions"];
    field("count-value").value = r.count + " " + unit[r.count === 1 ? 0 : 1];
  }

  // How many of `count` start now, and whether any could ever start, from what is free for this
  // user now (allocatable: free capacity within every quota) and the cluster's whole capacity.
  function advice(r, resources) {
    var keys = ["cpu", "mem", "fgpu"], scope = scopeOf(resources);
    var show = { cpu: fgpu.cores, mem: fgpu.size, fgpu: function (v) { return fgpu.trim(v) + " fGPU"; } };
    var where = scope.name ? " in " + scope.name : "";
    for (var i = 0; i < keys.length; i++) {
      var k = keys[i], node = largestNode(scope, resources.units_per_gpu, k), quota = config.limit ? config.limit[k] : null;
      if (r[k] > node + 1e-9) {
        return { never: true, text: "This can never start: it asks " + show[k](r[k]) + " and no node" + where + " has more than " + show[k](node) + "." };
      }
      if (quota !== null && quota !== undefined && r[k] > quota + 1e-9) {
        return { never: true, text: "This can never start: it asks " + show[k](r[k]) + " and your quota allows " + show[k](quota) + " in all." };
      }
    }
    // How many start now, and which limit holds the rest: a quota's (named, with its figures)
    // or the cluster's.
    var outlook = fgpu.launchOutlook(r, scope, resources.limits, batchMode() ? jobRoom() : null);
    return outlook && { never: false, text: outlook.text };
  }

  // What one session could ever get: the largest node (admins see nodes), else the whole cluster
  // (or group).
  function largestNode(scope, unitsPerGpu, key) {
    if (!scope.nodes || !scope.nodes.length) return scope.capacity[key];
    return Math.max.apply(null, scope.nodes.map(function (n) {
      if (key === "fgpu") return n.gpus.length * (unitsPerGpu || 1);
      return key === "cpu" ? n.cpu_total : n.mem_total;
    }));
  }

  function updateLaunchAdvice() {
    var resources = latest.resources;
    if (!resources) return;
    var lines = fgpu.freeLines(scopeOf(resources), resources.limits, resources.units_per_gpu);
    field("free").replaceChildren.apply(field("free"), lines.map(function (line) { return el("div", { text: line }); }));
    var verdict = advice(request(), resources);
    warning.textContent = verdict ? verdict.text : "";
    warning.classList.toggle("d-none", !verdict);
    warning.classList.toggle("alert-danger", !!(verdict && verdict.never));
    warning.classList.toggle("alert-warning", !(verdict && verdict.never));
    warning.setAttribute("data-kind", verdict ? (verdict.never ? "never" : "wait") : "");
  }

  // One session's limits (the spawn form's too: config.sessionLimits), within the capacity.
  var limits = config.sessionLimits, GIB = Math.pow(1024, 3);

  function setSliders() {
    field("cpu").min = String(limits.cpu_min);
    field("cpu").value = String(limits.cpu_default);
    field("mem").min = String(Math.max(0.25, Math.ceil(limits.mem_min / GIB * 4) / 4));
    field("mem").value = String(limits.mem_default / GIB);
    field("fgpu").value = String(limits.fgpu_default);
  }

  function fitSliders(resources) {
    var capacity = scopeOf(resources).capacity;
    field("cpu").max = String(Math.max(limits.cpu_min, Math.floor(Math.min(capacity.cpu, limits.cpu_max) * 2) / 2));
    field("mem").max = String(Math.max(0.25, Math.floor((Math.min(capacity.mem, limits.mem_max) / GIB) * 4) / 4));
    field("fgpu").max = String(Math.min(capacity.fgpu, limits.fgpu_max));
    field("fgpu").dataset.none = Math.min(capacity.fgpu, limits.fgpu_max) > 0 ? "0" : "1";
    field("fgpu").disabled = field("fgpu").dataset.none === "1";
  }

  // Opens the launch dialog; the promise resolves once its images, presets and folders are in.
  function openLaunch() {
    launchError.classList.add("d-none");
    if (latest.resources) fitSliders(latest.resources);
    renderRecent();
    dialog.showModal();
    // Nothing to choose or send until the lists are in: options a reopened dialog still shows
    // from last time are replaced when they come, and a choice made on them would be lost.
    var loading = [field("image"), field("submit")];
    loading.forEach(function (f) { f.disabled = true; });
    // The recent launches again once the folders are known: they name their folders.
    return Promise.all([loadImages(), loadPresets(), loadFolders()]).then(function () { renderRecent(); followPreset(); showValues(); updateLaunchAdvice(); })
      .finally(function () { loading.forEach(function (f) { f.disabled = false; }); });
  }
  document.getElementById("fgpu-start").addEventListener("click", function () {
    field("from").classList.add("d-none");
    openLaunch();
  });
  document.getElementById("fgpu-launch-cancel").addEventListener("click", function () { dialog.close(); });
  field("image").addEventListener("change", describeImage);
  field("group").addEventListener("change", function () {
    chosenGroup = field("group").value;
    if (latest.resources) {
      fitSliders(latest.resources);
      renderResources(latest.resources);
    }
    showValues();
  });
  form.addEventListener("input", function () { followPreset(); showValues(); updateLaunchAdvice(); });
  form.addEventListener("change", function (event) {
    // Another kind starts from that kind's defaults: three GPU jobs must not follow from a
    // session's count and fGPU by accident.
    if (event.target.name === "type") { setSliders(); field("count").value = "1"; followPreset(); updateLaunchAdvice(); }
    if (event.target.name === "type" || event.target.name === "job_kind") { showMode(); showValues(); }
  });
  field("notebook").addEventListener("input", tickNotebookFolder);

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var body = launchBody();
    // A job's outputs go to the home folder, kept anyway: no question about storage folders.
    if (body.folders || offeredFolders().length === 0 || body.type === "batch") {
      launch(body);
      return;
    }
    fgpu.confirmAction(noFolderQuestion()).then(function (yes) {
      if (yes) launch(body);
      else form.querySelector("input[name=folders]").focus();
    });
  });

  function launch(body) {
    var submit = field("submit");
    submit.disabled = true;
    submit.textContent = body.type === "batch" ? "Submitting…" : "Launching…";
    launchError.classList.add("d-none");
    var launching = fgpu.api("POST", "sessions", body);
    // The list shows each new row as the hub creates it, while the request is still answering.
    var early = setInterval(refresh, 1000);
    launching.then(
      function () { remember(body); field("name").value = ""; dialog.close(); },
      function (e) { launchError.textContent = e.message; launchError.classList.remove("d-none"); }
    ).then(function () {
      clearInterval(early);
      submit.disabled = false;
      submit.textContent = submitLabel();
      refresh();
    });
  }
  // ---- "Run as a batch job…" in JupyterLab (image_catalog/recipes/jupyter-base/session-status)
  // opens this page as sessions?job=<notebook>&from=<session id>: the dialog opens in batch mode
  // on that notebook, with the image of the session it came from, and the student submits it
  // (JupyterLab cannot: the service takes writes from its own pages only). The arguments are read
  // once and taken off the address, so that a reload does not open the dialog again. A `job` that
  // is not a notebook's path in the home folder is ignored (the service checks it again anyway).
  function notebookPath(path) {
    if (typeof path !== "string" || !path || path.length > 1024 || !/\.ipynb$/.test(path)) return null;
    if (path.charAt(0) === "/" || path.indexOf("\\") >= 0 || /[\u0000-\u001f\u007f]/.test(path)) return null;
    var parts = path.split("/");
    return parts.every(function (part) { return part && part !== "." && part !== ".."; }) ? path : null;
  }

  function jobAsked() {
    var params = new URLSearchParams(location.search);
    if (!params.has("job") && !params.has("from")) return null;
    var notebook = notebookPath(params.get("job")), from = params.get("from");
    params.delete("job");
    params.delete("from");
    var rest = params.toString();
    history.replaceState(history.state, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
    return notebook && { notebook: notebook, from: from };
  }

  // The image and slice of the session the notebook was in, when it is still one of the user's
  // and its image offered: a notebook written on a GPU session is most likely meant to run on one
  // (each value within what the sliders reach). That session, or null (the defaults stay).
  function pickSessionOf(sessionId) {
    if (!sessionId) return Promise.resolve(null);
    return fgpu.api("GET", "sessions").then(function (data) {
      var from = data.sessions.filter(function (s) { return s.id === sessionId; })[0];
      var offered = from && images.some(function (i) { return i.name === from.image; });
      if (!offered) return null;
      field("image").value = from.image;
      describeImage();
      setWithin("cpu", from.cpu);
      setWithin("mem", from.mem / GIB);
      if (!field("fgpu").disabled) setWithin("fgpu", from.fgpu);
      showValues();
      updateLaunchAdvice();
      return from;
    }, function () { return null; });
  }

  function setWithin(name, value) {
    var slider = field(name);
    slider.value = String(Math.min(Number(slider.max), Math.max(Number(slider.min), value)));
  }

  function fromNote(job, session) {
    var note = field("from");
    var where = session && (session.server_name ? "session \u201c" + session.server_name + "\u201d" : "default session");
    note.replaceChildren("From JupyterLab: run ", el("code", { text: job.notebook }),
      where ? " with the image and resources of your " + where + "." : ".",
      " Check " + (where ? "them" : "the image and resources") + " and the time limit below, then press Submit job.");
    var shared = notebookFolderOwner();
    if (shared) {
      note.append(" This notebook is ", el("strong", { text: shared.owner + "\u2019s" }),
        ", in their folder \u201c" + shared.name + "\u201d shared with you: it would run as you, with your home and folders. " +
        "Its folder is not ticked; tick it only if you trust " + shared.owner + ".");
    }
    note.classList.remove("d-none");
  }

  function openJob(job) {
    field("type-batch").checked = true;
    field("kind-notebook").checked = true;
    field("notebook").value = job.notebook;
    showMode();
    showValues();
    fromNote(job, null);
    openLaunch().then(function () {
      tickNotebookFolder();
      return pickSessionOf(job.from);
    }).then(function (session) {
      fromNote(job, session);
      field("submit").focus();
    });
  }

  setSliders();
  showValues();
  showMode();
  timeLimitNote();
  var asked = jobAsked();
  if (asked) openJob(asked);

  // ---- admins: a running session → a private image of its owner (POST sessions/{id}/image) ---
  var saveField = fieldsOf("fgpu-save-");
  var saveDialog = document.getElementById("fgpu-save");
  var notice = document.getElementById("fgpu-notice");
  var saving = null;

  function openSave(session) {
    saving = session;
    saveField("about").textContent = "Commit " + session.user + "'s session " +
      session.id.slice(0, 8) + " (" + session.image + ") to an image that only " + session.user + " can start.";
    saveField("error").classList.add("d-none");
    saveDialog.showModal();
  }

  function saved(result) {
    saveDialog.close();
    notice.textContent = "Saved " + result.user + "'s session as " + result.image + ". It is in the catalog as " +
      result.catalog.name + ", which only " + result.user + " sees and can start.";
    notice.classList.remove("d-none");
  }

  if (saveDialog) {
    saveField("cancel").addEventListener("click", function () { saveDialog.close(); });
    saveField("form").addEventListener("submit", function (event) {
      event.preventDefault();
      var submit = saveField("submit"), error = saveField("error");
      submit.disabled = true;
      submit.textContent = "Saving…";
      fgpu.api("POST", "sessions/" + saving.id + "/image", { tag: saveField("tag").value }).then(
        saved,
        function (e) { error.textContent = e.message; error.classList.remove("d-none"); }
      ).then(function () { submit.disabled = false; submit.textContent = "Save image"; });
    });
  }
})();
