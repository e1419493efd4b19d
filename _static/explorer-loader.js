/* Loads the live attention explorer (the book's explorer/ folder, from
 * explorer/site/ in the repository) on the pages that hold one, and only there:
 * a page opts in with <div class="attn-explorer" data-explorer="...">
 * (chapters 6 and 10). Its script, style sheet, onnxruntime-web and models are
 * then fetched from the book's own files, never from a CDN. The one-page build
 * that the PDF is printed from keeps the still figure instead. */
(function () {
  "use strict";
  function load() {
    if (!document.querySelector(".attn-explorer[data-explorer]")) return;
    // Sphinx declares DOCUMENTATION_OPTIONS with const: a global binding, not a
    // property of window.
    const options = typeof DOCUMENTATION_OPTIONS === "undefined" ? {} : DOCUMENTATION_OPTIONS;
    if (options.BUILDER === "singlehtml") return;
    const root = document.documentElement.dataset.content_root || "";
    const css = document.createElement("link");
    css.rel = "stylesheet";
    css.href = root + "explorer/explorer.css";
    document.head.append(css);
    const script = document.createElement("script");
    script.src = root + "explorer/explorer.js";
    document.head.append(script);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", load);
  else load();
})();
