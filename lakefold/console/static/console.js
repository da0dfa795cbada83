// The console page: it uses only the console's JSON API (see /openapi.json). The overview
// arrives live as server-sent events (/api/stream); history, contents, dead letters and the
// audit are fetched; every action asks for confirmation first.
"use strict";

const { escapeXml: esc, formatNumber: num, formatDuration: duration, formatBytes: bytes,
  lineChart, dagSvg } = window.lakefoldCharts;
const $ = (selector) => document.querySelector(selector);
let latest = null;
const consoleInfo = { token_required: false, can_rebuild: false };
// The lag that needs a person (the alert rules' LakefoldProjectionLagging / CaptureLagging).
const LAG_LIMIT_S = 600;

function operator() { return $("#operator").value.trim() || "anonymous"; }

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    // X-Lakefold-Request: the mark of the console's own page (no form can send it)
    headers: { "X-Lakefold-Operator": operator(), "Content-Type": "application/json",
               "X-Lakefold-Request": "page", ...(options.headers || {}) },
  });
  const body = response.headers.get("content-type")?.includes("json")
    ? await response.json() : await response.text();
  if (response.status === 503) showBanner(body.error || "the store cannot be reached");
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function showBanner(text) {
  const banner = $("#banner");
  banner.textContent = "Store unavailable: " + text;
  banner.hidden = false;
}

function toast(text) {
  const box = $("#toast");
  box.textContent = text;
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

// ------------------------------------------------------------------ actions

function confirmAction(text, extra = "") {
  return new Promise((resolve) => {
    const dialog = $("#confirm");
    $("#confirm-text").textContent = text;
    $("#confirm-extra").innerHTML = extra;
    const finish = (ok) => {
      $("#confirm-yes").onclick = $("#confirm-no").onclick = null;
      const input = $("#confirm-extra input");
      dialog.close();
      resolve(ok ? (input ? input.value : true) : false);
    };
    $("#confirm-yes").onclick = () => finish(true);
    $("#confirm-no").onclick = () => finish(false);
    dialog.showModal();
  });
}

async function act(path, question, body, extra) {
  const answer = await confirmAction(question, extra);
  if (answer === false) return;
  const payload = extra ? { tables: String(answer).split(",").map((t) => t.trim())
    .filter(Boolean) } : body;
  try {
    const result = await api(path, { method: "POST",
      body: payload ? JSON.stringify(payload) : undefined });
    toast(result.message);
  } catch (error) {
    toast("Refused: " + error.message);
  }
  loadAudit();
  loadDeadLetters();
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  const { action, name, slot, id } = button.dataset;
  const enc = encodeURIComponent;
  if (action === "pause" || action === "resume") {
    act(`/api/projections/${enc(name)}/${action}`, `${action} projection ${name}?`);
  } else if (action === "rebuild") {
    act(`/api/projections/${enc(name)}/rebuild`,
      `Rebuild ${name} into a new generation (views that read it too)? The live one keeps ` +
      "serving until the new one has caught up and switches.");
  } else if (action === "capture-pause" || action === "capture-resume") {
    const verb = action.split("-")[1];
    act(`/api/captures/${enc(slot)}/${verb}`, `${verb} capture ${slot}?`);
  } else if (action === "resnapshot") {
    act(`/api/captures/${enc(slot)}/resnapshot`, `Re-snapshot tables of capture ${slot}?`,
      null, '<label>tables (schema.table, comma-separated) <input id="resnapshot-tables">' +
      "</label>");
  } else if (action === "retry" || action === "drop") {
    act(`/api/dead-letters/${enc(id)}/${action}`, `${action} dead letter ${id}?`);
  } else if (action === "show-letter") {
    api(`/api/dead-letters/${enc(id)}`).then((letter) => {
      const box = $(detail.kind ? "#detail-letter" : "#dead-letter");
      box.textContent = JSON.stringify(letter, null, 2);
      box.hidden = false;
    });
  } else if (action === "older" || action === "peek") {
    peek(button.dataset.kind, button.dataset.subject, button.dataset.before,
      button.dataset.into);
  }
});

// ------------------------------------------------------------------ the overview

function healthCell(health, text) {
  return `<span class="health-${esc(health)}">${esc(text)}</span>`;
}

