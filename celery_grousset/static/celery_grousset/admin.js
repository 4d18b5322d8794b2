/* celery-grousset admin: copy a full fingerprint from the journal list. */
"use strict";
(function () {
  const CHECK = '<svg class="grousset-copy-icon" viewBox="0 0 16 16" width="14" height="14" ' +
    'aria-hidden="true" focusable="false" fill="none" stroke="currentColor" ' +
    'stroke-width="2"><path d="M3 8.5l3.5 3.5L13 4.5"/></svg>';
  function copied(button) {
    button.setAttribute("data-copied", "yes");
    if (button.getAttribute("data-state") === "copied") { return; }
    const icon = button.innerHTML;
    const label = button.getAttribute("aria-label") || "";
    button.setAttribute("data-state", "copied");
    button.setAttribute("aria-label", "Copied");
    button.innerHTML = CHECK;
    setTimeout(function () {
      button.innerHTML = icon;
      button.setAttribute("aria-label", label);
      button.removeAttribute("data-state");
    }, 1500);
  }
  function fallback(button, text) {
    const area = document.createElement("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    try {
      if (document.execCommand("copy")) { copied(button); }
    } catch (e) { /* the full value stays in the title attribute */ }
    area.remove();
  }
  document.addEventListener("click", function (event) {
    const button = event.target.closest(".grousset-copy");
    if (!button) { return; }
    event.preventDefault();
    const text = button.getAttribute("data-copy") || "";
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { copied(button); },
        function () { fallback(button, text); }
      );
    } else {
      fallback(button, text);
    }
  });
})();
