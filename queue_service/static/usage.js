// The Usage page: api/usage as a table and a chart (Chart.js from static/vendor/, installed at
// setup), the budgets of the user's groups (api/resources), and the CSV link for the same filters.
"use strict";

(function () {
  var FIGURES = [
    { key: "cpu_hours", label: "CPU core-hours", color: "#4c78a8", axis: "hours" },
    { key: "fgpu_hours", label: "fGPU-hours", color: "#e45756", axis: "hours" },
    { key: "mem_gib_hours", label: "Memory GiB-hours", color: "#54a24b", axis: "gib" },
  ];
  var form = document.getElementById("fgpu-usage-filters");
  var errorBox = document.getElementById("fgpu-error");
  var chart = null;

  function isoDay(date) {
    return date.toISOString().slice(0, 10);
  }

  function filters() {
    var params = new URLSearchParams();
    ["from", "to", "user", "group"].forEach(function (name) {
      var input = form.elements[name];
      if (input && input.value.trim()) params.set(name, input.value.trim());
    });
    return params;
  }

  function showError(message) {
    errorBox.textContent = message || "";
    errorBox.classList.toggle("d-none", !message);
  }

  var number = fgpu.amount;

  function renderTable(data) {
    var body = document.querySelector("#fgpu-usage tbody");
    body.replaceChildren.apply(body, data.usage.map(function (row) {
      return fgpu.element("tr", { "data-day": row.day, "data-user": row.user }, [
        fgpu.element("td", { text: row.day }),
        fgpu.element("td", { text: row.user }),
        fgpu.element("td", { text: row.resource_group || "—" }),
      ].concat(["cpu_hours", "mem_gib_hours", "fgpu_hours"].map(function (key) {
        return fgpu.element("td", { "data-figure": key, "data-value": String(row[key]), text: number(row[key]) });
      })));
    }));
    var foot = document.querySelector("#fgpu-usage tfoot");
    foot.replaceChildren(fgpu.element("tr", { className: "fw-bold", id: "fgpu-usage-total" }, [
      fgpu.element("td", { text: "Total", colspan: "3" }),
    ].concat(["cpu_hours", "mem_gib_hours", "fgpu_hours"].map(function (key) {
      return fgpu.element("td", { "data-figure": key, "data-value": String(data.totals[key]), text: number(data.totals[key]) });
    }))));
    document.getElementById("fgpu-usage-empty").classList.toggle("d-none", data.usage.length > 0);
  }

  // One point per day from `from` to `to`, days without use at 0, summed over the rows shown.
  function perDay(data) {
    var days = [], byDay = {};
    for (var d = new Date(data.from + "T00:00:00Z"); isoDay(d) <= data.to; d.setUTCDate(d.getUTCDate() + 1)) {
      days.push(isoDay(d));
      byDay[isoDay(d)] = { cpu_hours: 0, mem_gib_hours: 0, fgpu_hours: 0 };
    }
    data.usage.forEach(function (row) {
      var day = byDay[row.day];
      if (!day) return;
      FIGURES.forEach(function (f) { day[f.key] += row[f.key]; });
    });
    return { days: days, byDay: byDay };
  }

  function renderChart(data) {
    var canvas = document.getElementById("fgpu-usage-chart");
    if (typeof Chart === "undefined") {
      canvas.classList.add("d-none");
      document.getElementById("fgpu-usage-chart-missing").classList.remove("d-none");
      return;
    }
    var series = perDay(data);
    var datasets = FIGURES.map(function (f) {
      return {
        label: f.label,
        data: series.days.map(function (day) { return series.byDay[day][f.key]; }),
        backgroundColor: f.color,
        borderColor: f.color,
        type: f.axis === "gib" ? "line" : "bar",
        yAxisID: f.axis,
      };
    });
    if (chart) chart.destroy();
    chart = new Chart(canvas, {
      type: "bar",
      data: { labels: series.days, datasets: datasets },
      options: {
        animation: false,
        maintainAspectRatio: false,
        scales: {
          hours: { type: "linear", position: "left", beginAtZero: true, title: { display: true, text: "core-hours, fGPU-hours" } },
          gib: { type: "linear", position: "right", beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: "GiB-hours" } },
        },
        plugins: { title: { display: true, text: chartTitle() } },
      },
    });
    canvas.setAttribute("data-ready", "1");
  }

  function chartTitle() {
    var params = filters();
    if (!fgpu.config.admin) return "Your use per day";
    if (params.get("user")) return params.get("user") + "'s use per day";
    return params.get("group") ? "Group " + params.get("group") + ", use per day" : "Everyone's use per day";
  }

  function renderBudgets(resources) {
    var target = document.getElementById("fgpu-budgets");
    var budgets = resources.budgets || [];
    target.replaceChildren.apply(target, budgets.map(function (b) {
      return fgpu.element("div", {
        className: "alert py-1 px-2 mb-2 " + (b.used_up ? "alert-warning" : "alert-light"),
        "data-budget": b.group + ":" + b.figure + ":" + b.period,
      }, [
        "Group " + b.group + ": " + number(b.used) + " of " + number(b.limit) + " " + b.label +
          " this " + b.period + (b.used_up ? ", used up until " : ", renews ") + fgpu.time(b.frees_at) + ".",
      ]);
    }));
  }

  function load() {
    var params = filters();
    var csv = new URLSearchParams(params);
    csv.set("format", "csv");
    // A link is not a script's fetch: it carries the XSRF token itself, as the hub's own forms do.
    csv.set("_xsrf", fgpu.config.xsrf || "");
    document.getElementById("fgpu-usage-csv").href = fgpu.config.api + "usage?" + csv.toString();
    return fgpu.api("GET", "usage?" + params.toString()).then(function (data) {
      showError("");
      form.elements.from.value = data.from;
      form.elements.to.value = data.to;
      renderTable(data);
      renderChart(data);
      document.getElementById("fgpu-usage").setAttribute("data-ready", "1");
    }, function (e) { showError(e.message); });
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    load();
  });
  load();
  fgpu.api("GET", "resources").then(renderBudgets, function () {});
})();
