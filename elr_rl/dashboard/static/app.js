// elr-rl dashboard page: polls the run's JSON endpoints (or reads the inlined snapshot of a static
// export) and draws every panel. Data layout and metric names: see elr_rl/metrics.py.
"use strict";

(() => {
  const C = ElrCharts;
  const params = new URLSearchParams(location.search);
  const POLL_MS = Math.max(200, Number(params.get("poll")) || 2000);
  const STATIC = window.ELR_STATIC || null;
  const RUN = params.get("run") || "";
  const MAX_TABLE_ROWS = 500, MAX_SAMPLES_SHOWN = 200;

  const newRun = () => ({ rows: [], keys: new Set(), offset: 0 });
  const state = {
    main: newRun(), overlay: newRun(), overlayName: params.get("compare") || "",
    routing: [], routingOffset: 0, routingFollow: true,
    samples: [], samplesOffset: 0,
    profile: null, passrates: null, config: null, status: null, signature: null, passSig: null, runs: [],
    messages: { status: [], metrics: [], routing: [], profile: [], config: [], samples: [], overlay: [] },
    fetchError: null, env: "", profileK: "", sort: { col: "pass_rate", dir: 1 },
    smooth: 0, xRange: null, logCharts: new Set(),
  };

  // ---- data ingestion -------------------------------------------------------------------------

  // A step below the last one means the run resumed from an older checkpoint: later rows win.
  function ingestRows(run, rows) {
    for (const row of rows) {
      const last = run.rows[run.rows.length - 1];
      if (last && row.step <= last.step) run.rows = run.rows.filter((r) => r.step < row.step);
      run.rows.push(row);
      for (const k of Object.keys(row)) run.keys.add(k);
    }
  }
  // Several curriculum batches are routed per step: records of the same step are summed.
  function ingestRouting(records) {
    for (const rec of records) {
      const last = state.routing[state.routing.length - 1];
      if (last && rec.step < last.step) state.routing = state.routing.filter((r) => r.step < rec.step);
      const same = state.routing.length && state.routing[state.routing.length - 1].step === rec.step
        ? state.routing[state.routing.length - 1] : null;
      if (!same) { state.routing.push(JSON.parse(JSON.stringify(rec))); continue; }
      for (const name of ["score", "q", "pass_rate"]) {
        for (const [k, counts] of Object.entries(rec[name] || {})) {
          const have = same[name][k];
          same[name][k] = have && have.length === counts.length ? have.map((c, i) => c + counts[i]) : counts.slice();
        }
      }
      for (const [k, n] of Object.entries(rec.n || {})) same.n[k] = (same.n[k] || 0) + n;
    }
  }
  function ingestSamples(rows) {
    state.samples.push(...rows);
    if (state.samples.length > 5000) state.samples = state.samples.slice(-5000);
  }
  function clearRun() {
    state.main = newRun(); state.routing = []; state.routingOffset = 0; state.samples = []; state.samplesOffset = 0;
    state.profile = null; state.passrates = null; state.config = null; state.signature = null; state.passSig = null;
  }

  const api = (path, run) => {
    const sep = path.includes("?") ? "&" : "?";
    return run ? `api/${path}${sep}run=${encodeURIComponent(run)}` : `api/${path}`;
  };
  async function getJSON(path) {
    const resp = await fetch(path, { cache: "no-store" });
    let body;
    try { body = await resp.json(); } catch (e) { throw new Error(`${path}: HTTP ${resp.status}, not JSON`); }
    if (!resp.ok || body.error) throw new Error(`${path}: ${body.error || "HTTP " + resp.status}`);
    return body;
  }

  async function pollOnce() {
    const st = await getJSON(api("status", RUN));
    state.status = st; state.messages.status = st.messages || [];
    if (!st.exists) { clearRun(); return; }
    state.runs = (await getJSON("api/runs")).runs;
    const m = await getJSON(api(`metrics?offset=${state.main.offset}`, RUN));
    if (m.reset) state.main = newRun();
    ingestRows(state.main, m.rows); state.main.offset = m.offset; state.messages.metrics = m.messages;
    const r = await getJSON(api(`routing?offset=${state.routingOffset}`, RUN));
    if (r.reset) state.routing = [];
    ingestRouting(r.records); state.routingOffset = r.offset; state.messages.routing = r.messages;
    const s = await getJSON(api(`samples?offset=${state.samplesOffset}`, RUN));
    if (s.reset) state.samples = [];
    ingestSamples(s.rows); state.samplesOffset = s.offset; state.messages.samples = s.messages;
    if (st.signature !== state.signature || state.profile === null) {
      state.profile = await getJSON(api("profile", RUN)); state.messages.profile = state.profile.messages;
      state.config = await getJSON(api("config", RUN)); state.messages.config = [];
      state.signature = st.signature; state.passSig = null;
    }
    if (st.passrate_signature !== state.passSig) {
      state.passrates = await getJSON(api("passrates", RUN)); state.passSig = st.passrate_signature;
    }
    if (state.overlayName) {
      const o = await getJSON(api(`metrics?offset=${state.overlay.offset}`, state.overlayName));
      if (o.reset) state.overlay = newRun();
      ingestRows(state.overlay, o.rows); state.overlay.offset = o.offset; state.messages.overlay = o.messages;
    }
  }

  // Redraw only when something changed, so a hover tooltip survives polls of an idle run.
  let lastFingerprint = null;
  function fingerprint() {
    const last = state.main.rows[state.main.rows.length - 1], lastR = state.routing[state.routing.length - 1];
    return JSON.stringify([state.main.rows.length, last && last.step, last && last.time, state.routing.length,
      lastR && lastR.step, lastR && lastR.n, state.samples.length, state.overlay.rows.length, state.signature, state.passSig,
      state.messages, state.fetchError, state.status && state.status.exists, state.runs]);
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
    ingestRows(state.main, STATIC.metrics.rows); state.messages.metrics = STATIC.metrics.messages;
    ingestRouting(STATIC.routing.records); state.messages.routing = STATIC.routing.messages;
    ingestSamples((STATIC.samples || { rows: [] }).rows);
    state.profile = STATIC.profile; state.messages.profile = STATIC.profile.messages;
    state.passrates = STATIC.passrates || null;
    state.config = STATIC.config;
    render();
  }

  // ---- series from metric rows ----------------------------------------------------------------

  // Keys matching `re` (whose group 1 names the series), sorted numerically when they are loop counts.
  function matchKeys(re, run = state.main) {
    const out = [];
    for (const key of run.keys) { const m = key.match(re); if (m) out.push({ key, name: m[1], m }); }
    const numeric = out.every((o) => /^\d+$/.test(o.name));
    out.sort((a, b) => (numeric ? Number(a.name) - Number(b.name) : a.name.localeCompare(b.name)));
    return out;
  }
  function points(key, run = state.main) {
    const pts = [];
    for (const row of run.rows) if (key in row) pts.push([row.step, typeof row[key] === "number" ? row[key] : null]);
    return pts;
  }
  // Per-k series of keys `{prefix}{k}{suffix}`; `label` names them.
  function perK(prefix, suffix = "", label = (k) => `k=${k}`) {
    const found = matchKeys(new RegExp(`^${prefix.replace(/\//g, "\\/")}(\\d+)${suffix}$`));
    return found.map((o, i) => ({ key: o.key, name: label(o.name), color: C.sequentialColor(i), points: points(o.key) }));
  }
  function allEnvs() {
    const envs = new Set(matchKeys(/^(?:critic\/score|critic\/pass_rate|response_length)\/env\/([^/]+)$/).map((o) => o.name));
    const col = state.profile && state.profile.data && state.profile.data.env;
    if (col) for (const e of col) if (e !== null) envs.add(String(e));
    return Array.from(envs).sort();
  }
  function perEnv(prefix) {
    const envs = allEnvs();
    return matchKeys(new RegExp(`^${prefix}/env/([^/]+)$`))
      .filter((o) => !state.env || o.name === state.env)
      .map((o) => ({ key: o.key, name: o.name, color: C.categoricalColor(envs.indexOf(o.name)), points: points(o.key) }));
  }
  function named(list) {
    return list.filter(([key]) => state.main.keys.has(key))
      .map(([key, name, color], i) => ({ key, name, color: color || C.categoricalColor(i), points: points(key) }));
  }
  // The overlaid run's copy of every series that has a metric key, dashed, in the same colour.
  function withOverlay(series) {
    if (!state.overlayName || !state.overlay.rows.length) return series;
    const extra = series.filter((s) => s.key && state.overlay.keys.has(s.key))
      .map((s) => ({ ...s, name: `${s.name} · ${state.overlayName}`, dash: true, points: points(s.key, state.overlay) }));
    return series.concat(extra);
  }

  // ---- panels ---------------------------------------------------------------------------------

  function chartEl(name) { return document.querySelector(`[data-chart="${name}"]`); }
  function setPanelState(name, ok) {
    const panel = document.querySelector(`[data-panel="${name}"]`);
    if (panel) panel.dataset.state = ok ? "ok" : "empty";
  }
  function setZoom(lo, hi) {
    state.xRange = lo === null ? null : [Math.floor(lo), Math.ceil(hi)];
    render();
  }
  function lineChart(name, series, opts) {
    const n = C.line(chartEl(name), {
      ...opts, series: withOverlay(series), smooth: state.smooth, xRange: state.xRange, log: state.logCharts.has(name),
      onZoom: setZoom, onLog: (on) => { if (on) state.logCharts.add(name); else state.logCharts.delete(name); render(); },
    });
    setPanelState(name, n > 0);
  }
  const want = (keys) => `No data yet: this panel plots ${keys} from metrics.jsonl.`;

  function renderCurriculum() {
    const n = C.stacked(chartEl("slots"), { series: perK("curriculum/prompts_k"), yLabel: "prompts", xRange: state.xRange,
      emptyText: want("curriculum/prompts_k{k}") });
    setPanelState("slots", n > 0);
    lineChart("mean_q", perK("curriculum/mean_q_k"), { yLabel: "mean q", yMin: 0, yMax: 1, emptyText: want("curriculum/mean_q_k{k}") });
    renderPassRateDist();
    renderScoreDist();
    renderHeat();
  }

  function renderHeat() {
    const envs = allEnvs();
    const rows = matchKeys(/^critic\/pass_rate\/env\/([^/]+)\/k(\d+)$/)
      .filter((o) => !state.env || o.name === state.env)
      .sort((a, b) => (a.name.localeCompare(b.name) || Number(a.m[2]) - Number(b.m[2])))
      .map((o) => ({ name: `${o.name} · k=${o.m[2]}`, points: points(o.key), env: envs.indexOf(o.name) }));
    const n = C.heatmap(chartEl("pass_heat"), { rows, xRange: state.xRange, scaleLabel: "pass rate",
      emptyText: want("critic/pass_rate/env/{env}/k{k}") });
    setPanelState("pass_heat", n > 0);
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

  // The curriculum's current estimate (profile + live rollouts); the profile table alone before RL starts.
  function renderPassRateDist() {
    const pr = state.passrates, d = pr && pr.data;
    let rows = [];
    if (d && d.k) rows = d.k.map((k, i) => ({ k, env: d.env[i], pass_rate: d.pass_rate[i], samples: d.samples[i] }));
    rows = rows.filter((r) => typeof r.pass_rate === "number" && (!state.env || r.env === state.env));
    const ks = Array.from(new Set(rows.map((r) => r.k))).sort((a, b) => a - b);
    const { edges, index } = passRateBins(rows);
    const series = ks.map((k, i) => {
      const counts = new Array(edges.length - 1).fill(0);
      for (const r of rows) if (r.k === k) counts[index(r.pass_rate)] += 1;
      return { name: `k=${k}`, color: C.sequentialColor(i), counts };
    });
    const source = !pr || !pr.source ? "no profile or live counts yet"
      : pr.source === "live" ? `live: the profile${pr.file ? ` (${pr.file})` : ""} plus the rollouts so far (curriculum/state.json)`
        : `the profile table ${pr.file} (no rollouts yet)`;
    const src = document.getElementById("passrate-source");
    src.textContent = source; src.dataset.source = (pr && pr.source) || "";
    const empty = state.env ? `No pass rates for environment ${state.env}.` : "No pass rates yet: expects profile/*.parquet or curriculum/state.json.";
    const n = C.bars(chartEl("passrate_dist"), { edges, series, normalize: true, xLabel: "pass rate", emptyText: empty });
    setPanelState("passrate_dist", n > 0);
  }

  function renderScoreDist() {
    const slider = document.getElementById("routing-step");
    const recs = state.routing;
    slider.max = String(Math.max(0, recs.length - 1));
    if (state.routingFollow) slider.value = slider.max;
    const rec = recs[Number(slider.value)];
    const label = document.getElementById("routing-step-label");
    label.textContent = rec ? String(rec.step) : "–";
    label.dataset.step = rec ? String(rec.step) : "";
    let series = [];
    if (rec) {
      const ks = Object.keys(rec.score).sort((a, b) => Number(a) - Number(b));
      series = ks.map((k, i) => ({ name: `k=${k} (${rec.n[k] ?? "?"} prompts)`, color: C.sequentialColor(i), counts: rec.score[k] }));
    }
    const n = C.bars(chartEl("score_dist"), { edges: rec ? rec.edges : [], series, normalize: true, xLabel: "routing score",
      emptyText: "No routing records yet: expects curriculum/routing.jsonl." });
    setPanelState("score_dist", n > 0);
  }

  function renderValidation() {
    lineChart("val_k", perK("val/pass_at_1/k"), { yLabel: "pass@1", yMin: 0, yMax: 1,
      emptyText: want("val/pass_at_1/k{k}") + " Set run.eval_interval to validate during RL." });
    const train = perK("loss/k");
    const held = perK("eval/loss_k", "", (k) => `held-out k=${k}`).map((s, i) => ({ ...s, color: C.sequentialColor(i), dash: true }));
    lineChart("loss_k", train.concat(held), { yLabel: "loss", emptyText: want("loss/k{k} (pretraining and SFT runs)") });
  }

  function renderPerK() {
    lineChart("reward_k", perK("critic/score/k"), { yLabel: "reward", emptyText: want("critic/score/k{k}") });
    lineChart("pass_k", perK("critic/pass_rate/k"), { yLabel: "pass rate", yMin: 0, yMax: 1, emptyText: want("critic/pass_rate/k{k}") });
    lineChart("length_k", perK("response_length/k"), { yLabel: "tokens", emptyText: want("response_length/k{k}") });
  }

  function renderPerEnv() {
    const filtered = state.env ? ` for environment ${state.env}` : "";
    lineChart("reward_env", perEnv("critic/score"), { yLabel: "reward", emptyText: want("critic/score/env/{env}") + filtered });
    lineChart("pass_env", perEnv("critic/pass_rate"), { yLabel: "pass rate", yMin: 0, yMax: 1, emptyText: want("critic/pass_rate/env/{env}") + filtered });
    lineChart("length_env", perEnv("response_length"), { yLabel: "tokens", emptyText: want("response_length/env/{env}") + filtered });
  }

  function renderCollapse() {
    lineChart("zero_std", named([["batch/frac_reward_zero_std", "zero reward std (fraction of groups)"]]), { yMin: 0, yMax: 1, emptyText: want("batch/frac_reward_zero_std") });
    lineChart("dropped", named([["async/dropped_stale_frac", "dropped stale (fraction of groups)"]]), { yMin: 0, emptyText: want("async/dropped_stale_frac") });
    lineChart("trained_samples", named([["batch/trained_samples", "trained samples"]]), { yMin: 0, emptyText: want("batch/trained_samples") });
    lineChart("grad_norm", named([["actor/grad_norm", "grad norm (RL)"], ["grad_norm", "grad norm"]]), { yMin: 0, emptyText: want("actor/grad_norm") });
    lineChart("lr", named([["actor/lr", "learning rate (RL)"], ["lr", "learning rate"]]), { yMin: 0, emptyText: want("actor/lr") });
    lineChart("entropy", named([["actor/entropy", "entropy"]]), { yMin: 0, emptyText: want("actor/entropy") });
  }

  function configSays(re) { return !!(state.config && state.config.text && re.test(state.config.text)); }
  function renderTraining() {
    lineChart("loss", named([["actor/pg_loss", "policy loss"]]), { emptyText: want("actor/pg_loss") });
    const klOff = configSays(/^\s*kl_coef:\s*0(\.0*)?\s*$/m);
    lineChart("kl", named([["actor/ppo_kl", "KL (k3 estimate)"]]), { yMin: 0,
      emptyText: klOff ? "KL penalty is off in this run (algo.kl_coef: 0): no reference model, so there is no KL to plot." : want("actor/ppo_kl") });
    lineChart("clip_frac", named([["actor/pg_clipfrac", "clipped ratios (fraction of tokens)"],
      ["response_length/clip_ratio", "responses cut at max_new_tokens (fraction)"]]), { yMin: 0, emptyText: want("actor/pg_clipfrac") });
  }

  const HEALTH_TILES = [
    ["perf/gen_tokens_per_s", "generated tokens / s"], ["async/staleness_mean", "staleness (mean)"], ["perf/weight_sync_frac", "weight sync (share of step)"],
    ["perf/rollout_idle_ratio", "rollout idle"], ["perf/learner_idle_ratio", "learner idle"], ["faults/restarted_workers", "restarted workers"],
  ];
  function latest(key) {
    const rows = state.main.rows;
    for (let i = rows.length - 1; i >= 0; i--) if (typeof rows[i][key] === "number") return rows[i][key];
    return null;
  }
  // The weight-sync share; rows that only have the seconds get it computed from them.
  function syncShare() {
    if (state.main.keys.has("perf/weight_sync_frac")) return named([["perf/weight_sync_frac", "weight sync / step"]]);
    const pts = state.main.rows.filter((r) => typeof r["timing_s/weight_sync"] === "number" && r["timing_s/step"] > 0)
      .map((r) => [r.step, r["timing_s/weight_sync"] / r["timing_s/step"]]);
    return pts.length ? [{ name: "weight sync / step", color: C.categoricalColor(0), points: pts }] : [];
  }
  function renderHealth() {
    const tiles = HEALTH_TILES.map(([key, label]) =>
      `<div class="tile" data-key="${key}"><div class="label">${label}</div><div class="value">${C.formatNumber(latest(key))}</div></div>`);
    document.getElementById("health-tiles").innerHTML = tiles.join("");
    setPanelState("health_summary", HEALTH_TILES.some(([key]) => latest(key) !== null));
    lineChart("staleness", named([["async/staleness_mean", "mean"], ["async/staleness_max", "max"]]), { yMin: 0, emptyText: want("async/staleness_mean") });
    lineChart("throughput", named([["perf/gen_tokens_per_s", "generated tokens/s"], ["perf/trained_tokens_per_s", "trained tokens/s"],
      ["perf/tokens_per_s", "trained tokens/s (pretraining/SFT)"]]), { yMin: 0, emptyText: want("perf/gen_tokens_per_s, perf/trained_tokens_per_s") });
    lineChart("weight_sync", syncShare(), { yMin: 0, yLabel: "share of step", emptyText: want("perf/weight_sync_frac") });
    lineChart("idle", named([["perf/rollout_idle_ratio", "rollout workers"], ["perf/learner_idle_ratio", "learner"]]),
      { yMin: 0, yMax: 1, emptyText: want("perf/rollout_idle_ratio, perf/learner_idle_ratio") });
    lineChart("restarts", named([["faults/restarted_workers", "restarted (cumulative)"]]), { yMin: 0, emptyText: want("faults/restarted_workers") });
  }

  // ---- tables ---------------------------------------------------------------------------------

  function renderSamples() {
    const wrap = document.getElementById("sample-table"), countEl = document.getElementById("sample-count");
    const all = state.samples;
    syncOptions(document.getElementById("sample-env"), Array.from(new Set(all.map((r) => String(r.env ?? "?")))).sort(), "all", (e) => e);
    syncOptions(document.getElementById("sample-k"), Array.from(new Set(all.map((r) => r.k))).sort((a, b) => a - b).map(String), "all", (k) => `k=${k}`);
    const env = document.getElementById("sample-env").value, k = document.getElementById("sample-k").value;
    const rw = document.getElementById("sample-reward").value;
    const rows = all.filter((r) => (!env || String(r.env) === env) && (!k || String(r.k) === k)
      && (!rw || (rw === "pos" ? r.reward > 0 : !(r.reward > 0)))).reverse();
    if (!all.length) {
      wrap.innerHTML = `<div class="empty">No samples yet: expects rollouts.jsonl (written every run.sample_log_interval steps).</div>`;
      countEl.textContent = "–"; countEl.dataset.rows = "0"; setPanelState("samples", false); return;
    }
    const cut = (t, n) => { t = String(t ?? ""); return t.length > n ? t.slice(0, n) + "…" : t; };
    const body = rows.slice(0, MAX_SAMPLES_SHOWN).map((r) => `<tr class="sample" data-env="${C.escapeHtml(r.env ?? "")}" data-k="${r.k}" data-reward="${r.reward}">`
      + `<td>${r.step}</td><td class="text">${C.escapeHtml(r.env ?? "?")}</td><td>${r.k ?? "–"}</td><td>${r.policy_version ?? "–"}</td>`
      + `<td>${C.formatNumber(r.reward)}</td>`
      + `<td class="text wrap"><details><summary>${C.escapeHtml(cut(r.prompt, 80) || "(prompt not logged)")}</summary><pre>${C.escapeHtml(r.prompt ?? "")}</pre></details></td>`
      + `<td class="text wrap"><details><summary>${C.escapeHtml(cut(r.completion, 80))}</summary><pre>${C.escapeHtml(r.completion ?? "")}</pre></details></td></tr>`).join("");
    wrap.innerHTML = `<table><thead><tr><th>step</th><th class="text">environment</th><th>k</th><th>policy version</th><th>reward</th>`
      + `<th class="text">prompt</th><th class="text">completion</th></tr></thead><tbody>${body}</tbody></table>`;
    countEl.textContent = `${rows.length} of ${all.length} sample(s), newest first${rows.length > MAX_SAMPLES_SHOWN ? `, first ${MAX_SAMPLES_SHOWN} shown` : ""}`;
    countEl.dataset.rows = String(rows.length);
    setPanelState("samples", true);
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

  // Keep a <select>'s options equal to `values` (after its first "all" option) without losing the choice.
  function syncOptions(sel, values, allLabel, label) {
    const have = Array.from(sel.options).slice(1).map((o) => o.value);
    if (have.join("\u0000") === values.join("\u0000")) return;
    const chosen = sel.value;
    sel.innerHTML = `<option value="">${allLabel}</option>`
      + values.map((v) => `<option value="${C.escapeHtml(v)}">${C.escapeHtml(label(v))}</option>`).join("");
    sel.value = values.includes(chosen) ? chosen : "";
  }

  // ---- page frame -----------------------------------------------------------------------------

  function renderRuns() {
    const st = state.status || {}, runs = state.runs || [];
    const listPanel = document.querySelector('[data-panel="runs"]');
    const folderRuns = st.runs || [];
    listPanel.hidden = folderRuns.length === 0;
    document.getElementById("run-list").innerHTML = folderRuns.map((r) =>
      `<li><a href="?run=${encodeURIComponent(r)}" data-run="${C.escapeHtml(r)}">${C.escapeHtml(r)}</a></li>`).join("");
    setPanelState("runs", folderRuns.length > 0);
    const pick = document.getElementById("run-pick"), sel = document.getElementById("run-select");
    pick.hidden = runs.length < 2 && !RUN;
    const opts = runs.filter((r) => r !== ".");
    if (sel.options.length !== opts.length + 1) {
      sel.innerHTML = `<option value="">(folder)</option>` + opts.map((r) => `<option value="${C.escapeHtml(r)}">${C.escapeHtml(r)}</option>`).join("");
    }
    sel.value = RUN;
    const cmp = document.getElementById("compare-pick");
    cmp.hidden = runs.length < 2 || STATIC;
    syncOptions(document.getElementById("compare-select"), opts.filter((r) => r !== RUN), "none", (r) => r);
    document.getElementById("compare-select").value = state.overlayName;
  }

  function renderBanner() {
    const msgs = [];
    if (state.fetchError) msgs.push({ level: "error", text: state.fetchError });
    for (const list of Object.values(state.messages)) for (const m of list || []) msgs.push(m);
    if (state.status && state.status.exists && !state.main.rows.length && state.status.has_metrics) {
      msgs.push({ level: "warning", text: "metrics.jsonl has no complete row yet (the run may be writing its first step)." });
    }
    const banner = document.getElementById("banner");
    banner.innerHTML = msgs.map((m) => `<div class="msg ${m.level}">${C.escapeHtml(m.text)}</div>`).join("");
    banner.hidden = msgs.length === 0;
  }

  function renderHeader() {
    const st = state.status || {};
    const name = RUN || st.name || st.run_dir || "run";
    document.getElementById("run-name").textContent = name;
    document.title = `elr-rl · ${st.name || "dashboard"}`;
    const last = state.main.rows[state.main.rows.length - 1];
    const stepEl = document.getElementById("last-step");
    stepEl.textContent = last ? `step ${last.step} · ${state.main.rows.length} rows` : "no steps yet";
    stepEl.dataset.step = last ? String(last.step) : "";
    const live = document.getElementById("live-state");
    if (STATIC) { live.textContent = "static snapshot"; live.className = "pill"; }
    else if (state.fetchError) { live.textContent = "disconnected"; live.className = "pill down"; }
    else { live.textContent = `live · every ${POLL_MS / 1000}s`; live.className = "pill live"; }
    syncOptions(document.getElementById("env-filter"), allEnvs(), "all environments", (e) => e);
    state.env = document.getElementById("env-filter").value;
    const zoom = document.getElementById("zoom-state");
    zoom.hidden = !state.xRange;
    document.getElementById("zoom-label").textContent = state.xRange ? `${state.xRange[0]}–${state.xRange[1]}` : "";
    document.getElementById("config-text").textContent = (state.config && state.config.text) || "No config.yaml in this run directory.";
    document.getElementById("footer").textContent = `run directory: ${st.run_dir || "?"}`
      + (last && last.time ? ` · last row written ${new Date(last.time * 1000).toLocaleString()}` : "");
  }

  function render() {
    state.messages.render = [];
    try {
      renderHeader(); renderRuns();
      renderCurriculum(); renderValidation(); renderPerK(); renderPerEnv(); renderCollapse(); renderTraining();
      renderHealth(); renderSamples(); renderTable();
    } catch (e) {
      // A bug or a malformed row must not blank the page: say what broke.
      state.messages.render = [{ level: "error", text: `The page could not draw this run: ${e.message}` }];
      console.error(e);
    }
    // A pretraining/SFT run has none of RL's panels: hide their empty frames so loss per k comes first.
    const k = state.main.keys;
    const folder = !!(state.status && (state.status.runs || []).length) && !state.main.rows.length;
    document.body.dataset.stage = folder ? "folder" : k.has("loss/mean") && !k.has("critic/score/mean") ? "train" : "rl";
    if (folder) state.messages.profile = [];  // a folder of runs has no profile of its own: no need to say so
    renderBanner();
    document.body.dataset.ready = "1";
  }

  // ---- controls -------------------------------------------------------------------------------

  const on = (id, ev, fn) => document.getElementById(id).addEventListener(ev, fn);
  on("env-filter", "change", (ev) => { state.env = ev.target.value; render(); });
  on("k-filter", "change", (ev) => { state.profileK = ev.target.value; render(); });
  for (const id of ["sample-env", "sample-k", "sample-reward"]) on(id, "change", renderSamples);
  on("smoothing", "input", (ev) => {
    state.smooth = Number(ev.target.value);
    document.getElementById("smoothing-label").textContent = String(state.smooth);
    render();
  });
  on("zoom-reset", "click", () => setZoom(null));
  on("run-select", "change", (ev) => {
    const q = new URLSearchParams(location.search);
    if (ev.target.value) q.set("run", ev.target.value); else q.delete("run");
    q.delete("compare");
    location.search = q.toString();
  });
  on("compare-select", "change", (ev) => {
    state.overlayName = ev.target.value; state.overlay = newRun(); state.messages.overlay = [];
    if (!STATIC) pollOnce().then(render, () => render()); else render();
  });
  on("routing-step", "input", (ev) => {
    state.routingFollow = Number(ev.target.value) >= state.routing.length - 1;
    renderScoreDist();
  });
  on("profile-table", "click", (ev) => {
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