// The pages of one item: #projection/NAME (a projection or view) and #capture/SLOT.
function projectionLink(name) {
  return `<a href="#projection/${esc(encodeURIComponent(name))}">${esc(name)}</a>`;
}

function captureLink(slot) {
  return `<a href="#capture/${esc(encodeURIComponent(slot))}">${esc(slot)}</a>`;
}

// The capture whose streams hold a changelog stream (null: none captures it).
function captureOf(overview, stream) {
  return overview.captures.find((c) => c.streams.includes(stream)) || null;
}

function dagLink(node) {
  const enc = encodeURIComponent;
  if (node.kind === "projection" || node.kind === "view") return `#projection/${enc(node.label)}`;
  if (node.kind === "capture") return `#capture/${enc(node.label)}`;
  if (node.kind === "target") return `#projection/${enc(node.id.split(":").slice(2).join(":"))}`;
  if (node.kind === "changelog" && latest) {
    const capture = captureOf(latest, node.label);
    return capture ? `#capture/${enc(capture.slot)}` : null;
  }
  return null;
}

function rebuildBar(p) {
  if (!p.rebuilding_generation) return "";
  const live = Object.values(p.position).reduce((a, b) => a + b, 0);
  const built = Object.values(p.rebuild_position).reduce((a, b) => a + b, 0);
  const pct = live > 0 ? Math.min(100, Math.round((100 * built) / live)) : 0;
  return `<div class="rebuild">→ gen ${p.rebuilding_generation} <span class="bar"
    role="progressbar" aria-valuenow="${pct}"><span style="width:${pct}%"></span></span>
    ${pct}% (switches when caught up)</div>`;
}

// What can be done to a projection or view: pause or resume, and rebuild when this console
// can.
function projectionActions(p) {
  return (p.paused
    ? `<button data-action="resume" data-name="${esc(p.name)}">resume</button>`
    : `<button data-action="pause" data-name="${esc(p.name)}">pause</button>`) +
    (consoleInfo.can_rebuild
      ? `<button data-action="rebuild" data-name="${esc(p.name)}">rebuild</button>` : "");
}

// What can be done to a capture: pause or resume its streaming, re-snapshot tables.
function captureActions(c) {
  return (c.paused
    ? `<button data-action="capture-resume" data-slot="${esc(c.slot)}">resume</button>`
    : `<button data-action="capture-pause" data-slot="${esc(c.slot)}">pause</button>`) +
    `<button data-action="resnapshot" data-slot="${esc(c.slot)}">re-snapshot</button>`;
}

// A dead letter's row (with the projection's name on the overview, without on its page).
function letterRow(d, { withName = true } = {}) {
  return `<tr data-letter="${d.id}"><td>${d.id}</td>${withName ? `<td>${esc(d.name)}</td>`
    : ""}<td>${esc(d.stage)}</td><td>${esc(d.source)}</td><td class="num">${d.position}</td>
    <td class="num">${d.attempts}</td><td class="status">${esc(d.status)}</td>
    <td class="error-text">${esc(d.error)}</td><td>
    <button data-action="show-letter" data-id="${d.id}">show</button>${d.status === "open"
      ? `<button data-action="retry" data-id="${d.id}">retry</button>
         <button data-action="drop" data-id="${d.id}">drop</button>` : ""}</td></tr>`;
}

function renderProjections(projections) {
  $("#projections tbody").innerHTML = projections.map((p) => `
    <tr data-projection="${esc(p.name)}">
      <td>${projectionLink(p.name)}</td><td>${esc(p.style)} → ${esc(p.target_spec)}</td>
      <td class="num">${p.generation}${rebuildBar(p)}</td>
      <td class="state">${healthCell(p.health, p.state)}</td>
      <td class="num lag">${num(p.lag_records)}</td>
      <td class="num lag-seconds${p.lag_seconds > LAG_LIMIT_S ? " health-failed" : ""}">
        ${duration(p.lag_seconds)}</td>
      <td class="num">${num(p.throughput_per_s)}</td>
      <td class="num dead">${p.dead_letters}</td>
      <td class="error-text">${esc(p.last_error || "")}</td>
      <td>${projectionActions(p)}</td>
    </tr>`).join("") || '<tr><td colspan="10" class="muted">no projections yet</td></tr>';
}

