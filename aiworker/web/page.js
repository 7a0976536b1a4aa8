"use strict";
let csrf = null, revision = null, after = 0, pages = [0], selected = null, fields = {};
const $ = (id) => document.getElementById(id);

// Forge text as it is, its direction overrides shown as \u202e (as the CLI shows them):
// "RTL \u202eevil" must not read as "RTL live" on the page.
function plain(text) {
  return String(text).replace(/[\u202a-\u202e\u2066-\u2069]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
}

function say(text, bad) { $("message").textContent = text; $("message").className = bad ? "alert" : ""; }

async function api(method, path, body, retried) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") {
    if (!csrf) { csrf = (await api("GET", "/api/v1/session")).csrf_token; }
    headers["X-CSRF-Token"] = csrf;
    headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: "same-origin" });
  let document;
  try { document = await response.json(); }
  catch (e) { throw new Error(method + " " + path + ": HTTP " + response.status + " with no JSON answer (" + (response.statusText || "no reason") + ")"); }
  if (response.status === 403 && document.error && document.error.code === "csrf" && !retried) {
    csrf = null;  // the cookie changed (another tab, a restart): take the current token once
    return api(method, path, body, true);
  }
  if (!response.ok) { throw new Error(document.error ? document.error.message + (document.error.details ? ": " + document.error.details.join("; ") : "") : response.statusText); }
  return document;
}

// Times: relative in the text ("4 min ago"), exact (UTC, to the second) on hover.
function span(seconds) {
  const s = Math.abs(Math.round(seconds));
  for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]]) if (s >= size) return Math.floor(s / size) + " " + unit;
  return "0 s";
}
function relative(iso) {
  if (!iso) return "never";
  const delta = (Date.now() - Date.parse(iso)) / 1000;
  if (Math.abs(delta) < 1) return "just now";
  return delta > 0 ? span(delta) + " ago" : "in " + span(delta);
}
function exact(iso) { return iso ? new Date(Date.parse(iso)).toISOString().slice(0, 19).replace("T", " ") + " UTC" : ""; }
function when(iso) {
  const node = document.createElement("time");
  node.textContent = relative(iso);
  if (iso) { node.title = exact(iso); node.dateTime = iso; }
  return node;
}
function state(name) {
  const node = document.createElement("span");
  node.className = "state state-" + name; node.textContent = name;
  return node;
}
function link(text, url) {
  if (!url) return document.createTextNode(plain(text));
  const a = document.createElement("a"); a.href = url; a.textContent = plain(text); a.rel = "noopener noreferrer";
  return a;
}

function row(cells, cls) {
  const tr = document.createElement("tr");
  if (cls) tr.className = cls;
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell);
    else td.textContent = cell === null || cell === undefined ? "-" : plain(cell);
    tr.appendChild(td);
  }
  return tr;
}

async function refreshStatus() {
  const s = await api("GET", "/api/v1/status");
  const sch = s.scheduler;
  const top = $("scheduler"); top.replaceChildren();
  if (sch.paused) {
    top.className = "alert";
    top.append("PAUSED" + (sch.paused_by ? " by " + sch.paused_by : "") + (sch.paused_at ? " since " : ""), sch.paused_at ? when(sch.paused_at) : "", ": " + plain(sch.paused_reason || "no reason given"));
  } else { top.className = ""; top.append("running"); }
  const checks = $("checks"); checks.replaceChildren("Last check ", when(sch.last_check));
  if (sch.overdue) { const flag = document.createElement("strong"); flag.className = "alert"; flag.textContent = " OVERDUE (interval " + sch.check_interval_s + " s): is the timer running?"; checks.append(flag); }
  if (sch.next_check) checks.append("; next ", sch.check_requested ? "asked for" : when(sch.next_check));
  const polls = $("polls"); polls.replaceChildren();
  if (sch.poll_error) { polls.className = "alert"; polls.append("Polls failing: " + sch.poll_failures + " in a row, the last ", when(sch.poll_error_at), ": " + plain(sch.poll_error)); }
  const held = $("held"); held.replaceChildren();
  for (const h of s.held) {
    const item = document.createElement("li"), open = document.createElement("button");
    item.className = "alert"; open.textContent = "#" + h.task; open.setAttribute("aria-label", "show held task " + h.task);
    open.addEventListener("click", () => select(h.task));
    item.append("Held for you: task ", open, " since ", when(h.since), ": " + plain(h.reason)); held.appendChild(item);
  }
  const body = $("slots").tBodies[0]; body.replaceChildren();
  for (const slot of s.slots) body.appendChild(row([slot.slot, slot.busy ? "yes" : "no", slot.holder_pid, slot.task_id, slot.task_state ? state(slot.task_state) : null]));
  $("slots").caption.textContent = "Slots of controller " + s.controller;
  const hosts = $("controllers").tBodies[0]; hosts.replaceChildren();
  for (const c of s.controllers) hosts.appendChild(row([c.id + (c.id === s.controller ? " (this one)" : ""), c.seen_at ? when(c.seen_at) : "never", c.claims.map((k) => "task " + k.task + " on slot " + k.slot + " (" + k.state + ")").join(", ") || null]));
  $("counts").textContent = Object.entries(s.tasks).filter(([, n]) => n > 0).map(([name, n]) => name + ": " + n).join(", ") + " (" + s.total_tasks + " in all)";
  const filter = $("state-filter");
  if (filter.options.length === 1) for (const name of Object.keys(s.tasks)) { const o = document.createElement("option"); o.value = o.textContent = name; filter.appendChild(o); }
}

