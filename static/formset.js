// "Add a row" for Django formsets: clone the <template> row, number it, and
// bump the management form's TOTAL_FORMS. Without JS the blank rows remain.
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var button = event.target.closest("button.add-row");
    if (!button) return;
    var table = document.getElementById(button.dataset.formset);
    var prefix = table.dataset.prefix;
    var total = document.getElementById("id_" + prefix + "-TOTAL_FORMS");
    var index = parseInt(total.value, 10);
    var html = table.querySelector("template").innerHTML.replace(/__prefix__/g, String(index));
    table.querySelector("tbody").insertAdjacentHTML("beforeend", html);
    total.value = String(index + 1);
  });
})();
