/* zbsearch report: draws the timeline and memory charts from the JSON in #plan-data as inline SVG.
   Vanilla script, no library, nothing fetched (inlined by zbsearch/report/html.py). A box is
   [rank, start, end, kind code, kind label, chunk, microbatch, recompute, waited-for box, why,
    inputs [[box, arrival]], critical] (zbsearch/report/html_data.py). */
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("plan-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = { F: ["#3465a4", "#9fbfe8"], B: ["#2e9451", "#9ad9ad"], W: ["#e8b419", "#f6e09a"],
                 BW: ["#d2601a", "#f2b48c"], FB: ["#7b3f9e", "#cfb0e3"] };
  var NAMES = { F: "F forward", B: "B backward for inputs (torch I)", W: "W backward for weights",
                BW: "BW fused backward (torch B)", FB: "F&B overlapped pair" };
  var LEFT = 44, RIGHT = 14, ROW = 24, TOP = 6, AXIS = 22, MEM_ROW = 64;
  var boxes = D.boxes, p = D.ranks, unit = D.time_unit;
  var svg = document.getElementById("timeline"), msvg = document.getElementById("memory");
  var tip = document.getElementById("tip"), details = document.getElementById("details");
  var view = [0, D.makespan || 1], width = 800, rects = [], labels = [], hatches = [], selected = -1;
  var byRank = [], critical = [];
  boxes.forEach(function (b, i) {
    (byRank[b[0]] = byRank[b[0]] || []).push(i);
    if (b[11]) critical.push(i);
  });
  critical.sort(function (a, b) { return boxes[a][1] - boxes[b][1]; });

  function el(name, attrs, parent, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(x) { return Math.abs(x) >= 1000 ? Math.round(x).toLocaleString("en") : (+x.toPrecision(4)).toString(); }
  function light(c) {
    var n = parseInt(c.slice(1), 16);
    return 0.299 * (n >> 16) + 0.587 * ((n >> 8) & 255) + 0.114 * (n & 255) > 140;
  }
  function colour(b) { return COLORS[b[3]][D.local_chunk[+String(b[5]).split("&")[0]] % 2]; }
  function name(i) {
    var b = boxes[i];
    return b[4] + b[6] + " of chunk " + b[5] + " on rank " + b[0];
  }
  function waited(i) {
    var b = boxes[i], w = b[8];
    if (b[9] === "start") return "nothing: it is its rank's first pass and needs no input";
    if (b[9] === "rank") return "its rank: " + name(w) + " ran until " + fmt(boxes[w][2]);
    var arrival = b[10].filter(function (x) { return x[0] === w; })[0][1];
    return "its input from " + name(w) + ", which arrived at " + fmt(arrival);
  }
  function describe(i) {
    var b = boxes[i];
    return "chunk " + b[5] + ", kind " + b[4] + ", microbatch " + b[6] + ", rank " + b[0] + "; start " +
      fmt(b[1]) + ", end " + fmt(b[2]) + " " + unit + "; waited for " + waited(i) +
      (b[7] ? "; recomputes its chunk's layers" : "") + (b[11] ? "; on the critical path" : "");
  }
  function x(t) { return LEFT + (t - view[0]) / (view[1] - view[0]) * (width - LEFT - RIGHT); }

  function legend() {
    var box = document.getElementById("legend"), used = {};
    boxes.forEach(function (b) { used[b[3]] = 1; });
    var items = Object.keys(NAMES).filter(function (k) { return used[k]; }).map(function (k) {
      return '<span><i style="background:' + COLORS[k][0] + '"></i>' + NAMES[k] + "</span>";
    });
    items.push('<span><i style="background:#fff;border:2px solid #000"></i>critical path</span>');
    if (boxes.some(function (b) { return b[7]; }))
      items.push('<span><i style="background:repeating-linear-gradient(45deg,#fff,#fff 2px,#b3261e 2px,#b3261e 4px)"></i>recompute</span>');
    items.push("<span>light shade: a rank's second chunk</span>");
    box.innerHTML = items.join("");
  }

  function build() {
    var defs = el("defs", {}, svg);
    var pat = el("pattern", { id: "hatch", width: 5, height: 5, patternUnits: "userSpaceOnUse",
                              patternTransform: "rotate(45)" }, defs);
    el("rect", { width: 1.6, height: 5, fill: "#b3261e", "fill-opacity": 0.8 }, pat);
    var clip = el("clipPath", { id: "plot-clip" }, defs);
    svg._clip = el("rect", { x: LEFT, y: 0, height: TOP + p * ROW }, clip);
    for (var r = 0; r < p; r++)
      el("text", { x: 4, y: TOP + r * ROW + ROW / 2 + 4, "class": "rank-label" }, svg, "rank " + r);
    var g = el("g", { "clip-path": "url(#plot-clip)" }, svg);
    boxes.forEach(function (b, i) {
      var c = colour(b);
      var rect = el("rect", { "class": "box" + (b[11] ? " crit" : ""), y: TOP + b[0] * ROW + 2, height: ROW - 4,
                              fill: c, "data-i": i }, g);
      el("title", {}, rect, b[4] + b[6] + " (chunk " + b[5] + ")");
      rects.push(rect);
      hatches.push(b[7] ? el("rect", { y: TOP + b[0] * ROW + 2, height: ROW - 4, fill: "url(#hatch)",
                                       "pointer-events": "none" }, g) : null);
      labels.push(el("text", { "class": "lab", y: TOP + b[0] * ROW + ROW / 2, fill: light(c) ? "#000" : "#fff" },
                     g, b[6]));
    });
    svg._axis = el("g", { "class": "axis" }, svg);
    svg.setAttribute("aria-label", "Timeline: " + boxes.length + " passes on " + p + " ranks, makespan " +
                     fmt(D.makespan) + " " + unit + ", " + critical.length + " passes on the critical path");
  }

  function axis(g, y0, y1) {
    while (g.firstChild) g.removeChild(g.firstChild);
    var span = view[1] - view[0], step = Math.pow(10, Math.floor(Math.log10(span / 6)));
    if (span / step > 12) step *= 5; else if (span / step > 6) step *= 2;
    for (var t = Math.ceil(view[0] / step) * step; t <= view[1] + 1e-9; t += step) {
      el("line", { x1: x(t), x2: x(t), y1: y0, y2: y1 }, g);
      el("text", { x: x(t), y: y1 + 14, "text-anchor": "middle" }, g, fmt(t));
    }
    el("text", { x: width - RIGHT, y: y1 + 14, "text-anchor": "end" }, g, unit);
  }

  function layout() {
    width = Math.max(400, svg.parentNode.clientWidth || 800);
    var h = TOP + p * ROW + AXIS;
    svg.setAttribute("viewBox", "0 0 " + width + " " + h);
    svg.setAttribute("height", h);
    svg._clip.setAttribute("width", width - LEFT - RIGHT);
    boxes.forEach(function (b, i) {
      var x0 = x(b[1]), w = Math.max(0.5, x(b[2]) - x0);
      rects[i].setAttribute("x", x0);
      rects[i].setAttribute("width", w);
      if (hatches[i]) { hatches[i].setAttribute("x", x0); hatches[i].setAttribute("width", w); }
      labels[i].setAttribute("x", x0 + w / 2);
      labels[i].style.display = w >= 7 * String(b[6]).length + 4 ? "" : "none";
    });
    axis(svg._axis, TOP, TOP + p * ROW);
    drawMemory();
  }

  function drawMemory() {
    while (msvg.lastChild && msvg.lastChild.nodeName !== "title") msvg.removeChild(msvg.lastChild);
    var h = TOP + p * MEM_ROW + AXIS;
    msvg.setAttribute("viewBox", "0 0 " + width + " " + h);
    msvg.setAttribute("height", h);
    var clip = el("clipPath", { id: "mem-clip" }, el("defs", {}, msvg));
    el("rect", { x: LEFT, y: 0, width: width - LEFT - RIGHT, height: h }, clip);
    var g = el("g", { "clip-path": "url(#mem-clip)" }, msvg);
    D.memory.forEach(function (m) {
      var top = TOP + m.rank * MEM_ROW + 12, bottom = top + MEM_ROW - 16;
      var high = Math.max(m.peak, m.cap || 0) * 1.08 || 1;
      function y(v) { return bottom - v / high * (bottom - top); }
      var d = "M" + x(0) + "," + y(0), last = 0;
      m.points.forEach(function (pt) { d += "L" + x(pt[0]) + "," + y(last) + "L" + x(pt[0]) + "," + y(pt[1]); last = pt[1]; });
      d += "L" + x(D.makespan) + "," + y(last) + "L" + x(D.makespan) + "," + y(0) + "Z";
      var path = el("path", { d: d, "class": "mem-curve" }, g);
      el("title", {}, path, "rank " + m.rank + " activation memory");
      if (m.cap !== null) el("line", { x1: LEFT, x2: width - RIGHT, y1: y(m.cap), y2: y(m.cap), "class": "mem-cap" }, msvg);
      el("circle", { cx: x(m.peak_at), cy: y(m.peak), r: 3.5, "class": "mem-peak" }, g);
      el("text", { x: 4, y: top + 8, "class": "rank-label" }, msvg, "rank " + m.rank);
      var note = "peak " + fmt(m.peak) + " " + D.memory_unit + " at " + fmt(m.peak_at) +
        (m.cap !== null ? " of cap " + fmt(m.cap) : "") + (m.static !== null ? "; static " + fmt(m.static) + " " + D.memory_unit : "");
      el("text", { x: width - RIGHT, y: top - 2, "class": "mem-text", "text-anchor": "end" }, msvg, note);
    });
    axis(el("g", { "class": "axis" }, msvg), TOP, TOP + p * MEM_ROW);
  }

  function zoom(factor, at) {
    var span = view[1] - view[0], t = at === undefined ? (view[0] + view[1]) / 2 : at;
    var next = Math.min(D.makespan, Math.max(D.makespan / 2000, span * factor));
    var left = t - (t - view[0]) * next / span;
    view = clampView(left, next);
    layout();
  }
  function clampView(left, span) {
    left = Math.max(0, Math.min(left, D.makespan - span));
    return [left, left + span];
  }
  function pan(dt) { view = clampView(view[0] + dt, view[1] - view[0]); layout(); }
  function timeAt(clientX) {
    var box = svg.getBoundingClientRect(), px = (clientX - box.left) * width / box.width;
    return view[0] + (px - LEFT) / (width - LEFT - RIGHT) * (view[1] - view[0]);
  }

  function select(i) {
    if (selected >= 0) rects[selected].classList.remove("sel");
    selected = i;
    rects[i].classList.add("sel");
    details.textContent = describe(i);
    var b = boxes[i];
    if (b[2] < view[0] || b[1] > view[1]) { view = clampView(b[1] - (view[1] - view[0]) / 2, view[1] - view[0]); layout(); }
  }
  function showTip(i, ev) {
    tip.textContent = describe(i);
    tip.hidden = false;
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 300) + "px";
    tip.style.top = ev.clientY + 14 + "px";
  }
  function nearest(rank, t) {
    var list = byRank[rank] || [], best = -1, dist = Infinity;
    list.forEach(function (i) { var d = Math.abs((boxes[i][1] + boxes[i][2]) / 2 - t); if (d < dist) { dist = d; best = i; } });
    return best;
  }
  function onKey(ev) {
    var k = ev.key, cur = selected >= 0 ? selected : (byRank[0] || [0])[0], b = boxes[cur], list = byRank[b[0]];
    var pos = list.indexOf(cur), next = -1;
    if (k === "ArrowRight") next = selected < 0 ? cur : list[Math.min(list.length - 1, pos + 1)];
    else if (k === "ArrowLeft") next = list[Math.max(0, pos - 1)];
    else if (k === "ArrowDown" || k === "ArrowUp") {
      var r = b[0] + (k === "ArrowDown" ? 1 : -1);
      next = r >= 0 && r < p ? nearest(r, (b[1] + b[2]) / 2) : cur;
    } else if (k === "c" || k === "C") {
      var at = critical.indexOf(cur);
      next = critical[(at + 1) % critical.length];
    } else if (k === "+" || k === "=") zoom(0.5);
    else if (k === "-") zoom(2);
    else if (k === "0") { view = [0, D.makespan]; layout(); }
    else return;
    ev.preventDefault();
    if (next >= 0) select(next);
  }

  function wire() {
    svg.addEventListener("mouseover", function (ev) {
      var i = ev.target.getAttribute && ev.target.getAttribute("data-i");
      if (i !== null && i !== undefined) showTip(+i, ev);
    });
    svg.addEventListener("mouseout", function () { tip.hidden = true; });
    svg.addEventListener("click", function (ev) {
      var i = ev.target.getAttribute("data-i");
      if (i !== null && !svg._dragged) select(+i);
    });
    var start = null;
    svg.addEventListener("mousedown", function (ev) { start = [ev.clientX, view[0]]; svg._dragged = false; });
    window.addEventListener("mousemove", function (ev) {
      if (!start) return;
      var dx = ev.clientX - start[0];
      if (Math.abs(dx) > 3) { svg._dragged = true; svg.classList.add("dragging"); }
      var box = svg.getBoundingClientRect(), per = (view[1] - view[0]) / ((width - LEFT - RIGHT) * box.width / width);
      view = clampView(start[1] - dx * per, view[1] - view[0]);
      layout();
    });
    window.addEventListener("mouseup", function () { start = null; svg.classList.remove("dragging"); });
    svg.addEventListener("wheel", function (ev) {
      if (ev.ctrlKey) zoom(ev.deltaY > 0 ? 1.25 : 0.8, timeAt(ev.clientX));
      else if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY) || ev.shiftKey)
        pan((ev.deltaX || ev.deltaY) / width * (view[1] - view[0]));
      else return;
      ev.preventDefault();
    }, { passive: false });
    svg.addEventListener("keydown", onKey);
    document.getElementById("zoom-in").addEventListener("click", function () { zoom(0.5); });
    document.getElementById("zoom-out").addEventListener("click", function () { zoom(2); });
    document.getElementById("zoom-reset").addEventListener("click", function () { view = [0, D.makespan]; layout(); });
    window.addEventListener("resize", layout);
    window.addEventListener("beforeprint", function () { view = [0, D.makespan]; layout(); });
  }

  legend();
  build();
  layout();
  wire();
  document.documentElement.setAttribute("data-ready", "1");
})();
