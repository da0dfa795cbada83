// Small SVG drawings for the console, by hand (no library, no CDN): a line chart of a time
// series and the DAG laid out in columns. Both return SVG text built from escaped values.
(function () {
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function escapeXml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

function formatNumber(value) {
  const v = Number(value);
  if (Math.abs(v) >= 1e9) return (v / 1e9).toFixed(1) + "G";
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (Math.abs(v) >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return Number.isInteger(v) ? String(v) : v.toFixed(2);
}

// A duration for a person: "0 s", "42 s", "12 min", "3.5 h", "2.1 d".
function formatDuration(seconds) {
  const s = Number(seconds);
  if (!Number.isFinite(s)) return "-";
  if (s < 90) return `${s < 10 ? s.toFixed(1).replace(/\.0$/, "") : Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

// A size for a person, in binary units: "512 B", "1.5 KiB", "2.0 GiB".
function formatBytes(bytes) {
  let v = Number(bytes);
  if (!Number.isFinite(v)) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
}

// points: [[isoTime, value], ...] in time order; format: how a value reads (its unit);
// threshold: a value drawn as a dashed line, the chart scaled to show it.
function lineChart(points, { width = 320, height = 120, format = formatNumber,
                             threshold = null } = {}) {
  const pad = { left: 52, right: 6, top: 8, bottom: 16 };
  if (!points.length) {
    return `<svg viewBox="0 0 ${width} ${height}"><text x="${width / 2}" y="${height / 2}"
      text-anchor="middle">no samples yet</text></svg>`;
  }
  const times = points.map((p) => Date.parse(p[0]));
  const values = points.map((p) => Number(p[1]));
  const t0 = Math.min(...times), t1 = Math.max(...times, t0 + 1);
  const vmax = Math.max(...values, threshold ?? 0, 1e-9);
  const x = (t) => pad.left + ((t - t0) / (t1 - t0)) * (width - pad.left - pad.right);
  const y = (v) => height - pad.bottom - (v / vmax) * (height - pad.top - pad.bottom);
  const line = points.map((_, i) => `${x(times[i]).toFixed(1)},${y(values[i]).toFixed(1)}`);
  const label = (t) => new Date(t).toISOString().slice(11, 16);
  const over = threshold !== null && values.some((v) => v > threshold);
  const limit = threshold === null ? "" : `<line class="threshold" x1="${pad.left}"
      y1="${y(threshold).toFixed(1)}" x2="${width - pad.right}" y2="${y(threshold).toFixed(1)}"/>
      <text class="threshold" x="${width - pad.right}" y="${(y(threshold) - 2).toFixed(1)}"
      text-anchor="end">${escapeXml(format(threshold))}</text>`;
  return `<svg viewBox="0 0 ${width} ${height}" preserveAspectRatio="none"
      class="${over ? "over" : ""}">
    <line x1="${pad.left}" y1="${height - pad.bottom}" x2="${width - pad.right}"
      y2="${height - pad.bottom}" stroke="#ccd"/>
    <text x="2" y="${pad.top + 8}">${escapeXml(format(vmax))}</text>
    <text x="2" y="${height - pad.bottom}">0</text>
    <text x="${pad.left}" y="${height - 3}">${label(t0)}</text>
    <text x="${width - pad.right}" y="${height - 3}" text-anchor="end">${label(t1)}</text>
    ${limit}<polyline points="${line.join(" ")}"/>
  </svg>`;
}

// dag: {nodes: [{id, kind, label, health, column}], edges: [{from, to}]}; linkOf(node): the
// page a node opens (a URL) or null.
function dagSvg(dag, linkOf = () => null) {
  const colWidth = 190, rowHeight = 44, boxW = 160, boxH = 30;
  const rows = {};
  const place = {};
  for (const node of dag.nodes) {
    const r = rows[node.column] = (rows[node.column] || 0) + 1;
    place[node.id] = { x: 10 + node.column * colWidth, y: 10 + (r - 1) * rowHeight };
  }
  const columns = Math.max(1, ...dag.nodes.map((n) => n.column + 1));
  const height = 20 + Math.max(1, ...Object.values(rows)) * rowHeight;
  const width = 20 + columns * colWidth;
  const edges = dag.edges.filter((e) => place[e.from] && place[e.to]).map((e) => {
    const a = place[e.from], b = place[e.to];
    const x1 = a.x + boxW, y1 = a.y + boxH / 2, x2 = b.x, y2 = b.y + boxH / 2;
    const mid = (x1 + x2) / 2;
    return `<path class="edge" data-from="${escapeXml(e.from)}" data-to="${escapeXml(e.to)}"
      d="M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}"/>`;
  });
  const nodes = dag.nodes.map((n) => {
    const p = place[n.id];
    const text = n.label.length > 24 ? n.label.slice(0, 23) + "…" : n.label;
    const link = linkOf(n);
    const box = `<g class="node ${escapeXml(n.health)}" data-id="${escapeXml(n.id)}"
      data-kind="${escapeXml(n.kind)}" data-health="${escapeXml(n.health)}">
      <title>${escapeXml(n.kind + " " + n.label + ": " + n.health)}</title>
      <rect x="${p.x}" y="${p.y}" width="${boxW}" height="${boxH}"/>
      <text x="${p.x + 6}" y="${p.y + 13}">${escapeXml(n.kind)}</text>
      <text x="${p.x + 6}" y="${p.y + 25}" font-weight="600">${escapeXml(text)}</text></g>`;
    return link ? `<a href="${escapeXml(link)}">${box}</a>` : box;
  });
  return `<svg xmlns="${SVG_NS}" viewBox="0 0 ${width} ${height}" height="${height}">
    <defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6"
      markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#8a93a5"/></marker></defs>
    ${edges.join("")}${nodes.join("")}</svg>`;
}

window.lakefoldCharts = { escapeXml, formatNumber, formatDuration, formatBytes, lineChart,
  dagSvg };
})();
