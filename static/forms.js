// Form behaviours declared in the markup, never as inline on* handlers (the Content-Security-Policy
// runs scripts from static files only):
//   <select data-submit-on-change> submits its form when its choice changes;
//   <form data-confirm="question"> asks the question and submits only on OK.
// Listening on the document, so parts swapped in by live.js behave the same.
(function () {
  "use strict";

  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el instanceof HTMLSelectElement && el.hasAttribute("data-submit-on-change") && el.form) {
      el.form.submit();
    }
  });

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();