function select(id) { selected = id; refreshTask().catch((e) => say(e.message, true)); }

async function refreshTasks() {
  const filter = $("state-filter").value;
  const list = await api("GET", "/api/v1/tasks?limit=50&after=" + after + (filter ? "&state=" + encodeURIComponent(filter) : ""));
  const body = $("tasks").tBodies[0]; body.replaceChildren();
  for (const t of list.tasks) {
    const open = document.createElement("button");
    open.textContent = "#" + t.id; open.setAttribute("aria-label", "show task " + t.id);
    open.addEventListener("click", () => select(t.id));
    const issue = t.issue ? t.repository + "#" + t.issue : t.repository;
    body.appendChild(row([open, t.kind, link(issue, t.issue_url), state(t.state), t.title, when(t.updated_at)], "task"));
  }
  $("next-page").disabled = list.next_after === null || list.next_after === undefined;
  $("next-page").dataset.after = list.next_after || "";
}

async function refreshTask() {
  if (selected === null) return;
  const t = await api("GET", "/api/v1/tasks/" + selected);
  $("task-id").replaceChildren("#" + t.id + " (" + t.kind + ") ", state(t.state));
  const links = $("task-links"); links.replaceChildren(link("issue " + t.repository + "#" + (t.issue || "-"), t.issue_url));
  for (const p of t.publications) links.append(" · ", link("PR #" + p.pr, p.pr_url));
  $("retry-task").disabled = !["failed", "needs_input"].includes(t.state);
  $("resume-task").disabled = t.state !== "paused";
  $("cancel-task").disabled = ["done", "cancelled"].includes(t.state);
  const body = $("history").tBodies[0]; body.replaceChildren();
  for (const e of t.history) body.appendChild(row([when(e.at), e.kind, e.from ? e.from + " -> " + e.to : (e.to || ""), e.data && e.data.reason]));
  const tried = $("attempts").tBodies[0]; tried.replaceChildren();
  for (const a of t.attempts) tried.appendChild(row([a.id, a.phase, a.provider || "host", a.outcome, a.reason, a.output_tail]));
  $("log").textContent = plain((await api("GET", "/api/v1/tasks/" + selected + "/logs?limit=8192")).tail);
}

async function refreshProviders() {
  const p = await api("GET", "/api/v1/providers");
  const body = $("providers").tBodies[0]; body.replaceChildren();
  for (const r of p.readings) {
    const read = document.createElement("span"); read.append(when(r.observed_at || new Date(Date.now() - r.age_s * 1000).toISOString()), r.stale ? " (stale)" : "");
    const tr = row([r.provider, r.window, r.used_percent, r.resets_at ? when(r.resets_at) : null, read, r.valid ? r.reason : "invalid: " + r.reason]);
    if (r.stale) tr.className = "muted";
    body.appendChild(tr);
  }
  if (!p.readings.length) body.appendChild(row(["no readings recorded yet", "", "", "", "", ""]));
}

async function refreshEvents() {
  const e = await api("GET", "/api/v1/events?limit=20");
  const body = $("events").tBodies[0]; body.replaceChildren();
  for (const ev of e.events) body.appendChild(row([when(ev.at), ev.task, ev.kind, ev.from ? ev.from + " -> " + ev.to : (ev.to || ""), ev.reason]));
}

