// The admin's cluster view: nodes and GPUs (api/resources admin fields) with each session's slices
// (api/sessions grants), the queue in order, and use against quota (cluster/quotas).
"use strict";

(function () {
  var el = fgpu.element;
  var state = { sessions: [], resources: null, quotas: { users: {}, groups: {} } };
  var HOLDING = ["SCHEDULED", "RUNNING"];

  function showError(message) {
    var box = document.getElementById("fgpu-error");
    box.textContent = message || "";
    box.classList.toggle("d-none", !message);
  }

  function asks(s) {
    return fgpu.trim(s.cpu) + " cores, " + fgpu.size(s.mem) + ", " + fgpu.trim(s.fgpu) + " fGPU";
  }

  function endButton(s, label) {
    var button = el("button", { type: "button", className: "btn btn-sm btn-outline-danger fgpu-end", text: label });
    button.addEventListener("click", function () {
      fgpu.endSession(s, button, s.user === fgpu.config.user,
        function () { showError(""); refresh(); },
        function (e) { showError(e.message); });
    });
    return button;
  }

  // Who holds which part of a GPU: the service's `slices` when it sends them, else the grants.
  function holders(node, gpu) {
    if (gpu.slices) return gpu.slices;
    return state.sessions.filter(function (s) {
      return HOLDING.indexOf(s.status) >= 0 && s.grant && s.grant.node === node.name && (s.grant.gpus || {})[gpu.uuid];
    }).map(function (s) {
      return { session_id: s.id, user: s.user, server_name: s.server_name, fraction: s.grant.gpus[gpu.uuid] };
    });
  }

  // One GPU as a strip of `units` fGPU slices; each session's fraction is a labelled block.
  function gpuStrip(node, gpu, units) {
    var layer = [];
    for (var i = 1; i < units; i++) {
      layer.push(el("div", { className: "fgpu-gpu-slice-line", style: "left:" + (100 * i) / units + "%" }));
    }
    var offset = 0;
    holders(node, gpu).forEach(function (h) {
      layer.push(el("div", {
        className: "fgpu-gpu-hold", "data-session": h.session_id, "data-user": h.user,
        style: "left:" + 100 * offset + "%;width:" + 100 * h.fraction + "%",
        title: h.user + " / " + h.server_name + ": " + fgpu.trim(h.fraction * units) + " fGPU",
        text: h.user + " " + fgpu.trim(h.fraction * units) + " fGPU",
      }));
      offset += h.fraction;
    });
    var used = (1 - gpu.fraction_free) * units;
    return el("div", { className: "fgpu-gpu", "data-gpu": gpu.uuid }, [
      el("div", { className: "small", text: "GPU " + gpu.index + " (" + gpu.uuid + "): " + fgpu.trim(used) +
        " of " + units + " fGPU held, " + fgpu.trim(gpu.fgpu_free) + " free" }),
      el("div", { className: "fgpu-gpu-strip" }, layer),
    ]);
  }

  // Swarm mode: the catalog's images this node holds of those it should (the nodes pull them
  // ahead of their sessions), and what it lacks: pulling, failed with the reason, or missing.
  function imagesLine(node) {
    var images = node.images;
    if (!images) return null;
    var all = images.present === images.offered;
    var parts = ["Catalog images here: " + images.present + " of " + images.offered];
    ["pulling", "failed", "missing", "unknown"].forEach(function (state) {
      var those = images.lacking.filter(function (i) { return i.state === state; });
      if (!those.length) return;
      parts.push(state + ": " + those.map(function (i) {
        return i.image + (state === "failed" ? " (" + i.error + ")" : "");
      }).join(", "));
    });
    var failed = images.lacking.some(function (i) { return i.state === "failed"; });
    return el("div", {
      className: "small fgpu-node-images " + (failed ? "text-danger" : all ? "text-success" : "text-muted"),
      text: (all ? "✓ " : "") + parts.join("; "),
    });
  }

  function renderNodes() {
    var resources = state.resources;
    if (!resources || !resources.nodes) return;
    var units = resources.units_per_gpu || 1;
    var target = document.getElementById("fgpu-nodes");
    target.replaceChildren.apply(target, resources.nodes.map(function (node) {
      return el("div", { className: "fgpu-node", "data-node": node.name }, [
        el("div", { className: "fw-semibold", text: node.name + " (resource group " + node.resource_group + ")" }),
        el("div", { className: "small", text: "CPU " + fgpu.trim(node.cpu_total - node.cpu_free) + " / " +
          fgpu.trim(node.cpu_total) + " cores held; memory " + fgpu.size(node.mem_total - node.mem_free) + " / " +
          fgpu.size(node.mem_total) + (fgpu.config.simulated ? "; GPUs simulated" : "") }),
        imagesLine(node),
      ].concat(node.gpus.length ? node.gpus.map(function (gpu) { return gpuStrip(node, gpu, units); })
        : [el("div", { className: "small text-muted", text: "No GPU." })]));
    }));
  }

  function renderQueue() {
    var pending = state.sessions.filter(function (s) { return s.status === "PENDING"; });
    pending.sort(function (a, b) { return (a.position || 1e9) - (b.position || 1e9); });
    var tbody = document.querySelector("#fgpu-queue tbody");
    tbody.replaceChildren.apply(tbody, pending.map(function (s) {
      return el("tr", { "data-session": s.id }, [
        el("td", { text: s.position ? String(s.position) : "—" }),
        el("td", { className: "fgpu-id", text: s.id.slice(0, 8) }),
        el("td", { text: s.user }),
        el("td", { text: asks(s) }),
        el("td", { text: fgpu.duration(s.created) }),
        el("td", { text: s.reason || "" }),
        el("td", { className: "fgpu-actions" }, [endButton(s, "Cancel")]),
      ]);
    }));
    document.getElementById("fgpu-queue-empty").classList.toggle("d-none", pending.length > 0);

    var running = state.sessions.filter(function (s) { return HOLDING.indexOf(s.status) >= 0; });
    var rbody = document.querySelector("#fgpu-running tbody");
    rbody.replaceChildren.apply(rbody, running.map(function (s) {
      return el("tr", { "data-session": s.id }, [
        el("td", { className: "fgpu-id", text: s.id.slice(0, 8) }),
        el("td", { text: s.user }),
        fgpu.nameCell(s.server_name || "(default)"),
        el("td", { text: s.status }),
        el("td", { text: s.grant ? s.grant.node : "—" }),
        el("td", { text: asks(s) }),
        el("td", { text: fgpu.time(s.started) }),
        el("td", { className: "fgpu-actions" }, [endButton(s, "Stop")]),
      ]);
    }));
  }

  function against(used, limit, show) {
    return show(used) + " / " + (limit === null || limit === undefined ? "∞" : show(limit));
  }

  function useOf(sessions) {
    var held = sessions.filter(function (s) { return HOLDING.indexOf(s.status) >= 0; });
    return {
      sessions: held.length,
      pending: sessions.length - held.length,
      cpu: held.reduce(function (t, s) { return t + s.cpu; }, 0),
      mem: held.reduce(function (t, s) { return t + s.mem; }, 0),
      fgpu: held.reduce(function (t, s) { return t + s.fgpu; }, 0),
    };
  }

  function slotCells(use, limit) {
    return [
      el("td", { text: against(use.cpu, limit.cpu, fgpu.trim) }),
      el("td", { text: against(use.mem, limit.mem, fgpu.size) }),
      el("td", { text: against(use.fgpu, limit.fgpu, fgpu.trim) }),
    ];
  }

  function renderQuotas() {
    var users = state.quotas.users, groups = state.quotas.groups;
    var ubody = document.querySelector("#fgpu-user-quotas tbody");
    ubody.replaceChildren.apply(ubody, Object.keys(users).map(function (name) {
      var use = useOf(state.sessions.filter(function (s) { return s.user === name; }));
      return el("tr", { "data-user": name }, [
        el("td", { text: name }),
        el("td", { text: users[name].groups.join(", ") || "—" }),
        el("td", { text: String(use.sessions) }),
        el("td", { text: String(use.pending) }),
      ].concat(slotCells(use, users[name].limit)));
    }));
    var gbody = document.querySelector("#fgpu-group-quotas tbody");
    gbody.replaceChildren.apply(gbody, Object.keys(groups).map(function (name) {
      var members = Object.keys(users).filter(function (u) { return users[u].groups.indexOf(name) >= 0; });
      var use = useOf(state.sessions.filter(function (s) { return members.indexOf(s.user) >= 0; }));
      return el("tr", { "data-group": name }, [
        el("td", { text: name }),
        el("td", { text: String(use.sessions) }),
      ].concat(slotCells(use, groups[name])));
    }));
  }

  function render() {
    renderNodes();
    renderQueue();
    renderQuotas();
    document.getElementById("fgpu-nodes").setAttribute("data-updated", String(Date.now()));
  }

  var sessionsPoll = fgpu.poll("sessions?all=1", 2, function (data) { state.sessions = data.sessions; render(); },
    function (e) { showError(e.message); });
  var resourcesPoll = fgpu.poll("resources", 2, function (data) { state.resources = data; render(); });
  function loadQuotas() {
    fetch(fgpu.config.quotas, { credentials: "same-origin", headers: fgpu.headers() })
      .then(function (r) { return r.ok ? r.json() : state.quotas; })
      .then(function (q) { state.quotas = q; render(); }, function () {});
  }
  loadQuotas();
  setInterval(loadQuotas, 10000);
  // What the service's health checks say is wrong (admins get the checks), e.g. a session
  // container the engine does not answer about, or one that was frozen and thawed.
  fgpu.poll("health", 10, function (data) {
    var box = document.getElementById("fgpu-health");
    var bad = (data.checks || []).filter(function (c) { return c.status !== "ok"; });
    box.replaceChildren.apply(box, bad.map(function (c) {
      return el("div", { className: "fgpu-health-check", "data-check": c.name }, [
        el("strong", { text: c.name + ": " }), el("span", { text: c.message }),
        c.fix ? el("div", { className: "small", text: c.fix }) : null,
      ].filter(Boolean));
    }));
    box.classList.toggle("d-none", bad.length === 0);
  });
  function refresh() { sessionsPoll.now(); resourcesPoll.now(); }
})();
