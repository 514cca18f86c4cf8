// Renders every chart on the page: a <div data-chart="ID"> next to a
// json_script element with the same id holding a plotly figure {data, layout}.
// A point whose customdata is a URL opens that page when clicked.
(function () {
  "use strict";

  function render(root) {
    if (typeof Plotly === "undefined") return;
    (root || document).querySelectorAll("div[data-chart]").forEach(function (div) {
      var source = document.getElementById(div.dataset.chart);
      if (!source) return;
      var fig = JSON.parse(source.textContent);
      Plotly.react(div, fig.data || [], fig.layout || {}, { responsive: true, displaylogo: false });
      if (!div.dataset.clickBound) {
        div.dataset.clickBound = "1";
        div.on("plotly_click", function (event) {
          var point = event.points && event.points[0];
          var url = point && point.customdata;
          if (typeof url === "string" && url.charAt(0) === "/") window.location.assign(url);
        });
      }
    });
  }

  window.tailtuneCharts = { render: render };
  document.addEventListener("DOMContentLoaded", function () { render(document); });
  document.addEventListener("tailtune:updated", function (e) { render(e.target); });
})();
