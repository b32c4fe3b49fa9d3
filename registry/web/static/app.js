// Progressive enhancement only: every page works without this file.
(function () {
  "use strict";

  function initRunSelection() {
    var form = document.getElementById("compare-form");
    if (!form) return;
    var boxes = Array.prototype.slice.call(form.querySelectorAll("input.run-select"));
    var all = document.getElementById("select-all");
    var count = document.getElementById("selected-count");
    var button = document.getElementById("compare-button");

    function update() {
      var n = boxes.filter(function (b) { return b.checked; }).length;
      if (count) count.textContent = n ? n + " selected" : "select runs to compare";
      if (button) button.disabled = n < 1;
      if (all) {
        all.checked = n > 0 && n === boxes.length;
        all.indeterminate = n > 0 && n < boxes.length;
      }
    }
    boxes.forEach(function (b) { b.addEventListener("change", update); });
    if (all) {
      all.addEventListener("change", function () {
        boxes.forEach(function (b) { b.checked = all.checked; });
        update();
      });
    }
    update();
  }

  function initPlotFallback() {
    var images = document.querySelectorAll("img.plot");
    Array.prototype.forEach.call(images, function (img) {
      img.addEventListener("error", function () {
        var note = document.createElement("div");
        note.className = "plot-failed";
        note.textContent = "This plot could not be drawn. Open the CSV link for the data.";
        img.replaceWith(note);
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    initRunSelection();
    initPlotFallback();
  });
})();
