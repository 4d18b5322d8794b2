/* celery-grousset admin: copy a full fingerprint from the journal list. */
"use strict";
(function () {
  function copied(button) {
    button.setAttribute("data-copied", "yes");
    button.textContent = "copied";
    setTimeout(function () { button.textContent = "copy"; }, 1500);
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
