// Interactive plots (plotly.js, served from the installed plotly package) for every
// <div class="iplot"> on the page. Without JavaScript the <noscript> PNG next to each shows.
//
// - hover: step, raw value (with the number of points at that step where there are several) and
//   smoothed value; the crosshair and hover follow on every plot of the page at the same x;
// - drag to zoom (x and y), double-click to reset; the zoomed range is fetched again from the
//   server reduced to the plot's width in pixels, so a spike inside it is always drawn;
// - smoothing method and window change in the browser (smoothing.js, the server's algorithms);
//   for a series reduced for display the exact line (smoothed on the full series) follows from
//   the server a moment later;
// - log-y, x-axis (step, fraction of training, wall time, a logged counter), legend toggles;
// - healthy band and findings shaded; a running run's plots extend by themselves (the page polls
//   /api/runs/<id>/stamp with If-None-Match) and say when the run last wrote.
(function () {
  "use strict";

  var plots = [];
  var settings = {method: "ema", window: null, logy: false, x: "step"};
  var syncing = false;
  var COLORS = {raw: "#a9c9ea", smooth: "#17467f", band: "rgba(46, 160, 67, 0.12)",
                warning: "rgba(230, 160, 20, 0.18)", critical: "rgba(210, 50, 40, 0.18)", nonfinite: "#c62828"};

  function qs(params) {
    return Object.keys(params).filter(function (k) { return params[k] !== null && params[k] !== undefined && params[k] !== ""; })
      .map(function (k) { return encodeURIComponent(k) + "=" + encodeURIComponent(params[k]); }).join("&");
  }

  function plotWidth(p) {
    var w = p.gd && p.gd._fullLayout && p.gd._fullLayout._size ? p.gd._fullLayout._size.w : p.el.clientWidth - 70;
    return Math.max(100, Math.min(4000, Math.round(w)));
  }

  // Series up to this many points come whole (about three plot widths), so the browser smooths them
  // exactly as the server does; longer ones come reduced to the plot's width.
  var WHOLE_UP_TO = 2000;

  function viewUrl(p, range) {
    var whole = p.count > 0 && p.count <= WHOLE_UP_TO;
    return p.api + "?" + qs({
      key: p.key, points: whole ? WHOLE_UP_TO : plotWidth(p), smooth: settings.method, window: settings.window || p.window,
      x: settings.x, from_step: range ? range[0] : null, to_step: range ? range[1] : null
    });
  }

  function overlayUrl(p, range) {
    return p.api + "&" + qs({points: 2 * plotWidth(p), x_from: range ? range[0] : null, x_to: range ? range[1] : null});
  }

  function fetchView(p, range) {
    var url = p.kind === "overlay" ? overlayUrl(p, range) : viewUrl(p, range);
    var headers = {};
    if (p.etags[url]) headers["If-None-Match"] = p.etags[url];
    p.fetches += 1;
    p.el.dataset.fetches = String(p.fetches);
    return fetch(url, {headers: headers, credentials: "same-origin"}).then(function (r) {
      if (r.status === 304 && p.bodies[url]) return p.bodies[url];
      return r.json().then(function (body) {
        if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
        var tag = r.headers.get("ETag");
        if (tag) { p.etags = {}; p.bodies = {}; p.etags[url] = tag; p.bodies[url] = body; }
        return body;
      });
    });
  }

  // x of a step, from the held points (the server gives x beside each step for other axes).
  function xOf(line, steps) {
    if (!line.x) return steps;
    return steps.map(function (s) { return interp(s, line.steps, line.x); });
  }

  function interp(v, xs, ys) {
    var n = xs.length;
    if (!n) return v;
    if (v <= xs[0]) return ys[0];
    if (v >= xs[n - 1]) return ys[n - 1];
    var lo = 0, hi = n - 1;
    while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (xs[mid] <= v) lo = mid; else hi = mid; }
    var t = (v - xs[lo]) / ((xs[hi] - xs[lo]) || 1);
    return ys[lo] + t * (ys[hi] - ys[lo]);
  }

  function smoothedFor(p, body) {
    // The server's line is exact (smoothed on the full series). Re-smooth here only when the
    // settings changed since it was fetched, or when the browser holds every point of the series.
    var line = body.line;
    var wanted = {method: settings.method, window: settings.window || p.window};
    var current = body.smoothing && body.smoothing.method === wanted.method && body.smoothing.window === wanted.window;
    if (current) return line.smoothed || null;
    if (wanted.method === "none") return null;
    var finite = line.values.map(function (v) { return v === null ? NaN : v; });
    return Array.prototype.slice.call(RLSmoothing.smooth(finite, wanted.method, wanted.window));
  }

  function fmt(v) {
    if (v === null || v === undefined || isNaN(v)) return "–";
    var a = Math.abs(v);
    return (a !== 0 && (a < 1e-3 || a >= 1e6)) ? v.toExponential(4) : String(+v.toPrecision(6));
  }

  function traces(p, body) {
    var line = body.line;
    var x = line.x || line.steps;
    var smooth = smoothedFor(p, body);
    var out = [];
    var custom = line.steps.map(function (s, i) {
      return [s, line.counts ? line.counts[i] : 1, smooth ? fmt(smooth[i]) : "–"];
    });
    var stepText = "step %{customdata[0]}<br>";
    if (body.raw) {
      out.push({x: body.raw.x || body.raw.steps, y: body.raw.values, type: "scatter", mode: "markers",
                name: "raw points", marker: {color: COLORS.raw, size: 3}, hoverinfo: "skip"});
      out.push({x: x, y: line.values, customdata: custom, type: "scatter", mode: "lines", name: "mean per step",
                line: {color: COLORS.raw, width: 1},
                hovertemplate: stepText + "mean %{y:.6g} of %{customdata[1]} points<br>smoothed %{customdata[2]}<extra></extra>"});
    } else {
      out.push({x: x, y: line.values, customdata: custom, type: "scatter", mode: "lines", name: "raw",
                line: {color: COLORS.raw, width: 1},
                hovertemplate: stepText + "raw %{y:.6g}<br>smoothed %{customdata[2]}<extra></extra>"});
    }
    if (smooth) {
      out.push({x: x, y: smooth, type: "scatter", mode: "lines", name: "smoothed", hoverinfo: "skip",
                line: {color: COLORS.smooth, width: 2}});
    }
    if (body.nonfinite && body.nonfinite.steps.length) {
      out.push({x: body.nonfinite.x || body.nonfinite.steps, y: body.nonfinite.steps.map(function () { return 0; }),
                yaxis: "y2", type: "scatter", mode: "markers", name: "NaN / Inf",
                marker: {color: COLORS.nonfinite, symbol: "line-ns-open", size: 10}, hoverinfo: "skip"});
    }
    return out;
  }

  // The healthy range the run's diagnosis judges by: the server's answer (current diagnosis), else the page's.
  function healthyOf(p, body) {
    if (body && body.healthy) return {range: body.healthy, source: body.healthy_source || ""};
    return {range: p.healthy, source: p.healthySource};
  }

  function shapes(p, body) {
    var out = [];
    var low = healthyOf(p, body).range[0], high = healthyOf(p, body).range[1];
    if (low !== null || high !== null) {
      var ys = body.line.values.filter(function (v) { return v !== null; });
      var min = Math.min.apply(null, ys.concat(low !== null ? [low] : [])),
          max = Math.max.apply(null, ys.concat(high !== null ? [high] : []));
      var pad = (max - min) * 0.05 || 1;
      out.push({type: "rect", xref: "paper", x0: 0, x1: 1, yref: "y", layer: "below", line: {width: 0},
                y0: low !== null ? low : min - pad, y1: high !== null ? high : max + pad, fillcolor: COLORS.band});
    }
    var held = p.full || body;
    var lx = held.line.x || held.line.steps;
    var minWidth = lx.length ? (lx[lx.length - 1] - lx[0]) * 0.006 : 0;  // a one-step finding stays visible
    p.spans.forEach(function (s) {
      var xs = xOf(held.line, [s[0], s[1]]);
      if (xs[1] - xs[0] < minWidth) { var mid = (xs[0] + xs[1]) / 2; xs = [mid - minWidth / 2, mid + minWidth / 2]; }
      out.push({type: "rect", xref: "x", yref: "paper", x0: xs[0], x1: xs[1], y0: 0, y1: 1, layer: "below",
                line: {width: 0}, fillcolor: s[2] === "critical" ? COLORS.critical : COLORS.warning});
    });
    return out;
  }

  // Where the shaded band comes from (dictionary, task range, baseline, diagnosis default), on the plot itself.
  function bandNote(p, body) {
    var h = healthyOf(p, body);
    if ((h.range[0] === null && h.range[1] === null) || !h.source) return [];
    return [{xref: "paper", yref: "paper", x: 1, y: 0, xanchor: "right", yanchor: "bottom", showarrow: false,
             text: "healthy range: " + h.source.replace(/&/g, "&amp;").replace(/</g, "&lt;"),
             font: {size: 9, color: "#4a7a3f"}, bgcolor: "rgba(255,255,255,0.7)"}];
  }

  function layout(p, body) {
    return {
      height: 330, margin: {l: 58, r: 12, t: 8, b: 42}, uirevision: p.key + "|" + settings.x,
      hovermode: "x", dragmode: "zoom", showlegend: true,
      legend: {orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: {size: 11}},
      xaxis: {title: {text: body.x_title, font: {size: 12}}, showspikes: true, spikemode: "across",
              spikesnap: "cursor", spikethickness: 1, spikecolor: "#888", spikedash: "dot", zeroline: false},
      yaxis: {title: {text: p.unit, font: {size: 12}}, type: settings.logy ? "log" : "linear", zeroline: false},
      yaxis2: {overlaying: "y", range: [0, 1], visible: false, fixedrange: true},
      shapes: p.kind === "overlay" ? [] : shapes(p, body), annotations: p.kind === "overlay" ? [] : bandNote(p, body),
      font: {family: "system-ui, sans-serif", size: 11},
      paper_bgcolor: "#fff", plot_bgcolor: "#fff"
    };
  }

  // No mode bar: drag zooms, double-click resets (said beside the controls), and the bar would sit
  // on the legend of a narrow card.
  var CONFIG = {displaylogo: false, responsive: true, doubleClick: "reset", displayModeBar: false};

  function rgba(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + ((n >> 16) & 255) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  // A comparison: per run a light raw curve and its smoothed line, per seed group a mean and band.
  function overlayTraces(body) {
    var out = [];
    body.traces.forEach(function (t) {
      var dash = t.dash ? "dash" : "solid";
      if (t.band_x) {
        out.push({x: t.band_x, y: t.band_low, type: "scatter", mode: "lines", line: {width: 0}, showlegend: false,
                  legendgroup: t.label, hoverinfo: "skip"});
        out.push({x: t.band_x, y: t.band_high, type: "scatter", mode: "lines", line: {width: 0}, fill: "tonexty",
                  fillcolor: rgba(t.color, 0.18), showlegend: false, legendgroup: t.label, hoverinfo: "skip"});
      }
      if (t.raw_x) {
        out.push({x: t.raw_x, y: t.raw_y, type: "scatter", mode: t.raw_markers ? "markers" : "lines",
                  line: {color: rgba(t.color, 0.3), width: 1}, marker: {color: rgba(t.color, 0.35), size: 3},
                  showlegend: false, legendgroup: t.label, hoverinfo: "skip"});
      }
      if (t.smooth_x) {
        out.push({x: t.smooth_x, y: t.smooth_y, type: "scatter", mode: "lines", name: t.label, legendgroup: t.label,
                  line: {color: t.color, width: 2, dash: dash}, hovertemplate: "%{y:.6g}<extra>" + t.label.replace(/</g, "&lt;") + "</extra>"});
      }
    });
    return out;
  }

  function drawOverlay(p, body) {
    p.shown = body;
    var lay = layout(p, {x_title: body.xlabel, line: {values: []}});
    lay.hovermode = "x unified";
    if (body.normalized) lay.yaxis.title.text = "normalized";
    lay.height = 400;
    delete lay.yaxis2;
    var low = body.healthy[0], high = body.healthy[1];
    lay.shapes = [];
    if (low !== null && high !== null) {
      lay.shapes.push({type: "rect", xref: "paper", x0: 0, x1: 1, yref: "y", y0: low, y1: high, layer: "below",
                       line: {width: 0}, fillcolor: COLORS.band});
    }
    if (p.range !== null && p.gd.layout && p.gd.layout.xaxis) {
      lay.xaxis.range = p.gd.layout.xaxis.range;
      lay.xaxis.autorange = false;
    }
    return Plotly.react(p.gd, overlayTraces(body), lay, CONFIG).then(function () {
      p.el.dataset.state = "ready";
      var note = p.figure.querySelector(".iplot-note");
      if (note) note.textContent = body.notes.concat(p.range !== null ? ["zoomed: double-click to reset"] : []).join(" · ");
    });
  }

  function draw(p, body) {
    if (p.kind === "overlay") return drawOverlay(p, body);
    p.shown = body;
    var zoomed = p.range !== null;
    var lay = layout(p, body);
    if (zoomed && p.gd && p.gd.layout && p.gd.layout.xaxis) {
      lay.xaxis.range = p.gd.layout.xaxis.range;
      lay.xaxis.autorange = false;
    }
    return Plotly.react(p.gd, traces(p, body), lay, CONFIG).then(function () {
      p.el.dataset.state = "ready";
      p.el.dataset.returned = String(body.returned);
      p.el.dataset.downsampled = body.downsampled ? "1" : "0";
      p.el.dataset.lastStep = String(body.last_step);
      if (p.live) {
        // A live run: the card's last value and point count follow the plot.
        var vals = body.line.values, value = p.figure.querySelector(".plot-value .value");
        if (value && vals.length && body.to_step === null) value.textContent = fmt(vals[vals.length - 1]);
      }
      var note = p.figure.querySelector(".iplot-note");
      if (note) {
        note.textContent = (body.downsampled ? "showing " + body.returned.toLocaleString() + " of " +
          body.in_range.toLocaleString() + " steps (MinMaxLTTB: every spike kept)" : body.in_range.toLocaleString() + " steps, every point") +
          (zoomed ? " · zoomed: double-click to reset" : "") + " · " +
          (settings.method === "none" ? "no smoothing" : settings.method + ", window " + (settings.window || p.window));
      }
    });
  }

  function fail(p, err) {
    p.el.dataset.state = "error";
    var note = p.figure.querySelector(".iplot-note");
    if (note) note.textContent = "could not load: " + err.message;
  }

  function load(p) {
    if (p.loading) return p.loading;
    p.loading = fetchView(p, null).then(function (body) {
      p.full = body;
      return draw(p, body).then(function () { attach(p); });
    }).catch(function (err) { fail(p, err); });
    return p.loading;
  }

  // Step range of an x range (x is monotone in step on every axis offered).
  function stepRange(p, r0, r1) {
    if (p.kind === "overlay") return [r0, r1];
    var line = (p.full || p.shown).line;
    if (!line.x) return [Math.floor(r0), Math.ceil(r1)];
    return [Math.floor(interp(r0, line.x, line.steps)), Math.ceil(interp(r1, line.x, line.steps))];
  }

  function onRelayout(p, ev) {
    if (ev["xaxis.autorange"] || ev.autosize) {
      if (p.range !== null) {
        p.range = null;
        if (p.full) draw(p, p.full);
      }
      return;
    }
    var r0 = ev["xaxis.range[0]"], r1 = ev["xaxis.range[1]"];
    if (r0 === undefined && ev["xaxis.range"]) { r0 = ev["xaxis.range"][0]; r1 = ev["xaxis.range"][1]; }
    if (r0 === undefined) return;
    p.range = stepRange(p, +r0, +r1);
    var asked = p.range;
    fetchView(p, asked).then(function (body) {
      if (p.range !== asked) return;  // a newer zoom went out meanwhile
      p.zoomed = body;
      return draw(p, body);
    }).catch(function (err) { fail(p, err); });
  }

  function onHover(p, ev) {
    if (syncing || !ev.points || !ev.points.length) return;
    var pt = ev.points[0];
    var step = pt.customdata ? pt.customdata[0] : pt.x;
    if (p.kind === "overlay") {
      syncing = true;
      try {
        plots.forEach(function (q) { if (q !== p && q.shown && q.gd._fullLayout) Plotly.Fx.hover(q.gd, {xval: pt.x}, "xy"); });
      } finally { syncing = false; }
      return;
    }
    syncing = true;
    try {
      plots.forEach(function (q) {
        if (q === p || !q.shown || !q.gd._fullLayout) return;
        var x = settings.x === "step" ? step : interp(step, q.shown.line.steps, q.shown.line.x || q.shown.line.steps);
        Plotly.Fx.hover(q.gd, {xval: x}, "xy");
      });
    } finally { syncing = false; }
  }

  function onUnhover(p) {
    if (syncing) return;
    syncing = true;
    try { plots.forEach(function (q) { if (q !== p && q.gd._fullLayout) Plotly.Fx.unhover(q.gd); }); }
    finally { syncing = false; }
  }

  function attach(p) {
    p.gd.on("plotly_relayout", function (ev) { onRelayout(p, ev); });
    p.gd.on("plotly_hover", function (ev) { onHover(p, ev); });
    p.gd.on("plotly_unhover", function () { onUnhover(p); });
  }

  function redrawAll(refetch) {
    plots.forEach(function (p) {
      if (!p.shown) return;
      draw(p, p.range ? (p.zoomed || p.shown) : (p.full || p.shown));
    });
    if (!refetch) return;
    plots.forEach(function (p) {
      if (!p.shown) return;
      var range = p.range;
      fetchView(p, null).then(function (full) {
        p.full = full;
        if (range) return fetchView(p, range).then(function (z) { if (p.range === range) { p.zoomed = z; return draw(p, z); } });
        if (p.range === null) return draw(p, full);
      }).catch(function (err) { fail(p, err); });
    });
  }

  var refetchTimer = null;
  function settingsChanged(exactLater) {
    redrawAll(false);   // in the browser, at once
    if (!exactLater) return;
    clearTimeout(refetchTimer);
    refetchTimer = setTimeout(function () { redrawAll(true); }, 400);
  }

  function initControls() {
    var method = document.getElementById("smooth-method");
    var windowBox = document.getElementById("smooth-window");
    var slider = document.getElementById("smooth-slider");
    var sliderValue = document.getElementById("smooth-slider-value");
    var logy = document.getElementById("iplot-logy");
    var xaxis = document.getElementById("iplot-x");
    if (method) settings.method = method.value;
    if (windowBox && windowBox.value) settings.window = parseInt(windowBox.value, 10) || null;
    function setWindow(w, from) {
      settings.window = w;
      if (windowBox && from !== windowBox) windowBox.value = w || "";
      if (slider && from !== slider && w) slider.value = w;
      if (sliderValue) sliderValue.textContent = w ? String(w) : "default";
      settingsChanged(true);
    }
    if (method) method.addEventListener("change", function () { settings.method = method.value; settingsChanged(true); });
    if (windowBox) windowBox.addEventListener("input", function () {
      var w = parseInt(windowBox.value, 10);
      if (w >= 1) setWindow(Math.min(w, RLSmoothing.MAX_WINDOW), windowBox);
    });
    if (slider) slider.addEventListener("input", function () { setWindow(parseInt(slider.value, 10), slider); });
    if (logy) logy.addEventListener("change", function () {
      settings.logy = logy.checked;
      plots.forEach(function (p) { if (p.shown) Plotly.relayout(p.gd, {"yaxis.type": logy.checked ? "log" : "linear"}); });
    });
    if (xaxis) xaxis.addEventListener("change", function () {
      settings.x = xaxis.value;
      plots.forEach(function (p) { p.range = null; p.zoomed = null; p.full = null; });
      redrawAll(true);
    });
    var form = document.getElementById("smoothing-form");
    if (form) form.addEventListener("submit", function (e) { e.preventDefault(); settingsChanged(true); });
  }

  // --- live runs ---------------------------------------------------------------------
  function initLive() {
    var box = document.getElementById("live-status");
    if (!box || box.dataset.live !== "1") return;
    var url = box.dataset.stampUrl, every = parseInt(box.dataset.pollMs || "5000", 10);
    var etag = null, version = box.dataset.version, updated = box.dataset.updated;
    var when = document.getElementById("live-updated");
    function showAge() {
      if (!when || !updated) return;
      var secs = Math.max(0, Math.round((Date.now() - Date.parse(updated)) / 1000));
      when.textContent = new Date(updated).toLocaleTimeString() + " (" + (secs < 90 ? secs + " s" : Math.round(secs / 60) + " min") + " ago)";
      when.setAttribute("datetime", updated);
    }
    function poll() {
      fetch(url, {headers: etag ? {"If-None-Match": etag} : {}, credentials: "same-origin"}).then(function (r) {
        if (r.status === 304) return null;
        etag = r.headers.get("ETag");
        return r.json();
      }).then(function (stamp) {
        if (stamp) {
          updated = stamp.updated_at;
          if (String(stamp.data_version) !== String(version)) {
            version = stamp.data_version;
            box.dataset.version = String(version);
            plots.forEach(function (p) { p.live = true; });
            redrawAll(true);
          }
          if (stamp.status !== "running") {
            box.dataset.live = "0";
            var state = document.getElementById("live-state");
            if (state) state.textContent = "run " + stamp.status;
            showAge();
            return;
          }
        }
        showAge();
        setTimeout(poll, every);
      }).catch(function () { setTimeout(poll, every * 2); });
    }
    poll();
  }

  function init() {
    var els = document.querySelectorAll(".iplot");
    if (!els.length || typeof Plotly === "undefined") return;
    document.body.classList.add("iplots-on");
    initControls();
    Array.prototype.forEach.call(els, function (el) {
      var p = {el: el, kind: el.classList.contains("iplot-overlay") ? "overlay" : "series",
               figure: el.closest(".compare-image") || el.closest("figure") || el.parentNode, api: el.dataset.api, key: el.dataset.key,
               window: parseInt(el.dataset.window || "10", 10), count: parseInt(el.dataset.count || "0", 10), unit: el.dataset.unit || "",
               healthy: JSON.parse(el.dataset.healthy || "[null, null]"), healthySource: el.dataset.healthySource || "",
               spans: JSON.parse(el.dataset.spans || "[]"),
               range: null, full: null, zoomed: null, shown: null, etags: {}, bodies: {}, fetches: 0, loading: null};
      p.gd = document.createElement("div");
      p.gd.className = "iplot-canvas";
      el.appendChild(p.gd);
      el.dataset.state = "waiting";
      plots.push(p);
    });
    // Draw what is on screen first; folded layers draw when opened.
    if ("IntersectionObserver" in window) {
      var io = new IntersectionObserver(function (entries) {
        entries.forEach(function (e) {
          if (!e.isIntersecting) return;
          io.unobserve(e.target);
          plots.forEach(function (p) { if (p.el === e.target) load(p); });
        });
      }, {rootMargin: "300px"});
      plots.forEach(function (p) { io.observe(p.el); });
    } else {
      plots.forEach(load);
    }
    initLive();
  }

  window.RLPlots = {
    plots: plots, settings: settings,
    byKey: function (key) { return plots.filter(function (p) { return p.key === key; })[0] || null; }
  };
  document.addEventListener("DOMContentLoaded", init);
})();
