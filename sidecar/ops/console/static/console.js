// The redrive page's live progress: polls /redrives/<id>.json once a second until the redrive ends.
// The console's only script, served from 'self' (no inline script: the pages' CSP forbids it).
(function () {
  "use strict";
  var box = document.getElementById("redrive");
  if (!box) { return; }
  var bar = document.getElementById("redrive-bar");
  var text = document.getElementById("redrive-text");
  var url = box.getAttribute("data-progress");
  function show(p) {
    if (p.total) { bar.max = p.total; }
    bar.value = p.scanned;
    var line = p.state + ": " + p.scanned + " of " + p.total + " DLQ records read, " + p.sent + " sent";
    if (p.replayed !== null) { line += ", " + p.replayed + " confirmed"; }
    if (p.skipped) { line += ", " + p.skipped + " skipped"; }
    if (p.failures) { line += ", " + p.failures + " failed"; }
    if (p.error) { line += ": " + p.error; }
    text.textContent = line + " (" + p.elapsed_s + " s)";
    box.setAttribute("data-state", p.state);
    if (p.state === "done" || p.state === "failed") { window.location.reload(); return; }
    window.setTimeout(poll, 1000);
  }
  function poll() {
    fetch(url, { cache: "no-store" }).then(function (r) { return r.json(); }).then(show, function () {
      window.setTimeout(poll, 2000);
    });
  }
  if (box.getAttribute("data-state") !== "done" && box.getAttribute("data-state") !== "failed") { poll(); }
}());
