// Shows a short-lived toast when an htmx request fails; the page keeps working and polling.
(function () {
  "use strict";
  function toast(message) {
    var box = document.getElementById("toasts");
    if (!box) return;
    var item = document.createElement("div");
    item.className = "toast";
    item.setAttribute("role", "status");
    item.textContent = message;
    box.replaceChildren(item);
    setTimeout(function () { item.remove(); }, 6000);
  }
  document.addEventListener("htmx:responseError", function (event) {
    var status = event.detail.xhr ? event.detail.xhr.status : "?";
    toast("Live refresh failed (HTTP " + status + "); showing the last values, retrying.");
  });
  document.addEventListener("htmx:sendError", function () {
    toast("Live refresh failed (server unreachable); showing the last values, retrying.");
  });
})();
