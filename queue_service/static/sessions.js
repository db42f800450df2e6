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
      children.push(el("div", { className: "fgpu-pending-detail fgpu-position", text: where }));
      if (s.reason) children.push(el("div", { className: "fgpu-pending-detail fgpu-reason", text: s.reason }));
    }
    if (s.status === "RUNNING" && s.ends) children.push(endsLine(s.ends));
    return el("td", {}, children);
  }

  // When and why a running session will end by itself (api/sessions `ends`); highlighted once
  // its warning is due.
  function endsLine(ends) {
    var idle = ends.why === "idle";
    var parts = [];
    if (ends.at) parts.push((idle ? "Stops if unused from " : "Ends at ") + fgpu.time(ends.at) + " (" + ends.text + ")");
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
    tbody.replaceChildren.apply(tbody, shown.map(row));
    document.getElementById("fgpu-empty").classList.toggle("d-none", shown.length > 0);
    document.getElementById("fgpu-sessions").setAttribute("data-updated", String(Date.now()));
  }

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
      return el("div", { className: "form-check", "data-folder": f.name }, [el("input", box), label]);
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
    return r;
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
    field("count-value").value = r.count === 1 ? "1 session" : r.count + " sessions";
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
    var outlook = fgpu.launchOutlook(r, scope, resources.limits);
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

  document.getElementById("fgpu-start").addEventListener("click", function () {
    launchError.classList.add("d-none");
    if (latest.resources) fitSliders(latest.resources);
    renderRecent();
    // The recent launches again once the folders are known: they name their folders.
    Promise.all([loadImages(), loadPresets(), loadFolders()]).then(function () { renderRecent(); followPreset(); showValues(); updateLaunchAdvice(); });
    dialog.showModal();
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

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var body = launchBody();
    if (body.folders || offeredFolders().length === 0) {
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
    submit.textContent = "Launching…";
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
      submit.textContent = "Launch";
      refresh();
    });
  }
  setSliders();
  showValues();

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