// What needs a person now, and why: one line each, worst first; "all is well" otherwise.
function renderHealth(overview) {
  const items = [];
  for (const p of overview.projections) {
    const error = p.last_error ? `: ${p.last_error}` : "";
    if (p.state === "failed") items.push(["failed", `projection ${p.name} failed${error}`]);
    else if (p.state === "retrying") {
      items.push(["warning", `projection ${p.name} is retrying${error}`]);
    }
    if (p.dead_letters) {
      items.push(["warning", `projection ${p.name} has ${p.dead_letters} open dead ` +
        `letter${p.dead_letters === 1 ? "" : "s"}: retry or drop them below`]);
    }
    if (p.lag_seconds > LAG_LIMIT_S) {
      items.push(["warning", `projection ${p.name} is ${duration(p.lag_seconds)} behind`]);
    }
  }
  for (const c of overview.captures) {
    if (c.status !== "ok") {
      const level = ["critical", "lost", "missing"].includes(c.status) ? "failed" : "warning";
      const why = c.problems.length ? c.problems.join("; ") : "no reason given";
      items.push([level, `capture ${c.slot} is ${c.status}: ${why}`]);
    }
  }
  const holder = overview.event_store.watermark_holder;
  if (overview.event_store.watermark_held && holder) {
    items.push(["warning", `${overview.event_store.pending_events} events wait behind ` +
      `a transaction open for ${duration(holder.held_for_s)} (pid ${holder.pid}, ` +
      `${holder.application || "no application name"})`]);
  }
  items.sort((a, b) => (a[0] === "failed" ? 0 : 1) - (b[0] === "failed" ? 0 : 1));
  const running = overview.projections.filter((p) => p.state === "running").length;
  $("#health").innerHTML = items.map(([level, text]) =>
    `<li class="health-${level}">${esc(text)}</li>`).join("") ||
    `<li class="health-ok">All is well: ${running} of ${overview.projections.length} ` +
    `projections and views running, ${overview.captures.length} capture(s) ok.</li>`;
}

function captureHealth(capture) {
  if (capture.status === "unknown") return "unknown";
  return capture.status === "ok" ? "ok"
    : ["critical", "lost", "missing"].includes(capture.status) ? "failed" : "warning";
}

function renderCaptures(captures) {
  $("#captures tbody").innerHTML = captures.map((c) => {
    const snap = c.snapshots.map((s) => {
      const pct = s.tables ? Math.round((100 * s.tables_done) / s.tables) : 0;
      return `<div class="snapshot">${esc(s.kind)} snapshot ${s.snapshot_id}: ` +
        `${s.tables_done}/${s.tables} tables, ${num(s.rows)} rows <span class="bar" ` +
        `role="progressbar" aria-valuenow="${pct}"><span style="width:${pct}%"></span></span>` +
        "</div>";
    }).join("");
    const health = captureHealth(c);
    const why = c.status === "ok" ? "" : `<div class="muted error-text">${
      esc(c.problems.join("; ") || "no reason given")}</div>`;
    return `<tr data-slot="${esc(c.slot)}"><td>${captureLink(c.slot)}</td>
      <td>${esc(c.source)}</td>
      <td>${healthCell(health, c.status + (c.paused ? " (paused)" : ""))}${why}</td>
      <td>${esc(c.wal_status ?? "-")}</td>
      <td class="num">${c.safe_wal_size === null ? "unlimited" : bytes(c.safe_wal_size)}</td>
      <td class="num">${c.lag_bytes === null ? "-" : bytes(c.lag_bytes)}</td>
      <td class="num">${c.lag_seconds === null ? "-" : duration(c.lag_seconds)}</td>
      <td class="num">${num(c.changes_per_s)}</td><td>${snap || "-"}</td>
      <td>${captureActions(c)}</td>
    </tr>`;
  }).join("") || '<tr><td colspan="10" class="muted">no captures</td></tr>';
}

function renderEventStore(store) {
  const holder = store.watermark_holder;
  $("#eventstore").innerHTML = `<div class="row"><span>head <b id="head">${num(store.head)}
    </b></span><span>${num(store.events_per_s)} events/s</span>
    <span>${store.pending_events} pending</span>
    <span>${holder ? healthCell(store.watermark_held ? "failed" : "warning",
      `watermark held by pid ${holder.pid} (${holder.application || "?"}) for ` +
      `${duration(holder.held_for_s)}`) : healthCell("ok", "watermark free")}</span></div>`;
  $("#subscriptions tbody").innerHTML = store.subscriptions.map((s) => `<tr>
    <td>${esc(s.name)}</td><td class="num">${s.position}</td><td class="num">${s.lag}</td>
    </tr>`).join("") || '<tr><td colspan="3" class="muted">no subscriptions</td></tr>';
}

