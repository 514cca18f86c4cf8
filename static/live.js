// Live parts: an element with data-live-url is replaced by a fresh copy of
// itself from that URL every data-live-interval ms. The server leaves the
// attribute out once the experiment stops running, which stops the polling;
// that last copy carries data-reload, and the page's main content is then
// fetched afresh and swapped in (no navigation: the page turns analysed by itself).
(function () {
  "use strict";

  function schedule(el) {
    var interval = parseInt(el.dataset.liveInterval || "2000", 10);
    setTimeout(function () { refresh(el); }, interval);
  }

  function swapMain() {
    return fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("main");
        var current = document.querySelector("main");
        if (!fresh || !current) throw new Error("no main element");
        current.replaceWith(fresh);
        fresh.dispatchEvent(new CustomEvent("tailtune:updated", { bubbles: true }));
      })
      .catch(function () { window.location.reload(); });
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
        if (fresh.dataset.reload) {
          // The experiment left "running" (analysed, cancelled): the badge, the buttons and the
          // decision above this partial change too. Swap the page's main content in place.
          return swapMain();
        }
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
