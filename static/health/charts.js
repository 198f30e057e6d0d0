// Telemetry charts (uPlot, vendored in static/vendor/uplot/). Every element with a
// data-history-url is a chart group: its figures [data-chart-metric] are drawn from one
// request to that URL (health/api/history.py), with range buttons [data-chart-range],
// drag-to-zoom on any chart (all of the group's charts follow) and [data-chart-reset], health
// events as marked lines with a tooltip, and a refresh every REFRESH_MS while the group shows
// the last hour unzoomed. Works on content HTMX swaps in; a group swapped out stops.
(function () {
  "use strict";
  if (window.gpuadminCharts) {
    return; // the section's script tags came again with an HTMX swap
  }
  var REFRESH_MS = 10000;
  var HEIGHT = 180;
  var PALETTE = ["#76b900", "#1f5fbf", "#b26a00", "#c62828", "#7b3fb5", "#0f8b8d", "#8d6e00",
    "#d6336c", "#555555", "#2b8a3e", "#364fc7", "#e8590c", "#5f3dc4", "#0b7285", "#a61e4d",
    "#495057"];
  var UNITS = { utilization: "%", memory: " GiB", temperature: " \u00b0C", power: " W" };
  var SEVERITY_COLOURS = { critical: "#c62828", warning: "#b26a00", info: "#1f5fbf" };

  function cssVar(el, name, fallback) {
    var value = getComputedStyle(el).getPropertyValue(name).trim();
    return value || fallback;
  }

  function withAlpha(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  function formatter(metric) {
    var unit = UNITS[metric] || "";
    return function (u, value) {
      return value == null ? "\u2013" : value.toFixed(metric === "memory" ? 2 : 1) + unit;
    };
  }

  function eventTitle(event) {
    var when = new Date(event.at * 1000).toLocaleString();
    var parts = [when, event.gpu, event.label, event.severity, event.message];
    return parts.filter(function (part) { return part; }).join(" \u00b7 ");
  }

  function Group(el) {
    this.el = el;
    this.url = el.getAttribute("data-history-url");
    this.range = el.getAttribute("data-range") || "1h";
    this.plots = {}; // metric -> {plot, shape}
    this.events = [];
    this.zoom = null; // {min, max} while zoomed
    this.timer = null;
    this.status = el.querySelector("[data-chart-status]");
    this.resetButton = el.querySelector("[data-chart-reset]");
    var group = this;
    el.querySelectorAll("[data-chart-range]").forEach(function (button) {
      button.addEventListener("click", function () {
        group.range = button.getAttribute("data-chart-range");
        group.zoom = null;
        group.load();
      });
    });
    if (this.resetButton) {
      this.resetButton.addEventListener("click", function () { group.resetZoom(); });
    }
    this.observer = new ResizeObserver(function () { group.resize(); });
    this.observer.observe(el);
    this.load();
  }

  Group.prototype.alive = function () {
    if (document.contains(this.el)) {
      return true;
    }
    // Swapped out by HTMX: stop refreshing and free the charts.
    clearTimeout(this.timer);
    this.observer.disconnect();
    Object.keys(this.plots).forEach(function (metric) { this.plots[metric].plot.destroy(); }, this);
    this.plots = {};
    return false;
  };

  Group.prototype.load = function () {
    var group = this;
    clearTimeout(this.timer);
    this.el.setAttribute("data-range", this.range);
    this.el.querySelectorAll("[data-chart-range]").forEach(function (button) {
      button.setAttribute("aria-pressed", String(button.getAttribute("data-chart-range") === group.range));
    });
    this.showZoom();
    var url = this.url + (this.url.indexOf("?") < 0 ? "?" : "&") + "range=" + encodeURIComponent(this.range);
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(function (data) {
        if (group.alive()) {
          group.draw(data);
        }
      })
      .catch(function (error) {
        group.say("Could not load the history (" + error.message + ").");
      })
      .then(function () { group.schedule(); });
  };

  // The last hour refreshes while the tab is visible; other ranges and a zoomed view stay put.
  Group.prototype.schedule = function () {
    var group = this;
    clearTimeout(this.timer);
    if (this.range !== "1h" || this.zoom || !this.alive()) {
      return;
    }
    this.timer = setTimeout(function tick() {
      if (!group.alive()) {
        return;
      }
      if (document.visibilityState === "visible") {
        group.load();
      } else {
        group.timer = setTimeout(tick, REFRESH_MS);
      }
    }, REFRESH_MS);
  };

  Group.prototype.say = function (text) {
    if (this.status) {
      this.status.textContent = text;
    }
  };

  Group.prototype.draw = function (data) {
    var group = this;
    this.events = data.events;
    this.bounds = { min: data.start, max: data.end };
    var bucket = data.step >= 60 ? data.step / 60 + " min" : data.step + " s";
    var origin = data.source === "raw" ? "raw samples" : "1-minute rollups";
    var any = data.series.some(function (s) { return s.avg.some(function (v) { return v != null; }); });
    this.say(any ? bucket + " buckets from " + origin +
      (data.events.length ? ", " + data.events.length + " health events" : "")
      : "No samples in this range yet.");
    this.el.querySelectorAll("[data-chart-metric]").forEach(function (figure) {
      var metric = figure.getAttribute("data-chart-metric");
      var series = data.series.filter(function (s) { return s.metric === metric; });
      group.drawOne(figure, metric, series, data.times);
      // The buckets with a value (the others are gaps): what a test or a curious admin reads.
      var filled = data.times.filter(function (t, i) {
        return series.some(function (s) { return s.avg[i] != null; });
      });
      figure.setAttribute("data-points", String(filled.length));
    });
  };

  Group.prototype.drawOne = function (figure, metric, series, times) {
    var columns = [times];
    var shape = [];
    series.forEach(function (s) {
      columns.push(s.avg);
      shape.push(s.label);
      if (s.min && s.max) {
        columns.push(s.max, s.min);
        shape.push("max", "min");
      }
    });
    var key = shape.join("|");
    var existing = this.plots[metric];
    var scale = this.zoom || this.bounds;
    if (existing && existing.shape === key) {
      existing.plot.setData(columns); // the y scale follows the new values
      existing.plot.setScale("x", scale);
      return;
    }
    if (existing) {
      existing.plot.destroy();
    }
    // A chart this group did not draw (HTML copied with its charts, e.g. a swapped-in copy
    // of a drawn section) is only a picture: it goes.
    figure.querySelectorAll(":scope > .uplot").forEach(function (stale) { stale.remove(); });
    var plot = new uPlot(this.options(figure, metric, series), columns, figure);
    plot.setScale("x", scale);
    this.plots[metric] = { plot: plot, shape: key };
  };

  Group.prototype.options = function (figure, metric, series) {
    var group = this;
    var fg = cssVar(figure, "--muted", "#5b6576");
    var grid = cssVar(figure, "--border", "#d9dee7");
    var format = formatter(metric);
    var unit = UNITS[metric] || "";
    var uSeries = [{}];
    var bands = [];
    series.forEach(function (s, i) {
      var colour = PALETTE[i % PALETTE.length];
      uSeries.push({ label: s.label, stroke: colour, width: 1.5, value: format, spanGaps: false });
      if (s.min && s.max) {
        var faint = withAlpha(colour, 0.35);
        uSeries.push({ label: "max", stroke: faint, width: 0.5, value: format });
        uSeries.push({ label: "min", stroke: faint, width: 0.5, value: format });
        bands.push({ series: [uSeries.length - 2, uSeries.length - 1], fill: withAlpha(colour, 0.12) });
      }
    });
    var y = metric === "utilization" ? { range: [0, 100] } : { range: function (u, min, max) {
      return [0, max == null ? 1 : max * 1.1 || 1];
    } };
    return {
      width: Math.max(figure.clientWidth, 200),
      height: HEIGHT,
      series: uSeries,
      bands: bands,
      scales: { x: { time: true }, y: y },
      axes: [
        { stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid } },
        { stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid },
          values: function (u, splits) {
            return splits.map(function (v) { return v == null ? "" : +v.toFixed(2) + unit; });
          },
          size: 64 },
      ],
      cursor: { drag: { x: true, y: false, setScale: false } },
      legend: { live: true },
      hooks: {
        setSelect: [function (u) { group.selected(u); }],
        draw: [function (u) { group.drawEvents(u); }],
      },
    };
  };

  // A drag on one chart zooms every chart of the group to the selected time span.
  Group.prototype.selected = function (u) {
    if (u.select.width < 2) {
      return;
    }
    var min = u.posToVal(u.select.left, "x");
    var max = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    this.zoom = { min: min, max: max };
    clearTimeout(this.timer); // a zoomed view stays put
    this.applyScale(this.zoom);
    this.showZoom();
  };

  Group.prototype.resetZoom = function () {
    this.zoom = null;
    this.load();
  };

  Group.prototype.applyScale = function (scale) {
    Object.keys(this.plots).forEach(function (metric) {
      this.plots[metric].plot.setScale("x", scale);
    }, this);
  };

  Group.prototype.showZoom = function () {
    if (this.resetButton) {
      this.resetButton.hidden = !this.zoom;
    }
  };

  Group.prototype.resize = function () {
    Object.keys(this.plots).forEach(function (metric) {
      var plot = this.plots[metric].plot;
      var width = Math.max(plot.root.parentNode.clientWidth, 200);
      if (Math.abs(width - plot.width) > 2) {
        plot.setSize({ width: width, height: HEIGHT });
      }
    }, this);
  };

  // Health events: a dashed line across the plot and a marker on the time axis whose title
  // says what happened (the canvas has no tooltips of its own).
  Group.prototype.drawEvents = function (u) {
    var over = u.over;
    over.querySelectorAll(".chart-event").forEach(function (marker) { marker.remove(); });
    var ctx = u.ctx;
    var top = u.bbox.top;
    var bottom = u.bbox.top + u.bbox.height;
    var xMin = u.scales.x.min;
    var xMax = u.scales.x.max;
    this.events.forEach(function (event) {
      if (event.at < xMin || event.at > xMax) {
        return;
      }
      var colour = SEVERITY_COLOURS[event.severity] || SEVERITY_COLOURS.info;
      var x = Math.round(u.valToPos(event.at, "x", true));
      ctx.save();
      ctx.strokeStyle = colour;
      ctx.lineWidth = 1.5 * devicePixelRatio;
      ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, bottom);
      ctx.stroke();
      ctx.restore();
      var marker = document.createElement("div");
      marker.className = "chart-event chart-event-" + event.severity;
      marker.title = eventTitle(event);
      marker.style.left = u.valToPos(event.at, "x") + "px";
      over.appendChild(marker);
    });
  };

  function init(root) {
    var groups = root.matches && root.matches("[data-history-url]") ? [root] : [];
    root.querySelectorAll("[data-history-url]").forEach(function (el) { groups.push(el); });
    groups.forEach(function (el) {
      if (!el.gpuadminCharts) {
        el.gpuadminCharts = new Group(el);
      }
    });
  }

  window.gpuadminCharts = { init: init };
  document.addEventListener("htmx:load", function (event) { init(event.detail.elt); });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { init(document); });
  } else {
    init(document);
  }
})();
