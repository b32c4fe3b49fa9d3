// The upload form sent with XMLHttpRequest, for the transfer's progress bar; the server answers
// with the registration report as an HTML fragment (rendered and escaped by the server), put under
// the form. Without this file the form posts normally and the report is a page of its own.
(function () {
  "use strict";

  function megabytes(n) {
    return (n / (1024 * 1024)).toFixed(n < 10 * 1024 * 1024 ? 2 : 1) + " MB";
  }

  function init() {
    var form = document.getElementById("upload-form");
    if (!form || !window.FormData || !window.XMLHttpRequest) return;
    var bar = document.getElementById("upload-progress");
    var status = document.getElementById("upload-status");
    var button = document.getElementById("upload-button");
    var report = document.getElementById("upload-report");
    var token = form.querySelector("input[name=csrf_token]");

    form.addEventListener("submit", function (event) {
      var file = document.getElementById("upload-file");
      if (!file.files || !file.files.length) return;  // let the browser say the file is required
      event.preventDefault();
      var xhr = new XMLHttpRequest();
      var events = 0;
      xhr.open("POST", form.action);
      xhr.setRequestHeader("X-Requested-With", "XMLHttpRequest");
      if (token) xhr.setRequestHeader("X-CSRFToken", token.value);
      bar.hidden = false;
      bar.value = 0;
      bar.max = 100;
      button.disabled = true;
      report.innerHTML = "";
      form.setAttribute("aria-busy", "true");
      status.textContent = "uploading " + file.files[0].name + "\u2026";
      xhr.upload.addEventListener("progress", function (e) {
        if (!e.lengthComputable) return;
        events += 1;
        bar.dataset.events = String(events);
        bar.value = Math.round(100 * e.loaded / e.total);
        status.textContent = "uploaded " + megabytes(e.loaded) + " of " + megabytes(e.total) +
          " (" + bar.value + "%)";
      });
      xhr.upload.addEventListener("load", function () {
        bar.value = 100;
        status.textContent = "uploaded; registering (reading the metrics, binding keys, diagnosing)\u2026";
      });
      xhr.addEventListener("load", function () {
        button.disabled = false;
        form.removeAttribute("aria-busy");
        var fragment = (xhr.getResponseHeader("Content-Type") || "").indexOf("text/html") === 0 &&
          xhr.responseText.indexOf("<!doctype") !== 0;
        if (xhr.status === 201) {
          status.textContent = "registered";
          form.reset();
        } else {
          status.textContent = "not registered (HTTP " + xhr.status + ")";
        }
        if (fragment) {
          report.innerHTML = xhr.responseText;
        } else {
          // An answer from before the view (too large, logged out): its message, as text.
          var box = document.createElement("div");
          box.className = "error";
          box.id = "upload-error";
          box.setAttribute("role", "alert");
          var doc = new DOMParser().parseFromString(xhr.responseText, "text/html");
          var message = doc.querySelector(".error-page p, main p");
          box.textContent = "Not registered: " + (message ? message.textContent : "HTTP " + xhr.status);
          report.appendChild(box);
        }
        report.dataset.status = String(xhr.status);
      });
      xhr.addEventListener("error", function () {
        button.disabled = false;
        form.removeAttribute("aria-busy");
        status.textContent = "the upload failed (connection lost); nothing was registered";
        report.dataset.status = "error";
      });
      xhr.send(new FormData(form));
    });
  }

  document.addEventListener("DOMContentLoaded", init);
})();
