/* The site's own reading conventions (issue 32), on every page (_ext/site_assets.py adds it).
 *
 * 1. The sidebar buttons. pydata-sphinx-theme 0.17.1 binds its sidebar dialogs (☰ "Site navigation"
 *    and "On this page") to the *first* .primary-toggle / .secondary-toggle of the page, and
 *    sphinx-book-theme 1.3.0 its wide-screen collapse to the first .primary-toggle: that is the
 *    navbar's button, which the book theme hides; the visible one, in the article header, gets no
 *    handler, so on a phone it only shows its tooltip (pydata/pydata-sphinx-theme#2451,
 *    executablebooks/sphinx-book-theme#917). Every other toggle forwards its click to the first.
 * 2. Sideways scrolling says so: whatever scrolls sideways in the article gets a hint above it.
 * 3. Code keeps its shape. A line too long for its box: in code, on a wide screen, wraps at a
 *    space only, its continuation indented under it (on a narrow screen code scrolls instead); in an
 *    output, a line of prose wraps the same way, while a table's rows never wrap: the output's
 *    font shrinks a little to fit them (down to SHRINK_MIN of its size), or it scrolls.
 */
(function () {
  "use strict";
  var SHRINK_MIN = 0.8, WIDE = 600;  // (an article narrower than WIDE px: code scrolls)

  function forwardToggles() {
    [".primary-toggle", ".secondary-toggle"].forEach(function (selector) {
      var all = document.querySelectorAll(selector), bound = all[0];
      Array.prototype.slice.call(all, 1).forEach(function (button) {
        button.addEventListener("click", function (e) {
          e.preventDefault();
          e.stopImmediatePropagation();
          // no tooltip left standing, now or when the dialog gives the focus back (the theme does
          // this for its first button only): on a phone it sticks out past the screen's edge, and
          // the page zooms out to show it
          button.blur();
          button.dispatchEvent(new Event("mouseleave"));
          bound.click();
          var tip = window.bootstrap && window.bootstrap.Tooltip && window.bootstrap.Tooltip.getInstance(button);
          if (tip) tip.hide();
        }, true);
      });
    });
  }

  // -- 3. lines of code and output ----------------------------------------------------------------
  var TABLE_ROW = /\S {2,}\S|^[\s\-=_\u2500+|:]{8,}$|\u2502/;

  // The pre's content as one block per line (pygments' spans split where a newline falls in them);
  // in an output, a line that looks like a table's row (columns apart, a rule) is marked.
  function splitLines(pre, output) {
    var lines = [[]], text = [""];
    Array.prototype.slice.call(pre.childNodes).forEach(function (node) {
      var parts = node.textContent.split("\n");
      parts.forEach(function (part, i) {
        if (i > 0) { lines.push([]); text.push(""); }
        if (!part) return;
        var piece = node.nodeType === 1 ? node.cloneNode(false) : document.createTextNode(part);
        if (node.nodeType === 1) piece.textContent = part;
        lines[lines.length - 1].push(piece);
        text[text.length - 1] += part;
      });
    });
    if (!text[text.length - 1]) { lines.pop(); text.pop(); }
    pre.textContent = "";
    lines.forEach(function (pieces, i) {
      var line = document.createElement("span"), indent = /^ */.exec(text[i])[0].length;
      line.className = "inflight-line" + (output && TABLE_ROW.test(text[i]) ? " inflight-row" : "");
      line.style.setProperty("--indent", indent + "ch");
      pieces.forEach(function (p) { line.appendChild(p); });
      if (!pieces.length) line.appendChild(document.createTextNode("\u200b"));
      pre.appendChild(line);
    });
  }

  function shape(pre) {
    if (pre.clientWidth === 0 || pre.getAttribute("data-inflight-shaped")) return;
    if (pre.scrollWidth <= pre.clientWidth + 1) return;
    pre.setAttribute("data-inflight-shaped", "1");
    var output = !!pre.closest(".cell_output");
    pre.classList.add(output ? "inflight-output-lines" : "inflight-code-lines");
    splitLines(pre, output);
    if (!output) return;
    var widest = 0;
    pre.querySelectorAll(".inflight-row").forEach(function (row) { widest = Math.max(widest, row.scrollWidth); });
    var room = pre.clientWidth - parseFloat(getComputedStyle(pre).paddingLeft) -
      parseFloat(getComputedStyle(pre).paddingRight);
    if (widest > room && room / widest >= SHRINK_MIN) {
      pre.style.fontSize = (parseFloat(getComputedStyle(pre).fontSize) * room / widest * 0.995) + "px";
    }
  }

  // -- 2. hints for what scrolls sideways -----------------------------------------------------------
  function hint(el) {
    var scrolls = el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1 &&
      /auto|scroll/.test(getComputedStyle(el).overflowX);
    var prev = el.previousElementSibling, has = prev && prev.classList.contains("inflight-scroll-hint");
    if (scrolls && !has) {
      var note = document.createElement("div");
      note.className = "inflight-scroll-hint";
      note.setAttribute("aria-hidden", "true");
      note.textContent = "scroll sideways for more \u2192";
      el.parentNode.insertBefore(note, el);
    } else if (!scrolls && has) {
      prev.remove();
    }
    el.classList.toggle("inflight-scrolls", scrolls);
  }

  var pending = null;
  function review() {
    pending = null;
    var article = document.querySelector("article.bd-article") || document.querySelector("main");
    if (!article) return;
    var wide = article.clientWidth >= WIDE;
    document.documentElement.classList.toggle("inflight-narrow", !wide);
    article.querySelectorAll("pre").forEach(shape);
    article.querySelectorAll("div, pre, table, span.inflight-figure").forEach(function (el) {
      if (!el.closest(".inflight-explorer") && !el.classList.contains("inflight-scroll-hint")) hint(el);
    });
  }
  function later() { if (!pending) pending = setTimeout(review, 120); }

  function start() {
    forwardToggles();
    review();
    window.addEventListener("resize", later);
    window.addEventListener("load", later);
    var article = document.querySelector("article.bd-article");
    if (article && window.MutationObserver) {  // a cell opened, a toggle pressed
      new MutationObserver(function (records) {
        if (records.some(function (r) { return !r.target.closest || !r.target.closest(".inflight-explorer"); })) later();
      }).observe(article, {subtree: true, attributes: true, attributeFilter: ["class", "open"]});
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
