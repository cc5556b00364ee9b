/* Typeset the page's maths with KaTeX (loaded just before this script; _ext/site_assets.py).
 * Sphinx writes inline maths as <span class="math">\(...\)</span> and display maths as
 * <div class="math">\[...\]</div> (an equation's number, a <span class="eqno">, sits inside the div
 * before its TeX). A formula KaTeX cannot read is shown as its TeX in red (.katex-error). */
(function () {
  "use strict";
  function typeset(el) {
    var texts = Array.prototype.filter.call(el.childNodes, function (n) { return n.nodeType === 3; });
    var tex = texts.map(function (n) { return n.textContent; }).join("").trim();
    var display = el.tagName === "DIV";
    tex = tex.replace(/^\\\(|\\\)$/g, "").replace(/^\\\[|\\\]$/g, "");
    var out = document.createElement(display ? "div" : "span");
    window.katex.render(tex, out, {displayMode: display, throwOnError: false});
    texts.forEach(function (n) { n.remove(); });
    el.appendChild(out);
  }
  function all() {
    if (!window.katex) return;
    document.querySelectorAll(".math").forEach(function (el) {
      if (!el.querySelector(".katex")) typeset(el);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", all);
  else all();
})();
