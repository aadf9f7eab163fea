"""The report page: inline CSS and JavaScript around the embedded data (``%%DATA%%``); no external resource.

State lives in the URL hash (``#step=12&errors=1&all=1&q=foo&reward=1&trunc=1&page=0&pagesize=10&diff=3``), so
a view can be bookmarked and a test can open the page in a given state. When the first render is done, the
page stores ``performance.now()`` (ms since navigation start) in ``body[data-load-ms]`` and ``#load-ms``.
"""

TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%%TITLE%%</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:13px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2433;background:#f6f7f9}
header{background:#1d2433;color:#fff;padding:10px 16px;display:flex;gap:18px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:16px;margin:0}header .muted{color:#aab3c5}
main{padding:12px 16px;max-width:1500px}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:10px 12px;margin-bottom:12px}
#curves{display:flex;gap:16px;flex-wrap:wrap}.chart{flex:0 1 450px}.chart h3{margin:0 0 4px;font-size:13px}
svg{background:#fbfcfd;border:1px solid #eceff3}svg text{font-size:10px;fill:#5b6475}
.legend span{margin-right:12px;white-space:nowrap}.legend i{display:inline-block;width:12px;height:3px;margin-right:4px;vertical-align:middle}
#controls{display:flex;gap:14px;flex-wrap:wrap;align-items:center}
#controls label{white-space:nowrap}input[type=range]{width:280px;vertical-align:middle}
button{font:inherit;padding:2px 8px;cursor:pointer}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #eceff3;padding:3px 6px;vertical-align:top;text-align:left}
th{background:#f0f2f5;position:sticky;top:0}
tr.ghead td{background:#eef3fb;border-top:2px solid #b9c8e4}
pre{margin:0;white-space:pre-wrap;word-break:break-word;font:12px/1.35 ui-monospace,Menlo,Consolas,monospace}
pre.txt{max-height:9em;overflow:auto}table.turns{font-size:11px;border-collapse:collapse}table.turns td{padding:0 6px 0 0}
.chip{display:inline-block;min-width:30px;text-align:center;border-radius:3px;margin:1px;padding:0 2px;font:11px ui-monospace,monospace}
.r1{background:#c8ecd0}.r0{background:#f6d2d2}.rmid{background:#f3e7c0}.rerr{background:#555;color:#fff}
.err{color:#b00020}.trunc{color:#8a5a00}.num{text-align:right;font-variant-numeric:tabular-nums}
.pick{font-size:11px;color:#5b6475}.muted{color:#7a8394}
#pager{margin:8px 0;display:flex;gap:10px;align-items:center}
#diff .cols{display:flex;gap:12px}#diff .cols>div{flex:1;min-width:0}
del{background:#f6d2d2;text-decoration:line-through}ins{background:#c8ecd0;text-decoration:none}
.hidden{display:none}.crow{display:flex;gap:6px;align-items:baseline;border-bottom:1px solid #f0f2f5}
.crow pre{flex:1}#diff h4{margin:6px 0 2px}
</style></head>
<body>
<header><h1>%%TITLE%%</h1><span class="muted">generated %%GENERATED%%</span><span id="summary"></span>
<span class="muted">rendered in <span id="load-ms">…</span></span></header>
<main>
<section id="curves"></section>
<section id="controls">
 <label>step <button id="prev" title="previous step">◀</button>
 <input id="slider" type="range" min="0" max="0" value="0"><button id="next" title="next step">▶</button></label>
 <select id="steplist" title="steps with rollouts (mean reward, errors)"></select>
 <label>reward <select id="f-reward"><option value="all">any</option><option value="1">= 1</option>
  <option value="0">= 0</option><option value="other">other</option><option value="none">no reward</option></select></label>
 <label><input type="checkbox" id="f-errors"> errors only</label>
 <label title="rows that stopped at max_new_tokens (finish reason 'length')"><input type="checkbox" id="f-trunc"> budget reached only</label>
 <label>search <input id="f-q" type="search" placeholder="prompt, answer, completion, error"></label>
 <label><input type="checkbox" id="f-all"> all steps</label>
</section>
<section id="diff" class="hidden"></section>
<section><div id="pager"></div><table id="rows"><thead><tr><th>#</th><th>completion</th><th>reward</th>
<th>components</th><th>adv.</th><th>finish</th><th>len</th><th>version / stale</th><th>log-prob</th><th>error</th></tr></thead>
<tbody id="tbody"></tbody></table></section>
</main>
<script id="data" type="application/json">%%DATA%%</script>
<script>
"use strict";
const T0 = performance.now();  // the HTML (with the data) is parsed by now
const D = JSON.parse(document.getElementById("data").textContent);
const T1 = performance.now();
const F = {}; D.fields.forEach((f, i) => F[f] = i);
const $ = id => document.getElementById(id);
// Text as HTML, with the control characters a page would drop or hide made visible: C0 ones (NUL, which the HTML
// parser removes, \x0b, \x1c-\x1e, ...; not tab, newline, CR) and DEL as their Control Pictures (U+2400 + code,
// U+2421), C1 ones (U+0085 NEL, ...) as ⟨U+0085⟩. U+2028 / U+2029 stay: the browser breaks the line there.
const CTRL = /[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]/g;
const ctrlPicture = c => { const n = c.charCodeAt(0); return n < 0x20 ? String.fromCharCode(0x2400 + n) : n === 0x7f ? "\u2421" : `⟨U+${n.toString(16).toUpperCase().padStart(4, "0")}⟩`; };
const esc = s => String(s == null ? "" : s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c])).replace(CTRL, ctrlPicture);
const fmt = (x, d = 3) => x == null ? "–" : (Number.isInteger(x) ? String(x) : x.toFixed(d));
const S = {step: D.steps.length ? D.steps[D.steps.length - 1] : null, reward: "all", errors: false, trunc: false,
           q: "", all: false, page: 0, pagesize: 10, diff: null, a: null, b: null};

function readHash() {
  for (const kv of location.hash.replace(/^#/, "").split("&")) {
    if (!kv) continue;
    const [k, v0] = kv.split("="); const v = decodeURIComponent(v0 || "");
    if (["step", "page", "pagesize", "diff", "a", "b"].includes(k)) S[k] = v === "" ? null : Number(v);
    else if (["errors", "trunc", "all"].includes(k)) S[k] = v === "1";
    else if (k in S) S[k] = v;
  }
  if (!D.steps.includes(S.step) && D.steps.length) S.step = D.steps[D.steps.length - 1];
}
function writeHash() {
  const p = [];
  for (const k of ["step", "reward", "errors", "trunc", "q", "all", "page", "pagesize", "diff", "a", "b"]) {
    const v = S[k]; if (v === null || v === "" || v === false || (k === "reward" && v === "all")) continue;
    p.push(k + "=" + encodeURIComponent(v === true ? 1 : v));
  }
  history.replaceState(null, "", "#" + p.join("&"));
}

// A row that stopped at max_new_tokens says so: "budget reached", not "length" (nor "truncated": for a task whose
// answer is the whole budget, e.g. one token, every row reaches it and nothing was cut short).
const finishText = f => f === "length" ? "budget reached" : f;
const LEGEND = {"rollout/truncation_rate": "rollout/truncation_rate (budget reached)"};

// ---------------------------------------------------------------- curves
const COLORS = ["#2f6fdb", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#5c940d", "#1098ad"];
function chart(title, keys, w = 440, h = 160) {
  const series = keys.filter(k => D.curves[k] && D.curves[k].length).map(k => [k, D.curves[k]]);
  if (!series.length) return "";
  const pts = series.flatMap(s => s[1]);
  let x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
  let y0 = Math.min(...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
  if (y0 >= 0 && y1 <= 1) { y0 = 0; y1 = 1; } if (y1 === y0) { y1 += 1; y0 -= 1; } if (x1 === x0) x1 = x0 + 1;
  const L = 40, R = 8, T = 8, B = 20, X = x => L + (x - x0) / (x1 - x0) * (w - L - R), Y = y => T + (1 - (y - y0) / (y1 - y0)) * (h - T - B);
  let g = "", lastX = null;
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + (y1 - y0) * i / 4, xv = Math.round(x0 + (x1 - x0) * i / 4);
    g += `<line x1="${L}" x2="${w - R}" y1="${Y(yv)}" y2="${Y(yv)}" stroke="#eceff3"/><text x="2" y="${Y(yv) + 3}">${+yv.toPrecision(3)}</text>`;
    // the last label ends at the plot's right edge (centred it was clipped); few steps: no repeated labels
    const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
    if (xv !== lastX) g += `<text x="${X(xv)}" y="${h - 5}" text-anchor="${anchor}">${xv}</text>`;
    lastX = xv;
  }
  series.forEach(([k, s], i) => {
    const c = COLORS[i % COLORS.length];
    // Curves can coincide (eval/accuracy equals eval/reward_mean under an exact-answer reward): each later one is
    // thinner and dashed, with smaller markers, drawn over the earlier ones, so every curve stays visible.
    const sw = Math.max(1.2, 3.6 - 0.9 * i), dash = ["", "6,3", "2,2", "8,3,2,3"][i % 4], r = Math.max(1.6, 3.4 - 0.7 * i);
    g += `<polyline class="curve" data-key="${esc(k)}" fill="none" stroke="${c}" stroke-width="${sw}" stroke-dasharray="${dash}" points="${s.map(p => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" ")}"/>`;
    if (s.length < 60) g += s.map(p => `<circle cx="${X(p[0])}" cy="${Y(p[1])}" r="${r}" fill="${c}"/>`).join("");
  });
  const cur = S.step == null ? "" : `<line id="mark-${esc(title)}" x1="${X(S.step)}" x2="${X(S.step)}" y1="${T}" y2="${h - B}" stroke="#888" stroke-dasharray="3,3"/>`;
  const legend = series.map(([k], i) => `<span><i style="background:${COLORS[i % COLORS.length]}"></i>${esc(LEGEND[k] || k)}</span>`).join("");
  return `<div class="chart"><h3>${esc(title)}</h3><svg width="${w}" height="${h}" data-x0="${x0}" data-x1="${x1}" data-l="${L}" data-r="${R}">${g}${cur}</svg><div class="legend">${legend}</div></div>`;
}
function renderCurves() {
  const keys = Object.keys(D.curves);
  const rewardKeys = ["reward/mean"].concat(keys.filter(k => k.startsWith("eval/") && !k.includes("variance")));
  const other = keys.includes("rollout/response_len_mean") ? ["rollout/response_len_mean"] : keys.filter(k => !rewardKeys.includes(k)).slice(0, 1);
  const errs = keys.filter(k => k === "reward/invalid_frac" || k === "rollout/truncation_rate");
  const html = chart("reward (train) and held-out", rewardKeys) + chart("response length", other) + chart("reward errors / budget reached", errs);
  $("curves").innerHTML = html || '<span class="muted">no metric curves (rollouts/metrics.jsonl is empty)</span>';
  for (const svg of $("curves").querySelectorAll("svg")) svg.addEventListener("click", ev => {
    const r = svg.getBoundingClientRect(), d = svg.dataset, L = +d.l, W = r.width - L - (+d.r);
    const x = +d.x0 + (ev.clientX - r.left - L) / W * (+d.x1 - +d.x0);
    if (!D.steps.length) return;
    S.step = D.steps.reduce((a, b) => Math.abs(b - x) < Math.abs(a - x) ? b : a); S.page = 0; S.all = false; update();
  });
}

// ---------------------------------------------------------------- rows
function rewardClass(r, err) { return err ? "rerr" : r == null ? "rerr" : r >= 1 ? "r1" : r <= 0 ? "r0" : "rmid"; }
function matches(r, q) {
  const rw = r[F.reward];
  if (S.reward === "1" && rw !== 1) return false;
  if (S.reward === "0" && rw !== 0) return false;
  if (S.reward === "other" && (rw === null || rw === 0 || rw === 1)) return false;
  if (S.reward === "none" && rw !== null) return false;
  if (S.errors && !r[F.error]) return false;
  if (S.trunc && r[F.finish] !== "length") return false;
  if (q) {
    const p = D.prompts[r[F.prompt]];
    const hay = (p[0] + "\n" + (p[1] ?? "") + "\n" + r[F.completion] + "\n" + (r[F.error] || "")).toLowerCase();
    if (!hay.includes(q)) return false;
  }
  return true;
}
function groups() {
  const q = S.q.trim().toLowerCase(), out = [];
  for (const step of (S.all ? D.steps : [S.step])) {
    const byG = new Map();
    for (const r of D.rows[String(step)] || []) {
      if (!byG.has(r[F.group])) byG.set(r[F.group], []);
      byG.get(r[F.group]).push(r);
    }
    for (const [gid, rows] of byG) {
      const shown = rows.filter(r => matches(r, q));
      if (shown.length) out.push({step, gid, rows, shown});
    }
  }
  return out;
}
function groupHead(g) {
  const p = D.prompts[g.rows[0][F.prompt]];
  const chips = g.rows.map(r => `<span class="chip ${rewardClass(r[F.reward], r[F.error])}" title="row ${r[F.row]}">${r[F.error] ? "err" : fmt(r[F.reward], 2)}</span>`).join("");
  const advs = g.rows.map(r => `<span class="chip">${r[F.advantage] == null ? "–" : (r[F.advantage] >= 0 ? "+" : "") + r[F.advantage].toFixed(2)}</span>`).join("");
  return `<tr class="ghead" data-step="${g.step}" data-group="${g.gid}"><td colspan="10"><b>step ${g.step}</b> · group ${g.gid} · <span class="pick">${esc(g.rows[0][F.pick])}</span>
   · <button class="cmp" data-prompt="${g.rows[0][F.prompt]}">compare steps</button>
   <pre>${esc(p[0])}</pre>${p[1] != null ? `<div>answer: <code>${esc(p[1])}</code></div>` : ""}
   <div>rewards ${chips}</div><div>advantages ${advs}</div></td></tr>`;
}
// empty or whitespace-only completions are shown as a quoted string, so they are never an invisible cell
const showText = t => String(t ?? "").trim() ? `<pre class="txt">${esc(t)}</pre>` : `<span class="muted">${esc(JSON.stringify(t ?? ""))} (blank)</span>`;
// an agent episode's turns: each turn's tool calls, reward and advantage (the credit each turn got)
const turnsHtml = ts => !ts ? "" : `<table class="turns">` + ts.map(([k, calls, rw, adv, n]) =>
  `<tr class="turn"><td>turn ${k}</td><td>${calls == null ? "" : calls.length ? calls.map(esc).join("<br>") : '<span class="muted">no call</span>'}</td>` +
  `<td>r ${fmt(rw)}</td><td class="tadv">adv ${adv == null ? "–" : (adv >= 0 ? "+" : "") + adv.toFixed(3)}</td><td class="muted">${n ?? ""} tok</td></tr>`).join("") + `</table>`;
function rowHtml(r, step) {
  const comps = D.components.map((k, i) => r[F.components] && r[F.components][i] != null ? `${esc(k)}=${fmt(r[F.components][i])}` : "").filter(Boolean)
    // what rewards logged for the row (TRL's log_extra columns, a failed component's "<reward>/error")
    .concat(Object.entries(r[F.extra] || {}).map(([k, v]) => `<span class="muted">${esc(k)}: ${esc(typeof v === "string" ? v : JSON.stringify(v))}</span>`)).join("<br>");
  const err = r[F.error];
  return `<tr class="row" data-step="${step}" data-row="${r[F.row]}" data-err="${err ? 1 : 0}" data-finish="${esc(r[F.finish])}">
   <td class="num">${r[F.row]}</td><td>${showText(r[F.completion])}${turnsHtml(r[F.turns])}</td>
   <td><span class="chip ${rewardClass(r[F.reward], err)}">${err ? "none" : fmt(r[F.reward])}</span></td><td>${comps}</td>
   <td class="num">${fmt(r[F.advantage])}</td><td class="${r[F.finish] === "length" ? "trunc" : ""}"${r[F.finish] === "length" ? ' title="stopped at max_new_tokens (finish reason: length)"' : ""}>${esc(finishText(r[F.finish]))}</td>
   <td class="num">${r[F.length]}</td><td class="num">${r[F.policy_version]} / ${r[F.staleness] ?? "–"}</td>
   <td class="num">${fmt(r[F.logprob])}</td><td class="err">${esc(err || "")}</td></tr>`;
}
function renderRows() {
  const gs = groups(), n = Math.max(1, S.pagesize), pages = Math.max(1, Math.ceil(gs.length / n));
  S.page = Math.min(Math.max(0, S.page), pages - 1);
  const page = gs.slice(S.page * n, S.page * n + n);
  const nrows = gs.reduce((a, g) => a + g.shown.length, 0);
  $("tbody").innerHTML = page.map(g => groupHead(g) + g.shown.map(r => rowHtml(r, g.step)).join("")).join("")
    || `<tr><td colspan="10" class="muted">no rows match the filters</td></tr>`;
  $("pager").innerHTML = `<button id="pg-prev">◀ page</button><span id="pg-info" data-rows="${nrows}" data-groups="${gs.length}">` +
    `${S.all ? "all steps" : "step " + S.step}: ${nrows} rows in ${gs.length} groups · page ${S.page + 1} / ${pages}</span><button id="pg-next">page ▶</button>`;
  $("pg-prev").onclick = () => { S.page--; update(); };
  $("pg-next").onclick = () => { S.page++; update(); };
  for (const b of document.querySelectorAll("button.cmp")) b.onclick = () => { S.diff = +b.dataset.prompt; S.a = S.b = null; update(); };
}

// ---------------------------------------------------------------- two-step diff of one prompt
let promptSteps = null;
function stepsOf(pi) {
  if (!promptSteps) {
    promptSteps = new Map();
    for (const s of D.steps) for (const r of D.rows[String(s)]) {
      const l = promptSteps.get(r[F.prompt]) || []; if (l[l.length - 1] !== s) l.push(s); promptSteps.set(r[F.prompt], l);
    }
  }
  return promptSteps.get(pi) || [];
}
function wordDiff(a, b) {
  const x = a.split(/(\s+)/), y = b.split(/(\s+)/);
  if (x.length * y.length > 4e6) return `<pre>${esc(b)}</pre>`;
  const m = x.length, n = y.length, L = Array.from({length: m + 1}, () => new Uint16Array(n + 1));
  for (let i = m - 1; i >= 0; i--) for (let j = n - 1; j >= 0; j--) L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  let i = 0, j = 0, out = "";
  while (i < m && j < n) {
    if (x[i] === y[j]) { out += esc(x[i]); i++; j++; } else if (L[i + 1][j] >= L[i][j + 1]) out += `<del>${esc(x[i++])}</del>`; else out += `<ins>${esc(y[j++])}</ins>`;
  }
  while (i < m) out += `<del>${esc(x[i++])}</del>`; while (j < n) out += `<ins>${esc(y[j++])}</ins>`;
  return `<pre>${out}</pre>`;
}
function renderDiff() {
  const box = $("diff");
  if (S.diff == null || !D.prompts[S.diff]) { box.className = "hidden"; box.innerHTML = ""; return; }
  const steps = stepsOf(S.diff);
  const a = steps.includes(S.a) ? S.a : steps[0], b = steps.includes(S.b) ? S.b : steps[steps.length - 1];
  const rowsAt = s => (D.rows[String(s)] || []).filter(r => r[F.prompt] === S.diff).sort((u, v) => (v[F.reward] ?? -1e9) - (u[F.reward] ?? -1e9));
  const col = s => `<div><h4>step ${s}</h4>` + rowsAt(s).map(r => `<div class="crow"><span class="chip ${rewardClass(r[F.reward], r[F.error])}">${r[F.error] ? "err" : fmt(r[F.reward], 2)}</span><span class="muted">adv ${fmt(r[F.advantage], 2)}</span>${showText(r[F.completion])}</div>`).join("") + "</div>";
  const opts = sel => steps.map(s => `<option value="${s}" ${s === sel ? "selected" : ""}>${s}</option>`).join("");
  const ra = rowsAt(a), rb = rowsAt(b);
  box.className = "";
  box.innerHTML = `<b>Same prompt at two steps</b> <button id="diff-close">close</button><pre>${esc(D.prompts[S.diff][0])}</pre>
    <label>step A <select id="diff-a">${opts(a)}</select></label> <label>step B <select id="diff-b">${opts(b)}</select></label>
    <span class="muted"> (the prompt has rollouts at ${steps.length} inspected steps)</span>
    <div>best completion, A → B: ${ra.length && rb.length ? wordDiff(ra[0][F.completion], rb[0][F.completion]) : ""}</div>
    <div class="cols">${col(a)}${col(b)}</div>`;
  $("diff-close").onclick = () => { S.diff = null; update(); };
  $("diff-a").onchange = e => { S.a = +e.target.value; S.b = b; update(); };
  $("diff-b").onchange = e => { S.b = +e.target.value; S.a = a; update(); };
}

// ---------------------------------------------------------------- controls
function stepStats(s) {
  const rows = D.rows[String(s)] || [], ok = rows.filter(r => r[F.reward] != null);
  return {mean: ok.length ? ok.reduce((a, r) => a + r[F.reward], 0) / ok.length : null, errors: rows.filter(r => r[F.error]).length, n: rows.length};
}
function initControls() {
  const sl = $("slider"); sl.max = Math.max(0, D.steps.length - 1);
  $("steplist").innerHTML = D.steps.map(s => { const t = stepStats(s); return `<option value="${s}">step ${s} · r̄ ${fmt(t.mean, 2)}${t.errors ? " · " + t.errors + " err" : ""}</option>`; }).join("");
  const setStep = s => { S.step = s; S.page = 0; update(); };
  sl.oninput = () => setStep(D.steps[+sl.value]);
  $("steplist").onchange = e => setStep(+e.target.value);
  $("prev").onclick = () => { const i = D.steps.indexOf(S.step); if (i > 0) setStep(D.steps[i - 1]); };
  $("next").onclick = () => { const i = D.steps.indexOf(S.step); if (i < D.steps.length - 1) setStep(D.steps[i + 1]); };
  $("f-reward").onchange = e => { S.reward = e.target.value; S.page = 0; update(); };
  $("f-errors").onchange = e => { S.errors = e.target.checked; S.page = 0; update(); };
  $("f-trunc").onchange = e => { S.trunc = e.target.checked; S.page = 0; update(); };
  $("f-all").onchange = e => { S.all = e.target.checked; S.page = 0; update(); };
  let timer = null;
  $("f-q").oninput = e => { clearTimeout(timer); timer = setTimeout(() => { S.q = e.target.value; S.page = 0; update(); }, 150); };
  let total = 0, errs = 0; for (const s of D.steps) { const t = stepStats(s); total += t.n; errs += t.errors; }
  const skipped = D.skipped || [];  // lines of the files that were not records (a torn line of a killed run)
  $("summary").textContent = `${D.steps.length} inspected steps · ${total} rows · ${errs} rows with reward errors` +
    (skipped.length ? ` · ${skipped.length} unreadable line(s) left out: ${skipped.slice(0, 3).join("; ")}` : "");
}
function syncControls() {
  $("slider").value = Math.max(0, D.steps.indexOf(S.step)); $("steplist").value = String(S.step);
  $("f-reward").value = S.reward; $("f-errors").checked = S.errors; $("f-trunc").checked = S.trunc;
  $("f-all").checked = S.all; if ($("f-q").value !== S.q) $("f-q").value = S.q;
}
function update() { syncControls(); renderRows(); renderDiff(); renderCurves(); writeHash(); }

readHash(); initControls(); update();
const ms = performance.now();
document.body.dataset.loadMs = ms.toFixed(1); $("load-ms").textContent = ms.toFixed(0) + " ms";
// where the time went: HTML parse (until this script ran), JSON.parse, first render
document.body.dataset.phases = [T0, T1 - T0, ms - T1].map(x => x.toFixed(1)).join(",");
</script></body></html>
"""
