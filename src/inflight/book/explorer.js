/* inflight's explorers, drawn with plotly.js.
 *
 * An explorer is a <div class="inflight-explorer"> holding its figure as JSON: the traces and
 * layout of its first view, one plotly frame per point of a grid of knob values (named by the
 * knobs' indices, "2,0"), one slider per knob, and `narrow`, its layout for a narrow screen
 * (inflight.book.explorer_layout). Plotly's own sliders can drive only one knob (a step can only
 * name a fixed frame), so the sliders here do nothing themselves (method "skip"): on every move
 * this script shows the frame of *all* the sliders' current positions. A "play" button steps its
 * knob from where it stands to the end, one frame at a time, and reads "pause" meanwhile.
 *
 * An explorer is drawn when it comes near the screen, and plotly.js is loaded then too where the
 * page says where it is (the book's site: this script's data-plotly attribute); elsewhere (a
 * notebook) the page brings plotly.js itself. Above the plot, the title (wrapped to the width),
 * the legend and the panels' titles each get a band of their own, measured once drawn.
 */
(function () {
  "use strict";
  var INSTANT = {mode: "immediate", frame: {duration: 0, redraw: true}, transition: {duration: 0}};
  var PLAY = "\u25b6 play", PAUSE = "\u275a\u275a pause";
  var TOP_PAD = 8, BAND_GAP = 6, PANEL_LINE = 19;
  var script = document.currentScript;
  var PLOTLY_SRC = script && script.getAttribute("data-plotly") ?
    new URL(script.getAttribute("data-plotly"), script.src).href : null;

  function clone(x) { return JSON.parse(JSON.stringify(x)); }

  function merge(base, extra) {
    var out = Array.isArray(base) ? base.slice() : Object.assign({}, base);
    Object.keys(extra || {}).forEach(function (k) {
      var v = extra[k];
      out[k] = v && typeof v === "object" && !Array.isArray(v) && base && typeof base[k] === "object" &&
        !Array.isArray(base[k]) ? merge(base[k], v) : v;
    });
    return out;
  }

  // -- text: measured with the figure's font, wrapped at spaces to a width ----------------------
  var canvas = null;
  function textWidth(text, size, family) {
    canvas = canvas || document.createElement("canvas").getContext("2d");
    canvas.font = size + "px " + family;
    return canvas.measureText(String(text).replace(/<[^>]+>/g, "")).width;
  }
  function wrap(text, width, size, family) {
    if (!text) return text;
    return String(text).split(/<br\s*\/?>/i).map(function (line) {
      if (textWidth(line, size, family) <= width || /<[^>]+>/.test(line)) return line;
      var out = [], cur = "";
      line.split(" ").forEach(function (w) {
        var next = cur ? cur + " " + w : w;
        if (cur && textWidth(next, size, family) > width) { out.push(cur); cur = w; } else { cur = next; }
      });
      if (cur) out.push(cur);
      return out.join("<br>");
    }).join("<br>");
  }
  function lineCount(text) { return text ? String(text).split(/<br\s*\/?>/i).length : 0; }

  // -- narrow screens: columns of panels stacked (spec.blocks: [x0, x1, y0, y1, ny0, ny1]) -------
  function blockAt(blocks, x) {
    var best = null, dist = Infinity;
    blocks.forEach(function (b) {
      var d = x < b[0] ? b[0] - x : x > b[1] ? x - b[1] : 0;
      if (d < dist - 1e-9) { dist = d; best = b; }
    });
    return best;
  }
  function mapX(b, x) { return (x - b[0]) / (b[1] - b[0]); }
  function mapY(b, y) { return b[4] + (y - b[2]) / (b[3] - b[2]) * (b[5] - b[4]); }

  function axisBlocks(layout, blocks) {
    var of = {};
    Object.keys(layout).forEach(function (k) {
      if (/^xaxis\d*$/.test(k) && layout[k].domain) {
        var d = layout[k].domain, b = blockAt(blocks, (d[0] + d[1]) / 2);
        of["x" + k.slice(5)] = b;
        var a = layout[k].anchor;
        if (typeof a === "string" && a.charAt(0) === "y") of[a] = b;
      }
    });
    return of;
  }
  function refAxis(ref) { return String(ref || "").split(" ")[0]; }

  // Move what a layout places in paper coordinates with the panel (column) it belongs to.
  function stack(layout, blocks, of) {
    Object.keys(layout).forEach(function (k) {
      var m = /^([xy])axis(\d*)$/.exec(k), d = layout[k] && layout[k].domain, b = m && of[m[1] + m[2]];
      if (!b || !d) return;
      layout[k].domain = m[1] === "x" ? [mapX(b, d[0]), mapX(b, d[1])] : [mapY(b, d[0]), mapY(b, d[1])];
    });
    ["annotations", "shapes", "images"].forEach(function (key) {
      (layout[key] || []).forEach(function (o) { place(o, blocks, of, key === "annotations" ? ["x"] : ["x0", "x1"],
                                                        key === "annotations" ? ["y"] : ["y0", "y1"]); });
    });
  }
  // A label left of its panel, in the gap between two columns, belongs to the panel on its right.
  function labelBlock(blocks, x, anchor) {
    var inside = blocks.filter(function (b) { return x >= b[0] - 1e-6 && x <= b[1] + 1e-6; })[0];
    if (inside || anchor !== "left") return inside || blockAt(blocks, x);
    var right = blocks.filter(function (b) { return b[0] > x; }).sort(function (a, b) { return a[0] - b[0]; })[0];
    return right || blockAt(blocks, x);
  }
  function place(o, blocks, of, xs, ys) {
    var px = refAxis(o.xref || "paper") === "paper", py = refAxis(o.yref || "paper") === "paper";
    if (!px && !py) return;
    var b = px ? labelBlock(blocks, xs.reduce(function (s, k) { return s + (o[k] || 0); }, 0) / xs.length, o.xanchor)
      : of[refAxis(o.xref)];
    if (!b) return;
    if (px) xs.forEach(function (k) { if (o[k] !== undefined) o[k] = Math.min(1, Math.max(0, mapX(b, o[k]))); });
    if (py) ys.forEach(function (k) { if (o[k] !== undefined) o[k] = mapY(b, o[k]); });
  }

  // -- the layout for this width -----------------------------------------------------------------
  function legendAbove(legend) {
    return legend.yref === "container" || (legend.y === undefined ? true : legend.y >= 1 &&
      (legend.yanchor || "auto") !== "top");
  }

  function build(fig, width) {
    var spec = fig.narrow, narrow = !!spec && width < spec.below;
    var layout = clone(fig.layout), data = clone(fig.data), frames = clone(fig.frames);
    var plotPx = layout.height - layout.margin.t - layout.margin.b;
    if (narrow) {
      var sliders = layout.sliders, menus = layout.updatemenus;
      if (spec.blocks.length) {
        var of = axisBlocks(layout, spec.blocks);
        stack(layout, spec.blocks, of);
        frames.forEach(function (f) { if (f.layout) stack(f.layout, spec.blocks, of); });
      }
      layout = merge(layout, spec.layout);
      layout.sliders = sliders.map(function (s, i) { return merge(s, (spec.layout.sliders || [])[i] || {}); });
      layout.updatemenus = menus.map(function (m, i) { return merge(m, (spec.layout.updatemenus || [])[i] || {}); });
      Object.keys(spec.traces || {}).forEach(function (i) { data[i] = merge(data[i], spec.traces[i]); });
      plotPx = spec.plot_px;
      layout.title = merge(layout.title || {}, {xref: "container", x: 0, pad: {l: 8}});
      smallerNotes(layout, frames);
      fitSliders(layout, width);
    }
    var strip = narrow || legendAbove(layout.legend || {});
    if (strip) {
      layout.legend = merge(layout.legend || {}, narrow ?
        {orientation: "h", xref: "container", x: 0.01, xanchor: "left", yref: "container", yanchor: "top"} :
        {orientation: "h", yref: "container", yanchor: "top"});
    }
    layout.title = merge(layout.title || {}, {yref: "container", yanchor: "top", y: 1 - TOP_PAD / layout.height});
    var font = merge(layout.font || {}, (layout.title || {}).font || {});
    var titleWidth = (narrow ? width - 16 : width - layout.margin.l - 8);
    var titleLines = 0;
    [layout].concat(frames.map(function (f) { return f.layout || {}; })).forEach(function (l) {
      if (l.title && l.title.text) {
        l.title.text = wrap(l.title.text, titleWidth, font.size || 14, font.family);
        titleLines = Math.max(titleLines, lineCount(l.title.text));
      }
    });
    var panelLines = narrow ? wrapPanelTitles(layout, frames, width) : topPanelLines(layout);
    return {data: data, layout: layout, frames: frames, narrow: narrow, plotPx: plotPx, strip: strip,
            titleLines: titleLines, panelLines: panelLines};
  }

  // On a narrow screen, annotations (panel titles, counters) in a smaller font: 0.8 of it, 10 px at least.
  function smallerNotes(layout, frames) {
    var base = (layout.font && layout.font.size) || 13;
    [layout].concat(frames.map(function (f) { return f.layout || {}; })).forEach(function (l) {
      (l.annotations || []).forEach(function (a) {
        a.font = merge(a.font || {}, {size: Math.max(10, Math.round(((a.font && a.font.size) || base) * 0.8))});
      });
    });
  }

  // A slider's current value must fit above its rail: a long knob name loses its parenthesis, then shrinks.
  function fitSliders(layout, width) {
    var plotW = width - layout.margin.l - layout.margin.r, family = (layout.font || {}).family;
    (layout.sliders || []).forEach(function (s) {
      var cv = s.currentvalue || {}, size = (cv.font && cv.font.size) || 13;
      var longest = s.steps.reduce(function (m, st) { return st.label.length > m.length ? st.label : m; }, "");
      var room = s.len * plotW - ((s.pad && s.pad.l) || 0);
      var fits = function () { return textWidth((cv.prefix || "") + longest, size, family) <= room; };
      if (!fits()) cv.prefix = (cv.prefix || "").replace(/\s*\([^)]*\)/, "");
      while (!fits() && size > 10) size -= 1;
      s.currentvalue = merge(cv, {font: {size: size}});
    });
  }

  // Panel titles: annotations above a panel (on its own axes, or in paper coordinates); where they
  // stand in paper coordinates, from their axes' domains.
  function isPanelTitle(a) { return a.yanchor === "bottom" && !a.showarrow; }
  function paperAt(layout, ref, v, letter) {
    var m = /^([xy])(\d*) domain$/.exec(String(ref || "paper"));
    if (!m) return refAxis(ref || "paper") === "paper" ? v : null;
    var d = (layout[letter + "axis" + m[2]] || {}).domain || [0, 1];
    return d[0] + v * (d[1] - d[0]);
  }
  function topPanelLines(layout) {
    var top = 0;
    (layout.annotations || []).forEach(function (a) {
      var y = paperAt(layout, a.yref, a.y, "y");
      if (isPanelTitle(a) && y !== null && y >= 0.98) top = Math.max(top, lineCount(a.text));
    });
    return top;
  }
  function wrapPanelTitles(layout, frames, width) {
    var plotW = width - layout.margin.l - layout.margin.r, font = layout.font || {};
    [layout].concat(frames.map(function (f) { return f.layout || {}; })).forEach(function (l) {
      (l.annotations || []).forEach(function (a) {
        var x = paperAt(layout, a.xref, a.x, "x");
        if (!isPanelTitle(a) || x === null || a.xanchor !== "left") return;
        var size = (a.font && a.font.size) || font.size || 13;
        a.text = wrap(a.text, (1 - x) * plotW + layout.margin.r, size, font.family);
      });
    });
    return topPanelLines(layout);
  }

  // -- the bands above the plot, measured on a first drawing without the data ---------------------
  var DATA_KEYS = ["x", "y", "z", "text", "base", "width", "customdata", "hovertext"];
  function outline(data) {  // each trace a single point: its legend entry stays, the drawing is quick
    return data.map(function (t) {
      var o = Object.assign({}, t);
      DATA_KEYS.forEach(function (k) { if (k in o) o[k] = k === "z" ? [[0]] : k === "text" ? [""] : [0]; });
      return o;
    });
  }

  // The figure's height and top margin, and where its title and legend go, from the first drawing.
  function topLayout(gd, v) {
    var box = gd.getBoundingClientRect();
    var title = gd.querySelector(".g-gtitle text"), legend = gd.querySelector(".legend");
    var tb = title ? title.getBoundingClientRect() : null;
    var lineH = tb && v.titleLines ? tb.height / Math.max(1, lineCount(gd.layout.title.text)) : 17;
    var shift = tb ? tb.top - box.top - TOP_PAD : 0;  // plotly lifts a title of several lines
    var titleH = v.titleLines * lineH;
    var legendH = v.strip && legend ? legend.getBoundingClientRect().height : 0;
    var top = TOP_PAD + titleH + (legendH ? BAND_GAP + legendH : 0) + BAND_GAP + v.panelLines * PANEL_LINE + 6;
    var H = Math.round(top + v.plotPx + v.layout.margin.b);
    var layout = merge(v.layout, {height: H, margin: {t: top}});
    if (title) layout.title.y = 1 - (TOP_PAD - shift) / H;
    if (legendH) layout.legend.y = 1 - (TOP_PAD + titleH + BAND_GAP) / H;
    return layout;
  }

  // -- moving the sliders, playing -----------------------------------------------------------------
  function frameName(gd) {
    return (gd.layout.sliders || []).map(function (s) { return s.active || 0; }).join(",");
  }
  function show(gd) { return window.Plotly.animate(gd, [frameName(gd)], INSTANT); }

  function playLabel(gd, k, playing) {
    var menus = gd.layout.updatemenus || [];
    for (var m = 0; m < menus.length; m++) {
      var buttons = menus[m].buttons || [];
      for (var j = 0; j < buttons.length; j++) {
        if (buttons[j].name === "inflight-play-" + k) {
          var update = {};
          update["updatemenus[" + m + "].buttons[" + j + "].label"] = playing ? PAUSE : PLAY;
          return window.Plotly.relayout(gd, update);
        }
      }
    }
  }
  function stop(gd) {
    if (!gd._inflightTimer) return;
    clearInterval(gd._inflightTimer);
    gd._inflightTimer = null;
    playLabel(gd, gd._inflightPlaying, false);
  }
  // Step slider `k` one position per tick, from the next position (the first, after the last) to
  // the end; a click while playing pauses.
  function play(gd, k, ms) {
    if (gd._inflightTimer) { stop(gd); return; }
    var n = gd.layout.sliders[k].steps.length;
    var i = gd.layout.sliders[k].active || 0;
    if (i >= n - 1) i = -1;
    gd._inflightPlaying = k;
    playLabel(gd, k, true);
    gd._inflightTimer = setInterval(function () {
      i += 1;
      if (i >= n) { stop(gd); return; }
      var update = {};
      update["sliders[" + k + "].active"] = i;
      window.Plotly.relayout(gd, update).then(function () { return show(gd); });
    }, ms);
  }

  // -- drawing -------------------------------------------------------------------------------------
  function pause() { return new Promise(function (done) { setTimeout(done, 0); }); }

  function draw(box) {
    var fig = box._inflightFigure || (box._inflightFigure =
      JSON.parse(box.querySelector("script.inflight-figure").textContent));
    var gd = box.querySelector(".inflight-plot");
    var ms = Number(box.getAttribute("data-play-ms") || 500);
    var width = box.clientWidth || gd.clientWidth || 800;
    var active = gd.layout && gd.layout.sliders ? gd.layout.sliders.map(function (s) { return s.active || 0; }) : null;
    if (gd._inflightTimer) stop(gd);
    if (gd.layout) window.Plotly.purge(gd);
    var v = build(fig, width);
    if (active) v.layout.sliders.forEach(function (s, i) { s.active = active[i]; });
    box._inflightWidth = width;
    box.setAttribute("data-drawn", "1");
    box.removeAttribute("data-ready");  // (set once its frames are in and its controls answer)
    gd.style.height = v.layout.height + "px";
    // each stage a task of its own (a promise's callbacks would all run in one): the reader's taps
    // and scrolls are served between them
    return pause().then(function () {
      return window.Plotly.newPlot(gd, outline(v.data), v.layout, fig.config);
    }).then(pause).then(function () {
      var layout = topLayout(gd, v);
      gd.style.height = layout.height + "px";
      return window.Plotly.newPlot(gd, v.data, layout, fig.config);  // (react kept an outline's empty text)
    }).then(pause).then(function () {
      return window.Plotly.addFrames(gd, v.frames);
    }).then(function () {
      if (active) show(gd);
      gd.on("plotly_sliderchange", function (e) {
        if (e.interaction) { stop(gd); show(gd); }  // a reader moved it (not our own relayout)
      });
      gd.on("plotly_buttonclicked", function (e) {
        var m = /^inflight-play-(\d+)$/.exec((e.button && e.button.name) || "");
        if (m) play(gd, Number(m[1]), ms);
      });
      box.setAttribute("data-ready", "1");
    });
  }

  // A swipe that starts on a plot scrolls the page: plotly's drag layer (which no explorer uses:
  // no axis zooms or pans) would take the touch and cancel the scroll, so it never sees one.
  function letTouchScroll(gd) {
    gd.addEventListener("touchstart", function (e) {
      if (e.target.closest && e.target.closest(".draglayer")) e.stopPropagation();
    }, {capture: true, passive: true});
  }

  // Follow the column's width: plotly's own "responsive" follows only the window's; a new width
  // (a phone turned, a window resized) wraps the titles anew, or takes the other layout.
  function follow(box) {
    if (!window.ResizeObserver) return;
    var pending = null;
    new ResizeObserver(function () {
      var gd = box.querySelector(".inflight-plot");
      if (!gd.layout || Math.abs(box.clientWidth - box._inflightWidth) < 2) return;
      clearTimeout(pending);
      pending = setTimeout(function () { draw(box); }, 150);
    }).observe(box);
  }

  // -- plotly.js: loaded when the first explorer comes near (the site), or waited for ----------------
  var waiting = [], loading = false;
  function withPlotly(fn, tries) {
    if (window.Plotly) { fn(); return; }
    if (PLOTLY_SRC) {
      waiting.push(fn);
      if (loading) return;
      loading = true;
      var s = document.createElement("script");
      s.src = PLOTLY_SRC;
      s.onload = function () { waiting.splice(0).forEach(function (f) { f(); }); };
      document.head.appendChild(s);
      return;
    }
    tries = tries || 0;  // a notebook output that fetches plotly.js itself: wait up to 10 s
    if (tries < 50) { setTimeout(function () { withPlotly(fn, tries + 1); }, 200); return; }
    document.querySelectorAll(".inflight-explorer .inflight-plot").forEach(function (gd) {
      if (!gd.layout) gd.textContent = "This explorer needs plotly.js, which this page has not loaded.";
    });
  }

  function start(box) {
    letTouchScroll(box.querySelector(".inflight-plot"));
    withPlotly(function () { draw(box).then(function () { follow(box); }); });
  }

  function drawAll() {
    var boxes = Array.prototype.filter.call(document.querySelectorAll(".inflight-explorer"), function (b) {
      if (b.getAttribute("data-inflight-seen")) return false;
      b.setAttribute("data-inflight-seen", "1");
      return true;
    });
    if (!window.IntersectionObserver) { boxes.forEach(start); return; }
    var near = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { near.unobserve(e.target); start(e.target); }
      });
    }, {rootMargin: "600px 0px"});
    boxes.forEach(function (b) { near.observe(b); });
  }

  window.inflightExplorers = drawAll;
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawAll);
  } else {
    drawAll();
  }
})();
