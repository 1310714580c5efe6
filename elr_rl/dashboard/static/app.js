// elr-rl dashboard page: polls the run's JSON endpoints (or reads the inlined snapshot of a static
// export) and draws every panel. Data layout: see elr_rl/metrics.py.
"use strict";

(() => {
  const C = ElrCharts;
  const params = new URLSearchParams(location.search);
  const POLL_MS = Math.max(200, Number(params.get("poll")) || 2000);
  const STATIC = window.ELR_STATIC || null;
  const MAX_TABLE_ROWS = 500;

  const state = {
    rows: [], keys: new Set(), metricsOffset: 0,
    routing: [], routingOffset: 0, routingFollow: true,
    profile: null, config: null, status: null, signature: null,
    messages: { status: [], metrics: [], routing: [], profile: [], config: [] },
    fetchError: null, env: "", profileK: "", sort: { col: "pass_rate", dir: 1 },
  };

  // ---- data ingestion -------------------------------------------------------------------------

  // A step that is not past the last one means the run resumed from an older checkpoint: later rows win.
  function ingestRows(rows) {
    for (const row of rows) {
      const last = state.rows[state.rows.length - 1];
      if (last && row.step <= last.step) state.rows = state.rows.filter((r) => r.step < row.step);
      state.rows.push(row);
      for (const k of Object.keys(row)) state.keys.add(k);
    }
  }
  function ingestRouting(records) {
    for (const rec of records) {
      const last = state.routing[state.routing.length - 1];
      if (last && rec.step <= last.step) state.routing = state.routing.filter((r) => r.step < rec.step);
      state.routing.push(rec);
    }
  }
  function clearRun() {
    state.rows = []; state.keys = new Set(); state.metricsOffset = 0;
    state.routing = []; state.routingOffset = 0; state.profile = null; state.config = null; state.signature = null;
  }

  async function getJSON(path) {
    const resp = await fetch(path, { cache: "no-store" });
    let body;
    try { body = await resp.json(); } catch (e) { throw new Error(`${path}: HTTP ${resp.status}, not JSON`); }
    if (!resp.ok || body.error) throw new Error(`${path}: ${body.error || "HTTP " + resp.status}`);
    return body;
  }

  async function pollOnce() {
    const st = await getJSON("api/status");
    state.status = st; state.messages.status = st.messages || [];
    if (!st.exists) { clearRun(); return; }
    const m = await getJSON(`api/metrics?offset=${state.metricsOffset}`);
    if (m.reset) { state.rows = []; state.keys = new Set(); }
    ingestRows(m.rows); state.metricsOffset = m.offset; state.messages.metrics = m.messages;
    const r = await getJSON(`api/routing?offset=${state.routingOffset}`);
    if (r.reset) state.routing = [];
    ingestRouting(r.records); state.routingOffset = r.offset; state.messages.routing = r.messages;
    if (st.signature !== state.signature || state.profile === null) {
      state.profile = await getJSON("api/profile"); state.messages.profile = state.profile.messages;
      state.config = await getJSON("api/config"); state.messages.config = [];
      state.signature = st.signature;
    }
  }

  // Redraw only when something changed, so a hover tooltip survives polls of an idle run.
  let lastFingerprint = null;
  function fingerprint() {
    const last = state.rows[state.rows.length - 1], lastR = state.routing[state.routing.length - 1];
    return JSON.stringify([state.rows.length, last && last.step, last && last.time, state.routing.length,
      lastR && lastR.step, state.signature, state.messages, state.fetchError, state.status && state.status.exists]);
  }

  async function pollLoop() {
    try { await pollOnce(); state.fetchError = null; } catch (e) {
      state.fetchError = `Cannot read the run from the dashboard server (${e.message}). `
        + "Is `elr-rl dashboard` still running? Retrying.";
    }
    const fp = fingerprint();
    if (fp !== lastFingerprint) { lastFingerprint = fp; render(); }
    setTimeout(pollLoop, POLL_MS);
  }

  function loadStatic() {
    state.status = STATIC.status; state.messages.status = STATIC.status.messages || [];
    ingestRows(STATIC.metrics.rows); state.messages.metrics = STATIC.metrics.messages;
    ingestRouting(STATIC.routing.records); state.messages.routing = STATIC.routing.messages;
    state.profile = STATIC.profile; state.messages.profile = STATIC.profile.messages;
    state.config = STATIC.config;
    render();
  }

  // ---- series from metric rows ----------------------------------------------------------------

  // Keys matching `re` (whose group 1 names the series), sorted numerically when they are loop counts.
  function matchKeys(re) {
    const out = [];
    for (const key of state.keys) { const m = key.match(re); if (m) out.push({ key, name: m[1] }); }
    const numeric = out.every((o) => /^\d+$/.test(o.name));
    out.sort((a, b) => (numeric ? Number(a.name) - Number(b.name) : a.name.localeCompare(b.name)));
    return out;
  }
  function points(key) {
    const pts = [];
    for (const row of state.rows) if (key in row) pts.push([row.step, typeof row[key] === "number" ? row[key] : null]);
    return pts;
  }
  function perK(prefix) {
    const found = matchKeys(new RegExp(`^${prefix}k(\\d+)$`));
    return found.map((o, i) => ({ name: `k=${o.name}`, color: C.sequentialColor(i, found.length), points: points(o.key) }));
  }
  function allEnvs() {
    const envs = new Set(matchKeys(/^(?:reward|pass_rate|response_length)\/env\/(.+)$/).map((o) => o.name));
    const col = state.profile && state.profile.data && state.profile.data.env;
    if (col) for (const e of col) if (e !== null) envs.add(String(e));
    return Array.from(envs).sort();
  }
  function perEnv(prefix) {
    const envs = allEnvs();
    return matchKeys(new RegExp(`^${prefix}/env/(.+)$`))
      .filter((o) => !state.env || o.name === state.env)
      .map((o) => ({ name: o.name, color: C.categoricalColor(envs.indexOf(o.name)), points: points(o.key) }));
  }
  function named(list) {
    return list.filter(([key]) => state.keys.has(key))
      .map(([key, name], i) => ({ name, color: C.categoricalColor(i), points: points(key) }));
  }

  // ---- panels ---------------------------------------------------------------------------------

  function chartEl(name) { return document.querySelector(`[data-chart="${name}"]`); }
  function setPanelState(name, ok) {
    const panel = document.querySelector(`[data-panel="${name}"]`);
    if (panel) panel.dataset.state = ok ? "ok" : "empty";
  }
  function lineChart(name, series, opts) {
    const n = C.line(chartEl(name), { ...opts, series });
    setPanelState(name, n > 0);
  }
  const want = (keys) => `No data yet: this panel plots ${keys} from metrics.jsonl.`;

  function renderCurriculum() {
    lineChart("slots", perK("curriculum/prompts_"), { yLabel: "prompts", yMin: 0, emptyText: want("curriculum/prompts_k{k}") });
    lineChart("mean_q", perK("curriculum/mean_q_"), { yLabel: "mean q", yMin: 0, yMax: 1, emptyText: want("curriculum/mean_q_k{k}") });
    renderPassRateDist();
    renderScoreDist();
  }

  function profileRows() {
    const p = state.profile;
    if (!p || !p.data || !p.columns.length) return [];
    const n = p.data[p.columns[0]].length, rows = [];
    for (let i = 0; i < n; i++) {
      const row = {};
      for (const c of p.columns) row[c] = p.data[c][i];
      if (state.env && String(row.env) !== state.env) continue;
      rows.push(row);
    }
    return rows;
  }

  // Bins for pass rates: one per possible value successes/n when every prompt had the same n samples
  // (fixed bins would leave artificial gaps between the discrete values), else ten bins over [0, 1].
  function passRateBins(rows) {
    const ns = new Set(rows.map((r) => r.samples));
    const n = ns.size === 1 ? Array.from(ns)[0] : null;
    if (Number.isInteger(n) && n >= 1 && n <= 32) {
      return { edges: Array.from({ length: n + 2 }, (_, i) => (i - 0.5) / n), index: (p) => Math.round(p * n) };
    }
    return { edges: Array.from({ length: 11 }, (_, i) => i / 10), index: (p) => Math.min(9, Math.max(0, Math.floor(p * 10))) };
  }

  function renderPassRateDist() {
    const rows = profileRows().filter((r) => typeof r.pass_rate === "number");
    const ks = Array.from(new Set(rows.map((r) => r.k))).sort((a, b) => a - b);
    const { edges, index } = passRateBins(rows);
    const series = ks.map((k, i) => {
      const counts = new Array(edges.length - 1).fill(0);
      for (const r of rows) if (r.k === k) counts[index(r.pass_rate)] += 1;
      return { name: `k=${k}`, color: C.sequentialColor(i, ks.length), counts };
    });
    document.querySelectorAll(".profile-file").forEach((el) => { el.textContent = (state.profile && state.profile.file) || "none yet"; });
    const empty = state.profile && state.profile.file && state.env
      ? `No profiled prompts for environment ${state.env}.` : "No profile table yet: expects profile/*.parquet with env, k, pass_rate.";
    const n = C.bars(chartEl("passrate_dist"), { edges, series, normalize: true, xLabel: "pass rate", emptyText: empty });
    setPanelState("passrate_dist", n > 0);
  }

  function renderScoreDist() {
    const slider = document.getElementById("routing-step");
    const recs = state.routing;
    slider.max = String(Math.max(0, recs.length - 1));
    if (state.routingFollow) slider.value = slider.max;
    const rec = recs[Number(slider.value)];
    document.getElementById("routing-step-label").textContent = rec ? String(rec.step) : "–";
    let series = [];
    if (rec) {
      const ks = Object.keys(rec.score).sort((a, b) => Number(a) - Number(b));
      series = ks.map((k, i) => ({ name: `k=${k} (${rec.n[k] ?? "?"} prompts)`, color: C.sequentialColor(i, ks.length), counts: rec.score[k] }));
    }
    const n = C.bars(chartEl("score_dist"), { edges: rec ? rec.edges : [], series, normalize: true, xLabel: "routing score",
      emptyText: "No routing records yet: expects curriculum/routing.jsonl." });
    setPanelState("score_dist", n > 0);
  }

  function renderPerK() {
    lineChart("reward_k", perK("reward/"), { yLabel: "reward", emptyText: want("reward/k{k}") });
    lineChart("pass_k", perK("pass_rate/"), { yLabel: "pass rate", yMin: 0, yMax: 1, emptyText: want("pass_rate/k{k}") });
    lineChart("length_k", perK("response_length/"), { yLabel: "tokens", emptyText: want("response_length/k{k}") });
  }

  function renderPerEnv() {
    const filtered = state.env ? ` for environment ${state.env}` : "";
    lineChart("reward_env", perEnv("reward"), { yLabel: "reward", emptyText: want("reward/env/{env}") + filtered });
    lineChart("pass_env", perEnv("pass_rate"), { yLabel: "pass rate", yMin: 0, yMax: 1, emptyText: want("pass_rate/env/{env}") + filtered });
    lineChart("length_env", perEnv("response_length"), { yLabel: "tokens", emptyText: want("response_length/env/{env}") + filtered });
  }

  const HEALTH_TILES = [
    ["perf/tokens_per_s", "tokens / s"], ["async/staleness_mean", "staleness (mean)"], ["perf/weight_sync_s", "weight sync (s)"],
    ["perf/rollout_idle_ratio", "rollout idle"], ["perf/learner_idle_ratio", "learner idle"], ["faults/restarted_workers", "restarted workers"],
  ];
  function latest(key) {
    for (let i = state.rows.length - 1; i >= 0; i--) if (typeof state.rows[i][key] === "number") return state.rows[i][key];
    return null;
  }
  function renderHealth() {
    const tiles = HEALTH_TILES.map(([key, label]) =>
      `<div class="tile" data-key="${key}"><div class="label">${label}</div><div class="value">${C.formatNumber(latest(key))}</div></div>`);
    document.getElementById("health-tiles").innerHTML = tiles.join("");
    setPanelState("health_summary", HEALTH_TILES.some(([key]) => latest(key) !== null));
    lineChart("staleness", named([["async/staleness_mean", "mean"], ["async/staleness_max", "max"]]), { yMin: 0, emptyText: want("async/staleness_mean") });
    lineChart("throughput", named([["perf/tokens_per_s", "tokens/s"]]), { yMin: 0, emptyText: want("perf/tokens_per_s") });
    lineChart("weight_sync", named([["perf/weight_sync_s", "learner to workers"], ["perf/weight_load_s", "worker load (between requests)"],
      ["perf/learner_step_s", "learner step"]]), { yMin: 0, yLabel: "seconds", emptyText: want("perf/weight_sync_s") });
    lineChart("idle", named([["perf/rollout_idle_ratio", "rollout workers"], ["perf/learner_idle_ratio", "learner"]]),
      { yMin: 0, yMax: 1, emptyText: want("perf/rollout_idle_ratio, perf/learner_idle_ratio") });
    lineChart("restarts", named([["faults/restarted_workers", "restarted (cumulative)"]]), { yMin: 0, emptyText: want("faults/restarted_workers") });
  }

  function renderTraining() {
    lineChart("loss", named([["loss/policy", "policy loss"]]), { emptyText: want("loss/policy") });
    lineChart("kl", named([["kl", "KL"]]), { emptyText: want("kl") });
    lineChart("entropy", named([["entropy", "entropy"]]), { emptyText: want("entropy") });
    lineChart("clip_frac", named([["clip_frac", "clip fraction"]]), { yMin: 0, emptyText: want("clip_frac") });
  }

  function cell(col, v) {
    if (typeof v === "number") return `<td>${col === "pass_rate" ? v.toFixed(3) : C.formatNumber(v)}</td>`;
    return `<td class="text">${C.escapeHtml(v ?? "–")}</td>`;
  }
  function renderTable() {
    const p = state.profile, wrap = document.getElementById("profile-table");
    const countEl = document.getElementById("profile-count");
    const kSel = document.getElementById("k-filter");
    const all = profileRows();
    syncOptions(kSel, Array.from(new Set(all.map((r) => r.k))).sort((a, b) => a - b).map(String), "all k", (k) => `k=${k}`);
    state.profileK = kSel.value;
    const rows = all.filter((r) => !state.profileK || String(r.k) === state.profileK);
    if (!p || !p.file) {
      wrap.innerHTML = `<div class="empty">No profile table yet: expects profile/*.parquet in the run directory.</div>`;
      countEl.textContent = "–"; setPanelState("profile_table", false); return;
    }
    const { col, dir } = state.sort;
    rows.sort((a, b) => (a[col] < b[col] ? -dir : a[col] > b[col] ? dir : 0));
    const head = p.columns.map((c) => `<th data-col="${C.escapeHtml(c)}" class="${typeof rows[0]?.[c] === "number" ? "" : "text"}">`
      + `${C.escapeHtml(c)}${c === col ? (dir > 0 ? " ▲" : " ▼") : ""}</th>`).join("");
    const body = rows.slice(0, MAX_TABLE_ROWS).map((r) => `<tr data-env="${C.escapeHtml(r.env)}">${p.columns.map((c) => cell(c, r[c])).join("")}</tr>`).join("");
    wrap.innerHTML = `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
    countEl.textContent = `${p.file}: ${rows.length} row(s)${rows.length > MAX_TABLE_ROWS ? `, first ${MAX_TABLE_ROWS} shown` : ""}`
      + (state.env || state.profileK ? ` (filtered from ${p.data[p.columns[0]].length})` : "");
    countEl.dataset.rows = String(rows.length);
    setPanelState("profile_table", true);
  }

  // Keep a <select>'s options equal to `values` without losing the user's choice.
  function syncOptions(sel, values, allLabel, label) {
    const have = Array.from(sel.options).slice(1).map((o) => o.value);
    if (have.join("\u0000") === values.join("\u0000")) return;
    const chosen = sel.value;
    sel.innerHTML = `<option value="">${allLabel}</option>`
      + values.map((v) => `<option value="${C.escapeHtml(v)}">${C.escapeHtml(label(v))}</option>`).join("");
    sel.value = values.includes(chosen) ? chosen : "";
  }

  function renderBanner() {
    const msgs = [];
    if (state.fetchError) msgs.push({ level: "error", text: state.fetchError });
    for (const list of Object.values(state.messages)) for (const m of list || []) msgs.push(m);
    if (state.status && state.status.exists && !state.rows.length && state.status.has_metrics) {
      msgs.push({ level: "warning", text: "metrics.jsonl has no complete row yet (the run may be writing its first step)." });
    }
    const banner = document.getElementById("banner");
    banner.innerHTML = msgs.map((m) => `<div class="msg ${m.level}">${C.escapeHtml(m.text)}</div>`).join("");
    banner.hidden = msgs.length === 0;
  }

  function renderHeader() {
    const st = state.status || {};
    document.getElementById("run-name").textContent = st.name || st.run_dir || "run";
    document.title = `elr-rl · ${st.name || "dashboard"}`;
    const last = state.rows[state.rows.length - 1];
    const stepEl = document.getElementById("last-step");
    stepEl.textContent = last ? `step ${last.step} · ${state.rows.length} rows` : "no steps yet";
    stepEl.dataset.step = last ? String(last.step) : "";
    const live = document.getElementById("live-state");
    if (STATIC) { live.textContent = "static snapshot"; live.className = "pill"; }
    else if (state.fetchError) { live.textContent = "disconnected"; live.className = "pill down"; }
    else { live.textContent = `live · every ${POLL_MS / 1000}s`; live.className = "pill live"; }
    syncOptions(document.getElementById("env-filter"), allEnvs(), "all environments", (e) => e);
    state.env = document.getElementById("env-filter").value;
    document.getElementById("config-text").textContent = (state.config && state.config.text) || "No config.yaml in this run directory.";
    document.getElementById("footer").textContent = `run directory: ${st.run_dir || "?"}`
      + (last && last.time ? ` · last row written ${new Date(last.time * 1000).toLocaleString()}` : "");
  }

  function render() {
    state.messages.render = [];
    try {
      renderHeader();
      renderCurriculum(); renderPerK(); renderPerEnv(); renderHealth(); renderTraining(); renderTable();
    } catch (e) {
      // A bug or a malformed row must not blank the page: say what broke.
      state.messages.render = [{ level: "error", text: `The page could not draw this run: ${e.message}` }];
      console.error(e);
    }
    renderBanner();
    document.body.dataset.ready = "1";
  }

  // ---- controls -------------------------------------------------------------------------------

  document.getElementById("env-filter").addEventListener("change", (ev) => { state.env = ev.target.value; render(); });
  document.getElementById("k-filter").addEventListener("change", (ev) => { state.profileK = ev.target.value; render(); });
  document.getElementById("routing-step").addEventListener("input", (ev) => {
    state.routingFollow = Number(ev.target.value) >= state.routing.length - 1;
    renderScoreDist();
  });
  document.getElementById("profile-table").addEventListener("click", (ev) => {
    const th = ev.target.closest("th");
    if (!th) return;
    const col = th.dataset.col;
    state.sort = { col, dir: state.sort.col === col ? -state.sort.dir : 1 };
    renderTable();
  });
  let resizeTimer = null;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(render, 150); });

  if (STATIC) loadStatic(); else pollLoop();
})();
