// The Images page: the catalog from api/images; for managers, add / edit / hide / check / delete.
"use strict";

(function () {
  var config = fgpu.config;
  var el = fgpu.element;
  var images = [];
  var editing = null; // the image being edited, or null when adding

  function $(id) { return document.getElementById("fgpu-" + id); }

  function show(id, message) {
    $(id).textContent = message || "";
    $(id).classList.toggle("d-none", !message);
  }

  function load() {
    return fgpu.api("GET", config.manager ? "images?all=1" : "images").then(function (data) {
      images = data.images;
      render();
      show("error", "");
    }, function (error) { show("error", error.message); });
  }

  function minimum(image) {
    var min = (image.resources || {}).min || {};
    var parts = [];
    if (min.cpu) parts.push(fgpu.cores(min.cpu));
    if (min.mem) parts.push(fgpu.size(min.mem));
    if (min.fgpu) parts.push(fgpu.trim(min.fgpu) + " fGPU");
    return parts.join(", ") || "—";
  }

  // Who may start it: a private image's owner alone (its groups are empty, which for a shared
  // image means everyone), else its groups, else everyone.
  function offeredTo(image) {
    if (image.owner) return "only " + image.owner;
    return image.groups.length ? image.groups.join(", ") : "everyone";
  }

  function checkCell(check) {
    if (check.ok === null) return el("span", { className: "text-muted", text: "not checked" });
    return el("span", {
      className: check.ok ? "text-success" : "text-danger",
      title: check.message + (check.checked_at ? " (" + fgpu.time(check.checked_at) + ")" : ""),
      text: check.ok ? "✓ starts" : "✗ " + check.message,
    });
  }

  function minutesSeconds(seconds) {
    var s = Math.round(seconds || 0);
    return s < 60 ? s + " s" : Math.floor(s / 60) + " min " + (s % 60) + " s";
  }

  // Whether the engine holds the image, and the background build of a heavy one (queued,
  // building with its step and last log line, built, failed with the reason).
  function engineCell(image) {
    var build = image.build;
    if (build && build.state === "building") {
      return el("div", {}, [
        el("span", { className: "text-primary", text: "building" + (build.step ? ", " + build.step : "") }),
        el("div", { className: "fgpu-build-line text-muted small", text: build.last_line }),
      ]);
    }
    if (build && build.state === "failed") {
      return el("span", { className: "text-danger", text: "✗ build failed: " + build.reason });
    }
    if (image.on_engine) {
      // A build that ran steps built the image; one without found it up to date.
      var took = build && build.state === "built" && build.step
        ? " (built in " + minutesSeconds(build.seconds) + ")" : "";
      return el("span", { className: "text-success", text: "✓ on the engine" + took });
    }
    if (build && build.state === "queued") {
      return el("span", { className: "text-muted", text: "queued for building" });
    }
    return el("span", { className: "text-danger", text: "✗ not on the engine: not offered" });
  }

  // Swarm mode: on how many of the nodes that can run it the image is already (the nodes pull
  // the catalog's images ahead of their sessions), and each node's state, unfolded on demand.
  function nodesCell(image) {
    var nodes = image.nodes;
    if (!nodes) return null;
    var all = nodes.present === nodes.of;
    var summary = el("summary", {
      className: all ? "text-success" : "text-muted",
      text: (all ? "✓ " : "") + "on " + nodes.present + " of " + nodes.of + " nodes",
    });
    if (!nodes.nodes) return el("div", { className: "fgpu-image-nodes small " + summary.className, text: summary.textContent });
    var items = nodes.nodes.map(function (node) {
      var text = node.node + ": " + node.state;
      if (node.state === "failed") {
        text += " (" + node.error + "; tried again in " + minutesSeconds(node.retry_in_s) + ")";
      }
      var tone = { present: "text-success", failed: "text-danger", pulling: "text-primary" };
      return el("li", { className: tone[node.state] || "text-muted", "data-node": node.node, text: text });
    });
    return el("details", { className: "fgpu-image-nodes small" }, [summary, el("ul", {}, items)]);
  }

  function button(label, kind, action, image) {
    return el("button", {
      type: "button",
      className: "btn btn-sm btn-" + kind,
      "data-action": label.toLowerCase(),
      "data-image": image.name,
      onclick: function () { action(image); },
      text: label,
    });
  }

  function row(image) {
    var cells = [
      el("td", {}, [
        el("div", { className: "fw-semibold", text: image.display_name || image.name }),
        el("div", { className: "fgpu-id text-muted", text: image.name }),
        image.owner ? el("div", { className: "text-muted", text: "private to " + image.owner }) : null,
      ]),
      el("td", { className: "fgpu-id", text: image.image }),
      el("td", { text: [image.framework, image.version].filter(Boolean).join(" ") || "—" }),
      el("td", { className: "fgpu-groups", text: offeredTo(image) }),
      el("td", { text: minimum(image) }),
    ];
    if (config.manager) {
      cells.push(el("td", { className: "fgpu-visibility", text: image.hidden ? "hidden" : "visible" }));
      cells.push(el("td", { className: "fgpu-engine" }, [engineCell(image), nodesCell(image)]));
      cells.push(el("td", {}, [checkCell(image.check)]));
      cells.push(el("td", { className: "fgpu-actions" }, [el("div", { className: "fgpu-buttons" }, [
        button("Edit", "outline-primary", openEdit, image),
        button(image.hidden ? "Show" : "Hide", "outline-secondary", toggleHidden, image),
        button("Check", "outline-secondary", recheck, image),
        button("Delete", "outline-danger", remove, image),
      ])]));
    }
    return el("tr", { "data-image": image.name }, cells);
  }

  function render() {
    var body = $("images").querySelector("tbody");
    body.replaceChildren.apply(body, images.map(row));
  }

  function change(method, path, body, done) {
    show("done", "");
    return fgpu.api(method, path, body).then(function () {
      show("done", done);
      return load();
    }, function (error) { show("error", error.message); });
  }

  function toggleHidden(image) {
    change("PATCH", "images/" + image.name, { hidden: !image.hidden },
      image.name + (image.hidden ? " is offered again." : " is hidden."));
  }

  function recheck(image) {
    change("POST", "images/" + image.name + "/check", undefined, image.name + " checked.");
  }

  function remove(image) {
    fgpu.confirmAction({
      title: "Delete " + image.name + " from the catalog?",
      lines: ["Nobody can start it any more. Sessions already running from it keep running."],
      confirm: "Delete image", keep: "Keep it",
    }).then(function (yes) {
      if (yes) change("DELETE", "images/" + image.name, undefined, image.name + " deleted.");
    });
  }

  // -- the add / edit dialog --------------------------------------------------------------------

  var FIELDS = ["name", "image", "display_name", "framework", "version", "description"];

  function field(name) { return $("image-form").elements[name]; }

  function openDialog(image) {
    editing = image;
    $("image-title").textContent = image ? "Edit " + image.name : "Add an image";
    FIELDS.forEach(function (name) { field(name).value = image ? image[name] || "" : ""; });
    field("name").readOnly = Boolean(image);
    var resources = (image && image.resources) || {};
    var min = resources.min || {}, max = resources.max || {};
    // A course's instructor adds images for their courses only: the field starts with them.
    field("groups").value = image ? image.groups.join(", ") : (config.taught || []).join(", ");
    field("min_cpu").value = min.cpu || "";
    field("min_mem").value = min.mem ? fgpu.size(min.mem) : "";
    field("max_cpu").value = max.cpu || "";
    field("gpu").checked = Boolean(image && image.gpu);
    field("hidden").checked = Boolean(image && image.hidden);
    show("image-error", "");
    $("image-dialog").showModal();
  }

  function openEdit(image) { openDialog(image); }

  function bounds(existing, values) {
    var merged = Object.assign({}, existing || {});
    Object.keys(values).forEach(function (key) {
      if (values[key] === "") delete merged[key];
      else merged[key] = key === "mem" ? values[key] : Number(values[key]);
    });
    return merged;
  }

  function formBody() {
    var body = {};
    FIELDS.forEach(function (name) {
      var value = field(name).value.trim();
      // A blank field on a new image lets the image's own labels fill it in.
      if (value || editing) body[name] = value;
    });
    body.groups = field("groups").value.split(",").map(function (g) { return g.trim(); }).filter(Boolean);
    var resources = (editing && editing.resources) || {};
    body.resources = {
      min: bounds(resources.min, { cpu: field("min_cpu").value.trim(), mem: field("min_mem").value.trim() }),
      default: resources.default || {},
      max: bounds(resources.max, { cpu: field("max_cpu").value.trim() }),
    };
    body.gpu = field("gpu").checked;
    body.hidden = field("hidden").checked;
    return body;
  }

  function submit(event) {
    event.preventDefault();
    var body = formBody();
    var request = editing
      ? fgpu.api("PATCH", "images/" + editing.name, body)
      : fgpu.api("POST", "images", body);
    $("image-submit").disabled = true;
    show("image-error", "");
    request.then(function (saved) {
      $("image-dialog").close();
      show("done", saved.name + (editing ? " saved." : " added; it starts a single-user server."));
      return load();
    }, function (error) {
      show("image-error", error.message);
    }).finally(function () { $("image-submit").disabled = false; });
  }

  if (config.manager) {
    $("image-add").addEventListener("click", function () { openDialog(null); });
    $("image-cancel").addEventListener("click", function () { $("image-dialog").close(); });
    $("image-form").addEventListener("submit", submit);
  }
  load();
  // Builds behind the hub and the nodes' pulls take minutes: follow them while any is under way.
  setInterval(function () {
    var busy = images.some(function (i) {
      var pulling = i.nodes && i.nodes.pulling > 0;
      return pulling || (i.build && /queued|building/.test(i.build.state));
    });
    if (busy && !document.querySelector("dialog[open]")) load();
  }, 5000);
})();
