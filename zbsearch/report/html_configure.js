/* zbsearch configure's page: draws the throughput-against-memory scatter from the JSON in #run-data as
   inline SVG. Vanilla script, no library, nothing fetched (inlined by zbsearch/report/configure_html.py).
   A solved shape: {label, t, p, d, sharding, b, m, ep, placement, schedule, step_s, bound_s, tps, mfu,
   bubble, peak_gib, cap_gib, gap, chosen, fixed}; a pruned one: {label, p, bound_s, tps_bound, reason}
   (zbsearch/report/configure_data.py). */
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("run-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var PALETTE = ["#3465a4", "#2e9451", "#d2601a", "#7b3f9e", "#0f7f8a", "#8a6d0f", "#b3261e", "#555555"];
  var LEFT = 70, RIGHT = 16, TOP = 22, BOTTOM = 44, HEIGHT = 400, GAP = 34, PRINT_WIDTH = 760;
  var svg = document.getElementById("scatter"), tip = document.getElementById("shape-tip");
  var details = document.getElementById("shape-details");
  var shapes = D.shapes, pruned = D.pruned, marks = [], selected = -1, width = 800, printing = false;
  var pipes = [];
  shapes.concat(pruned).forEach(function (s) { if (pipes.indexOf(s.p) < 0) pipes.push(s.p); });
  pipes.sort(function (a, b) { return a - b; });

  function el(name, attrs, parent, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(x, digits) {
    if (x === null || x === undefined) return "n/a";
    return Math.abs(x) >= 1000 ? Math.round(x).toLocaleString("en") : (+x.toPrecision(digits || 4)).toString();
  }
  function tick(x) {  // axis labels stay short: 3.5M, 250k
    var a = Math.abs(x);
    return a >= 1e6 ? +(x / 1e6).toPrecision(3) + "M" : a >= 1e4 ? +(x / 1e3).toPrecision(3) + "k" : fmt(x);
  }
  function pct(x) { return x === null || x === undefined ? "n/a" : (100 * x).toFixed(1) + "%"; }
  function colour(p) { return PALETTE[pipes.indexOf(p) % PALETTE.length]; }
  function describe(m) {
    var s = m.s;
    if (m.pruned)
      return s.label + ": pruned, never solved; its step bound " + fmt(s.bound_s) + " s allows at most " +
        fmt(s.tps_bound) + " tokens/s/GPU (" + s.reason + "); its memory was not computed";
    return s.label + ": " + (s.schedule ? s.schedule + " on " + s.placement : "no pipeline") + "; step " +
      fmt(s.step_s) + " s, " + fmt(s.tps) + " tokens/s/GPU, MFU " + pct(s.mfu) + ", bubble " + pct(s.bubble) +
      ", peak " + fmt(s.peak_gib) + " of " + fmt(s.cap_gib) + " GiB per GPU, " + pct(s.gap) + " above its bound" +
      (s.chosen ? "; the chosen plan" : "") + (s.fixed ? "; your configuration" : "");
  }
  function ticks(lo, hi, n) {
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n || 1)));
    if ((hi - lo) / step > 2.5 * n) step *= 5; else if ((hi - lo) / step > n) step *= 2;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }
  function triangle(x, y, r) {
    return "M" + (x - r) + "," + (y - r * 0.8) + "L" + (x + r) + "," + (y - r * 0.8) + "L" + x + "," + (y + r) + "Z";
  }

  function legend() {
    function item(svgText, text) {
      return '<span><svg width="18" height="14" aria-hidden="true">' + svgText + "</svg>" + text + "</span>";
    }
    var items = pipes.map(function (p) {
      return item('<rect x="2" y="2" width="14" height="10" fill="' + colour(p) + '"/>', "p = " + p);
    });
    if (shapes.length) items.push(item('<circle cx="9" cy="7" r="5" fill="#777"/>', "solved shape"));
    if (D.chosen)
      items.push(item('<circle cx="9" cy="7" r="6" fill="none" stroke="#000" stroke-width="2"/>', "the chosen plan"));
    if (shapes.some(function (s) { return s.fixed; }))
      items.push(item('<rect x="2" y="1" width="12" height="12" fill="none" stroke="#c2185b" stroke-width="2"/>',
                      "your configuration"));
    if (pruned.length)
      items.push(item('<path d="' + triangle(9, 6, 5) + '" fill="#fff" stroke="#666" stroke-width="1.3"/>',
                      "pruned, drawn apart at the most its bound allows (tokens/s/GPU at its step bound; " +
                      "memory not computed)"));
    if (D.cap_gib !== null)
      items.push(item('<line x1="9" x2="9" y1="0" y2="14" stroke="#b3261e" stroke-dasharray="3 2" stroke-width="1.5"/>',
                      "GPU memory"));
    document.getElementById("scatter-legend").innerHTML = items.join("");
  }

  function scales() {
    var band = pruned.length ? Math.min(220, Math.max(120, width * 0.16)) : 0;
    var right = width - RIGHT - (band ? band + GAP : 0);
    var mem = shapes.map(function (s) { return s.peak_gib; }).filter(function (v) { return v !== null; });
    if (D.cap_gib !== null) mem.push(D.cap_gib);
    var lo = mem.length ? Math.min.apply(null, mem) : 0, hi = mem.length ? Math.max.apply(null, mem) : 1;
    var pad = (hi - lo) * 0.08 || Math.max(1, hi * 0.05);
    var xs = [Math.max(0, lo - pad), hi + pad];
    var top = Math.max.apply(null, [1].concat(shapes.map(function (s) { return s.tps || 0; }),
                                              pruned.map(function (s) { return s.tps_bound || 0; })));
    var ys = [0, top * 1.08];
    return {
      band: band, right: right, xs: xs, ys: ys,
      x: function (v) { return LEFT + (v - xs[0]) / (xs[1] - xs[0]) * (right - LEFT); },
      y: function (v) { return HEIGHT - BOTTOM - (v - ys[0]) / (ys[1] - ys[0]) * (HEIGHT - BOTTOM - TOP); }
    };
  }

  function axes(S) {
    if (S.band) {
      var x0 = width - RIGHT - S.band;
      el("rect", { x: x0, y: TOP, width: S.band, height: HEIGHT - BOTTOM - TOP, "class": "band" }, svg);
      el("text", { x: x0 + S.band / 2, y: TOP - 6, "text-anchor": "middle", "class": "mem-text" }, svg,
         "pruned: at most (bound)");
      el("text", { x: x0 + S.band / 2, y: HEIGHT - BOTTOM + 15, "text-anchor": "middle", "class": "axis-title" }, svg,
         "memory not computed");
    }
    var g = el("g", { "class": "axis" }, svg);
    ticks(S.ys[0], S.ys[1], 6).forEach(function (v) {
      el("line", { x1: LEFT, x2: width - RIGHT, y1: S.y(v), y2: S.y(v) }, g);
      el("text", { x: LEFT - 6, y: S.y(v) + 4, "text-anchor": "end" }, g, tick(v));
    });
    ticks(S.xs[0], S.xs[1], 8).forEach(function (v) {
      el("line", { x1: S.x(v), x2: S.x(v), y1: TOP, y2: HEIGHT - BOTTOM }, g);
      el("text", { x: S.x(v), y: HEIGHT - BOTTOM + 15, "text-anchor": "middle" }, g, tick(v));
    });
    el("text", { x: (LEFT + S.right) / 2, y: HEIGHT - 8, "text-anchor": "middle", "class": "axis-title" }, svg,
       "peak memory per GPU (GiB), busiest pipeline rank");
    el("text", { x: 14, y: (TOP + HEIGHT - BOTTOM) / 2, "text-anchor": "middle", "class": "axis-title",
                 transform: "rotate(-90 14 " + (TOP + HEIGHT - BOTTOM) / 2 + ")" }, svg, "tokens/s per GPU");
    if (D.cap_gib !== null) {
      el("line", { x1: S.x(D.cap_gib), x2: S.x(D.cap_gib), y1: TOP, y2: HEIGHT - BOTTOM, "class": "mem-cap" }, svg);
      el("text", { x: S.x(D.cap_gib) - 4, y: TOP - 6, "text-anchor": "end", "class": "mem-text" }, svg,
         "GPU memory " + fmt(D.cap_gib) + " GiB");
    }
  }

  function draw() {
    while (svg.lastChild && svg.lastChild.nodeName !== "desc") svg.removeChild(svg.lastChild);
    width = printing ? PRINT_WIDTH : Math.max(480, svg.parentNode.clientWidth || 800);
    svg.setAttribute("viewBox", "0 0 " + width + " " + HEIGHT);
    svg.setAttribute("height", HEIGHT);
    var S = scales();
    axes(S);
    marks = [];
    var g = el("g", {}, svg);
    pruned.forEach(function (s, k) {
      // Spread across the band by a low-discrepancy sequence: the same place on every draw.
      var x = width - RIGHT - S.band + 10 + ((k * 0.618034) % 1) * (S.band - 20);
      var node = el("path", { d: triangle(x, S.y(s.tps_bound), 4.5), "class": "pruned-pt", stroke: colour(s.p),
                              "data-k": marks.length }, g);
      el("title", {}, node, s.label + ": pruned, at most " + fmt(s.tps_bound) + " tokens/s/GPU");
      marks.push({ s: s, pruned: true, node: node, x: x, y: S.y(s.tps_bound) });
    });
    var order = shapes.map(function (s, k) { return k; }).reverse();  // the fastest drawn last, on top
    var solvedMarks = [];
    order.forEach(function (k) {
      var s = shapes[k], x = S.x(s.peak_gib === null ? S.xs[0] : s.peak_gib), y = S.y(s.tps || 0);
      if (s.fixed) el("rect", { x: x - 9, y: y - 9, width: 18, height: 18, "class": "fixed-ring" }, g);
      var node = el("circle", { cx: x, cy: y, r: 6, fill: colour(s.p),
                                "class": "shape-pt" + (s.chosen ? " chosen" : "") + (s.fixed ? " fixed" : "") }, g);
      el("title", {}, node, s.label + ": " + fmt(s.tps) + " tokens/s/GPU, peak " + fmt(s.peak_gib) + " GiB");
      solvedMarks[k] = { s: s, pruned: false, node: node, x: x, y: y };
      if (s.chosen) {
        el("circle", { cx: x, cy: y, r: 11, "class": "chosen-ring" }, g);
        var left = x > (LEFT + S.right) / 2;
        el("text", { x: x + (left ? -14 : 14), y: y - 10, "text-anchor": left ? "end" : "start", "class": "chosen-label" },
           g, "chosen: " + s.label);
      }
    });
    // Keyboard order: the solved shapes fastest first, then the pruned ones.
    marks = solvedMarks.concat(marks);
    marks.forEach(function (m, i) { m.node.setAttribute("data-k", i); });
    if (selected >= 0) marks[selected].node.classList.add("sel");
    svg.setAttribute("aria-label", "Tokens/s per GPU against peak memory per GPU: " + shapes.length +
                     " solved shapes" + (D.chosen ? ", the chosen " + D.chosen : "") + "; " + pruned.length +
                     " pruned shapes drawn apart at the most their bound allows");
  }

  function select(i) {
    if (selected >= 0 && marks[selected]) marks[selected].node.classList.remove("sel");
    selected = i;
    marks[i].node.classList.add("sel");
    details.textContent = describe(marks[i]);
  }
  function showTip(i, ev) {
    tip.textContent = describe(marks[i]);
    tip.hidden = false;
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 300) + "px";
    tip.style.top = ev.clientY + 14 + "px";
  }
  function onKey(ev) {
    var k = ev.key, n = marks.length, next = -1;
    if (!n) return;
    if (k === "ArrowRight" || k === "ArrowDown") next = selected < 0 ? 0 : Math.min(n - 1, selected + 1);
    else if (k === "ArrowLeft" || k === "ArrowUp") next = selected < 0 ? 0 : Math.max(0, selected - 1);
    else if (k === "Home") next = Math.max(0, marks.findIndex(function (m) { return !m.pruned && m.s.chosen; }));
    else if (k === "End") next = n - 1;
    else return;
    ev.preventDefault();
    select(next);
  }

  function wire() {
    svg.addEventListener("mouseover", function (ev) {
      var i = ev.target.getAttribute && ev.target.getAttribute("data-k");
      if (i !== null && i !== undefined) showTip(+i, ev);
    });
    svg.addEventListener("mouseout", function () { tip.hidden = true; });
    svg.addEventListener("click", function (ev) {
      var i = ev.target.getAttribute && ev.target.getAttribute("data-k");
      if (i !== null && i !== undefined) select(+i);
    });
    svg.addEventListener("keydown", onKey);
    window.addEventListener("resize", draw);
    // On paper the chart is drawn about a printed page wide, so that its text prints at a readable size.
    window.addEventListener("beforeprint", function () { printing = true; draw(); });
    window.addEventListener("afterprint", function () { printing = false; draw(); });
  }

  legend();
  draw();
  wire();
  // The chosen plan's script, where the page has one, runs next and marks the page ready itself.
  if (!D.plan) document.documentElement.setAttribute("data-ready", "1");
})();
