// The results page's evidence: every part is a <details class="evidence"> closed by default.
// 1. A link to #anchor (on load, or a click on this page) opens every <details> around that
//    element, so a link can open one part.
// 2. plotly.js (megabytes) loads only when a part with a chart is first opened; then the
//    charts inside that part are drawn (static/charts.js).
(function () {
  "use strict";
  var me = document.currentScript;
  var plotlySrc = me && me.dataset.plotly;
  var loading = null;

  function loadPlotly() {
    if (typeof Plotly !== "undefined") return Promise.resolve();
    if (!loading) {
      loading = new Promise(function (resolve, reject) {
        var s = document.createElement("script");
        s.src = plotlySrc;
        s.onload = resolve;
        s.onerror = reject;
        document.head.appendChild(s);
      });
    }
    return loading;
  }

  function drawIn(details) {
    if (!details.querySelector("div[data-chart]")) return;
    loadPlotly().then(function () {
      if (window.tailtuneCharts) window.tailtuneCharts.render(details);
    });
  }

  function openHash() {
    var id = decodeURIComponent(window.location.hash.slice(1));
    var target = id && document.getElementById(id);
    if (!target) return;
    for (var el = target; el; el = el.parentElement) {
      if (el.tagName === "DETAILS") el.open = true;
    }
    target.scrollIntoView();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("details.evidence").forEach(function (d) {
      d.addEventListener("toggle", function () { if (d.open) drawIn(d); });
      if (d.open) drawIn(d);
    });
    openHash();
  });
  window.addEventListener("hashchange", openHash);
})();
