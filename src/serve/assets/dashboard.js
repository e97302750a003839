// The gpulock dashboard's logic: polls /api/status and /api/queue every 2 s and /api/usage
// every minute, and redraws the tables and the usage chart (inline SVG) in place, without
// reloading the page. Text from the server only ever goes in through textContent.
"use strict";

const POLL_MS = 2000;
const USAGE_POLL_MS = 60000;
const state = { updates: 0, lastOk: 0 };
window.gpulockDashboard = state;  // for tests and curious people: how many updates arrived

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  seconds = Math.max(0, Math.floor(seconds));
  const d = Math.floor(seconds / 86400), h = Math.floor(seconds % 86400 / 3600);
  const m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(s).padStart(2, "0")}s`;
  return `${s}s`;
}

function gib(bytes) { return (bytes / 1073741824).toFixed(1); }

function bar(fraction, text) {
  const cell = el("td");
  const outer = el("span", null, { class: "bar" });
  const inner = el("span");
  inner.style.width = `${Math.round(Math.min(1, Math.max(0, fraction)) * 100)}%`;
  outer.appendChild(inner);
  cell.appendChild(outer);
  cell.appendChild(document.createTextNode(text));
  return cell;
}

// A GPU held by shared leases (by memory): in the holder cell, what is reserved and what is
// left, then one line per lease with its reservation (marked when it uses more); its labels; and
// how long the oldest has held it.
function appendShared(tr, shared, now) {
  const n = shared.jobs;
  const cell = el("td", null, { class: "holder shared" });
  cell.appendChild(el("div", `shared by ${n} lease${n === 1 ? "" : "s"}: ` +
                      `${gib(shared.reserved_bytes)} GiB reserved, ` +
                      `${gib(shared.unreserved_bytes)} GiB free to reserve`,
                      { class: "shared-summary" }));
  for (const l of shared.leases) {
    const over = l.over_reservation
      ? ` OVER: uses ${gib(l.memory_used_bytes)} GiB` : "";
    cell.appendChild(el("div", `${l.user} (${l.lease_id}) ${gib(l.memory_bytes)} GiB${over}`,
                        { class: l.over_reservation ? "shared-lease over" : "shared-lease",
                          "data-lease": l.lease_id, title: l.command }));
  }
  tr.appendChild(cell);
  tr.appendChild(el("td", shared.leases.map((l) => l.label).filter((x) => x).join(", "),
                    { class: "label" }));
  const started = shared.leases.map((l) => l.started_at);
  tr.appendChild(el("td", started.length ? duration(now - Math.min(...started)) : "",
                    { class: "held" }));
}

function renderGpus(status) {
  const body = document.querySelector("#gpus tbody");
  const rows = [];
  for (const g of status.gpus) {
    const shownState = g.reserved_for ? "reserved" : g.state;
    const name = g.host === status.host ? g.display_index : `${g.host}/${g.display_index}`;
    const tr = el("tr", null, { "data-gpu": name, "data-state": shownState });
    tr.appendChild(el("td", name, { title: g.uuid }));
    tr.appendChild(el("td", shownState + (g.idle ? " (idle)" : ""), { class: "state" }));
    const h = g.holder;
    if (g.shared) {
      tr.setAttribute("data-shared", String(g.shared.jobs));
      appendShared(tr, g.shared, status.taken_at);
    } else {
      let holder = "";
      const foreign = (g.processes || []).filter((p) => p.foreign)
        .map((p) => `pid ${p.pid}${p.user ? ` (${p.user})` : ""}`);
      if (h) holder = `${h.user} (${h.lease_id})`;
      else if (g.reserved_for) holder = `reserved for ${g.reserved_for.user}`;
      else if (foreign.length) holder = `foreign: ${foreign.join(", ")}`;
      else if (g.note) holder = g.note;
      tr.appendChild(el("td", holder, { class: "holder", title: h ? h.command : "" }));
      tr.appendChild(el("td", h ? h.label : "", { class: "label" }));
      tr.appendChild(el("td", h ? duration(h.held_seconds) : "", { class: "held" }));
    }
    const util = g.utilization_percent;
    tr.appendChild(util === null ? el("td", "?") : bar(util / 100, `${util}%`));
    if (g.memory_total_bytes)
      tr.appendChild(bar((g.memory_used_bytes || 0) / g.memory_total_bytes,
                         `${gib(g.memory_used_bytes || 0)} / ${gib(g.memory_total_bytes)} GiB`));
    else tr.appendChild(el("td", "?"));
    rows.push(tr);
  }
  body.replaceChildren(...rows);
}

function renderAlerts(status) {
  const list = document.getElementById("alerts");
  const items = [];
  for (const g of status.gpus) {
    if (!g.idle || !g.holder) continue;
    items.push(el("li", `idle: GPU ${g.display_index} leased by ${g.holder.user} ` +
                  `(lease ${g.holder.lease_id}) at 0% for ${duration(g.idle_seconds)}`,
                  { class: "idle", "data-gpu": g.display_index }));
  }
  for (const i of status.intruders || [])
    items.push(el("li", `intruder: pid ${i.pid}${i.user ? ` (${i.user})` : ""} on GPU ${i.gpu} ` +
                  `leased by ${i.holder_user} (lease ${i.lease_id})`,
                  { class: "intruder", "data-pid": String(i.pid) }));
  if (!items.length) {
    const after = status.idle_after_seconds;
    items.push(el("li", `none (idle means 0% for ${after ? duration(after) : "idle_after"})`,
                  { class: "none" }));
  }
  list.replaceChildren(...items);
}

function renderQueue(queue, now) {
  document.getElementById("queue-policy").textContent = `(${queue.policy})`;
  const rows = queue.waiting.map((e) => {
    const tr = el("tr", null, { "data-ticket": e.ticket_id });
    tr.appendChild(el("td", e.position));
    tr.appendChild(el("td", e.user));
    tr.appendChild(el("td", e.gpus_requested));
    tr.appendChild(el("td", e.priority));
    tr.appendChild(el("td", duration(now - e.waiting_since)));
    tr.appendChild(el("td", e.standing));
    tr.appendChild(el("td", e.blocked_by, { class: "waits-for" }));
    tr.appendChild(el("td", e.label));
    tr.appendChild(el("td", e.command, { class: "command" }));
    return tr;
  });
  if (!rows.length) {
    const tr = el("tr");
    tr.appendChild(el("td", "nobody is waiting", { colspan: "9", class: "note" }));
    rows.push(tr);
  }
  document.querySelector("#queue tbody").replaceChildren(...rows);
}

// The usage document's rows as {user, day, hours}. Accepts an array under "rows" or "groups"
// whose entries carry user, day (or date) and gpu_hours.
function usageRows(doc) {
  const list = doc.rows || doc.groups || [];
  return list.filter((r) => r.user !== undefined && (r.day || r.date))
             .map((r) => ({ user: r.user, day: r.day || r.date, hours: Number(r.gpu_hours) || 0 }));
}

const PALETTE = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#c62828", "#00838f", "#9e9d24",
                 "#5d4037", "#ad1457", "#455a64"];

function renderUsage(doc) {
  const box = document.getElementById("usage");
  const rows = usageRows(doc);
  if (!rows.length) { box.replaceChildren(el("p", "no usage recorded yet", { class: "note" })); return; }
  const days = [...new Set(rows.map((r) => r.day))].sort();
  const users = [...new Set(rows.map((r) => r.user))].sort();
  const totals = days.map((d) => rows.filter((r) => r.day === d).reduce((a, r) => a + r.hours, 0));
  const max = Math.max(...totals, 1e-9);
  const ns = "http://www.w3.org/2000/svg";
  const width = Math.max(360, days.length * 26 + 60), height = 220, bottom = 180, left = 40;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height + users.length * 16);
  svg.setAttribute("role", "img"); svg.setAttribute("aria-label", "GPU-hours per user per day");
  const text = (x, y, s, anchor) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("text-anchor", anchor || "start");
    t.textContent = s; svg.appendChild(t);
  };
  text(left - 4, 14, max.toFixed(1), "end");
  text(left - 4, bottom, "0", "end");
  days.forEach((day, i) => {
    let y = bottom;
    users.forEach((user, u) => {
      const hours = rows.filter((r) => r.day === day && r.user === user).reduce((a, r) => a + r.hours, 0);
      if (!hours) return;
      const h = hours / max * (bottom - 10);
      const rect = document.createElementNS(ns, "rect");
      rect.setAttribute("x", left + i * 26); rect.setAttribute("y", y - h);
      rect.setAttribute("width", 20); rect.setAttribute("height", h);
      rect.setAttribute("fill", PALETTE[u % PALETTE.length]);
      const title = document.createElementNS(ns, "title");
      title.textContent = `${user}, ${day}: ${hours.toFixed(2)} GPU-hours`;
      rect.appendChild(title); svg.appendChild(rect);
      y -= h;
    });
    if (i % Math.ceil(days.length / 10) === 0) text(left + i * 26 + 10, bottom + 14, day.slice(5), "middle");
  });
  users.forEach((user, u) => {
    const y = height + u * 16;
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("x", left); rect.setAttribute("y", y - 10);
    rect.setAttribute("width", 10); rect.setAttribute("height", 10);
    rect.setAttribute("fill", PALETTE[u % PALETTE.length]); svg.appendChild(rect);
    text(left + 16, y, user);
  });
  box.replaceChildren(svg);
}

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `${path}: HTTP ${response.status}`);
  return body;
}

async function poll() {
  const freshness = document.getElementById("freshness");
  try {
    const [status, queue] = await Promise.all([getJson("/api/status"), getJson("/api/queue")]);
    document.getElementById("source").textContent =
      `${status.host} · ${status.device_source}${status.simulated ? " (simulated)" : ""} · ` +
      (status.spans_hosts ? `pool ${status.pool}` : "local lock files");
    renderGpus(status);
    renderAlerts(status);
    renderQueue(queue, status.taken_at);
    state.updates += 1;
    state.lastOk = Date.now();
    freshness.textContent = `updated ${new Date().toLocaleTimeString()}`;
    freshness.className = "";
  } catch (error) {
    freshness.textContent = `not updated: ${error.message}`;
    freshness.className = "stale";
  }
  setTimeout(poll, POLL_MS);
}

async function pollUsage() {
  try {
    renderUsage(await getJson("/api/usage?since=28d&by=user,day"));
  } catch (error) {
    document.getElementById("usage").replaceChildren(el("p", error.message, { class: "note" }));
  }
  setTimeout(pollUsage, USAGE_POLL_MS);
}

poll();
pollUsage();
