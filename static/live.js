// Live parts: an element with data-live-url is replaced by a fresh copy of
// itself from that URL every data-live-interval ms. The server leaves the
// attribute out once nothing is running, which stops the polling.
(function () {
  "use strict";

  function schedule(el) {
    var interval = parseInt(el.dataset.liveInterval || "2000", 10);
    setTimeout(function () { refresh(el); }, interval);
  }

  function refresh(el) {
    if (!document.body.contains(el)) return;
    fetch(el.dataset.liveUrl, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var holder = document.createElement("div");
        holder.innerHTML = html.trim();
        var fresh = holder.firstElementChild;
        if (!fresh) return schedule(el);
        el.replaceWith(fresh);
        fresh.dispatchEvent(new CustomEvent("tailtune:updated", { bubbles: true }));
        if (fresh.dataset.liveUrl) schedule(fresh);
      })
      .catch(function () { schedule(el); }); // a missed poll is retried, never fatal
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live-url]").forEach(schedule);
  });
})();
