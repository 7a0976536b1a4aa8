"use strict";
let csrf = null, revision = null, after = 0, pages = [0], selected = null;
const $ = (id) => document.getElementById(id);

function say(text, bad) { $("message").textContent = text; $("message").style.color = bad ? "#b00" : "#070"; }

async function api(method, path, body, retried) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") {
    if (!csrf) { csrf = (await api("GET", "/api/v1/session")).csrf_token; }
    headers["X-CSRF-Token"] = csrf;
    headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: "same-origin" });
  const document = await response.json();
  if (response.status === 403 && document.error && document.error.code === "csrf" && !retried) {
    csrf = null;  // the cookie changed (another tab, a restart): take the current token once
    return api(method, path, body, true);
  }
  if (!response.ok) { throw new Error(document.error ? document.error.message + (document.error.details ? ": " + document.error.details.join("; ") : "") : response.statusText); }
  return document;
}

function row(cells, cls) {
  const tr = document.createElement("tr");
  if (cls) tr.className = cls;
  for (const cell of cells) { const td = document.createElement("td"); td.textContent = cell === null || cell === undefined ? "-" : String(cell); tr.appendChild(td); }
  return tr;
}

async function refreshStatus() {
  const s = await api("GET", "/api/v1/status");
  $("scheduler").textContent = (s.paused ? "PAUSED" + (s.paused_reason ? " (" + s.paused_reason + ")" : "") : "running")
    + "; last check " + (s.last_check || "never") + "; next by " + (s.next_check || "-")
    + (s.poll_error ? "; poll failing (" + s.poll_failures + " in a row): " + s.poll_error : "");
  $("scheduler").className = s.paused || s.poll_error ? "paused" : "";
  const body = $("slots").tBodies[0]; body.replaceChildren();
  for (const slot of s.slots) body.appendChild(row([slot.slot, slot.busy ? "yes" : "no", slot.holder_pid, slot.task_id, slot.task_state]));
  $("counts").textContent = Object.entries(s.tasks).filter(([, n]) => n > 0).map(([state, n]) => state + ": " + n).join(", ") + " (" + s.total_tasks + " in all)";
  const filter = $("state-filter");
  if (filter.options.length === 1) for (const state of Object.keys(s.tasks)) { const o = document.createElement("option"); o.value = o.textContent = state; filter.appendChild(o); }
}

async function refreshTasks() {
  const state = $("state-filter").value;
  const list = await api("GET", "/api/v1/tasks?limit=50&after=" + after + (state ? "&state=" + encodeURIComponent(state) : ""));
  const body = $("tasks").tBodies[0]; body.replaceChildren();
  for (const t of list.tasks) {
    const tr = row([t.id, t.kind, t.issue, t.state, t.title, t.updated_at], "task");
    tr.addEventListener("click", () => { selected = t.id; refreshTask(); });
    body.appendChild(tr);
  }
  $("next-page").disabled = list.next_after === null || list.next_after === undefined;
  $("next-page").dataset.after = list.next_after || "";
}

async function refreshProviders() {
  const p = await api("GET", "/api/v1/providers");
  const body = $("providers").tBodies[0]; body.replaceChildren();
  for (const r of p.readings) {
    const age = r.age_s < 120 ? r.age_s + " s ago" : Math.round(r.age_s / 60) + " min ago";
    const tr = row([r.provider, r.window, r.used_percent, r.resets_at, age + (r.stale ? " (stale)" : ""), r.valid ? r.reason : "invalid: " + r.reason]);
    if (r.stale) tr.className = "muted";
    body.appendChild(tr);
  }
  if (!p.readings.length) body.appendChild(row(["no readings recorded yet", "", "", "", "", ""]));
}

async function refreshEvents() {
  const e = await api("GET", "/api/v1/events?limit=20");
  const body = $("events").tBodies[0]; body.replaceChildren();
  for (const ev of e.events) body.appendChild(row([ev.at, ev.task, ev.kind, ev.from ? ev.from + " -> " + ev.to : (ev.to || ""), ev.reason]));
}

async function refreshTask() {
  if (selected === null) return;
  const t = await api("GET", "/api/v1/tasks/" + selected);
  $("task-id").textContent = "#" + t.id + " (" + t.kind + ", " + t.state + ")";
  const body = $("history").tBodies[0]; body.replaceChildren();
  for (const e of t.history) body.appendChild(row([e.at, e.kind, e.from ? e.from + " -> " + e.to : (e.to || ""), e.data && e.data.reason]));
  const tried = $("attempts").tBodies[0]; tried.replaceChildren();
  for (const a of t.attempts) tried.appendChild(row([a.id, a.phase, a.provider || "host", a.outcome, a.reason, a.output_tail]));
  $("log").textContent = (await api("GET", "/api/v1/tasks/" + selected + "/logs?limit=8192")).tail;
}

async function loadSettings() {
  const [settings, caps] = await Promise.all([api("GET", "/api/v1/settings"), api("GET", "/api/v1/capabilities")]);
  revision = settings.revision; $("revision").textContent = "revision " + revision.slice(0, 12);
  const form = $("settings"); form.replaceChildren();
  for (const key of caps.general) {
    let value = settings.config;
    for (const part of key.split(".")) value = value === null || value === undefined ? undefined : value[part];
    const label = document.createElement("label"); label.textContent = key + " ";
    const input = document.createElement("input"); input.name = key; input.size = 40;
    input.value = value === null || value === undefined ? "" : JSON.stringify(value);
    input.dataset.initial = input.value;
    label.appendChild(input); form.appendChild(label); form.appendChild(document.createElement("br"));
  }
  // Provider settings per phase, as each configured provider lets them be changed.
  for (const provider of settings.config.providers || []) {
    for (const phase of caps.phases) {
      for (const setting of caps.providers[provider] || []) {
        const key = "phases." + phase + ".providers." + provider + "." + setting;
        const current = ((settings.config.phases[phase] || {}).providers || {})[provider];
        const value = current ? current[setting] : undefined;
        const label = document.createElement("label"); label.textContent = key + " ";
        const input = document.createElement("input"); input.name = key; input.size = 30;
        input.value = value === null || value === undefined ? "" : JSON.stringify(value);
        input.dataset.initial = input.value;
        label.appendChild(input); form.appendChild(label); form.appendChild(document.createElement("br"));
      }
    }
  }
}

async function saveSettings() {
  const values = {};
  for (const input of $("settings").querySelectorAll("input")) {
    if (input.value === input.dataset.initial) continue;
    try { values[input.name] = input.value === "" ? null : JSON.parse(input.value); }
    catch (e) { say(input.name + ": not a JSON value", true); return; }
  }
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

$("start-now").addEventListener("click", () => act("start-now"));
$("pause").addEventListener("click", () => act("pause", { reason: "paused from the web page" }));
$("resume").addEventListener("click", () => act("resume"));
$("stop-slot").addEventListener("click", () => {
  const slot = Number($("stop-slot-number").value);
  if (confirm("Stop the job on slot " + slot + "?")) act("stop-slot", { slot, confirm: true });
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

async function refresh() {
  try { await refreshStatus(); await refreshTasks(); await refreshTask(); await refreshProviders(); await refreshEvents(); }
  catch (e) { say("refresh failed: " + e.message, true); }
}
refresh(); loadSettings().catch((e) => say(e.message, true));
setInterval(refresh, 5000);
