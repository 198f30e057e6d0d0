// Live regions poll with hx-trigger="every 2s"; while the tab is hidden their requests are
// skipped (htmx cancels a request whose htmx:confirm event is prevented). Kept out of the
// trigger (an "[expression]" filter) because htmx evaluates those, which the CSP forbids.
(function () {
  "use strict";
  document.addEventListener("htmx:confirm", function (event) {
    var trigger = event.detail.elt.getAttribute("hx-trigger") || "";
    if (document.visibilityState !== "visible" && trigger.indexOf("every ") === 0) {
      event.preventDefault();
    }
  });
})();
