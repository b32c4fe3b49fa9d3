// Grouped curves, pattern panels and parallel coordinates over many runs (runs_views.py).
// The numbers come in <script type="application/json"> blocks; plotly.js draws them.
(function () {
  "use strict";

  var CONFIG = {displaylogo: false, responsive: true, doubleClick: "reset", displayModeBar: false};
  var COLORS = ["#1f5fa8", "#d1495b", "#2a7a3b", "#8a5a00", "#6a4c93", "#00798c", "#c06014", "#4d4d4d",
                "#9c27b0", "#558b2f"];

  function readJSON(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function rgba(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  function groupTraces(t, color) {
    var upper = [], lower = [], bx = [];
    for (var i = 0; i < t.x.length; i++) {
      if (t.y[i] === null || t.se[i] === null) continue;
      bx.push(t.x[i]);
      upper.push(t.y[i] + t.se[i]);
      lower.push(t.y[i] - t.se[i]);
    }
    var band = {
      x: bx.concat(bx.slice().reverse()), y: upper.concat(lower.reverse()), type: "scatter", mode: "lines",
      fill: "toself", fillcolor: rgba(color, 0.18), line: {width: 0}, hoverinfo: "skip", showlegend: false,
      legendgroup: t.name, name: t.name + " band"
    };
    var custom = t.x.map(function (_, i) { return [t.n[i], t.se[i]]; });
    var mean = {
      x: t.x, y: t.y, type: "scatter", mode: "lines", name: t.name, legendgroup: t.name, customdata: custom,
      line: {color: color, width: 2},
      hovertemplate: "step %{x}<br>mean %{y:.4g} \u00b1 %{customdata[1]:.3g} (s.e.)<br>n = %{customdata[0]} runs" +
        "<extra>%{fullData.name}</extra>"
    };
    return [band, mean];
  }

  function drawPanel(el, spec, grouped) {
    var traces = [];
    spec.traces.forEach(function (t, i) {
      var color = COLORS[i % COLORS.length];
      if (t.kind === "group") {
        traces = traces.concat(groupTraces(t, color));
      } else {
        traces.push({x: t.x, y: t.y, type: "scatter", mode: "lines", name: t.name, line: {color: color, width: 1.5},
                     hovertemplate: "step %{x}<br>%{y:.4g}<extra>%{fullData.name}</extra>"});
      }
    });
    var layout = {
      margin: {l: 60, r: 10, t: 10, b: 40}, height: 340, hovermode: grouped ? "x unified" : "closest",
      xaxis: {title: {text: "step", standoff: 4}, zeroline: false},
      yaxis: {title: {text: spec.unit ? spec.pattern + " (" + spec.unit + ")" : "value"}, zeroline: false},
      // Below the x-axis title, however many rows the legend takes.
      legend: {orientation: "h", y: -0.3, yanchor: "top"}, showlegend: true
    };
    return window.Plotly.newPlot(el, traces, layout, CONFIG).then(function () { el.dataset.state = "ready"; });
  }

  function initCurves() {
    var data = readJSON("curves-data");
    if (!data || !window.Plotly) return;
    data.panels.forEach(function (spec, i) {
      var el = document.getElementById("panel-" + i);
      if (el && spec.traces.length) drawPanel(el, spec, !!data.by);
    });
  }

  function hasWebGL() {
    try {
      var canvas = document.createElement("canvas");
      return !!(canvas.getContext("webgl") || canvas.getContext("experimental-webgl"));
    } catch (e) {
      return false;
    }
  }

  // The default: parallel coordinates from SVG lines, each axis scaled to
  // its own range, a line per run coloured by the outcome, hover naming the run.
  function svgParallel(el, data) {
    var dims = data.dimensions, outcome = dims[dims.length - 1];
    var lo = Math.min.apply(null, outcome.values), hi = Math.max.apply(null, outcome.values);
    function scale(d) {
      var a = Math.min.apply(null, d.values), b = Math.max.apply(null, d.values);
      return function (v) { return b > a ? (v - a) / (b - a) : 0.5; };
    }
    var scales = dims.map(scale);
    var traces = data.runs.map(function (name, r) {
      var t = hi > lo ? (outcome.values[r] - lo) / (hi - lo) : 0.5;
      var color = "hsl(" + Math.round(260 - 200 * t) + ",65%," + Math.round(35 + 15 * t) + "%)";
      return {x: dims.map(function (_, i) { return i; }), y: dims.map(function (d, i) { return scales[i](d.values[r]); }),
              type: "scatter", mode: "lines+markers", line: {color: color, width: 2}, marker: {size: 5},
              name: name, customdata: dims.map(function (d) { return d.ticktext ? d.ticktext[d.values[r]] : d.values[r]; }),
              hovertemplate: name + "<br>%{customdata}<extra></extra>", showlegend: false};
    });
    var notes = [];
    dims.forEach(function (d, i) {
      var a = Math.min.apply(null, d.values), b = Math.max.apply(null, d.values);
      var low = d.ticktext ? d.ticktext[a] : String(+a.toPrecision(4));
      var high = d.ticktext ? d.ticktext[b] : String(+b.toPrecision(4));
      notes.push({x: i, y: 1.06, text: d.label, showarrow: false, font: {size: 12, color: "#1d232b"}});
      notes.push({x: i, y: 1.0, text: high, showarrow: false, xanchor: "left", xshift: 4, font: {size: 10}});
      notes.push({x: i, y: 0.0, text: low, showarrow: false, xanchor: "left", xshift: 4, font: {size: 10}});
    });
    var layout = {
      margin: {l: 40, r: 90, t: 20, b: 20}, height: 460, hovermode: "closest", annotations: notes,
      xaxis: {showgrid: true, gridcolor: "#9a9a9a", zeroline: false, showticklabels: false, tickvals: dims.map(function (_, i) { return i; }),
              range: [-0.3, dims.length - 0.6]},
      yaxis: {showgrid: false, zeroline: false, showticklabels: false, range: [-0.06, 1.12]}
    };
    return window.Plotly.newPlot(el, traces, layout, CONFIG);
  }

  function initParallel() {
    var data = readJSON("parallel-data");
    var el = document.getElementById("parallel-plot");
    if (!data || !el || !window.Plotly || !data.dimensions.length) return;
    // plotly's parcoords (WebGL, with brushing) only on request: without a working WebGL it shows a
    // message with inline styles the CSP refuses, and a canvas context alone does not prove it works.
    if (el.dataset.renderer !== "webgl" || !hasWebGL()) {
      el.dataset.renderer = "svg";
      svgParallel(el, data).then(function () { el.dataset.state = "ready"; });
      return;
    }
    el.dataset.renderer = "webgl";
    var outcome = data.dimensions[data.dimensions.length - 1];
    var dims = data.dimensions.map(function (d) {
      var out = {label: d.label, values: d.values};
      if (d.tickvals) { out.tickvals = d.tickvals; out.ticktext = d.ticktext; }
      return out;
    });
    var trace = {
      type: "parcoords", dimensions: dims,
      line: {color: outcome.values, colorscale: "Viridis", showscale: true,
             colorbar: {title: {text: outcome.label}, thickness: 12}}
    };
    var layout = {margin: {l: 70, r: 90, t: 50, b: 30}, height: 460};
    window.Plotly.newPlot(el, [trace], layout, CONFIG).then(function () { el.dataset.state = "ready"; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    initCurves();
    initParallel();
  });
})();
