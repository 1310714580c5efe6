// Small SVG charts for the elr-rl dashboard: line charts over steps (smoothing, zoom, log scale, overlay),
// stacked bars over steps, heat maps over steps, and grouped histograms.
// Written here (no plotting library) so the page works offline and ships inside the package.
"use strict";

const ElrCharts = (() => {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const MARGIN = { l: 52, r: 12, t: 20, b: 30 };
  const HEIGHT = 220;

  // Loop counts get distinct hues ordered light to dark (shallow = amber, deep = navy), so neighbouring
  // k never look alike and "more loops" still reads as "darker".
  const LOOP_COLORS = ["#f2a900", "#e4572e", "#2a9d8f", "#3d348b", "#8ac926", "#c2185b", "#1b1b3a", "#6d597a"];
  const CATEGORICAL = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd"];

  function sequentialColor(i) { return LOOP_COLORS[i % LOOP_COLORS.length]; }
  function categoricalColor(i) { return CATEGORICAL[i % CATEGORICAL.length]; }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  function formatNumber(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    if (a >= 1000) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    return Number(v.toPrecision(3)).toString();
  }
  // Steps are shown exactly (never rounded or in exponent form).
  function formatStep(v) { return Number.isInteger(v) ? String(v) : formatNumber(v); }

  // Tick labels: short, no trailing zeros (0.5, 20, 12000, 1e-4).
  function formatTick(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(0);
    return String(Number(v.toPrecision(4)));
  }

  // Ticks at 1, 2 or 5 times a power of ten covering [lo, hi].
  function niceTicks(lo, hi, count) {
    if (!(hi > lo)) { hi = lo + 1; }
    const raw = (hi - lo) / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
    const top = Math.ceil(hi / step - 1e-9) * step, ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= top + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
    return { ticks, lo: Math.min(lo, ticks[0] ?? lo), hi: Math.max(hi, ticks[ticks.length - 1] ?? hi) };
  }
  // Log-scale ticks: powers of ten over [lo, hi] (lo > 0).
  function logTicks(lo, hi) {
    const a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi)), ticks = [];
    for (let e = a; e <= b; e++) ticks.push(Math.pow(10, e));
    return { ticks, lo: Math.pow(10, a), hi: Math.pow(10, Math.max(b, a + 1)) };
  }

  function frame(el) {
    const width = Math.max(260, el.clientWidth || 460);
    return { width, height: HEIGHT, iw: width - MARGIN.l - MARGIN.r, ih: HEIGHT - MARGIN.t - MARGIN.b };
  }

  function emptyState(el, text) {
    el.innerHTML = `<div class="empty">${escapeHtml(text)}</div>`;
    el.dataset.points = "0";
    el.dataset.series = "0";
    return 0;
  }

  function axes(f, xt, yt, sx, sy, xLabel, yLabel, xFormat) {
    let s = "";
    for (const t of yt) {
      const y = sy(t);
      s += `<line class="grid" x1="${MARGIN.l}" x2="${MARGIN.l + f.iw}" y1="${y}" y2="${y}"/>`;
      s += `<text class="tick" x="${MARGIN.l - 6}" y="${y + 4}" text-anchor="end">${formatTick(t)}</text>`;
    }
    for (const t of xt) {
      const x = sx(t);
      s += `<text class="tick" x="${x}" y="${MARGIN.t + f.ih + 16}" text-anchor="middle">${(xFormat || formatTick)(t)}</text>`;
    }
    s += `<line class="axis" x1="${MARGIN.l}" x2="${MARGIN.l + f.iw}" y1="${MARGIN.t + f.ih}" y2="${MARGIN.t + f.ih}"/>`;
    s += `<line class="axis" x1="${MARGIN.l}" x2="${MARGIN.l}" y1="${MARGIN.t}" y2="${MARGIN.t + f.ih}"/>`;
    if (xLabel) s += `<text class="label" x="${MARGIN.l + f.iw}" y="${f.height - 2}" text-anchor="end">${escapeHtml(xLabel)}</text>`;
    if (yLabel) s += `<text class="label" x="4" y="11">${escapeHtml(yLabel)}</text>`;
    return s;
  }

  function legend(series) {
    return `<div class="legend">${series.map((s) =>
      `<span class="item${s.dash ? " overlay" : ""}"><i style="background:${s.color}"></i>${escapeHtml(s.name)}</span>`).join("")}</div>`;
  }

  // Exponential moving average with TensorBoard's debiasing; nulls pass through.
  function smooth(points, weight) {
    if (!(weight > 0)) return points;
    let last = 0, n = 0;
    return points.map(([x, y]) => {
      if (y === null) return [x, null];
      last = last * weight + (1 - weight) * y; n += 1;
      return [x, last / (1 - Math.pow(weight, n))];
    });
  }

  // Long runs: draw at most MAX_POINTS points per series (every n-th step and the last).
  const MAX_POINTS = 1200;
  function thin(points) {
    if (points.length <= MAX_POINTS) return points;
    const stride = Math.ceil(points.length / MAX_POINTS);
    return points.filter((p, i) => i % stride === 0 || i === points.length - 1);
  }

  // series: [{name, color, points: [[x, y|null], ...], dash?}]; null y breaks the line.
  // opts: yMin/yMax (always inside the axis), xRange [lo, hi] (zoom), log (log y), smooth (EMA weight),
  // onZoom(lo, hi | null) (drag to zoom, double-click to reset), onLog(bool) (the chart's "log y" box).
  function line(el, opts) {
    const xr = opts.xRange;
    const inRange = (p) => !xr || (p[0] >= xr[0] && p[0] <= xr[1]);
    const usable = (y) => y !== null && (!opts.log || y > 0);
    const series = (opts.series || []).map((s) => ({ ...s, points: thin(s.points.filter(inRange)) }))
      .filter((s) => s.points.some((p) => usable(p[1])));
    if (!series.length) return emptyState(el, opts.emptyText || "No data yet.");
    for (const s of series) s.drawn = smooth(s.points.map(([x, y]) => [x, usable(y) ? y : null]), opts.smooth);
    let xs = [], ys = [];
    for (const s of series) for (const [x, y] of s.drawn) { xs.push(x); if (y !== null) ys.push(y); }
    let xlo = xr ? xr[0] : Math.min(...xs), xhi = xr ? xr[1] : Math.max(...xs);
    if (xhi === xlo) { xlo -= 1; xhi += 1; }
    let ylo, yhi;
    if (opts.log) { ylo = Math.min(...ys); yhi = Math.max(...ys); }
    else {
      ylo = opts.yMin !== undefined ? Math.min(opts.yMin, ...ys) : Math.min(...ys);
      yhi = opts.yMax !== undefined ? Math.max(opts.yMax, ...ys) : Math.max(...ys);
      if (yhi === ylo) {  // a flat series: zero sits at the bottom of a 0..1 axis, not in a -1..1 one
        if (ylo === 0) yhi = 1; else { const pad = Math.abs(ylo) * 0.1; ylo -= pad; yhi += pad; }
      }
    }
    const f = frame(el);
    const yn = opts.log ? logTicks(ylo, yhi) : niceTicks(ylo, yhi, 4);
    const xn = niceTicks(xlo, xhi, Math.max(2, Math.floor(f.iw / 80)));
    const sx = (x) => MARGIN.l + ((x - xlo) / (xhi - xlo)) * f.iw;
    const ty = opts.log ? (y) => Math.log10(y) : (y) => y;
    const sy = (y) => MARGIN.t + (1 - (ty(y) - ty(yn.lo)) / (ty(yn.hi) - ty(yn.lo))) * f.ih;
    let body = axes(f, xn.ticks.filter((t) => t >= xlo && t <= xhi), yn.ticks, sx, sy, opts.xLabel || "step", opts.yLabel);
    let drawn = 0;
    const path = (pts) => {
      let d = "", pen = false;
      for (const [x, y] of pts) {
        if (y === null) { pen = false; continue; }
        d += `${pen ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`;
        pen = true;
      }
      return d;
    };
    for (const s of series) {
      const dash = s.dash ? ` stroke-dasharray="5 3"` : "";
      if (opts.smooth > 0) {  // the raw values stay visible, faint, under the smoothed line
        body += `<path class="series raw" d="${path(s.points.map(([x, y]) => [x, usable(y) ? y : null]))}" stroke="${s.color}"${dash}/>`;
      }
      body += `<path class="series" d="${path(s.drawn)}" stroke="${s.color}"${dash}><title>${escapeHtml(s.name)}</title></path>`;
      drawn += s.drawn.filter((p) => p[1] !== null).length;
      if (s.points.length < 40 && !s.dash) {
        for (const [x, y] of s.drawn) if (y !== null) body += `<circle cx="${sx(x).toFixed(1)}" cy="${sy(y).toFixed(1)}" r="2.2" fill="${s.color}"/>`;
      }
    }
    body += `<line class="cursor" x1="0" x2="0" y1="${MARGIN.t}" y2="${MARGIN.t + f.ih}" visibility="hidden"/>`;
    body += `<rect class="brush" x="0" y="${MARGIN.t}" width="0" height="${f.ih}" visibility="hidden"/>`;
    const tools = opts.onLog ? `<label class="chart-tools"><input type="checkbox" class="log-toggle"${opts.log ? " checked" : ""}> log y</label>` : "";
    el.innerHTML = tools + `<svg xmlns="${SVG_NS}" width="${f.width}" height="${f.height}" viewBox="0 0 ${f.width} ${f.height}">${body}</svg>`
      + legend(series) + `<div class="tooltip" hidden></div>`;
    el.dataset.points = String(drawn);
    el.dataset.series = String(series.length);
    el.dataset.overlay = String(series.filter((s) => s.dash).length);
    el.dataset.log = opts.log ? "1" : "0";
    el.dataset.xlo = String(xlo); el.dataset.xhi = String(xhi);
    if (opts.onLog) el.querySelector(".log-toggle").addEventListener("change", (ev) => opts.onLog(ev.target.checked));
    attachLineHover(el, series, sx, xlo, xhi, f, opts.onZoom);
    return drawn;
  }

  // Hovering shows every series' raw (and smoothed) value at the nearest step; dragging selects steps to zoom to.
  function attachLineHover(el, series, sx, xlo, xhi, f, onZoom) {
    const svg = el.querySelector("svg"), cursor = svg.querySelector(".cursor"), tip = el.querySelector(".tooltip");
    const brush = svg.querySelector(".brush");
    const xsAll = Array.from(new Set(series.flatMap((s) => s.points.map((p) => p[0])))).sort((a, b) => a - b);
    const stepAt = (clientX) => {
      const box = svg.getBoundingClientRect();
      const px = (clientX - box.left) * (f.width / box.width);
      return { px, x: xlo + ((px - MARGIN.l) / f.iw) * (xhi - xlo) };
    };
    let dragFrom = null;
    svg.addEventListener("mousemove", (ev) => {
      const { px, x: xv } = stepAt(ev.clientX);
      let best = xsAll[0];
      for (const x of xsAll) if (Math.abs(x - xv) < Math.abs(best - xv)) best = x;
      cursor.setAttribute("x1", sx(best)); cursor.setAttribute("x2", sx(best));
      cursor.setAttribute("visibility", "visible");
      const lines = series.map((s) => {
        const i = s.points.findIndex((q) => q[0] === best);
        if (i < 0) return "";
        const raw = s.points[i][1], sm = s.drawn[i] ? s.drawn[i][1] : null;
        const extra = sm !== null && raw !== null && sm !== raw ? ` <span class="muted">(smoothed ${formatNumber(sm)})</span>` : "";
        return `<div><i style="background:${s.color}"></i>${escapeHtml(s.name)}: ${formatNumber(raw)}${extra}</div>`;
      }).join("");
      tip.innerHTML = `<b>step ${formatStep(best)}</b>${lines}`;
      tip.dataset.step = String(best);
      tip.hidden = false;
      tip.style.left = `${Math.min(px + 12, f.width - 180)}px`;
      tip.style.top = `${MARGIN.t + 24}px`;
      if (dragFrom !== null) {
        const a = Math.min(dragFrom.px, px), b = Math.max(dragFrom.px, px);
        brush.setAttribute("x", a); brush.setAttribute("width", b - a); brush.setAttribute("visibility", "visible");
      }
    });
    svg.addEventListener("mouseleave", () => {
      cursor.setAttribute("visibility", "hidden"); tip.hidden = true; dragFrom = null;
      brush.setAttribute("visibility", "hidden");
    });
    if (!onZoom) return;
    svg.addEventListener("mousedown", (ev) => { dragFrom = stepAt(ev.clientX); ev.preventDefault(); });
    svg.addEventListener("mouseup", (ev) => {
      if (dragFrom === null) return;
      const to = stepAt(ev.clientX), from = dragFrom;
      dragFrom = null; brush.setAttribute("visibility", "hidden");
      if (Math.abs(to.px - from.px) < 6) return;  // a click, not a drag
      onZoom(Math.min(from.x, to.x), Math.max(from.x, to.x));
    });
    svg.addEventListener("dblclick", () => onZoom(null));
  }

  // Stacked bars over steps: series [{name, color, points: [[step, value], ...]}]; each step's bar
  // is split by series (e.g. batch slots per loop count). opts.xRange zooms.
  function stacked(el, opts) {
    const xr = opts.xRange;
    const series = (opts.series || []).filter((s) => s.points.some((p) => p[1] > 0));
    if (!series.length) return emptyState(el, opts.emptyText || "No data yet.");
    const byStep = new Map();
    series.forEach((s, si) => {
      for (const [x, y] of s.points) {
        if (xr && (x < xr[0] || x > xr[1])) continue;
        if (!byStep.has(x)) byStep.set(x, new Array(series.length).fill(0));
        byStep.get(x)[si] = y > 0 ? y : 0;
      }
    });
    const steps = Array.from(byStep.keys()).sort((a, b) => a - b);
    if (!steps.length) return emptyState(el, "No steps in the zoomed range.");
    const f = frame(el);
    const totals = steps.map((x) => byStep.get(x).reduce((a, b) => a + b, 0));
    const yn = niceTicks(0, Math.max(...totals), 4);
    let xlo = steps[0] - 0.5, xhi = steps[steps.length - 1] + 0.5;
    const sx = (x) => MARGIN.l + ((x - xlo) / (xhi - xlo)) * f.iw;
    const sy = (y) => MARGIN.t + (1 - (y - yn.lo) / (yn.hi - yn.lo)) * f.ih;
    const xn = niceTicks(steps[0], steps[steps.length - 1], Math.max(2, Math.floor(f.iw / 80)));
    let body = axes(f, xn.ticks.filter((t) => t >= xlo && t <= xhi && Number.isInteger(t)), yn.ticks, sx, sy,
      opts.xLabel || "step", opts.yLabel, formatStep);
    const w = Math.max(0.6, (f.iw / steps.length) * 0.85);
    let drawn = 0;
    steps.forEach((x, xi) => {
      let acc = 0;
      const total = totals[xi];
      byStep.get(x).forEach((v, si) => {
        if (!(v > 0)) return;
        const y0 = sy(acc), y1 = sy(acc + v);
        acc += v;
        body += `<rect class="bar" data-step="${x}" x="${(sx(x) - w / 2).toFixed(1)}" y="${y1.toFixed(1)}" width="${w.toFixed(1)}" `
          + `height="${Math.max(0.5, y0 - y1).toFixed(1)}" fill="${series[si].color}">`
          + `<title>step ${formatStep(x)}, ${escapeHtml(series[si].name)}: ${formatNumber(v)} of ${formatNumber(total)}</title></rect>`;
        drawn += 1;
      });
    });
    el.innerHTML = `<svg xmlns="${SVG_NS}" width="${f.width}" height="${f.height}" viewBox="0 0 ${f.width} ${f.height}">${body}</svg>` + legend(series);
    el.dataset.points = String(drawn);
    el.dataset.series = String(series.length);
    el.dataset.steps = String(steps.length);
    return drawn;
  }

  // Colour of a value in [0, 1]: white-ish (0) through amber to deep green (1).
  function heatColor(v) {
    const stops = [[0, [247, 244, 249]], [0.25, [253, 219, 119]], [0.5, [244, 150, 66]], [0.75, [102, 189, 99]], [1, [0, 104, 55]]];
    v = Math.max(0, Math.min(1, v));
    for (let i = 1; i < stops.length; i++) {
      if (v <= stops[i][0]) {
        const [a, ca] = stops[i - 1], [b, cb] = stops[i], t = (v - a) / (b - a);
        return `rgb(${ca.map((c, j) => Math.round(c + t * (cb[j] - c))).join(",")})`;
      }
    }
    return "rgb(0,104,55)";
  }

  // Heat map over steps: rows [{name, points: [[step, value in 0..1], ...]}], one cell per (row, step);
  // many steps are binned into columns (the cell shows the bin's mean).
  function heatmap(el, opts) {
    const xr = opts.xRange;
    const rows = (opts.rows || []).map((r) => ({ ...r, points: r.points.filter((p) => p[1] !== null && (!xr || (p[0] >= xr[0] && p[0] <= xr[1]))) }))
      .filter((r) => r.points.length);
    if (!rows.length) return emptyState(el, opts.emptyText || "No data yet.");
    const steps = Array.from(new Set(rows.flatMap((r) => r.points.map((p) => p[0])))).sort((a, b) => a - b);
    const width = Math.max(260, el.clientWidth || 460), labelW = 170, rowH = 14;
    const iw = width - labelW - MARGIN.r, cols = Math.min(steps.length, Math.max(1, Math.floor(iw / 4)));
    const per = Math.ceil(steps.length / cols), colW = iw / Math.ceil(steps.length / per);
    const colOf = new Map(steps.map((s, i) => [s, Math.floor(i / per)]));
    const height = MARGIN.t + rows.length * rowH + 26;
    let body = "", drawn = 0;
    rows.forEach((r, ri) => {
      const y = MARGIN.t + ri * rowH;
      body += `<text class="tick" x="${labelW - 6}" y="${y + rowH - 3}" text-anchor="end">${escapeHtml(r.name)}</text>`;
      const cells = new Map();
      for (const [x, v] of r.points) {
        const c = colOf.get(x);
        if (!cells.has(c)) cells.set(c, { sum: 0, n: 0, lo: x, hi: x });
        const cell = cells.get(c); cell.sum += v; cell.n += 1; cell.lo = Math.min(cell.lo, x); cell.hi = Math.max(cell.hi, x);
      }
      for (const [c, cell] of cells) {
        const v = cell.sum / cell.n;
        const span = cell.lo === cell.hi ? `step ${formatStep(cell.lo)}` : `steps ${formatStep(cell.lo)}–${formatStep(cell.hi)}`;
        body += `<rect class="cell" x="${(labelW + c * colW).toFixed(1)}" y="${y}" width="${Math.max(1, colW - 0.5).toFixed(1)}" height="${rowH - 1}" `
          + `fill="${heatColor(v)}"><title>${escapeHtml(r.name)}, ${span}: ${formatNumber(v)}</title></rect>`;
        drawn += 1;
      }
    });
    const yAxis = MARGIN.t + rows.length * rowH + 14;
    const xt = niceTicks(steps[0], steps[steps.length - 1], Math.max(2, Math.floor(iw / 90))).ticks.filter((t) => t >= steps[0] && t <= steps[steps.length - 1]);
    const sx = (x) => labelW + (colOf.get(steps.find((s) => s >= x) ?? steps[steps.length - 1]) + 0.5) * colW;
    for (const t of xt) body += `<text class="tick" x="${sx(t).toFixed(1)}" y="${yAxis}" text-anchor="middle">${formatStep(t)}</text>`;
    body += `<text class="label" x="${width - MARGIN.r}" y="${height - 2}" text-anchor="end">step</text>`;
    const scale = [0, 0.25, 0.5, 0.75, 1].map((v) => `<span><i style="background:${heatColor(v)}"></i>${v}</span>`).join("");
    el.innerHTML = `<svg xmlns="${SVG_NS}" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">${body}</svg>`
      + `<div class="legend heat-scale">${escapeHtml(opts.scaleLabel || "")} ${scale}</div>`;
    el.dataset.points = String(drawn);
    el.dataset.series = String(rows.length);
    return drawn;
  }

  // Grouped histogram. edges: B+1 bin edges; series: [{name, color, counts: [B numbers]}].
  // normalize: draw each series as a fraction of its own total, so loop counts with few prompts compare fairly.
  function bars(el, opts) {
    const edges = opts.edges || [];
    const series = (opts.series || []).filter((s) => s.counts && s.counts.some((c) => c > 0));
    if (!series.length || edges.length < 2) return emptyState(el, opts.emptyText || "No data yet.");
    const bins = edges.length - 1;
    const values = series.map((s) => {
      const total = s.counts.reduce((a, b) => a + b, 0) || 1;
      return s.counts.map((c) => (opts.normalize ? c / total : c));
    });
    const f = frame(el);
    const yn = niceTicks(0, Math.max(...values.flat()), 4);
    const xlo = edges[0], xhi = edges[bins];
    const sx = (x) => MARGIN.l + ((x - xlo) / (xhi - xlo)) * f.iw;
    const sy = (y) => MARGIN.t + (1 - (y - yn.lo) / (yn.hi - yn.lo)) * f.ih;
    const xt = niceTicks(xlo, xhi, 5).ticks.filter((t) => t >= xlo && t <= xhi);
    let body = axes(f, xt, yn.ticks, sx, sy, opts.xLabel, opts.yLabel || (opts.normalize ? "fraction" : "count"));
    let drawn = 0;
    series.forEach((s, si) => {
      for (let b = 0; b < bins; b++) {
        const v = values[si][b];
        if (!(v > 0)) continue;
        const x0 = sx(edges[b]), x1 = sx(edges[b + 1]);
        const w = (x1 - x0 - 1) / series.length;
        const x = x0 + 0.5 + si * w, y = sy(v);
        const label = `${s.name}, [${formatNumber(edges[b])}, ${formatNumber(edges[b + 1])}): ${s.counts[b]}`
          + (opts.normalize ? ` (${(100 * v).toFixed(1)}%)` : "");
        body += `<rect class="bar" x="${x.toFixed(1)}" y="${y.toFixed(1)}" width="${Math.max(0.5, w).toFixed(1)}" `
          + `height="${(MARGIN.t + f.ih - y).toFixed(1)}" fill="${s.color}"><title>${escapeHtml(label)}</title></rect>`;
        drawn += 1;
      }
    });
    el.innerHTML = `<svg xmlns="${SVG_NS}" width="${f.width}" height="${f.height}" viewBox="0 0 ${f.width} ${f.height}">${body}</svg>`
      + legend(series);
    el.dataset.points = String(drawn);
    el.dataset.series = String(series.length);
    return drawn;
  }

  return { line, stacked, heatmap, bars, smooth, sequentialColor, categoricalColor, escapeHtml, formatNumber, formatStep, emptyState };
})();