// Settings: one control a key, of the type the configuration's schema gives it.
function control(key, field, value) {
  let input;
  if (value === undefined) value = field.default; // unset: what the configuration applies
  const items = field.items || {};
  if (field.type === "boolean") {
    input = document.createElement("input"); input.type = "checkbox"; input.checked = value === true;
    input.dataset.kind = "boolean"; input.dataset.initial = String(input.checked);
  } else if (field.enum) {
    input = document.createElement("select");
    if (field.nullable) { const o = document.createElement("option"); o.value = ""; o.textContent = "(default)"; input.appendChild(o); }
    for (const choice of field.enum) { const o = document.createElement("option"); o.value = o.textContent = choice; input.appendChild(o); }
    input.value = value === null || value === undefined ? "" : value; input.dataset.kind = "choice";
  } else if (field.type === "integer" || field.type === "number") {
    input = document.createElement("input"); input.type = "number";
    if (field.minimum !== undefined) input.min = field.minimum;
    if (field.maximum !== undefined) input.max = field.maximum;
    input.step = field.type === "integer" ? "1" : "any";
    input.value = value === null || value === undefined ? "" : value; input.dataset.kind = field.type;
  } else if (field.type === "array" && items.type === "string") {
    input = document.createElement("input"); input.type = "text"; input.size = 40;
    input.placeholder = items.enum ? "in order, e.g. " + items.enum.slice(0, 2).join(", ") : "comma separated";
    input.value = (value || []).join(", "); input.dataset.kind = "list";
  } else if (field.type === "string") {
    input = document.createElement("input"); input.type = "text"; input.size = 30;
    input.value = value === null || value === undefined ? "" : value; input.dataset.kind = "text";
  } else {
    input = document.createElement("textarea"); input.rows = 4;
    input.value = value === null || value === undefined ? "" : JSON.stringify(value, null, 1); input.dataset.kind = "json";
  }
  input.name = key; input.id = "setting-" + key.replaceAll(".", "-");
  if (input.dataset.initial === undefined) input.dataset.initial = input.value;
  const label = document.createElement("label");
  const name = document.createElement("span"); name.className = "key"; name.textContent = key;
  label.append(name, input);
  return label;
}

function valueOf(input) {
  const kind = input.dataset.kind, text = input.value.trim();
  if (kind === "boolean") return input.checked;
  if (text === "") return null;
  if (kind === "integer" || kind === "number") { const n = Number(text); if (Number.isNaN(n)) throw new Error(input.name + ": not a number"); return n; }
  if (kind === "list") return text.split(",").map((s) => s.trim()).filter((s) => s);
  if (kind === "json") { try { return JSON.parse(text); } catch (e) { throw new Error(input.name + ": not a JSON value"); } }
  return text;
}

function changed(input) {
  return input.dataset.kind === "boolean" ? String(input.checked) !== input.dataset.initial : input.value !== input.dataset.initial;
}

async function loadSettings() {
  const [settings, caps] = await Promise.all([api("GET", "/api/v1/settings"), api("GET", "/api/v1/capabilities")]);
  revision = settings.revision; $("revision").textContent = "revision " + revision.slice(0, 12);
  fields = caps.fields;
  const form = $("settings"); form.replaceChildren();
  for (const key of caps.general) {
    let value = settings.config;
    for (const part of key.split(".")) value = value === null || value === undefined ? undefined : value[part];
    form.appendChild(control(key, caps.fields[key] || {}, value));
  }
  // Provider settings per phase, as each configured provider lets them be changed.
  for (const provider of settings.config.providers || []) {
    for (const phase of caps.phases) {
      for (const setting of caps.providers[provider] || []) {
        const key = "phases." + phase + ".providers." + provider + "." + setting;
        const current = ((settings.config.phases[phase] || {}).providers || {})[provider];
        form.appendChild(control(key, caps.provider_fields[setting] || {}, current ? current[setting] : undefined));
      }
    }
  }
}