function fillPicker(select, names) {
  const current = select.value;
  const options = ['<option value="">—</option>', ...names.map((n) =>
    `<option value="${esc(n)}">${esc(n)}</option>`)].join("");
  if (select.dataset.names !== names.join("\n")) {
    select.innerHTML = options;
    select.dataset.names = names.join("\n");
    select.value = names.includes(current) ? current : "";
  }
}

function render(overview, { stale = false } = {}) {
  if (!stale) latest = overview;
  $("main").classList.toggle("stale", stale);
  $("#read-at").textContent = (stale ? "last read " : "read ") + overview.read_at.slice(11, 19) +
    " UTC" + (stale ? ": what follows may no longer be true" : "");
  renderHealth(overview);
  renderProjections(overview.projections);
  renderCaptures(overview.captures);
  renderEventStore(overview.event_store);
  $("#dag").innerHTML = dagSvg(overview.dag, dagLink);
  renderDetail();
  fillPicker($("#stream-pick"), overview.captures.flatMap((c) => c.streams));
  fillPicker($("#view-pick"), overview.projections.filter((p) =>
    ["delta", "redis"].includes(p.target)).map((p) => p.name));
}

function unknownHealth(overview) {
  const copy = structuredClone(overview);
  for (const p of copy.projections) { p.health = "unknown"; p.state = `${p.state}?`; }
  for (const c of copy.captures) c.status = "unknown";
  for (const n of copy.dag.nodes) n.health = "unknown";
  return copy;
}

function connect() {
  const source = new EventSource("/api/stream");
  source.addEventListener("overview", (event) => {
    const data = JSON.parse(event.data);
    $("#live").textContent = "live";
    $("#live").className = "pill on";
    if (data.ok) {
      $("#banner").hidden = true;
      render(data.overview);
    } else {
      showBanner(data.error);
      $("#live").textContent = "store down";
      $("#live").className = "pill off";
      // What was last read stays on the page, greyed, every health unknown: nothing can
      // say whether a capture or a projection is still ok while the store is down.
      if (latest) render(unknownHealth(latest), { stale: true });
      $("#health").innerHTML = `<li class="health-failed">${esc(data.error)}</li>`;
    }
  });
  source.onerror = () => {
    $("#live").textContent = "reconnecting…";
    $("#live").className = "pill off";
  };
}

// ------------------------------------------------------------------ one item's page

// #projection/NAME and #capture/SLOT open one item's page in place of the overview: its
// state, lag with units, throughput, last batches, errors in full, dead letters, inputs,
// readers and target, and its history; "#" goes back.
const detail = { kind: null, name: null, batches: null, letters: null, streams: null,
  error: null };

function route() {
  const found = /^#(projection|capture)\/(.+)$/.exec(location.hash);
  Object.assign(detail, { kind: found ? found[1] : null, batches: null, letters: null,
    streams: null, error: null,
    name: found ? decodeURIComponent(found[2]) : null });
  document.body.classList.toggle("detail-open", Boolean(found));
  if (found) {
    window.scrollTo(0, 0);
    loadDetail();
  }
  renderDetail();
}

async function loadDetail() {
  const { kind, name } = detail;
  if (!kind) return;
  const enc = encodeURIComponent;
  const still = () => detail.kind === kind && detail.name === name;
  try {
    if (kind === "projection") {
      const [batches, letters] = await Promise.all([
        api(`/api/projections/${enc(name)}/batches?limit=20`),
        api(`/api/dead-letters?projection=${enc(name)}&limit=100`)]);
      if (still()) Object.assign(detail, { batches, letters, error: null });
    } else {
      const streams = await api("/api/streams");
      if (still()) Object.assign(detail, { streams: streams.filter((x) => x.slot === name),
        error: null });
    }
  } catch (error) {
    if (still()) detail.error = error.message;
  }
  if (still()) renderDetail();
}

