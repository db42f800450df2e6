// The Storage page: folders from api/folders (own, shared with me; admins: everyone's), create /
// rename / share / delete, and a folder's files: browse, download, upload in chunks, make a
// subfolder, rename, delete. The location's hash names the open folder and path (#/ID/a/b), so
// the browser's Back button leaves a subfolder.
"use strict";

(function () {
  var config = fgpu.config;
  var el = fgpu.element;
  var folders = [];
  var quotas = [];
  var everyone = false;
  var current = null; // { folder, path, entries } while a folder is open
  var upload = null; // { xhrs, cancelled, failed, part } while an upload runs

  function $(id) { return document.getElementById("fgpu-" + id); }

  function show(id, message) {
    $(id).textContent = message || "";
    $(id).classList.toggle("d-none", !message);
  }

  function plural(n, one, many) { return n + " " + (n === 1 ? one : many || one + "s"); }

  function quoted(name) { return "“" + name + "”"; }

  // A path inside a folder, each part escaped for the URL ("a b/c#" → "a%20b/c%23").
  function encodePath(path) {
    return path.split("/").filter(Boolean).map(encodeURIComponent).join("/");
  }

  function filesPath(folder, path) {
    return "folders/" + folder.id + "/files/" + encodePath(path || "");
  }

  function join(path, name) { return path ? path + "/" + name : name; }

  function graceText() {
    var days = Number(config.graceDays);
    if (!days) return "it is kept by the admins for a grace period";
    return "it is kept for " + plural(Math.round(days * 10) / 10, "day") + " by the admins";
  }

  // -- the lists --------------------------------------------------------------------------------

  // The error box holds a view's failure (a listing that did not load), which the next good load
  // clears, or an action's, which stays through the reload after it: an upload refused halfway
  // must still say so once the folder is listed again.
  var viewFailed = false;
  function viewLoaded(clearAll) {
    if (viewFailed || clearAll) show("error", "");
    viewFailed = false;
  }
  function viewError(error) {
    viewFailed = true;
    show("error", error.message);
  }

  function load() {
    return fgpu.api("GET", everyone ? "folders?all=1" : "folders").then(function (data) {
      folders = data.folders;
      quotas = data.storage_quotas || [];
      viewLoaded(false);
      renderLists();
      if (current) refreshCurrentFolder();
    }, viewError);
  }

  function changedCell(iso) {
    return el("td", { className: "fgpu-changed", title: iso ? fgpu.time(iso) : "" }, [fgpu.ago(iso)]);
  }

  function nameCell(folder) {
    var link = el("a", {
      href: "#/" + folder.id + "/", className: "fgpu-open fw-semibold", "data-action": "open",
      text: folder.name,
    });
    var lines = [link];
    // `automount` is the reader's (their own dot-named folders); in everyone's view an admin
    // also sees whose sessions mount another user's.
    var othersAutomount = everyone && !folder.own && folder.name.charAt(0) === ".";
    if (folder.automount || othersAutomount) {
      lines.push(" ", el("span", { className: "badge text-bg-info", text: "automount" }));
      lines.push(el("div", {
        className: "fgpu-note text-muted small",
        text: "Mounted in every session" + (othersAutomount ? " of " + folder.owner : "") + " at ~/" + folder.name + ".",
      }));
    }
    return el("td", { className: "fgpu-folder-name" }, lines);
  }

  function sharesText(folder) {
    if (!folder.shares || !folder.shares.length) return "not shared";
    return folder.shares.map(function (s) {
      return (s.user ? s.user : "group " + s.group) + (s.permission === "rw" ? " (read-write)" : " (read-only)");
    }).join(", ");
  }

  function accessText(folder) {
    if (folder.permission !== "rw") return "read-only";
    var others = (folder.writers || []).filter(function (w) { return w !== folder.owner; });
    return "read-write; " + folder.owner + (others.length ? ", " + others.join(", ") : "") + " may write";
  }

  function button(label, kind, action, folder, handler) {
    return el("button", {
      type: "button", className: "btn btn-sm btn-" + kind, "data-action": action,
      onclick: function () { handler(folder); }, text: label,
    });
  }

  function actionsCell(folder) {
    var buttons = [];
    if (folder.own) buttons.push(button("Share", "outline-primary", "share", folder, openShare));
    buttons.push(button("Rename", "outline-secondary", "rename", folder, renameFolder));
    if (everyone) buttons.push(button("Change owner", "outline-secondary", "owner", folder, changeOwner));
    buttons.push(button("Delete", "outline-danger", "delete", folder, deleteFolder));
    return el("td", { className: "fgpu-actions" }, [el("div", { className: "fgpu-buttons" }, buttons)]);
  }

  function figures(folder) {
    return [
      el("td", { className: "fgpu-size", text: fgpu.size(folder.size_bytes) }),
      el("td", { className: "fgpu-files", text: folder.files === null || folder.files === undefined ? "—" : String(folder.files) }),
      changedCell(folder.modified || folder.created),
    ];
  }

  function mineRow(folder) {
    return el("tr", { "data-folder": folder.name, "data-id": folder.id }, [
      nameCell(folder), el("td", { className: "fgpu-shares", text: sharesText(folder) }),
    ].concat(figures(folder), [actionsCell(folder)]));
  }

  function sharedRow(folder) {
    return el("tr", { "data-folder": folder.name, "data-id": folder.id }, [
      nameCell(folder),
      el("td", { className: "fgpu-owner", text: folder.owner }),
      el("td", { className: "fgpu-access", text: accessText(folder) }),
    ].concat(figures(folder)));
  }

  function everyoneRow(folder) {
    return el("tr", { "data-folder": folder.name, "data-id": folder.id, "data-owner": folder.owner }, [
      nameCell(folder),
      el("td", { className: "fgpu-owner", text: folder.owner }),
      el("td", { className: "fgpu-shares", text: sharesText(folder) }),
    ].concat(figures(folder), [actionsCell(folder)]));
  }

  function fill(table, items, row, empty) {
    var body = $(table).querySelector("tbody");
    body.replaceChildren.apply(body, items.map(row));
    $(table).classList.toggle("d-none", !items.length);
    $(empty).classList.toggle("d-none", items.length > 0);
  }

  // How full each storage quota over one's own folders is ("2.1 GiB of 10 GiB used"), and what
  // a full one means: the service refuses new bytes and mounts one's folders read-only.
  function quotaLine(q) {
    var whose = q.group === null ? "Your folders" : "Group " + q.group + "'s folders (all its members')";
    var line = el("div", { className: "fgpu-quota-line" + (q.full ? " text-danger fw-semibold" : ""), "data-group": q.group || "" }, [
      el("progress", { max: String(q.limit_bytes), value: String(Math.min(q.used_bytes, q.limit_bytes)), "aria-label": whose + ", share of the quota used" }),
      el("span", { className: "ms-2", text: whose + ": " + fgpu.size(q.used_bytes) + " of " + fgpu.size(q.limit_bytes) + " used" + (q.full ? " (full)." : ".") }),
    ]);
    return line;
  }

  function renderQuota() {
    var box = $("quota");
    if (!quotas.length) {
      box.replaceChildren(el("div", { className: "text-muted", text: "No storage quota: your folders may grow as long as the disk has room." }));
      return;
    }
    var lines = quotas.map(quotaLine);
    var full = quotas.some(function (q) { return q.full; });
    var atOnce = quotas.every(function (q) { return q.held_by === "kernel"; });
    lines.push(el("div", {
      className: "small " + (full ? "text-danger" : "text-muted"),
      text: full ? "Full: uploads and new folders are refused, and your own folders are mounted read-only in the sessions you launch next, until you remove files." :
        atOnce ? "A write past the quota fails at once, in your sessions too (\"Disk quota exceeded\")." :
        "Sizes are measured every few minutes. Past the quota, uploads and new folders are refused and your folders are mounted read-only at your next launch.",
    }));
    box.replaceChildren.apply(box, lines);
  }

  function renderLists() {
    $("quota").classList.toggle("d-none", everyone);
    renderQuota();
    if ($("all-section")) {
      $("all-section").classList.toggle("d-none", !everyone);
      $("mine-section").classList.toggle("d-none", everyone);
      $("shared-section").classList.toggle("d-none", everyone);
    }
    if (everyone) {
      fill("all", folders, everyoneRow, "all-empty");
      return;
    }
    fill("mine", folders.filter(function (f) { return f.own; }), mineRow, "mine-empty");
    fill("shared", folders.filter(function (f) { return !f.own; }), sharedRow, "shared-empty");
  }

  function change(method, path, body, done) {
    show("done", "");
    return fgpu.api(method, path, body).then(function (answer) {
      show("done", done);
      show("error", "");
      return load().then(function () { return answer; });
    });
  }

  function failed(error) { show("error", error.message); }

  // -- create, rename, delete -------------------------------------------------------------------

  $("create-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var name = $("create-name").value.trim();
    show("create-error", "");
    $("create-name").classList.remove("is-invalid");
    if (!name) {
      $("create-name").classList.add("is-invalid");
      show("create-error", "Give the folder a name.");
      return;
    }
    change("POST", "folders", { name: name }, "Folder " + quoted(name) + " made.").then(function () {
      $("create-name").value = "";
    }, function (error) {
      $("create-name").classList.add("is-invalid");
      show("create-error", error.message);
    });
  });

  // The one small dialog that asks for a name: rename a folder or an entry, make a subfolder.
  // `save(name)` returns a promise; its refusal is shown in the dialog, which stays open.
  var naming = null;
  function askName(title, label, value, action, save) {
    naming = save;
    $("name-title").textContent = title;
    $("name-label").textContent = label;
    $("name-submit").textContent = action;
    $("name-input").value = value || "";
    show("name-error", "");
    $("name-dialog").showModal();
    $("name-input").select();
  }
  $("name-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var name = $("name-input").value.trim();
    if (!name) { show("name-error", "Type a name."); return; }
    $("name-submit").disabled = true;
    naming(name).then(function () {
      $("name-dialog").close();
    }, function (error) {
      show("name-error", error.message);
    }).then(function () { $("name-submit").disabled = false; });
  });
  $("name-cancel").addEventListener("click", function () { $("name-dialog").close(); });

  function renameFolder(folder) {
    askName("Rename " + quoted(folder.name), "New name", folder.name, "Rename", function (name) {
      return change("PATCH", "folders/" + folder.id, { name: name }, "Renamed to " + quoted(name) + ".");
    });
  }

  function insideText(folder) {
    if (folder.files === 0) return "It is empty; nothing will be removed.";
    if (folder.files === null || folder.files === undefined) return "Everything in it will be removed.";
    return plural(folder.files, "file") + ", " + fgpu.size(folder.size_bytes) + " will be removed.";
  }

  // An admin hands a folder to another user (a course changes instructor, say); its shares stay.
  function changeOwner(folder) {
    askName("Change the owner of " + quoted(folder.name), "New owner (their user name)", "", "Change owner", function (name) {
      return change("PATCH", "folders/" + folder.id, { owner: name },
        quoted(folder.name) + " now belongs to " + name + " (it was " + folder.owner + "'s).");
    });
  }

  function deleteFolder(folder) {
    var lines = [insideText(folder).replace(/\.$/, ";") + " " + graceText() +
      " (ask them if it was a mistake), then it is gone."];
    var shares = folder.shares || [];
    if (shares.length) {
      lines.push((shares.length === 1 ? "Its share ends: " : "Its " + shares.length + " shares end: ") +
        sharesText(folder) + ".");
    }
    fgpu.confirmAction({
      title: "Delete the folder " + quoted(folder.name) + (folder.own ? "" : " of " + folder.owner) + "?",
      lines: lines, confirm: "Delete folder", keep: "Keep it",
    }).then(function (yes) {
      if (!yes) return;
      if (current && current.folder.id === folder.id) location.hash = "";
      change("DELETE", "folders/" + folder.id, undefined, "Folder " + quoted(folder.name) + " deleted.").catch(failed);
    });
  }

  // -- sharing ----------------------------------------------------------------------------------

  var sharing = null;
  function openShare(folder) {
    sharing = folder;
    $("share-title").textContent = "Share " + quoted(folder.name);
    $("share-name").value = "";
    show("share-error", "");
    renderShares();
    $("share-dialog").showModal();
    $("share-name").focus();
  }

  function renderShares() {
    var list = $("share-list");
    var shares = sharing.shares || [];
    if (!shares.length) {
      list.replaceChildren(el("li", { className: "text-muted", text: "Nobody yet: only you see this folder." }));
      return;
    }
    list.replaceChildren.apply(list, shares.map(function (s) {
      var who = s.user ? s.user : "group " + s.group;
      return el("li", { className: "d-flex align-items-center gap-2 mb-1", "data-share": who }, [
        el("span", { className: "flex-fill", text: who + " — " + (s.permission === "rw" ? "read-write" : "read-only") }),
        el("button", {
          type: "button", className: "btn btn-sm btn-outline-danger", "data-action": "unshare", text: "Stop sharing",
          onclick: function () {
            fgpu.api("DELETE", "folders/" + sharing.id + "/shares/" + s.id).then(afterShare, function (e) { show("share-error", e.message); });
          },
        }),
      ]);
    }));
  }

  function afterShare() {
    show("share-error", "");
    return load().then(function () {
      sharing = folders.filter(function (f) { return f.id === sharing.id; })[0] || sharing;
      renderShares();
    });
  }

  $("share-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var name = $("share-name").value.trim();
    if (!name) { show("share-error", "Type the user's or the group's name."); return; }
    var body = { permission: $("share-form").elements.permission.value };
    body[$("share-kind").value] = name;
    fgpu.api("POST", "folders/" + sharing.id + "/shares", body).then(function () {
      $("share-name").value = "";
      return afterShare();
    }, function (e) { show("share-error", e.message); });
  });
  $("share-close").addEventListener("click", function () { $("share-dialog").close(); });

  // -- the file browser -------------------------------------------------------------------------

  function fromHash() {
    var match = /^#\/([0-9a-f]{32})\/?(.*)$/.exec(location.hash);
    if (!match) {
      current = null;
      $("browser").classList.add("d-none");
      $("lists").classList.remove("d-none");
      return;
    }
    var id = match[1], path = match[2].split("/").filter(Boolean).map(decodeURIComponent).join("/");
    var folder = folders.filter(function (f) { return f.id === id; })[0];
    var found = folder ? Promise.resolve(folder) : fgpu.api("GET", "folders/" + id);
    found.then(function (f) { openFolder(f, path); }, failed);
  }

  function hashFor(folder, path) { return "#/" + folder.id + "/" + encodePath(path); }

  function writable(folder) { return folder.permission === "rw" || config.admin; }

  // Going to a folder clears any message; listing the same one again after a change keeps it.
  function openFolder(folder, path, again) {
    return fgpu.api("GET", filesPath(folder, path)).then(function (listing) {
      current = { folder: folder, path: listing.path, entries: listing.entries, next: listing.next };
      viewLoaded(!again);
      renderBrowser();
    }, viewError);
  }

  // A large directory comes a page at a time (subdirectories first, by name); each further page is added under the last.
  function showMore() {
    var shown = current, button = $("more");
    button.disabled = true;
    var url = filesPath(shown.folder, shown.path) + "?after=" + encodeURIComponent(shown.next);
    fgpu.api("GET", url).then(function (listing) {
      if (current !== shown) return; // another directory was opened meanwhile
      shown.entries = shown.entries.concat(listing.entries);
      shown.next = listing.next;
      renderBrowser();
    }, failed).then(function () { button.disabled = false; });
  }
  $("more").addEventListener("click", showMore);

  function refreshCurrentFolder() {
    var fresh = folders.filter(function (f) { return f.id === current.folder.id; })[0];
    if (fresh) current.folder = fresh;
  }

  function reopen() { return openFolder(current.folder, current.path, true); }

  function renderBrowser() {
    var folder = current.folder, canWrite = writable(folder);
    $("lists").classList.add("d-none");
    $("browser").classList.remove("d-none");
    $("browser-title").textContent = folder.name;
    $("readonly").classList.toggle("d-none", canWrite);
    $("write-controls").classList.toggle("d-none", !canWrite);
    var note = folder.own ? "Your folder." : "Owned by " + folder.owner + ", " + accessText(folder) + ".";
    if (!canWrite) note += " You can open and download its files, not change them.";
    if (folder.automount) note += " Mounted in every session at ~/" + folder.name + ".";
    else note += " In a session that mounts it: ~/folders/" + folder.name + ".";
    $("browser-note").textContent = note;
    renderBreadcrumb();
    $("breadcrumb").parentNode.classList.toggle("d-none", !current.path);
    $("entries").classList.toggle("fgpu-read-only", !canWrite);
    var entries = current.entries.map(function (entry) { return entryRow(entry, canWrite); });
    var body = $("entries").querySelector("tbody");
    body.replaceChildren.apply(body, entries);
    $("entries").classList.toggle("d-none", !entries.length);
    $("more-row").classList.toggle("d-none", !current.next);
    $("more-note").textContent = current.next ? plural(entries.length, "entry", "entries") + " shown; more follow." : "";
    show("entries-empty", entries.length ? "" : current.path ? "This subfolder is empty." :
      canWrite ? "This folder is empty. Upload files here, or save them to it from a session." :
        "This folder is empty for now.");
  }

  function renderBreadcrumb() {
    var parts = current.path ? current.path.split("/") : [];
    var crumbs = [{ name: current.folder.name, path: "" }].concat(parts.map(function (part, i) {
      return { name: part, path: parts.slice(0, i + 1).join("/") };
    }));
    var list = $("breadcrumb");
    list.replaceChildren.apply(list, crumbs.map(function (crumb, i) {
      if (i === crumbs.length - 1) {
        return el("li", { className: "breadcrumb-item active", "aria-current": "page", text: crumb.name });
      }
      return el("li", { className: "breadcrumb-item" }, [
        el("a", { href: hashFor(current.folder, crumb.path), text: crumb.name }),
      ]);
    }));
  }

  function entryRow(entry, canWrite) {
    var path = join(current.path, entry.name), name;
    if (entry.type === "directory") {
      name = el("a", { href: hashFor(current.folder, path), className: "fw-semibold", text: entry.name + "/" });
    } else if (entry.type === "file") {
      name = el("a", {
        href: config.api + filesPath(current.folder, path), download: entry.name, "data-action": "download",
        title: "Download " + entry.name, text: entry.name,
      });
    } else {
      name = el("span", {}, [entry.name + " ", el("span", {
        className: "text-muted small", text: entry.type === "link" ? "link (not followed)" : "special file (not read)",
      })]);
    }
    var actions = [];
    if (canWrite) {
      actions.push(el("button", { type: "button", className: "btn btn-sm btn-outline-secondary", "data-action": "rename",
        text: "Rename", onclick: function () { renameEntry(entry); } }));
      actions.push(el("button", { type: "button", className: "btn btn-sm btn-outline-danger", "data-action": "delete",
        text: "Delete", onclick: function () { deleteEntry(entry); } }));
    }
    return el("tr", { "data-entry": entry.name, "data-type": entry.type }, [
      el("td", { className: "fgpu-entry-name" }, [name]),
      el("td", { className: "fgpu-size", text: entry.type === "file" ? fgpu.size(entry.size) : "" }),
      changedCell(entry.modified ? new Date(entry.modified * 1000).toISOString() : null),
      el("td", { className: "fgpu-actions" }, [el("div", { className: "fgpu-buttons" }, actions)]),
    ]);
  }

  function afterFileChange(done) {
    show("done", done);
    if (done) show("error", "");
    return Promise.all([reopen(), load()]);
  }

  $("mkdir").addEventListener("click", function () {
    askName("New subfolder in " + quoted(current.path || current.folder.name), "Name", "", "Make", function (name) {
      return fgpu.api("POST", filesPath(current.folder, join(current.path, name)), { type: "directory" })
        .then(function () { return afterFileChange("Subfolder " + quoted(name) + " made."); });
    });
  });

  function renameEntry(entry) {
    askName("Rename " + quoted(entry.name), "New name", entry.name, "Rename", function (name) {
      return fgpu.api("PATCH", filesPath(current.folder, join(current.path, entry.name)), { to: join(current.path, name) })
        .then(function () { return afterFileChange("Renamed to " + quoted(name) + "."); });
    });
  }

  function deleteEntry(entry) {
    var what = entry.type === "directory" ? "the subfolder " + quoted(entry.name) + " and everything in it" :
      quoted(entry.name) + (entry.type === "file" ? " (" + fgpu.size(entry.size) + ")" : "");
    fgpu.confirmAction({
      title: "Delete " + quoted(entry.name) + "?",
      lines: ["This removes " + what + " from " + quoted(current.folder.name) + " at once; it cannot be brought back."],
      confirm: "Delete", keep: "Keep it",
    }).then(function (yes) {
      if (!yes) return;
      fgpu.api("DELETE", filesPath(current.folder, join(current.path, entry.name)))
        .then(function () { return afterFileChange(quoted(entry.name) + " deleted."); }, failed);
    });
  }

  // -- uploads: each file in chunks of config.chunkBytes, several at once ------------------------
  // The first chunk (?offset=0&size=S) starts a parallel upload; the others name it (?upload=ID),
  // in any order. The file appears under its name only once every chunk is in (until then its
  // bytes are in a hidden part file), so a file it replaces stays whole if the upload fails. A
  // chunk cut short (the network, or a site's proxy ending a long request) is sent again.

  var PARALLEL_CHUNKS = 4, CHUNK_TRIES = 3;

  // One chunk: PUT as octet-stream; XMLHttpRequest for its progress and its abort.
  function sendChunk(url, blob, onProgress) {
    return new Promise(function (resolve, reject) {
      var xhr = new XMLHttpRequest();
      upload.xhrs.push(xhr);
      xhr.open("PUT", url);
      var headers = fgpu.headers();
      Object.keys(headers).forEach(function (k) { xhr.setRequestHeader(k, headers[k]); });
      xhr.setRequestHeader("Content-Type", "application/octet-stream");
      xhr.upload.onprogress = function (e) { onProgress(e.loaded); };
      function failed(message, status) {
        var error = new Error(message);
        error.status = status;
        reject(error);
      }
      xhr.onload = function () {
        if (xhr.status >= 200 && xhr.status < 300) { resolve(JSON.parse(xhr.responseText)); return; }
        var message = xhr.status + " " + xhr.statusText;
        try { message = JSON.parse(xhr.responseText).message || message; } catch (e) { /* not JSON */ }
        failed(message, xhr.status);
      };
      xhr.onerror = function () { failed("The upload was interrupted (network error).", 0); };
      xhr.onabort = function () { failed("cancelled", -1); };
      xhr.send(blob);
    });
  }

  // A chunk again when the way there failed (no answer, or a proxy's 502/503/504), not when the
  // service refused it.
  function withTries(send, left) {
    return send().catch(function (error) {
      var again = [0, 502, 503, 504].indexOf(error.status) >= 0 && left > 1 && !upload.cancelled;
      if (!again) throw error;
      return new Promise(function (resolve) { setTimeout(resolve, 1000); }).then(function () {
        return withTries(send, left - 1);
      });
    });
  }

  // One file; onSent(bytes) as its chunks go. Resolves once the service says it is complete.
  function uploadFile(url, file, onSent) {
    var sent = {};
    function send(offset, query) {
      var end = Math.min(file.size, offset + config.chunkBytes);
      return withTries(function () {
        return sendChunk(url + "?offset=" + offset + query, file.slice(offset, end), function (loaded) {
          sent[offset] = Math.min(loaded, end - offset);
          onSent(total());
        });
      }, CHUNK_TRIES).then(function (answer) {
        sent[offset] = end - offset;
        onSent(total());
        return answer;
      });
    }
    function total() {
      return Object.keys(sent).reduce(function (sum, k) { return sum + sent[k]; }, 0);
    }
    return send(0, "&size=" + file.size).then(function (first) {
      upload.part = first.part;
      var offsets = [], complete = first.complete;
      for (var o = config.chunkBytes; o < file.size; o += config.chunkBytes) offsets.push(o);
      function next() {
        if (!offsets.length || upload.failed) return Promise.resolve();
        return send(offsets.shift(), "&upload=" + first.upload).then(function (answer) {
          complete = complete || answer.complete;
          return next();
        });
      }
      var lanes = [];
      for (var i = 0; i < PARALLEL_CHUNKS; i++) lanes.push(next());
      return Promise.all(lanes).then(function () {
        if (!complete) throw new Error("The service did not take every chunk; upload the file again.");
      });
    });
  }

  function progress(sent, total, label) {
    var percent = total ? Math.floor((100 * sent) / total) : 100;
    $("upload-bar").value = percent;
    $("upload-bar").setAttribute("data-sent", String(sent));
    $("upload-text").textContent = label + ": " + fgpu.size(sent) + " of " + fgpu.size(total) + " (" + percent + "%)";
  }

  function uploadFiles(files) {
    if (!files.length || upload) return;
    var folder = current.folder, base = current.path;
    var total = files.reduce(function (sum, f) { return sum + f.size; }, 0), before = 0;
    var existing = current.entries.map(function (e) { return e.name; });
    var replaced = files.filter(function (f) { return existing.indexOf(f.name) >= 0; });
    var asked = replaced.length ? fgpu.confirmAction({
      title: "Replace " + (replaced.length === 1 ? quoted(replaced[0].name) : plural(replaced.length, "file")) + "?",
      lines: ["A file of that name is already here: uploading replaces it."],
      confirm: "Replace", keep: "Don't upload",
    }) : Promise.resolve(true);
    asked.then(function (yes) {
      if (!yes) return;
      upload = { xhrs: [], cancelled: false, failed: false, part: null };
      show("done", "");
      show("error", "");
      $("upload").classList.remove("d-none");
      var chain = Promise.resolve(), done = [], sending = null;
      files.forEach(function (file, index) {
        chain = chain.then(function () {
          var label = "Uploading " + file.name + (files.length > 1 ? " (" + (index + 1) + " of " + files.length + ")" : "");
          var url = config.api + filesPath(folder, join(base, file.name));
          upload.part = null;
          sending = file.name;
          progress(before, total, label);
          return uploadFile(url, file, function (sent) { progress(before + sent, total, label); }).then(function () {
            before += file.size;
            done.push(file.name);
            upload.xhrs = [];
          }, function (error) {
            // The other chunks stop, and the part file goes: nothing half-made stays.
            // The listing that follows must not show the part file, so its removal is awaited.
            upload.failed = true;
            upload.xhrs.forEach(function (xhr) { xhr.abort(); });
            var removed = upload.part ? fgpu.api("DELETE", filesPath(folder, upload.part)) : Promise.resolve();
            return removed.catch(function () {}).then(function () { throw error; });
          });
        });
      });
      chain.then(function () {
        return "Uploaded " + (done.length === 1 ? done[0] : plural(done.length, "file")) + " (" + fgpu.size(total) + ").";
      }, function (error) {
        var kept = done.length ? " " + plural(done.length, "file") + " finished before: " + done.join(", ") + "." : "";
        // The file it would have replaced stays as it was (the bytes went to a part file).
        if (sending && existing.indexOf(sending) >= 0) kept += " The " + quoted(sending) + " already there is unchanged.";
        if (upload.cancelled) return "Upload cancelled; the unfinished file was removed." + kept;
        show("error", "Upload failed: " + error.message + kept);
        return "";
      }).then(function (message) {
        upload = null;
        $("upload").classList.add("d-none");
        $("upload-input").value = "";
        if (current && current.folder.id === folder.id) return afterFileChange(message);
        show("done", message);
      });
    });
  }

  $("upload-input").addEventListener("change", function () {
    uploadFiles(Array.prototype.slice.call($("upload-input").files));
  });
  $("upload-cancel").addEventListener("click", function () {
    if (!upload) return;
    upload.cancelled = true;
    upload.xhrs.forEach(function (xhr) { xhr.abort(); });
  });

  // -- start ------------------------------------------------------------------------------------

  $("back").addEventListener("click", function (event) {
    event.preventDefault();
    location.hash = "";
  });
  window.addEventListener("hashchange", fromHash);
  if ($("storage-all")) {
    $("storage-all").addEventListener("change", function () {
      everyone = $("storage-all").checked;
      load();
    });
  }
  load().then(fromHash);
})();
