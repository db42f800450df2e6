// Shared by the queue service's pages: formatting, API calls, and the resource indicator.
// Plain browser JavaScript, no build step; every page loads this file first.
"use strict";

var fgpu = (function () {
  var config = JSON.parse(document.getElementById("fgpu-page-config").textContent);

  // Sizes as the spawn form writes them: binary, like Docker (1G = 1024M).
  function size(bytes) {
    if (bytes === null || bytes === undefined) return "—";
    var units = [["T", 4], ["G", 3], ["M", 2], ["K", 1]];
    for (var i = 0; i < units.length; i++) {
      var scaled = bytes / Math.pow(1024, units[i][1]);
      if (scaled >= 1) return trim(scaled) + units[i][0];
    }
    return bytes + "B";
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
    target.replaceChildren.apply(target, rows.concat([caption], budgetLines(resources.budgets)));
    target.setAttribute("data-ready", "1");
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

  return {
    config: config,
    api: api,
    headers: headers,
    size: size,
    trim: trim,
    amount: amount,
    cores: cores,
    ordinal: ordinal,
    duration: duration,
    time: time,
    element: element,
    renderIndicator: renderIndicator,
    indicatorFigures: indicatorFigures,
    poll: poll,
  };
})();