function facts(rows) {
  return `<table class="facts"><tbody>${rows.map(([label, value]) =>
    `<tr><th>${esc(label)}</th><td>${value}</td></tr>`).join("")}</tbody></table>`;
}

function ago(iso, now) {
  return `${duration(Math.max(0, (Date.parse(now) - Date.parse(iso)) / 1000))} ago ` +
    `<span class="muted">(${esc(iso.slice(0, 19).replace("T", " "))} UTC)</span>`;
}

function projectionPage(overview) {
  const p = overview.projections.find((x) => x.name === detail.name);
  if (!p) {
    return `<h2>${esc(detail.name)}</h2><p class="health-failed">no projection or view named ` +
      `${esc(detail.name)}</p>`;
  }
  const readers = overview.projections.filter((x) =>
    x.inputs.some((i) => i.kind === "view" && i.name === p.name));
  const inputOf = (i) => i.kind === "view" ? `view ${projectionLink(i.name)}`
    : i.kind === "changelog" ? `changelog ${esc(i.name)}${(() => {
      const c = captureOf(overview, i.name);
      return c ? ` (capture ${captureLink(c.slot)})` : "";
    })()}` : `events of ${esc(i.name)}`;
  const rows = [
    ["kind", `${esc(p.style)} → ${esc(p.target_spec)}`],
    ["state", healthCell(p.health, p.state) + (p.paused ? " (paused)" : "")],
    ["generation", `${p.generation}${rebuildBar(p)}`],
    ["behind by", duration(p.lag_seconds)],
    ["lag", `${num(p.lag_records)} records`],
    ["throughput", `${num(p.throughput_per_s)} records/s`],
    ["last batch", p.last_batch_at ? ago(p.last_batch_at, overview.read_at) : "none yet"],
    ["records processed", num(p.records_total)],
    ["errors", String(p.errors_total)],
    ["dead letters", `${p.dead_letters} open, ${p.dead_letters_total} ever`],
    ["key", esc(p.key ? p.key.join(", ") : "-")],
    ["reads", p.inputs.map(inputOf).join("<br>") || "-"],
    ["read by", readers.map((r) => `${esc(r.style)} ${projectionLink(r.name)}`)
      .join("<br>") || "-"],
    ["target", `${esc(p.target_spec)} <span class="muted">(generation ${p.generation})` +
      "</span>"],
  ];
  if (p.watermark !== null || p.late_events) {
    rows.push(["watermark", esc(p.watermark ?? "-")], ["late events", String(p.late_events)]);
  }
  const actions = projectionActions(p);
  const sources = p.sources.map((x) => `<tr><td>${esc(x.source)}</td>
    <td class="num">${num(x.position)}</td><td class="num">${num(x.head)}</td>
    <td class="num">${num(x.lag_records)}</td><td class="num">${duration(x.lag_seconds)}</td>
    </tr>`).join("") || '<tr><td colspan="5" class="muted">not started yet</td></tr>';
  const batches = detail.batches === null ? '<tr><td colspan="5" class="muted">reading…</td></tr>'
    : detail.batches.map((b) => `<tr><td class="num">${b.generation}</td>
      <td class="num">${b.batch_id}</td><td>${ago(b.committed_at, overview.read_at)}</td>
      <td class="num">${num(b.rows)}</td><td>${esc(Object.entries(b.end_position)
        .map(([k, v]) => `${k}: ${v}`).join(", "))}</td></tr>`).join("") ||
      '<tr><td colspan="5" class="muted">no batch yet</td></tr>';
  const letters = detail.letters === null ? '<tr><td colspan="7" class="muted">reading…</td></tr>'
    : detail.letters.map((d) => letterRow(d, { withName: false })).join("") ||
      '<tr><td colspan="8" class="muted">no dead letters</td></tr>';
  return `<h2>${esc(p.style)} ${esc(p.name)} ${actions}</h2>${facts(rows)}
    <h3>Last error</h3>${p.last_error ? `<pre class="error-text last-error">${
      esc(p.last_error)}</pre>` : '<p class="muted">none</p>'}
    <h3>Inputs</h3><div class="scroll"><table class="inputs"><thead><tr><th>input</th>
      <th>applied up to</th><th>head</th><th>lag (records)</th><th>behind by</th></tr></thead>
      <tbody>${sources}</tbody></table></div>
    <h3>Last batches</h3><div class="scroll"><table class="batches"><thead><tr>
      <th>generation</th><th>batch</th><th>committed</th><th>records</th><th>end position</th>
      </tr></thead><tbody>${batches}</tbody></table></div>
    <h3>Dead letters</h3><div class="scroll"><table class="letters"><thead><tr><th>id</th>
      <th>stage</th><th>source</th><th>position</th><th>attempts</th><th>status</th>
      <th>error</th><th>actions</th></tr></thead><tbody>${letters}</tbody></table></div>
    <pre id="detail-letter" hidden></pre>
    <h3>History</h3><div class="detail-charts">${charts(`projection:${p.name}`) ||
      '<p class="muted">no samples yet</p>'}</div>`;
}

