// The Courses page: your courses (GET api/courses); and a course's own page for its instructors
// and admins: roster with each member's live sessions and jobs (api/courses/{name}/sessions,
// polled), budgets, fGPU-hours per member (api/usage?group=), the message, a new roster.
"use strict";

(function () {
  var config = fgpu.config, el = fgpu.element;
  var errorBox = document.getElementById("fgpu-error");
  var doneBox = document.getElementById("fgpu-done");

  function showError(message) { fgpu.showMessage(errorBox, message); }
  function showDone(message) { fgpu.showMessage(doneBox, message); }

  function coursePath(name) {
    return "courses/" + encodeURIComponent(name);
  }

  // An allowance (the course group's fgpu_quota) in words: "2 sessions, 4 fGPU, 20 fGPU-hours a week".
  var ALLOWANCE = [
    ["sessions", function (v) { return v + (Number(v) === 1 ? " session" : " sessions"); }],
    ["pending", function (v) { return v + " waiting"; }],
    ["cpu", fgpu.cores],
    ["mem", function (v) { return typeof v === "number" ? fgpu.size(v) + " memory" : v + " memory"; }],
    ["fgpu", function (v) { return fgpu.trim(v) + " fGPU"; }],
    ["fgpu_hours_per_day", function (v) { return v + " fGPU-hours a day"; }],
    ["fgpu_hours_per_week", function (v) { return v + " fGPU-hours a week"; }],
    ["cpu_hours_per_week", function (v) { return v + " CPU core-hours a week"; }],
    ["storage", function (v) { return v + " storage"; }],
  ];

  function allowanceParts(allowance) {
    return ALLOWANCE.filter(function (pair) { return allowance[pair[0]] !== undefined && allowance[pair[0]] !== null; })
      .map(function (pair) { return pair[1](allowance[pair[0]]); });
  }

  function allowanceText(allowance) {
    if (!allowance) return "No course limit (your own quota applies)";
    var parts = allowanceParts(allowance);
    var each = allowance.per_member ? allowanceParts(allowance.per_member) : [];
    if (each.length) parts.push("each member at most " + each.join(", "));
    return parts.length ? parts.join(", ") : "No course limit (your own quota applies)";
  }

  // --- the list -------------------------------------------------------------------------------

  function renderList(data) {
    var table = document.getElementById("fgpu-courses");
    var rows = data.courses.map(function (c) {
      var runs = c.role === "instructor" || config.admin;
      var link = runs ? el("a", { href: coursePath(c.name), className: "btn btn-sm btn-outline-primary", text: "Course page" }) : null;
      return el("tr", { "data-course": c.name }, [
        fgpu.nameCell(c.name),
        el("td", { text: c.role || "admin" }),
        el("td", { text: c.instructors.join(", ") }),
        el("td", { text: String(c.members) }),
        el("td", { text: allowanceText(c.allowance) }),
        el("td", {}, [link]),
      ]);
    });
    table.querySelector("tbody").replaceChildren.apply(table.querySelector("tbody"), rows);
    table.classList.toggle("d-none", !rows.length);
    document.getElementById("fgpu-courses-empty").classList.toggle("d-none", rows.length > 0);
    table.setAttribute("data-ready", "1");
  }

  // --- a course's page --------------------------------------------------------------------------

  var course = config.course, roster = [], sessionsByUser = {}, hoursByUser = {};

  function statusLine(s) {
    var label = s.type === "batch" ? "Job " + s.status.toLowerCase() : s.status;
    var name = s.server_name || "default";
    var children = [
      el("span", { className: "fgpu-status fgpu-status-" + s.status, text: label }), " ",
      el("span", { className: "fgpu-id", text: name }), " · " + s.image + " · " +
        fgpu.cores(s.cpu) + ", " + fgpu.size(s.mem) + (Number(s.fgpu) ? ", " + fgpu.trim(s.fgpu) + " fGPU" : ""),
    ];
    if (s.status === "RUNNING" && s.started) children.push(" · for " + fgpu.duration(s.started));
    if (s.status === "PENDING") {
      var why = (s.position ? fgpu.ordinal(s.position) + " in line" : "waiting") + (s.reason ? ": " + s.reason : "");
      children.push(el("div", { className: "fgpu-pending-detail", text: why }));
    }
    return children;
  }

  function sessionItem(member, s) {
    var stop = el("button", { type: "button", className: "btn btn-sm btn-outline-danger", text: s.status === "PENDING" ? "Cancel" : "Stop" });
    stop.addEventListener("click", function () {
      fgpu.endSession(s, stop, false, function () {
        showDone((s.status === "PENDING" ? "Cancelled " : "Stopped ") + member + "’s " + (s.server_name || "default") + ".");
        sessions.now();
      }, function (e) { showError(e.message); });
    });
    var buttons = [stop];
    var mayOpen = s.status === "RUNNING" && s.type !== "batch" && member !== config.user && roleOf(config.user) === "instructor";
    if (mayOpen) {
      var open = el("button", { type: "button", className: "btn btn-sm btn-outline-primary", text: "Open" });
      open.addEventListener("click", function () { openSession(s, open); });
      buttons.unshift(open);
    }
    return el("li", { className: "mb-1", "data-session": s.id }, [
      el("div", {}, statusLine(s)),
      el("div", { className: "fgpu-buttons" }, buttons),
    ]);
  }

  function openSession(s, button) {
    button.disabled = true;
    // Opened before the answer, so that the browser does not take the new tab for a pop-up.
    var tab = window.open("about:blank", "_blank");
    fgpu.api("POST", coursePath(course) + "/sessions/" + encodeURIComponent(s.id) + "/open").then(function (answer) {
      button.disabled = false;
      if (tab) tab.location = answer.url; else window.location = answer.url;
    }, function (e) {
      button.disabled = false;
      if (tab) tab.close();
      showError(e.message);
    });
  }

  function roleOf(name) {
    var found = roster.filter(function (m) { return m.name === name; })[0];
    return found ? found.role : null;
  }

  function renderRoster() {
    var tbody = document.querySelector("#fgpu-roster tbody");
    tbody.replaceChildren.apply(tbody, roster.map(function (m) {
      var mine = sessionsByUser[m.name] || [];
      var list = mine.length
        ? el("ul", { className: "list-unstyled mb-0" }, mine.map(function (s) { return sessionItem(m.name, s); }))
        : el("span", { className: "text-muted", text: "none" });
      var who = m.display_name ? m.display_name + " (" + m.name + ")" : m.name;
      return el("tr", { "data-member": m.name }, [
        fgpu.nameCell(who),
        el("td", { text: m.role }),
        el("td", {}, [list]),
        el("td", { text: fgpu.amount(hoursByUser[m.name] || 0) }),
      ]);
    }));
    document.getElementById("fgpu-roster").setAttribute("data-ready", "1");
  }

  function renderCourse(data) {
    roster = data.roster;
    var students = roster.filter(function (m) { return m.role === "student"; }).length;
    document.getElementById("fgpu-course-summary").textContent =
      "Taught by " + data.instructors.join(", ") + " · " + students + (students === 1 ? " student" : " students");
    document.getElementById("fgpu-course-allowance").textContent = allowanceText(data.allowance);
    var budgets = document.getElementById("fgpu-course-budgets");
    budgets.replaceChildren.apply(budgets, (data.budgets || []).map(function (b) {
      return el("div", { className: "alert py-1 px-2 mb-1 mt-1 " + (b.used_up ? "alert-warning" : "alert-light"), "data-budget": b.figure + ":" + b.period }, [
        fgpu.amount(b.used) + " of " + fgpu.amount(b.limit) + " " + b.label + " used this " + b.period +
          (b.used_up ? ": used up until " : "; renews ") + fgpu.time(b.frees_at) + ".",
      ]);
    }));
    var text = document.getElementById("fgpu-message-text");
    if (document.activeElement !== text) text.value = data.message ? data.message.text : "";
    document.getElementById("fgpu-message-clear").disabled = !data.message;
    renderAllowanceForm(data);
    renderRoster();
  }

  // The allowance an instructor may change: the keys an admin bounded, each up to its bound
  // (course_bounds.py); `per_member` keys are each member's own.
  var LABELS = {
    sessions: "Sessions at once", pending: "Waiting requests", cpu: "CPU cores", mem: "Memory (e.g. 16G)",
    fgpu: "fGPU", storage: "Storage (e.g. 50G)", fgpu_hours_per_day: "fGPU-hours a day",
    fgpu_hours_per_week: "fGPU-hours a week", cpu_hours_per_day: "CPU core-hours a day",
    cpu_hours_per_week: "CPU core-hours a week", mem_gib_hours_per_day: "Memory GiB-hours a day",
    mem_gib_hours_per_week: "Memory GiB-hours a week",
  };

  function boundedFields(bounds, allowance, scope) {
    return Object.keys(bounds || {}).filter(function (key) { return LABELS[key]; }).map(function (key) {
      var id = "fgpu-allowance-" + scope + "-" + key;
      var value = allowance && allowance[key] !== undefined ? String(allowance[key]) : "";
      return el("div", { className: "col-sm-6" }, [
        el("label", { className: "form-label small mb-0", for: id, text: LABELS[key] + (scope === "member" ? ", each member" : "") }),
        el("input", { className: "form-control form-control-sm", id: id, value: value, "data-key": key, "data-scope": scope,
          placeholder: "at most " + bounds[key], "aria-describedby": id + "-bound" }),
        el("div", { className: "form-text", id: id + "-bound", text: "At most " + bounds[key] + (scope === "member" ? " for each member" : " for the course") + ", set by an admin." }),
      ]);
    });
  }

  function renderAllowanceForm(data) {
    var bounds = data.bounds, form = document.getElementById("fgpu-allowance-form");
    var boundsText = document.getElementById("fgpu-course-bounds");
    boundsText.textContent = bounds
      ? "An admin set the bounds; you may change the allowance within them."
      : "An admin sets this course's bounds; until then its allowance is theirs to change.";
    if (document.activeElement && form.contains(document.activeElement)) return;
    var allowance = data.allowance || {};
    var fields = boundedFields(bounds, allowance, "course")
      .concat(boundedFields((bounds || {}).per_member, allowance.per_member, "member"));
    var target = document.getElementById("fgpu-allowance-fields");
    target.replaceChildren.apply(target, fields);
    form.classList.toggle("d-none", !fields.length);
    var folder = data.folder, row = document.getElementById("fgpu-automount-row");
    row.classList.toggle("d-none", !folder);
    if (folder) document.getElementById("fgpu-automount").checked = Boolean(folder.automount);
  }

  function allowanceChange() {
    var change = {}, member = {};
    document.querySelectorAll("#fgpu-allowance-fields input").forEach(function (input) {
      var text = input.value.trim(), number = Number(text);
      var value = text === "" ? null : (isNaN(number) ? text : number);
      if (input.dataset.scope === "member") { if (value !== null) member[input.dataset.key] = value; }
      else change[input.dataset.key] = value;
    });
    if (document.querySelector('#fgpu-allowance-fields input[data-scope="member"]')) change.per_member = member;
    return change;
  }

  function patchCourse(body, done) {
    showError("");
    return fgpu.api("PATCH", coursePath(course), body).then(function () {
      showDone(done);
      loadCourse();
    }, function (e) { showError(e.message); loadCourse(); });
  }

  function loadCourse() {
    return fgpu.api("GET", coursePath(course)).then(renderCourse, function (e) { showError(e.message); });
  }

  function loadHours() {
    var to = new Date(), from = new Date(Date.now() - 6 * 86400000);
    var query = "usage?group=" + encodeURIComponent(course) + "&from=" + from.toISOString().slice(0, 10) + "&to=" + to.toISOString().slice(0, 10);
    return fgpu.api("GET", query).then(function (data) {
      hoursByUser = {};
      data.usage.forEach(function (row) { hoursByUser[row.user] = (hoursByUser[row.user] || 0) + row.fgpu_hours; });
      renderRoster();
    }, function (e) { showError(e.message); });
  }

  var sessions = null;

  function startCoursePage() {
    loadCourse().then(function () {
      loadHours();
      sessions = fgpu.poll(coursePath(course) + "/sessions", 5, function (data) {
        sessionsByUser = {};
        data.sessions.forEach(function (s) { (sessionsByUser[s.user] = sessionsByUser[s.user] || []).push(s); });
        renderRoster();
      }, function (e) { showError(e.message); });
    });

    document.getElementById("fgpu-message-form").addEventListener("submit", function (event) {
      event.preventDefault();
      postMessage(document.getElementById("fgpu-message-text").value);
    });
    document.getElementById("fgpu-message-clear").addEventListener("click", function () { postMessage(""); });
    document.getElementById("fgpu-allowance-form").addEventListener("submit", function (event) {
      event.preventDefault();
      patchCourse({ allowance: allowanceChange() }, "The allowance is saved; it holds for the next request.");
    });
    document.getElementById("fgpu-automount").addEventListener("change", function (event) {
      var on = event.target.checked;
      patchCourse({ automount: on }, on ? "The course folder is mounted in every member's next session." : "The course folder is no longer mounted by itself.");
    });
    document.getElementById("fgpu-link-form").addEventListener("submit", function (event) {
      event.preventDefault();
      makeLink(event.target);
    });
    document.getElementById("fgpu-link-copy").addEventListener("click", function () {
      var output = document.getElementById("fgpu-link-output");
      output.select();
      (navigator.clipboard ? navigator.clipboard.writeText(output.value) : Promise.reject())
        .then(function () { showDone("The link is copied."); }, function () { document.execCommand("copy"); });
    });
    document.getElementById("fgpu-roster-form").addEventListener("submit", function (event) {
      event.preventDefault();
      uploadRoster();
    });
  }

  function postMessage(text) {
    showError("");
    fgpu.api("POST", coursePath(course) + "/message", { text: text }).then(function (answer) {
      showDone(answer.message ? "Posted: every member sees it on top of the hub's pages." : "The message is taken down.");
      loadCourse();
    }, function (e) { showError(e.message); });
  }

  // GET api/courses/{name}/link: the service checks the repository, branch, file and app.
  function makeLink(form) {
    showError("");
    var query = new URLSearchParams();
    ["repo", "branch", "path", "app"].forEach(function (key) {
      if (form.elements[key].value.trim()) query.set(key, form.elements[key].value.trim());
    });
    fgpu.api("GET", coursePath(course) + "/link?" + query.toString()).then(function (answer) {
      var link = new URL(answer.link, window.location.href).href;
      document.getElementById("fgpu-link-output").value = link;
      document.getElementById("fgpu-link-result").classList.remove("d-none");
    }, function (e) { showError(e.message); });
  }

  function uploadRoster() {
    var file = document.getElementById("fgpu-roster-file").files[0];
    showError("");
    if (!file) { showError("Choose a CSV file first."); return; }
    file.text().then(function (text) {
      var headers = fgpu.headers();
      headers["Content-Type"] = "text/csv";
      return fetch(config.api + coursePath(course) + "/roster", { method: "PUT", credentials: "same-origin", headers: headers, body: text });
    }).then(function (response) {
      return response.json().then(function (data) {
        if (!response.ok) throw new Error(data.message || response.statusText);
        showDone("The roster is in: " + data.members + " members.");
        loadCourse().then(loadHours);
        sessions.now();
      });
    }).catch(function (e) { showError(e.message); });
  }

  function loadList() {
    return fgpu.api("GET", "courses").then(renderList, function (e) { showError(e.message); });
  }

  // Admins: POST api/courses makes the group a course (or adopts an existing one).
  function makeCourse(form) {
    showError("");
    var instructors = form.elements.instructors.value.split(",").map(function (n) { return n.trim(); }).filter(Boolean);
    fgpu.api("POST", "courses", { name: form.elements.name.value.trim(), instructors: instructors }).then(function (made) {
      showDone("The course " + made.name + " is ready; its instructors run it from its page.");
      form.reset();
      loadList();
    }, function (e) { showError(e.message); });
  }

  if (course) startCoursePage();
  else {
    loadList();
    var newCourse = document.getElementById("fgpu-new-course-form");
    if (newCourse) newCourse.addEventListener("submit", function (event) { event.preventDefault(); makeCourse(newCourse); });
  }
})();