async function saveSettings() {
  const values = {};
  try { for (const input of $("settings").querySelectorAll("input, select, textarea")) if (changed(input)) values[input.name] = valueOf(input); }
  catch (e) { say(e.message, true); return; }
  if (!Object.keys(values).length) { say("nothing changed"); return; }
  try { const saved = await api("PUT", "/api/v1/settings", { revision, values }); say("saved (revision " + saved.revision.slice(0, 12) + ")"); await loadSettings(); }
  catch (e) { say(e.message, true); }
}

function showAccess(report) {
  const body = $("access").tBodies[0]; body.replaceChildren();
  for (const e of report.access) body.appendChild(row([e.repository, e.role, e.login, e.permission + (e.ok ? "" : " (missing write)")]));
  const granted = (report.granted || []).map((g) => g.login + " on " + g.repository);
  say((granted.length ? "granted: " + granted.join(", ") + ". " : "") + (report.warnings || []).join("; "), (report.warnings || []).length > 0);
}

async function act(path, body) {
  try { await api("POST", "/api/v1/actions/" + path, body); say(path + " done"); await refreshStatus(); }
  catch (e) { say(e.message, true); }
}

async function taskAction(action, body) {
  try {
    const done = await api("POST", "/api/v1/tasks/" + selected + "/" + action, body);
    say("task " + selected + ": " + action + " done, now " + done.state); await refresh();
  }
  catch (e) { say(e.message, true); }
}

$("start-now").addEventListener("click", async () => {
  try {
    const asked = await api("POST", "/api/v1/actions/start-now");
    say(asked.paused ? "check requested; the scheduler is paused: " + plain(asked.paused) + "; no work starts until it is resumed" : "start-now done");
    await refreshStatus();
  } catch (e) { say(e.message, true); }
});
$("pause").addEventListener("click", async () => {
  try {
    const paused = await api("POST", "/api/v1/actions/pause", { reason: $("pause-reason").value });
    say((paused.already ? "already paused by " + paused.paused_by + ": " + plain(paused.reason) + " (that pause stands)" : "pause done") + (paused.pending ? "; " + paused.pending : ""), Boolean(paused.pending));
    await refreshStatus();
  } catch (e) { say(e.message, true); }
});
$("resume").addEventListener("click", () => act("resume"));
$("stop-slot").addEventListener("click", () => {
  const slot = Number($("stop-slot-number").value);
  if (confirm("Stop the job on slot " + slot + "?")) act("stop-slot", { slot, confirm: true });
});
$("retry-task").addEventListener("click", () => taskAction("retry"));
$("resume-task").addEventListener("click", () => taskAction("resume"));
$("cancel-task").addEventListener("click", () => {
  if (confirm("Cancel task " + selected + "? Its running job is stopped and its PR left open.")) taskAction("cancel", { confirm: true });
});
$("check-access").addEventListener("click", async () => {
  try { showAccess(await api("POST", "/api/v1/access/check")); } catch (e) { say(e.message, true); }
});
$("repair-access").addEventListener("click", async () => {
  const token = $("admin-token").value; $("admin-token").value = "";
  try { showAccess(await api("POST", "/api/v1/access/repair", { revision, admin_token: token })); } catch (e) { say(e.message, true); }
});
$("state-filter").addEventListener("change", () => { after = 0; pages = [0]; refreshTasks(); });
$("next-page").addEventListener("click", () => { after = Number($("next-page").dataset.after); pages.push(after); refreshTasks(); });
$("first-page").addEventListener("click", () => { after = 0; pages = [0]; refreshTasks(); });
$("save-settings").addEventListener("click", (event) => { event.preventDefault(); saveSettings(); });
$("settings").addEventListener("submit", (event) => { event.preventDefault(); saveSettings(); });

let shownAt = null, stale = false;  // when what the page shows was read; whether a refresh failed since
async function refresh() {
  try {
    await refreshStatus(); await refreshTasks(); await refreshTask(); await refreshProviders(); await refreshEvents();
    shownAt = new Date();
    if (stale) { stale = false; document.querySelector("main").classList.remove("stale"); say("the server answers again"); }
  } catch (e) {
    // What is shown is kept, marked as old: an operator must not take it for the state now.
    stale = true; document.querySelector("main").classList.add("stale");
    const since = shownAt ? "; what is shown was read at " + shownAt.toLocaleTimeString() : "";
    say("refresh failed at " + new Date().toLocaleTimeString() + ": " + e.message + since, true);
  }
}
refresh(); loadSettings().catch((e) => say(e.message, true));
setInterval(refresh, 5000);