function capturePage(overview) {
  const c = overview.captures.find((x) => x.slot === detail.name);
  if (!c) {
    return `<h2>capture ${esc(detail.name)}</h2><p class="health-failed">no capture with ` +
      `slot ${esc(detail.name)}</p>`;
  }
  const health = captureHealth(c);
  const rows = [
    ["source", esc(c.source) + (c.stream_prefix
      ? ` (streams prefixed <code>${esc(c.stream_prefix)}</code>)` : "")],
    ["health", healthCell(health, c.status) + (c.problems.length
      ? `<div class="error-text">${esc(c.problems.join("; "))}</div>` : "")],
    ["streaming", c.paused ? "paused" : c.active ? "active" : "no process streams it now"],
    ["wal_status", esc(c.wal_status ?? "-")],
    ["safe_wal_size", c.safe_wal_size === null ? "unlimited" : bytes(c.safe_wal_size)],
    ["lag", c.lag_bytes === null ? "-" : `${bytes(c.lag_bytes)} of WAL`],
    ["behind by", c.lag_seconds === null ? "-" : duration(c.lag_seconds)],
    ["WAL kept for it", c.retained_bytes === null ? "-" : bytes(c.retained_bytes)],
    ["changes", `${num(c.changes_per_s)}/s, ${num(c.records)} stored`],
  ];
  const snapshots = c.snapshots.map((x) => `<li>${esc(x.kind)} snapshot ${x.snapshot_id}: ` +
    `${x.tables_done}/${x.tables} tables, ${num(x.rows)} rows` +
    (x.last_error ? ` <span class="error-text">${esc(x.last_error)}</span>` : "") + "</li>")
    .join("");
  const actions = captureActions(c);
  const info = Object.fromEntries((detail.streams || []).map((x) => [x.name, x]));
  const streams = c.streams.map((name) => {
    const x = info[name];
    const readers = overview.projections.filter((p) =>
      p.inputs.some((i) => i.kind === "changelog" && i.name === name));
    return `<tr><td>${esc(name)}</td><td class="num">${x ? num(x.head) : "…"}</td>
      <td class="num">${x ? x.schema_version : "…"}</td>
      <td>${x && x.last_commit_ts ? ago(x.last_commit_ts, overview.read_at) : "-"}</td>
      <td>${readers.map((p) => projectionLink(p.name)).join(", ") || "-"}</td>
      <td><button data-action="peek" data-kind="stream" data-subject="${esc(name)}"
        data-into="#detail-inside">latest records</button></td></tr>`;
  }).join("") || '<tr><td colspan="6" class="muted">no streams</td></tr>';
  return `<h2>capture ${esc(c.slot)} ${actions}</h2>${facts(rows)}
    <h3>Last error</h3>${c.last_error ? `<pre class="error-text last-error">${
      esc(c.last_error)}</pre>` : '<p class="muted">none</p>'}
    <h3>Snapshots running</h3>${snapshots ? `<ul>${snapshots}</ul>` : '<p class="muted">none</p>'}
    <h3>Streams</h3><div class="scroll"><table class="streams"><thead><tr><th>stream</th>
      <th>head</th><th>schema version</th><th>last commit</th><th>read by</th><th></th></tr>
      </thead><tbody>${streams}</tbody></table></div>
    <div id="detail-inside" class="scroll"></div>
    <h3>History</h3><div class="detail-charts">${charts(`capture:${c.slot}`) ||
      '<p class="muted">no samples yet</p>'}</div>`;
}

