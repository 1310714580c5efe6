// Small SVG charts for the elr-rl dashboard: line charts over steps and grouped histograms.
// Written here (no plotting library) so the page works offline and ships inside the package.
"use strict";

const ElrCharts = (() => {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const MARGIN = { l: 52, r: 12, t: 20, b: 30 };
  const HEIGHT = 220;

  // Loop counts get an ordered palette (shallow = yellow, deep = indigo) so "more loops" reads at a glance.
  const SEQUENTIAL = ["#e8a200", "#e3683b", "#c03a76", "#8b0aa5", "#5302a3", "#0d0887"];
  const CATEGORICAL = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd"];

  function sequentialColor(i, n) {
    if (n <= 1) return SEQUENTIAL[3];
    return SEQUENTIAL[Math.round((i * (SEQUENTIAL.length - 1)) / (n - 1))];
  }
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
    // Round the top up to a tick so the tallest value sits under a labelled line.
    const top = Math.ceil(hi / step - 1e-9) * step, ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= top + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
    return { ticks, lo: Math.min(lo, ticks[0] ?? lo), hi: Math.max(hi, ticks[ticks.length - 1] ?? hi) };
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

  function axes(f, xt, yt, sx, sy, xLabel, yLabel) {
    let s = "";
    for (const t of yt) {
      const y = sy(t);
      s += `<line class="grid" x1="${MARGIN.l}" x2="${MARGIN.l + f.iw}" y1="${y}" y2="${y}"/>`;
      s += `<text class="tick" x="${MARGIN.l - 6}" y="${y + 4}" text-anchor="end">${formatTick(t)}</text>`;
    }
    for (const t of xt) {
      const x = sx(t);
      s += `<text class="tick" x="${x}" y="${MARGIN.t + f.ih + 16}" text-anchor="middle">${formatTick(t)}</text>`;
    }
    s += `<line class="axis" x1="${MARGIN.l}" x2="${MARGIN.l + f.iw}" y1="${MARGIN.t + f.ih}" y2="${MARGIN.t + f.ih}"/>`;
    s += `<line class="axis" x1="${MARGIN.l}" x2="${MARGIN.l}" y1="${MARGIN.t}" y2="${MARGIN.t + f.ih}"/>`;
    if (xLabel) s += `<text class="label" x="${MARGIN.l + f.iw}" y="${f.height - 2}" text-anchor="end">${escapeHtml(xLabel)}</text>`;
    if (yLabel) s += `<text class="label" x="4" y="11">${escapeHtml(yLabel)}</text>`;
    return s;
  }

  function legend(series) {
    return `<div class="legend">${series.map((s) =>
      `<span class="item"><i style="background:${s.color}"></i>${escapeHtml(s.name)}</span>`).join("")}</div>`;
  }

  // Long runs: draw at most MAX_POINTS points per series (every n-th step and the last); a chart is
  // a few hundred pixels wide, so more points only slow the page.
  const MAX_POINTS = 1200;
  function thin(points) {
    if (points.length <= MAX_POINTS) return points;
    const stride = Math.ceil(points.length / MAX_POINTS);
    return points.filter((p, i) => i % stride === 0 || i === points.length - 1);
  }

  // series: [{name, color, points: [[x, y|null], ...]}]; null y breaks the line (a non-finite value).
  function line(el, opts) {
    const series = (opts.series || []).filter((s) => s.points.some((p) => p[1] !== null))
      .map((s) => ({ ...s, points: thin(s.points) }));
    if (!series.length) return emptyState(el, opts.emptyText || "No data yet.");
    let xs = [], ys = [];
    for (const s of series) for (const [x, y] of s.points) { xs.push(x); if (y !== null) ys.push(y); }
    let xlo = Math.min(...xs), xhi = Math.max(...xs);
    if (xhi === xlo) { xlo -= 1; xhi += 1; }
    let ylo = opts.yMin !== undefined ? Math.min(opts.yMin, ...ys) : Math.min(...ys);
    let yhi = opts.yMax !== undefined ? Math.max(opts.yMax, ...ys) : Math.max(...ys);
    if (yhi === ylo) { const pad = Math.abs(ylo) * 0.1 || 1; ylo -= pad; yhi += pad; }
    const f = frame(el);
    const yn = niceTicks(ylo, yhi, 4);
    const xn = niceTicks(xlo, xhi, Math.max(2, Math.floor(f.iw / 80)));
    const sx = (x) => MARGIN.l + ((x - xlo) / (xhi - xlo)) * f.iw;
    const sy = (y) => MARGIN.t + (1 - (y - yn.lo) / (yn.hi - yn.lo)) * f.ih;
    let body = axes(f, xn.ticks.filter((t) => t >= xlo && t <= xhi), yn.ticks, sx, sy, opts.xLabel || "step", opts.yLabel);
    let drawn = 0;
    for (const s of series) {
      let d = "", pen = false;
      for (const [x, y] of s.points) {
        if (y === null) { pen = false; continue; }
        d += `${pen ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`;
        pen = true;
        drawn += 1;
      }
      body += `<path class="series" d="${d}" stroke="${s.color}"><title>${escapeHtml(s.name)}</title></path>`;
      if (s.points.length < 40) {
        for (const [x, y] of s.points) if (y !== null) body += `<circle cx="${sx(x).toFixed(1)}" cy="${sy(y).toFixed(1)}" r="2.2" fill="${s.color}"/>`;
      }
    }
    body += `<line class="cursor" x1="0" x2="0" y1="${MARGIN.t}" y2="${MARGIN.t + f.ih}" visibility="hidden"/>`;
    el.innerHTML = `<svg xmlns="${SVG_NS}" width="${f.width}" height="${f.height}" viewBox="0 0 ${f.width} ${f.height}">${body}</svg>`
      + legend(series) + `<div class="tooltip" hidden></div>`;
    el.dataset.points = String(drawn);
    el.dataset.series = String(series.length);
    attachLineHover(el, series, sx, xlo, xhi, f);
    return drawn;
  }

  // Hovering shows every series' value at the nearest step.
  function attachLineHover(el, series, sx, xlo, xhi, f) {
    const svg = el.querySelector("svg"), cursor = svg.querySelector(".cursor"), tip = el.querySelector(".tooltip");
    const xsAll = Array.from(new Set(series.flatMap((s) => s.points.map((p) => p[0])))).sort((a, b) => a - b);
    svg.addEventListener("mousemove", (ev) => {
      const box = svg.getBoundingClientRect();
      const px = ev.clientX - box.left;
      const xv = xlo + ((px - MARGIN.l) / f.iw) * (xhi - xlo);
      let best = xsAll[0];
      for (const x of xsAll) if (Math.abs(x - xv) < Math.abs(best - xv)) best = x;
      cursor.setAttribute("x1", sx(best)); cursor.setAttribute("x2", sx(best));
      cursor.setAttribute("visibility", "visible");
      const lines = series.map((s) => {
        const p = s.points.find((q) => q[0] === best);
        return p ? `<div><i style="background:${s.color}"></i>${escapeHtml(s.name)}: ${formatNumber(p[1])}</div>` : "";
      }).join("");
      tip.innerHTML = `<b>step ${formatNumber(best)}</b>${lines}`;
      tip.hidden = false;
      tip.style.left = `${Math.min(px + 12, f.width - 160)}px`;
      tip.style.top = `${MARGIN.t}px`;
    });
    svg.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); tip.hidden = true; });
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

  return { line, bars, sequentialColor, categoricalColor, escapeHtml, formatNumber, emptyState };
})();
