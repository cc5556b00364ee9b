/* inflight's explorers, drawn with plotly.js (loaded by the page before this script).
 *
 * An explorer is a <div class="inflight-explorer"> holding its figure as JSON: the traces and
 * layout of its first view, one plotly frame per point of a grid of knob values (named by the
 * knobs' indices, "2,0"), and one slider per knob. Plotly's own sliders can drive only one knob
 * (a step can only name a fixed frame), so the sliders here do nothing themselves (method
 * "skip"): on every move this script shows the frame of *all* the sliders' current positions. A
 * "play" button steps its knob from where it stands to the end, one frame at a time.
 */
(function () {
  "use strict";
  var INSTANT = {mode: "immediate", frame: {duration: 0, redraw: true}, transition: {duration: 0}};

  function frameName(gd) {
    return (gd.layout.sliders || []).map(function (s) { return s.active || 0; }).join(",");
  }

  function show(gd) {
    return window.Plotly.animate(gd, [frameName(gd)], INSTANT);
  }

  function stop(gd) {
    if (gd._inflightTimer) {
      clearInterval(gd._inflightTimer);
      gd._inflightTimer = null;
    }
  }

  // Step slider `k` one position per tick, from the next position (the first, after the last) to
  // the end; a click while playing stops.
  function play(gd, k, ms) {
    if (gd._inflightTimer) { stop(gd); return; }
    var n = gd.layout.sliders[k].steps.length;
    var i = gd.layout.sliders[k].active || 0;
    if (i >= n - 1) i = -1;
    gd._inflightTimer = setInterval(function () {
      i += 1;
      if (i >= n) { stop(gd); return; }
      var update = {};
      update["sliders[" + k + "].active"] = i;
      window.Plotly.relayout(gd, update).then(function () { return show(gd); });
    }, ms);
  }

  function draw(box) {
    if (box.getAttribute("data-drawn")) return;
    box.setAttribute("data-drawn", "1");
    var fig = JSON.parse(box.querySelector("script.inflight-figure").textContent);
    var gd = box.querySelector(".inflight-plot");
    var ms = Number(box.getAttribute("data-play-ms") || 500);
    window.Plotly.newPlot(gd, fig.data, fig.layout, fig.config).then(function () {
      return window.Plotly.addFrames(gd, fig.frames);
    }).then(function () {
      // follow the column's width (plotly's own "responsive" follows only the window's)
      if (window.ResizeObserver) {
        new ResizeObserver(function () { window.Plotly.Plots.resize(gd); }).observe(box);
      }
      gd.on("plotly_sliderchange", function (e) {
        if (e.interaction) { stop(gd); show(gd); }  // a reader moved it (not our own relayout)
      });
      gd.on("plotly_buttonclicked", function (e) {
        var m = /^inflight-play-(\d+)$/.exec((e.button && e.button.name) || "");
        if (m) play(gd, Number(m[1]), ms);
      });
    });
  }

  // plotly.js may still be loading (a notebook output that fetches it): wait up to 10 s.
  function drawAll(tries) {
    tries = tries || 0;
    if (!window.Plotly) {
      if (tries < 50) { setTimeout(function () { drawAll(tries + 1); }, 200); return; }
      document.querySelectorAll(".inflight-explorer .inflight-plot").forEach(function (gd) {
        gd.textContent = "This explorer needs plotly.js, which this page has not loaded.";
      });
      return;
    }
    document.querySelectorAll(".inflight-explorer").forEach(draw);
  }

  window.inflightExplorers = drawAll;
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { drawAll(0); });
  } else {
    drawAll(0);
  }
})();