function renderDetail() {
  const box = $("#detail");
  if (!detail.kind) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  // Parts the page fetched itself (a dead letter shown, a stream's records) survive a redraw.
  const kept = ["#detail-letter", "#detail-inside"].map((id) => [id, $(id)]);
  const back = '<p><a href="#" class="back">← overview</a></p>';
  const body = !latest ? '<p class="muted">reading…</p>'
    : detail.kind === "projection" ? projectionPage(latest) : capturePage(latest);
  box.innerHTML = back + (detail.error ? `<p class="health-failed">${esc(detail.error)}</p>`
    : "") + body;
  for (const [id, old] of kept) {
    const now = $(id);
    if (old && now) { now.innerHTML = old.innerHTML; now.hidden = old.hidden; }
  }
}

// ------------------------------------------------------------------ history

// The history is fetched whole once (and when the window changes), then only what is new.
const history = { minutes: null, last: null, series: {} };
const CHARTS = [
  ["lag_seconds", "behind by", duration, LAG_LIMIT_S],
  ["lag_records", "lag (records)", num, null],
  ["throughput_per_s", "records/s", num, null],
  ["lag_bytes", "lag (WAL)", bytes, null],
  ["changes_per_s", "changes/s", num, null],
  ["events_per_s", "events/s", num, null],
];

async function loadHistory() {
  const minutes = Number($("#history-minutes").value);
  const fresh = history.minutes !== minutes || history.last === null;
  const since = fresh ? "" : `&since=${encodeURIComponent(history.last)}`;
  let data;
  try {
    data = await api(`/api/history?minutes=${minutes}${since}`);
  } catch (error) {
    return;
  }
  if (fresh) { history.series = {}; history.minutes = minutes; }
  const oldest = Date.now() - minutes * 60000;
  for (const [subject, metrics] of Object.entries(data.series)) {
    for (const [metric, points] of Object.entries(metrics)) {
      const kept = ((history.series[subject] ||= {})[metric] ||= []);
      kept.push(...points);
      for (const [at] of points) if (!history.last || at > history.last) history.last = at;
    }
  }
  for (const metrics of Object.values(history.series)) {
    for (const [metric, points] of Object.entries(metrics)) {
      metrics[metric] = points.filter((p) => Date.parse(p[0]) >= oldest);
    }
  }
  $("#charts").innerHTML = Object.keys(history.series).sort().map((subject) =>
    charts(subject, subject === "eventstore" ? ["events_per_s"] : ["lag_seconds"])).join("") ||
    '<p class="muted">no samples yet</p>';
  renderDetail();
}

// The charts of one subject (projection:NAME, capture:SLOT, eventstore), of the metrics
// asked (all that it has by default); the title links to the subject's page.
function charts(subject, metrics = null) {
  const series = history.series[subject] || {};
  const [kind, ...rest] = subject.split(":");
  const name = rest.join(":");
  const title = kind === "projection" ? projectionLink(name)
    : kind === "capture" ? captureLink(name) : esc(subject);
  return CHARTS.filter(([metric]) => (!metrics || metrics.includes(metric)) &&
    series[metric] && series[metric].length).map(([metric, label, format, threshold]) =>
    `<div class="chart" data-subject="${esc(subject)}" data-metric="${esc(metric)}">
      <h3>${title}: ${esc(label)}</h3>${lineChart(series[metric], { format, threshold })}
    </div>`).join("");
}

// ------------------------------------------------------------------ look inside

function tableOf(rows) {
  if (!rows.length) return '<p class="muted">nothing here</p>';
  const columns = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  const cell = (v) => esc(typeof v === "object" && v !== null ? JSON.stringify(v) : v ?? "");
  return `<table class="peek"><thead><tr>${columns.map((c) => `<th>${esc(c)}</th>`).join("")}
    </tr></thead><tbody>${rows.map((r) => `<tr>${columns.map((c) =>
      `<td>${cell(r[c])}</td>`).join("")}</tr>`).join("")}</tbody></table>`;
}

