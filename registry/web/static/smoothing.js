// The smoothing of registry/web/smoothing.py, for the browser: the interactive plots re-smooth
// without a round trip when the window or method changes. Same definitions, same numbers
// (tests/test_smoothing_js.py runs both on the same input):
//   ema       TensorBoard's debiased EMA, weight = 1 - 2 / (window + 1)
//   trailing  mean of the last `window` points (fewer at the start)
//   centred   mean of `window` points centred on each point (shrinking at both ends)
//   none      no smoothed line (null)
// Input: finite values only (the plots keep NaN/Inf out, as the server does).
(function (root) {
  "use strict";

  var MAX_WINDOW = 100000;
  var METHODS = ["ema", "trailing", "centred", "none"];

  function emaWeight(window) {
    window = Math.max(1, Math.floor(window));
    return 1 - 2 / (window + 1);
  }

  function emaDebiased(values, weight) {
    var n = values.length;
    var out = new Float64Array(n);
    if (n === 0 || weight <= 0) {
      for (var k = 0; k < n; k++) out[k] = values[k];
      return out;
    }
    if (weight >= 1) throw new Error("EMA weight must be below 1");
    var logW = Math.log(weight);
    var last = 0;
    for (var i = 0; i < n; i++) {
      last = last * weight + (1 - weight) * values[i];
      // Debias: the average started from 0, so early values are scaled by 1 - w**(i+1).
      out[i] = last / -Math.expm1((i + 1) * logW);
    }
    return out;
  }

  // Cumulative sums of (x - mean), as the Python code keeps them, for the same rounding.
  function cumsum0(values) {
    var n = values.length;
    var offset = 0;
    for (var i = 0; i < n; i++) offset += values[i];
    offset = n ? offset / n : 0;
    var c = new Float64Array(n + 1);
    for (var j = 0; j < n; j++) c[j + 1] = c[j] + (values[j] - offset);
    return {c: c, offset: offset};
  }

  function trailingMean(values, window) {
    var n = values.length;
    var out = new Float64Array(n);
    if (n === 0 || window <= 1) {
      for (var k = 0; k < n; k++) out[k] = values[k];
      return out;
    }
    var cs = cumsum0(values), c = cs.c;
    var w = Math.min(window, n);
    for (var i = 0; i < n; i++) {
      out[i] = (i < w ? c[i + 1] / (i + 1) : (c[i + 1] - c[i + 1 - w]) / w) + cs.offset;
    }
    return out;
  }

  function centredMean(values, window) {
    var n = values.length;
    var out = new Float64Array(n);
    if (n === 0 || window <= 1) {
      for (var k = 0; k < n; k++) out[k] = values[k];
      return out;
    }
    var cs = cumsum0(values), c = cs.c;
    var before = Math.floor((window - 1) / 2), after = Math.floor(window / 2);
    for (var i = 0; i < n; i++) {
      var lo = Math.max(i - before, 0), hi = Math.min(i + after + 1, n);
      out[i] = (c[hi] - c[lo]) / (hi - lo) + cs.offset;
    }
    return out;
  }

  function smooth(values, method, window) {
    if (method === "none") return null;
    window = Math.max(1, Math.min(Math.floor(window), MAX_WINDOW));
    if (method === "ema") return emaDebiased(values, emaWeight(window));
    if (method === "trailing") return trailingMean(values, window);
    if (method === "centred" || method === "centered") return centredMean(values, window);
    throw new Error("smoothing must be one of " + METHODS.join(", ") + "; got " + method);
  }

  var api = {smooth: smooth, emaWeight: emaWeight, emaDebiased: emaDebiased, trailingMean: trailingMean,
             centredMean: centredMean, METHODS: METHODS, MAX_WINDOW: MAX_WINDOW};
  if (typeof module === "object" && module.exports) module.exports = api;
  else root.RLSmoothing = api;
})(typeof self !== "undefined" ? self : this);
