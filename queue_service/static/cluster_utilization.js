// The Cluster page's utilization charts: one line chart per resource type (CPU, memory, fGPU) of
// the cluster's capacity, allocated and used over the last hour, day or week, from
// api/utilization (Chart.js from static/vendor/, installed at setup). Each canvas says which
// answer it drew (data-from, data-to, data-points), so a test can hold the chart to the API.
"use strict";

(function () {
  var GIB = 1073741824;
  var RESOURCES = [
    { key: "cpu", title: "CPU (cores)", scale: 1 },
    { key: "mem", title: "Memory (G)", scale: 1 / GIB },
    { key: "fgpu", title: "fGPU (units)", scale: 1 },
  ];
  var SERIES = [
    { key: "capacity", label: "Capacity", color: "#6c757d", dash: [6, 4] },
    { key: "allocated", label: "Allocated", color: "#4c78a8", dash: [] },
    { key: "used", label: "Used", color: "#e45756", dash: [] },
  ];
  var range = document.getElementById("fgpu-util-range");
  var note = document.getElementById("fgpu-util-note");
  var charts = {};
  var timer = null;

  function showError(message) {
    var box = document.getElementById("fgpu-error");
    box.textContent = message || "";
    box.classList.toggle("d-none", !message);
  }

  // The points of one line: x in ms since the epoch, y in the chart's unit; null leaves a gap.
  function points(samples, resource, series) {
    return samples.map(function (s) {
      var value = s[resource.key][series.key];
      return { x: Date.parse(s.at), y: value === null ? null : value * resource.scale };
    });
  }

  // Ticks on whole steps: half a minute in 3 minutes, a minute in a quarter hour, 10 in an hour, 3 hours in a day, a day in
  // a week.
  function tickStep(hours) {
    return 60000 * (hours <= 0.05 ? 0.5 : hours <= 0.25 ? 1 : hours <= 1 ? 10 : hours <= 24 ? 180 : 1440);
  }

  // Where the x axis starts: the span's start, or where the samples start when that is later
  // (less a tenth of their length, 10 s at least), so that a young hub's few samples fill
  // the chart; the axis's times say what it spans.
  function axisStart(samples, from, to) {
    if (!samples.length) return from;
    var first = Date.parse(samples[0].at);
    return Math.max(from, first - Math.max(10000, (to - first) / 10));
  }

  // Ticks on whole steps of the clock (in local time), not counted from the span's start.
  function alignedTicks(axis) {
    var step = tickStep((axis.max - axis.min) / 3600000);
    var offset = new Date(axis.min).getTimezoneOffset() * 60000;
    var ticks = [];
    for (var t = Math.ceil((axis.min - offset) / step) * step + offset; t <= axis.max; t += step) {
      ticks.push({ value: t });
    }
    // Samples younger than one step still get their times, at the axis's two ends.
    axis.ticks = ticks.length ? ticks : [{ value: axis.min }, { value: axis.max }];
  }

  function tickLabel(hours) {
    // Each tick as precisely as the ticks' spacing needs, or two would read the same: a day
    // apart its date; less (a young hub's samples on a week's axis) its date and time; less
    // than a minute apart its seconds too.
    return function (value, index, ticks) {
      var when = new Date(value);
      var step = ticks.length > 1 ? ticks[1].value - ticks[0].value : hours * 3600000;
      var date = when.toLocaleDateString([], { month: "short", day: "numeric" });
      if (step >= 86400000) return date;
      var parts = { hour: "2-digit", minute: "2-digit" };
      if (step < 60000) parts.second = "2-digit";
      var time = when.toLocaleTimeString([], parts);
      return hours > 24 ? date + ", " + time : time;
    };
  }

  // Use of fGPU is measured by NVML; where it is not (simulated GPUs, Swarm nodes), say so.
  function subtitle(resource, samples) {
    if (resource.key !== "fgpu" || !samples.some(function (s) { return s.fgpu.used === null; })) return "";
    return fgpu.config.simulated ? "Used: not measured (simulated GPUs)" : "Used: not measured where NVML sees no GPU";
  }

  function draw(resource, data, hours) {
    var canvas = document.getElementById("fgpu-util-" + resource.key);
    var datasets = SERIES.map(function (series) {
      return {
        label: series.label,
        data: points(data.samples, resource, series),
        borderColor: series.color,
        backgroundColor: series.color,
        borderDash: series.dash,
        pointRadius: 0,
        borderWidth: 2,
        stepped: series.key === "capacity",
        spanGaps: false,
      };
    });
    var to = Date.parse(data.to), from = axisStart(data.samples, Date.parse(data.from), to);
    var chart = charts[resource.key];
    if (chart) {
      chart.data.datasets = datasets;
      chart.options.scales.x.min = from;
      chart.options.scales.x.max = to;
      chart.options.scales.x.ticks.callback = tickLabel(hours);
      chart.options.plugins.subtitle.text = subtitle(resource, data.samples);
      chart.update("none");
    } else {
      charts[resource.key] = new Chart(canvas, {
        type: "line",
        data: { datasets: datasets },
        options: {
          animation: false,
          maintainAspectRatio: false,
          parsing: true,
          interaction: { mode: "nearest", axis: "x", intersect: false },
          scales: {
            x: { type: "linear", min: from, max: to, afterBuildTicks: alignedTicks,
              ticks: { callback: tickLabel(hours), maxRotation: 0 } },
            y: { type: "linear", beginAtZero: true },
          },
          plugins: {
            title: { display: true, text: resource.title },
            subtitle: { display: true, text: subtitle(resource, data.samples) },
            tooltip: {
              callbacks: {
                title: function (items) { return items.length ? new Date(items[0].parsed.x).toLocaleString() : ""; },
                label: function (item) {
                  return item.dataset.label + ": " + (item.parsed.y === null ? "—" : fgpu.amount(item.parsed.y));
                },
              },
            },
          },
        },
      });
    }
    canvas.setAttribute("data-from", data.from);
    canvas.setAttribute("data-to", data.to);
    canvas.setAttribute("data-hours", String(hours));
    canvas.setAttribute("data-points", String(data.samples.length));
    canvas.setAttribute("data-ready", "1");
  }

  function describe(data) {
    var every = data.width ? data.width + " s averages" : "a sample every " + data.interval + " s";
    return data.samples.length ? data.samples.length + " points, " + every : "No samples in this span yet.";
  }

  // The span a page opens on: the shortest offered one that reaches back to the oldest sample
  // (a new hub's few minutes fill an hour, not a sliver of a day); the widest when none does.
  function openingSpan(samples, to, spans) {
    if (!samples.length) return spans[spans.length - 1];
    var age = (Date.parse(to) - Date.parse(samples[0].at)) / 3600000;
    return spans.filter(function (hours) { return hours >= age; })[0] || spans[spans.length - 1];
  }

  // The first answer is asked for the widest span; a narrower one that holds all of it follows.
  function openOnItsSpan() {
    var spans = Array.from(range.options).map(function (o) { return Number(o.value); });
    range.value = String(spans[spans.length - 1]);
    return load().then(function (data) {
      var span = data && openingSpan(data.samples, data.to, spans);
      if (span && String(span) !== range.value && !chosen) {
        range.value = String(span);
        return load();
      }
    });
  }

  var asked = 0, chosen = false;

  function load() {
    var hours = Number(range.value), mine = ++asked;
    return fgpu.api("GET", "utilization?hours=" + encodeURIComponent(range.value)).then(function (data) {
      if (mine !== asked) return; // a later choice of range is on its way
      showError("");
      RESOURCES.forEach(function (resource) { draw(resource, data, hours); });
      note.textContent = describe(data);
      schedule(data.interval);
      return data;
    }, function (e) {
      if (mine !== asked) return;
      showError(e.message);
      schedule(60);
    });
  }

  // Again after a sampling interval (between 5 s and a minute), from the range shown then.
  function schedule(interval) {
    clearTimeout(timer);
    timer = setTimeout(load, 1000 * Math.min(60, Math.max(5, Number(interval) || 60)));
  }

  if (typeof Chart === "undefined") {
    document.getElementById("fgpu-util-charts").classList.add("d-none");
    document.getElementById("fgpu-util-missing").classList.remove("d-none");
    return;
  }
  range.addEventListener("change", function () { chosen = true; load(); });
  document.getElementById("fgpu-util-form").addEventListener("submit", function (event) { event.preventDefault(); });
  openOnItsSpan();
})();