async function peek(kind, subject, before, into = "#inside") {
  const enc = encodeURIComponent;
  const where = into || "#inside";
  const page = before ? `&before=${enc(before)}` : "";
  try {
    if (kind === "stream") {
      const data = await api(`/api/streams/${enc(subject)}/records?limit=20${page}`);
      $(where).innerHTML = `<p>stream <b>${esc(subject)}</b>, head ${data.head}, schema
        version ${data.schema_version}; newest first</p>${tableOf(data.records)}` +
        (data.next_before ? `<button data-action="older" data-kind="stream"
          data-subject="${esc(subject)}" data-before="${data.next_before}"
          data-into="${esc(where)}">older</button>` : "");
    } else {
      const data = await api(`/api/categories/${enc(subject)}/events?limit=20${page}`);
      $(where).innerHTML = `<p>category <b>${esc(subject)}</b>, head ${data.head};
        newest first</p>${tableOf(data.events)}` + (data.next_before ? `<button
          data-action="older" data-kind="category" data-subject="${esc(subject)}"
          data-before="${data.next_before}" data-into="${esc(where)}">older</button>` : "");
    }
  } catch (error) {
    $(where).textContent = error.message;
  }
}

async function viewRows() {
  const name = $("#view-pick").value;
  if (!name) return;
  const key = $("#view-key").value.split(",").map((k) =>
    `key=${encodeURIComponent(k.trim())}`).join("&");
  try {
    const data = await api(`/api/views/${encodeURIComponent(name)}/rows?${key}`);
    $("#inside").innerHTML = `<p>view <b>${esc(name)}</b> generation ${data.generation},
      key ${esc(data.key_columns.join(", "))} = ${esc(data.key.join(", "))}</p>` +
      tableOf(data.rows);
  } catch (error) {
    $("#inside").textContent = error.message;
  }
}

async function loadCategories() {
  try {
    fillPicker($("#category-pick"), await api("/api/categories"));
  } catch (error) { /* the banner says why */ }
}

async function loadDeadLetters() {
  let letters;
  try { letters = await api("/api/dead-letters?limit=100"); } catch (error) { return; }
  $("#dead-letters tbody").innerHTML = letters.map((d) => letterRow(d)).join("") ||
    '<tr><td colspan="9" class="muted">no dead letters</td></tr>';
}

async function loadAudit() {
  let rows;
  try { rows = await api("/api/audit?limit=30"); } catch (error) { return; }
  $("#audit tbody").innerHTML = rows.map((a) => `<tr><td>${esc(a.at.slice(0, 19))}</td>
    <td>${esc(a.who)}</td><td>${esc(a.action)}</td><td>${esc(a.subject)}</td>
    <td>${esc(a.outcome)}</td></tr>`).join("") ||
    '<tr><td colspan="5" class="muted">nothing done yet</td></tr>';
}

// ------------------------------------------------------------------ start

$("#operator").value = localStorage.getItem("lakefold-operator") || "";
$("#operator").addEventListener("change", () =>
  localStorage.setItem("lakefold-operator", $("#operator").value));
// One picker at a time: choosing in one clears the others, so what the pickers show is what
// is shown below them.
function pickOnly(kept) {
  for (const id of ["#stream-pick", "#category-pick", "#view-pick"]) {
    if (id !== kept) $(id).value = "";
  }
  if (kept !== "#view-pick") $("#view-key").value = "";
}
$("#stream-pick").addEventListener("change", (e) => {
  pickOnly("#stream-pick");
  if (e.target.value) peek("stream", e.target.value); else $("#inside").innerHTML = "";
});
$("#category-pick").addEventListener("change", (e) => {
  pickOnly("#category-pick");
  if (e.target.value) peek("category", e.target.value); else $("#inside").innerHTML = "";
});
$("#view-pick").addEventListener("change", () => {
  pickOnly("#view-pick");
  $("#inside").innerHTML = "";
});
$("#view-go").addEventListener("click", viewRows);
window.addEventListener("hashchange", route);
$("#history-minutes").addEventListener("change", loadHistory);
$("#logout").addEventListener("click", async () => {
  await api("/logout", { method: "POST" }).catch(() => null);
  location.reload();
});
api("/api/console").then((info) => {
  Object.assign(consoleInfo, info);
  $("#logout").hidden = !info.token_required;
  if (latest) render(latest);
}).catch(() => null);
connect();
route();
loadHistory();
loadCategories();
loadDeadLetters();
loadAudit();
setInterval(loadHistory, 10000);
setInterval(loadDeadLetters, 3000);
setInterval(loadCategories, 15000);
setInterval(loadAudit, 10000);
setInterval(loadDetail, 3000);
