// The site's plotly.js: its core (the scatter trace, sliders, buttons, legends, annotations, shapes)
// and the other trace types the explorers draw. Keep in step with SITE_TRACES in
// src/inflight/book/interactive.py, then run ../update.sh.
var Plotly = require("plotly.js/lib/core");

Plotly.register([require("plotly.js/lib/bar"), require("plotly.js/lib/heatmap")]);

module.exports = Plotly;
