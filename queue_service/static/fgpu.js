// Shared by the queue service's pages: formatting, API calls, and the resource indicator.
// Plain browser JavaScript, no build step; every page loads this file first.
"use strict";

var fgpu = (function () {
  var config = JSON.parse(document.getElementById("fgpu-page-config").textContent);

  // Sizes as people read them and the forms take them back: binary IEC units with a space
  // ("532 B", "1.5 GiB"; 1 GiB = 1024 MiB, like Docker). Every page shows bytes through this one
  // function, and it gives the text fgpu_shared/units.py's format_size gives (the hub's spawn
  // form, the queue's messages): two decimals at most, halves up ("1.13 GiB").
  function size(bytes) {
    if (bytes === null || bytes === undefined) return "—";
    var units = [["TiB", 4], ["GiB", 3], ["MiB", 2], ["KiB", 1]];
    for (var i = 0; i < units.length; i++) {
      var scaled = bytes / Math.pow(1024, units[i][1]);
      if (scaled >= 1) return scaled.toFixed(2).replace(/\.?0+$/, "") + " " + units[i][0];
    }
    return bytes + " B";
  }

  // How long ago: "just now", "5 min ago", "3 h ago", "2 days ago"; `when` an ISO text or a Date.
  function ago(when) {
    if (!when) return "never";
    var seconds = Math.max(0, (Date.now() - new Date(when)) / 1000);
    if (seconds < 60) return "just now";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min ago";
    if (seconds < 86400) return Math.floor(seconds / 3600) + " h ago";
    var days = Math.floor(seconds / 86400);
    return days === 1 ? "yesterday" : days + " days ago";
  }

  function trim(number) {
    return String(Math.round(number * 100) / 100);
  }

  // Hours and the like: two decimals, or two significant digits for small ones (0.0001 is not 0).
  function amount(number) {
    number = Number(number);
    if (number !== 0 && Math.abs(number) < 0.1) return String(Number(number.toPrecision(2)));
    return trim(number);
  }

  function cores(n) {
    return trim(n) + (Number(n) === 1 ? " core" : " cores");
  }

  function ordinal(n) {
    var suffix = n % 100 >= 10 && n % 100 <= 20 ? "th" : { 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th";
    return n + suffix;
  }

  function duration(fromIso, toIso) {
    if (!fromIso) return "—";
    var end = toIso ? new Date(toIso) : new Date();
    var seconds = Math.max(0, Math.floor((end - new Date(fromIso)) / 1000));
    var h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
    return h + ":" + String(m).padStart(2, "0") + ":" + String(s).padStart(2, "0");
  }

  function time(iso) {
    return iso ? new Date(iso).toLocaleString() : "—";
  }

  // What every call to the service sends: the XSRF token proves the call comes from our own page
  // (the service refuses a cookie without it), as JupyterHub's own pages do.
  function headers() {
    return { Accept: "application/json", "X-XSRFToken": config.xsrf || "" };
  }

  // One call to the service's API; the promise rejects with the service's own message.
  function api(method, path, body) {
    var options = { method: method, credentials: "same-origin", headers: headers() };
    if (body !== undefined) {
      options.body = JSON.stringify(body);
      options.headers["Content-Type"] = "application/json";
    }
    return fetch(config.api + path, options).then(function (response) {
      return response.text().then(function (text) {
        var data = {};
        try { data = text ? JSON.parse(text) : {}; } catch (e) { data = { message: text }; }
        if (!response.ok) {
          var error = new Error(data.message || response.status + " " + response.statusText);
          error.status = response.status;
          throw error;
        }
        return data;
      });
    });
  }

  function element(tag, attributes, children) {
    var node = document.createElement(tag);
    Object.keys(attributes || {}).forEach(function (key) {
      if (key === "text") node.textContent = attributes[key];
      else if (key === "className") node.className = attributes[key];
      else if (key.indexOf("on") === 0) node.addEventListener(key.slice(2), attributes[key]);
      else node.setAttribute(key, attributes[key]);
    });
    (children || []).forEach(function (child) {
      if (child !== null && child !== undefined) {
        node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
      }
    });
    return node;
  }

  // A table cell for a name or an image ("s-99b9b4", "python-3.11"): on one line, never broken
  // at its hyphen; a long one ends in "…" and shows whole on hover (title) and to screen readers.
  function nameCell(text) {
    return element("td", { className: "fgpu-name", title: text }, [element("span", { text: text })]);
  }

  var SLOTS = [
    { key: "cpu", label: "CPU", show: cores },
    { key: "mem", label: "RAM", show: size },
    { key: "fgpu", label: "fGPU", show: function (v) { return trim(v) + " fGPU"; } },
  ];

  // The seed's two bars, from GET api/resources. Upper: what the user holds in the current
  // resource group, over all they could hold there (held + still allocatable there). Lower: what
  // they hold in total, over held in total + allocatable in the current group.
  function indicatorFigures(resources) {
    var groups = resources.resource_groups;
    var current = null, name = resources.resource_group || null;
    if (groups) {
      if (Array.isArray(groups)) {
        var byName = {};
        groups.forEach(function (g) { byName[g.name] = g; });
        groups = byName;
      }
      name = name && groups[name] ? name : currentGroup(groups);
      current = groups[name] || null;
    }
    var inGroup = current && current.allocated ? current : resources;
    return SLOTS.map(function (slot) {
      var held = Number(inGroup.allocated[slot.key] || 0);
      var room = Number(inGroup.allocatable[slot.key] || 0);
      var total = Number(resources.allocated[slot.key] || 0);
      return {
        slot: slot,
        group: name,
        upper: { used: held, total: held + room },
        lower: { used: total, total: total + room },
      };
    });
  }

  // The group a student works in: "default" when they may use it, else the first they may use.
  function currentGroup(groups) {
    var names = Object.keys(groups);
    var allowed = names.filter(function (n) { return groups[n].allowed !== false; });
    if (allowed.indexOf("default") >= 0) return "default";
    return allowed[0] || names[0];
  }

  function bar(kind, figures, show) {
    var percent = figures.total > 0 ? Math.min(100, (100 * figures.used) / figures.total) : 0;
    return element("div", {
      className: "fgpu-bar fgpu-bar-" + kind,
      "data-used": String(figures.used),
      "data-total": String(figures.total),
      title: show(figures.used) + " of " + show(figures.total),
    }, [
      element("div", { className: "fgpu-bar-fill", style: "width:" + percent + "%" }),
      element("span", { className: "fgpu-bar-text", text: show(figures.used) + " / " + show(figures.total) }),
    ]);
  }

  // ---- which limit stops a launch (api/resources `free`, `limits`: queue_service/core/limits.py) ----
  // Pure: a scope is {name, allocatable, free, capacity} (the whole of what the user may use, or
  // one resource group); `limits` are api/resources `limits`, each with its own sentence.

  function slotText(key, value) {
    return SLOTS.filter(function (s) { return s.key === key; })[0].show(value);
  }

  function reachedLimits(limits, kind) {
    return (limits || []).filter(function (l) { return l.reached && l.kind === kind; });
  }

  // Why a slot has nothing allocatable, as sentences: a used-up quota of the user's (or their
  // group's), others holding the cluster's share, or no such hardware; [] when something is.
  function whyNothing(scope, limits) {
    var reasons = [];
    function add(text) { if (reasons.indexOf(text) < 0) reasons.push(text); }
    var sessions = reachedLimits(limits, "sessions");
    sessions.forEach(function (l) { add("Nothing more starts for you now. " + l.text); });
    if (sessions.length) return reasons;
    SLOTS.forEach(function (slot) {
      var k = slot.key, capacity = Number(scope.capacity[k] || 0);
      if (Number(scope.allocatable[k] || 0) > 1e-9) return;
      if (!capacity) {
        if (k === "fgpu") add(scope.name ? "Resource group " + scope.name + " has no GPUs." : "This hub has no GPUs.");
        return;
      }
      var quota = reachedLimits(limits, k);
      quota.forEach(function (l) { add("No more " + slot.label + " for you now. " + l.text); });
      if (!quota.length && Number(scope.free ? scope.free[k] : 0) <= 1e-9) {
        add("No more " + slot.label + " for you now: all " + slotText(k, capacity) +
          (scope.name ? " of resource group " + scope.name : " of the cluster") + " are in use.");
      }
    });
    return reasons;
  }

  // The launch dialog's free figures: the cluster's, then what the user's quotas leave of them
  // when that is less, with the quota that leaves it.
  function freeLines(scope, limits, unitsPerGpu) {
    function figures(f) {
      return cores(f.cpu) + ", " + size(f.mem) + " memory, " + trim(f.fgpu) + " fGPU";
    }
    var where = scope.name ? " in " + scope.name : "";
    var lines = ["Free on the cluster" + where + ": " + figures(scope.free || scope.allocatable) +
      (unitsPerGpu ? " (1 fGPU = 1/" + unitsPerGpu + " GPU)" : "") + "."];
    var less = scope.free && SLOTS.some(function (s) { return scope.allocatable[s.key] + 1e-9 < scope.free[s.key]; });
    if (less) {
      var nothing = SLOTS.every(function (s) { return !(scope.allocatable[s.key] > 0); });
      lines.push("Your quota leaves you " + (nothing ? "none of it now" : figures(scope.allocatable)) + "." +
        (limits || []).filter(function (l) { return l.reached; }).map(function (l) { return " " + l.text; }).join(""));
    }
    return lines;
  }

  // How many of `r.count` sessions of r's slots start now, and why the rest wait or are refused.
  // {now, waiting, refused, text} or null when all start now.
  // `jobRoom`: for batch jobs, how many more may wait (QueueService.jobs_waiting_per_user less
  // those waiting now); jobs are not bound by the `pending` quota, sessions are (jobs.py).
  function launchOutlook(r, scope, limits, jobRoom) {
    var jobs = jobRoom !== undefined && jobRoom !== null;
    function fit(room) {
      var n = r.count;
      SLOTS.forEach(function (s) { if (r[s.key] > 0) n = Math.min(n, Math.floor((Number(room[s.key]) + 1e-9) / r[s.key])); });
      return n;
    }
    var now = fit(scope.allocatable);
    (limits || []).filter(function (l) { return l.kind === "sessions"; })
      .forEach(function (l) { now = Math.min(now, Math.max(0, Math.floor(l.left))); });
    if (now >= r.count) return null;
    var byCluster = scope.free ? fit(scope.free) : now;
    var binding = (limits || []).filter(function (l) {
      if (l.kind === "sessions") return l.left < r.count;
      return l.kind !== "pending" && r[l.kind] > 0 && l.left + 1e-9 < r[l.kind] * r.count;
    });
    // A quota that binds is named even when the cluster is short too: others ending alone
    // would not start the rest.
    var quota = byCluster > now || binding.length > 0;
    var clusterShort = byCluster < r.count;
    var waiting = r.count - now, refused = 0;
    if (jobs) refused = Math.max(0, waiting - Math.max(0, jobRoom));
    (limits || []).filter(function (l) { return !jobs && l.kind === "pending" && l.left < waiting; }).forEach(function (l) {
      refused = Math.max(refused, waiting - Math.max(0, Math.floor(l.left)));
      binding.push(l);
    });
    waiting -= refused;
    var what = jobs ? "job" : "request";
    var text = (now ? now + " will start now; " : "") +
      (waiting ? waiting + " will wait in the queue (PENDING) until " +
        (quota ? "your quota has room" + (clusterShort ? " and others end" : "") : "others end") +
        ". " : "") +
      (refused ? refused + " will be refused: no more " + what + "s may wait" +
        (jobs ? " (at most " + (jobRoom + waiting) + " more " + (jobRoom + waiting === 1 ? "job" : "jobs") + " of yours now)" : "") + ". " : "") +
      (quota || refused ? binding.map(function (l) { return l.text; }).join(" ") : "");
    return { now: now, waiting: waiting, refused: refused, quota: quota, text: text.trim() };
  }

  function renderIndicator(target, resources) {
    var rows = indicatorFigures(resources).map(function (f) {
      return element("div", { className: "fgpu-indicator-slot", "data-slot": f.slot.key }, [
        element("div", { className: "fgpu-indicator-label", text: f.slot.label }),
        element("div", { className: "fgpu-indicator-bars" }, [
          bar("upper", f.upper, f.slot.show),
          bar("lower", f.lower, f.slot.show),
        ]),
      ]);
    });
    var group = indicatorFigures(resources)[0].group;
    var caption = element("div", { className: "fgpu-indicator-caption" }, [
      "Upper: in resource group " + (group || "default") + ". Lower: in total.",
      config.simulated ? " GPUs on this hub are simulated." : "",
    ]);
    var why = whyNothing(indicatorScope(resources, group), resources.limits).map(function (text) {
      return element("div", { className: "fgpu-indicator-why", text: text });
    });
    target.replaceChildren.apply(target, rows.concat(why, [caption], budgetLines(resources.budgets)));
    target.setAttribute("data-ready", "1");
  }

  // The indicator's upper bars' scope: the current resource group's figures, else the totals.
  function indicatorScope(resources, group) {
    var groups = resources.resource_groups;
    var figures = groups && !Array.isArray(groups) && groups[group] && groups[group].allocatable ? groups[group] : null;
    if (!figures) return { name: null, allocatable: resources.allocatable, free: resources.free, capacity: resources.capacity };
    var several = Object.keys(groups).length > 1;
    return { name: several ? group : null, allocatable: figures.allocatable, free: figures.free, capacity: figures.capacity };
  }

  // The budgets of the user's groups (api/resources `budgets`): use this window, and when it renews.
  function budgetLines(budgets) {
    return (budgets || []).map(function (b) {
      var used = amount(b.used) + " of " + amount(b.limit) + " " + b.label + " this " + b.period;
      return element("div", {
        className: "fgpu-indicator-budget" + (b.used_up ? " fgpu-budget-used-up" : ""),
        "data-budget": b.group + ":" + b.figure + ":" + b.period,
        "data-used-up": b.used_up ? "1" : "0",
      }, [
        "Budget of " + b.group + ": " + used +
          (b.used_up ? "; used up until " : "; renews ") + time(b.frees_at) + ".",
      ]);
    });
  }

  // Asks before something that cannot be undone (stopping a session, giving up a place in the
  // queue, deleting an image): a modal <dialog> in the page, not window.confirm, so that it reads
  // like the rest of the page, says what is lost and what is kept, and a screen reader announces
  // its title and text (aria-labelledby / aria-describedby). Esc and "keep" both answer false;
  // the safe choice has the focus first. Resolves true only when the person confirms.
  // what: { title, lines: [text, ...], confirm: "Stop session", keep: "Keep it running", tone }
  var asking = null;
  function confirmAction(what) {
    var dialog = document.getElementById("fgpu-confirm");
    if (!dialog) {
      dialog = element("dialog", {
        className: "fgpu-dialog fgpu-confirm", id: "fgpu-confirm",
        "aria-labelledby": "fgpu-confirm-title", "aria-describedby": "fgpu-confirm-text",
      }, [
        element("h2", { className: "h5", id: "fgpu-confirm-title" }),
        element("div", { id: "fgpu-confirm-text" }),
        element("div", { className: "d-flex gap-2 justify-content-end" }, [
          element("button", { type: "button", className: "btn btn-secondary", id: "fgpu-confirm-keep" }),
          element("button", { type: "button", className: "btn btn-danger", id: "fgpu-confirm-go" }),
        ]),
      ]);
      document.body.appendChild(dialog);
      dialog.querySelector("#fgpu-confirm-keep").addEventListener("click", function () { dialog.close("keep"); });
      dialog.querySelector("#fgpu-confirm-go").addEventListener("click", function () { dialog.close("go"); });
      dialog.addEventListener("close", function () {
        if (asking) asking(dialog.returnValue === "go");
        asking = null;
      });
    }
    if (asking) asking(false);  // a second question replaces an open one; the first is "no"
    dialog.querySelector("#fgpu-confirm-title").textContent = what.title;
    var text = dialog.querySelector("#fgpu-confirm-text");
    text.replaceChildren.apply(text, what.lines.map(function (line) { return element("p", { text: line }); }));
    dialog.querySelector("#fgpu-confirm-keep").textContent = what.keep || "Cancel";
    dialog.querySelector("#fgpu-confirm-go").textContent = what.confirm;
    // A question that loses nothing (what.tone "btn-warning") is not shown in danger's red.
    dialog.querySelector("#fgpu-confirm-go").className = "btn " + (what.tone || "btn-danger");
    dialog.returnValue = "";
    return new Promise(function (resolve) {
      asking = resolve;
      dialog.showModal();
      dialog.querySelector("#fgpu-confirm-keep").focus();
    });
  }

  // The words for ending a session, from the student's side: what a Stop loses and keeps, what a
  // Cancel gives up. `session` is an api/sessions record; `mine`: the viewer owns it.
  function endQuestion(session, mine) {
    var name = session.server_name ? "“" + session.server_name + "”" : "your default session";
    var whose = mine ? name : session.user + "’s session " + (session.server_name ? "“" + session.server_name + "”" : "(default)");
    if (session.status === "PENDING") {
      var place = session.position ? " (" + ordinal(session.position) + " in line)" : "";
      return {
        title: "Cancel the request for " + whose + "?",
        lines: [
          "It gives up its place in the queue" + place + ". Asking again later puts a new request at the back of the line.",
          "Nothing has started yet, so nothing is lost.",
        ],
        confirm: "Cancel request", keep: "Keep waiting",
      };
    }
    return {
      title: "Stop " + whose + "?",
      lines: [
        "Its running kernels end: anything only in their memory (variables, unsaved notebook changes, running cells) is lost. Save your notebooks first.",
        "The home folder (/home/jovyan) is kept: files saved there are back in the next session.",
        "Its " + cores(session.cpu) + ", " + size(session.mem) + " memory" + (Number(session.fgpu) ? " and " + trim(session.fgpu) + " fGPU" : "") + " go back to the pool.",
      ],
      confirm: "Stop session", keep: "Keep it running",
    };
  }

  // A session's Stop or Cancel button: asks first, then DELETE api/sessions/{id}.
  function endSession(session, button, mine, done, failed) {
    return confirmAction(endQuestion(session, mine)).then(function (yes) {
      if (!yes) return;
      button.disabled = true;
      return api("DELETE", "sessions/" + session.id).then(done, function (e) { button.disabled = false; failed(e); });
    });
  }

  // A page's message box (an alert) says `message`, or hides when there is none.
  function showMessage(box, message) {
    box.textContent = message || "";
    box.classList.toggle("d-none", !message);
  }

  // Poll `path` every `seconds` while the page is visible; `render` gets each answer.
  function poll(path, seconds, render, onError) {
    var timer = null, round = 0;
    function tick() {
      // An early `now()` starts a new round; only the latest round schedules the next one.
      var mine = ++round;
      clearTimeout(timer);
      return api("GET", path)
        .then(render, onError || function () {})
        .catch(function (e) { console.error(e); })  // a failed render must not end the polling
        .then(function () {
          if (mine === round) timer = setTimeout(tick, document.hidden ? seconds * 5000 : seconds * 1000);
        });
    }
    tick();
    return { now: tick };
  }

  // Stacking tables (pages.css, fgpu-stack): each cell carries its column's heading as
  // data-label, which the narrow layout shows beside the value. Rows come and go as the pages
  // poll, so an observer labels new cells as they arrive.
  function labelCells(table) {
    var heads = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) { return th.textContent.trim(); });
    Array.prototype.forEach.call(table.tBodies[0] ? table.tBodies[0].rows : [], function (row) {
      var column = 0;
      Array.prototype.forEach.call(row.cells, function (cell) {
        if (cell.colSpan === 1 && heads[column] && cell.getAttribute("data-label") !== heads[column]) {
          cell.setAttribute("data-label", heads[column]);
        }
        column += cell.colSpan;
      });
    });
  }

  document.querySelectorAll("table.fgpu-stack").forEach(function (table) {
    labelCells(table);
    if (table.tBodies[0]) {
      new MutationObserver(function () { labelCells(table); }).observe(table.tBodies[0], { childList: true });
    }
  });

  return {
    config: config,
    api: api,
    headers: headers,
    size: size,
    ago: ago,
    trim: trim,
    amount: amount,
    cores: cores,
    ordinal: ordinal,
    duration: duration,
    time: time,
    element: element,
    showMessage: showMessage,
    nameCell: nameCell,
    renderIndicator: renderIndicator,
    indicatorFigures: indicatorFigures,
    whyNothing: whyNothing,
    freeLines: freeLines,
    launchOutlook: launchOutlook,
    poll: poll,
    confirmAction: confirmAction,
    endSession: endSession,
  };
})();
