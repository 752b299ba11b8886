// The customer page (endpoints, health, catalog, delivery log): plain DOM, no framework, no
// build step. Everything shown from the API is set with textContent, never parsed as HTML:
// response bodies come from strangers.
"use strict";

const state = {
  token: null,
  account: null,
  readOnly: false,
  endpoints: new Map(),
  cursor: null,
  auditCursor: null,
  selected: null,
  poll: null,
  // The endpoint open in the detail panel, and whether its secret is shown.
  endpoint: null,
  secretShown: false,
  // The endpoint the form edits; null when it adds one.
  editing: null,
  // The event-type catalog, by name.
  catalog: [],
};

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.error?.code;
    this.field = body?.error?.field;
  }
}

// Where Hooklane is mounted: the page is `<mount>ui` or `<mount>ui/`. Behind a proxy or an
// API Gateway base-path mapping that is `/base/`, not the host's root, and the API is there.
const mount = (/^(.*\/)ui\/?$/.exec(window.location.pathname) || [null, "/"])[1];

// `path` is the API's own (`/v1/…`), asked under the mount.
async function api(path, { method = "GET", body } = {}) {
  const headers = { Authorization: `Bearer ${state.token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(mount + path.replace(/^\//, ""), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const json = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, json);
  return json;
}

const accountPath = (rest = "") => `/v1/accounts/${encodeURIComponent(state.account)}${rest}`;

function notify(message, bad = false) {
  const notice = $("notice");
  notice.textContent = message;
  notice.classList.toggle("bad", bad);
  notice.hidden = !message;
}

function formatTime(value) {
  if (!value) return "—";
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? value : date.toLocaleString();
}

function badge(kind, value) {
  return el("span", { class: `badge ${kind}-${value}`, text: value });
}

function localToIso(value) {
  if (!value) return null;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? null : date.toISOString();
}

// --- signing in -------------------------------------------------------------------------

async function signIn(token, accountInput) {
  state.token = token;
  const who = await api("/v1/whoami");
  if (who.kind === "account") {
    state.account = who.account_id;
    // A read-only portal link holds the reading scopes only: the page hides what would change.
    state.readOnly = !who.scopes.includes("deliveries:replay");
    const access = state.readOnly ? " · read only" : "";
    $("who").textContent = `Account ${who.account_id}${access} · token expires ${formatTime(who.expires_at)}`;
  } else {
    if (!accountInput) throw new Error("With the admin token, enter the account id too.");
    state.account = accountInput;
    await api(accountPath());
    $("who").textContent = `Admin · account ${accountInput}`;
  }
  document.body.classList.toggle("read-only", state.readOnly);
  sessionStorage.setItem("hooklane.token", token);
  sessionStorage.setItem("hooklane.account", accountInput || "");
  $("sign-in").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  await Promise.all([loadEndpoints(), loadDeliveries(), loadReplays(), loadAudit(), loadCatalog()]);
}

// --- the event-type catalog -------------------------------------------------------------

async function loadCatalog() {
  // The catalog comes a page at a time (500 types, or 1 MiB of them).
  const list = { data: [] };
  for (let cursor = null, pages = 0; pages < 100; pages++) {
    const query = `?limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
    const page = await api(`/v1/event-types${query}`);
    list.data.push(...page.data);
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  state.catalog = list.data;
  $("catalog").replaceChildren(...list.data.map((t) => el("li", { "data-type": t.name },
    el("div", { class: "row" },
      el("strong", { class: "mono", text: t.name }),
      t.deprecated ? el("span", { class: "badge status-failed", text: "deprecated" }) : null),
    t.description ? el("p", { text: t.description }) : null,
    t.example === null ? null : el("details", {},
      el("summary", { text: "Example payload" }),
      el("pre", { class: "payload", text: JSON.stringify(t.example, null, 2) })),
  )));
  $("catalog-card").hidden = list.data.length === 0;
}

// The catalog's types as buttons under the form's field: a click adds one to the list.
function typeChoices() {
  const choices = $("ep-type-choices");
  const types = (state.catalog || []).filter((t) => !t.deprecated);
  choices.replaceChildren(...types.map((t) => el("button", {
    type: "button",
    class: "chip",
    text: t.name,
    title: t.description || t.name,
    "aria-label": `Add ${t.name}`,
    onclick: () => {
      const input = $("ep-event-types");
      const chosen = typesOf(input.value) || [];
      if (!chosen.includes(t.name)) input.value = [...chosen, t.name].join(", ");
    },
  })));
  choices.hidden = types.length === 0;
}

function signOut() {
  sessionStorage.removeItem("hooklane.token");
  sessionStorage.removeItem("hooklane.account");
  window.location.reload();
}

// --- endpoints --------------------------------------------------------------------------

function health(endpoint) {
  if (endpoint.status === "disabled") return ["failing", endpoint.disabled_reason || "disabled"];
  if (endpoint.failing_since) return ["failing", `failing since ${formatTime(endpoint.failing_since)}`];
  return ["healthy", "healthy"];
}

async function loadEndpoints() {
  // Endpoints come a page at a time (500, or 1 MiB of them); an account rarely has more.
  const list = { data: [] };
  for (let cursor = null, pages = 0; pages < 100; pages++) {
    const query = `?limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
    const page = await api(accountPath(`/endpoints${query}`));
    list.data.push(...page.data);
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  state.endpoints = new Map(list.data.map((e) => [e.id, e]));
  const body = $("endpoints").tBodies[0];
  body.replaceChildren();
  const select = $("f-endpoint");
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "", text: "All" }));
  for (const endpoint of list.data) {
    const [healthKind, healthText] = health(endpoint);
    body.append(
      el("tr", { "data-endpoint": endpoint.id, class: state.endpoint === endpoint.id ? "selected" : "" },
        el("td", {},
          el("div", { class: "mono", text: endpoint.url }),
          endpoint.description ? el("div", { class: "help", text: endpoint.description }) : null),
        el("td", { class: "mono", text: endpoint.event_types ? endpoint.event_types.join(", ") : "every type" }),
        el("td", {}, badge("status", endpoint.status)),
        el("td", {}, el("span", { class: `health-${healthKind}`, text: healthText })),
        el("td", { text: String(endpoint.max_in_flight) }),
        el("td", {}, el("div", { class: "actions" },
          el("button", {
            type: "button",
            class: "secondary",
            text: "Manage",
            "aria-label": `Manage ${endpoint.url}`,
            onclick: guarded(() => openEndpoint(endpoint.id)),
          }),
          el("button", {
            type: "button",
            class: "secondary writes",
            text: "Resend since…",
            "aria-label": `Resend deliveries of ${endpoint.url}`,
            onclick: () => openBulk(endpoint),
          }),
          el("button", {
            type: "button",
            class: "secondary writes",
            text: "Send test event",
            "aria-label": `Send a test event to ${endpoint.url}`,
            onclick: () => sendTestEvent(endpoint),
          }),
        )),
      ),
    );
    select.append(el("option", { value: endpoint.id, text: endpoint.url }));
  }
  select.value = chosen;
  $("endpoints-empty").hidden = list.data.length > 0;
  if (state.endpoint) {
    if (state.endpoints.has(state.endpoint)) showEndpoint();
    else closeEndpoint();
  }
}

// --- managing one endpoint --------------------------------------------------------------

const MASKED = "whsec_••••••••••••••••";

function showEndpoint() {
  const endpoint = state.endpoints.get(state.endpoint);
  if (!endpoint) return;
  $("endpoint-detail-title").textContent = `Endpoint ${endpoint.url}`;
  const summary = $("endpoint-summary");
  summary.replaceChildren();
  summaryItem(summary, "Id", el("span", { class: "mono", text: endpoint.id }));
  summaryItem(summary, "URL", el("span", { class: "mono", text: endpoint.url }));
  if (endpoint.description) summaryItem(summary, "Description", endpoint.description);
  summaryItem(summary, "Status", el("span", { id: "ep-status" }, badge("status", endpoint.status)));
  if (endpoint.disabled_reason) summaryItem(summary, "Disabled because", endpoint.disabled_reason);
  const [healthKind, healthText] = health(endpoint);
  summaryItem(summary, "Health", el("span", { class: `health-${healthKind}`, text: healthText }));
  summaryItem(summary, "Event types", el("span", {
    id: "ep-types",
    class: "mono",
    text: endpoint.event_types ? endpoint.event_types.join(", ") : "every type",
  }));
  summaryItem(summary, "In-flight cap", String(endpoint.max_in_flight));
  summaryItem(summary, "Rate limit", endpoint.rate_limit_per_second === null
    ? "none" : `${endpoint.rate_limit_per_second} per second`);
  const headers = Object.entries(endpoint.headers);
  summaryItem(summary, "Custom headers", headers.length
    ? el("ul", { id: "ep-header-list", class: "plain" }, ...headers.map(([name, h]) =>
      el("li", { class: "mono", text: `${name}: ${h.secret ? "(secret)" : h.value}` })))
    : "none");
  summaryItem(summary, "Created", formatTime(endpoint.created_at));
  // A read-only link is not given the secret: it is for those who may change the endpoint.
  const hasSecret = typeof endpoint.secret === "string";
  $("ep-secret").textContent = !hasSecret
    ? "shown to those who may change the endpoint"
    : state.secretShown ? endpoint.secret : MASKED;
  $("ep-reveal").hidden = !hasSecret;
  $("ep-copy").hidden = !hasSecret;
  $("ep-reveal").textContent = state.secretShown ? "Hide secret" : "Reveal secret";
  const retiring = $("ep-retiring");
  retiring.hidden = !endpoint.retiring_secret_until;
  retiring.textContent = endpoint.retiring_secret_until
    ? `The previous secret also signs until ${formatTime(endpoint.retiring_secret_until)}.` : "";
  const disabled = endpoint.status === "disabled";
  $("ep-toggle").textContent = disabled ? "Enable" : "Disable…";
  for (const row of $("endpoints").tBodies[0].rows) {
    row.classList.toggle("selected", row.dataset.endpoint === endpoint.id);
  }
}

async function openEndpoint(id) {
  if (state.endpoint !== id) state.secretShown = false;
  state.endpoint = id;
  // Read it again: the list may be older than the endpoint's last rotation.
  const endpoint = await api(accountPath(`/endpoints/${encodeURIComponent(id)}`));
  state.endpoints.set(id, endpoint);
  showEndpoint();
  $("endpoint-detail").hidden = false;
  $("endpoint-detail").scrollIntoView({ block: "nearest" });
  await loadEndpointStats();
}

function closeEndpoint() {
  state.endpoint = null;
  state.secretShown = false;
  $("ep-secret").textContent = MASKED;
  $("endpoint-detail").hidden = true;
  for (const row of $("endpoints").tBodies[0].rows) row.classList.remove("selected");
}

function currentEndpoint() {
  return state.endpoints.get(state.endpoint);
}

async function copySecret() {
  const endpoint = currentEndpoint();
  if (!endpoint || typeof endpoint.secret !== "string") return;
  try {
    await navigator.clipboard.writeText(endpoint.secret);
    notify("Signing secret copied to the clipboard.");
  } catch {
    // Without clipboard access, show the secret selected so that the user can copy it.
    state.secretShown = true;
    showEndpoint();
    window.getSelection().selectAllChildren($("ep-secret"));
    notify("The browser refused the clipboard: the secret is selected, copy it with Ctrl+C.", true);
  }
}

// Changes made in the panel are shown from the API's answer, then the list is read again.
async function changed(endpoint, message) {
  state.endpoints.set(endpoint.id, endpoint);
  notify(message);
  showEndpoint();
  await Promise.all([loadEndpoints(), loadAudit(), loadEndpointStats()]);
}

async function toggleEndpoint() {
  const endpoint = currentEndpoint();
  if (!endpoint) return;
  if (endpoint.status === "disabled") {
    const enabled = await api(accountPath(`/endpoints/${encodeURIComponent(endpoint.id)}/enable`), { method: "POST" });
    await changed(enabled, `${enabled.url} is enabled again.`);
    return;
  }
  const ok = await confirmDialog("Disable this endpoint?",
    `Nothing is sent to ${endpoint.url} until it is enabled again, and its pending deliveries are abandoned ` +
    "(they can be resent later).", "Disable");
  if (!ok) return;
  const disabled = await api(accountPath(`/endpoints/${encodeURIComponent(endpoint.id)}/disable`), { method: "POST" });
  await changed(disabled, `${disabled.url} is disabled.`);
}

async function deleteEndpoint() {
  const endpoint = currentEndpoint();
  if (!endpoint) return;
  const ok = await confirmDialog("Delete this endpoint?",
    `${endpoint.url} receives nothing more and its pending deliveries are abandoned. ` +
    "Its delivery history stays in the log. This cannot be undone.", "Delete");
  if (!ok) return;
  await api(accountPath(`/endpoints/${encodeURIComponent(endpoint.id)}`), { method: "DELETE" });
  closeEndpoint();
  notify(`${endpoint.url} was deleted.`);
  await Promise.all([loadEndpoints(), loadAudit()]);
}

function rotateSecret() {
  if (!currentEndpoint()) return;
  $("rotate-grace").value = "86400";
  $("rotate").showModal();
}

async function submitRotate(event) {
  if (event.submitter?.value !== "ok") return;
  const endpoint = currentEndpoint();
  if (!endpoint) return;
  const grace = Number($("rotate-grace").value);
  const rotated = await api(accountPath(`/endpoints/${encodeURIComponent(endpoint.id)}/secret/rotate`),
    { method: "POST", body: { grace_period_seconds: grace } });
  state.secretShown = false;
  await changed(rotated, grace
    ? "New signing secret made; the previous one signs too until the grace period ends."
    : "New signing secret made; the previous one no longer signs.");
}

// --- endpoint health at a glance -------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  node.append(...children);
  return node;
}

function duration(from) {
  const minutes = Math.max(0, Math.floor((Date.now() - new Date(from).getTime()) / 60_000));
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h ${minutes % 60} min`;
  return `${Math.floor(hours / 24)} days ${hours % 24} h`;
}

function totalsText(label, totals) {
  const noun = totals.attempts === 1 ? "attempt" : "attempts";
  if (!totals.attempts) return `${label}: no attempts`;
  const rate = totals.success_rate * 100;
  return `${label}: ${totals.attempts} ${noun}, ${rate === 100 ? "100" : rate.toFixed(1)}% succeeded`;
}

// Stacked bars, succeeded below failed, drawn as SVG by the page itself: no chart library.
function barChart(periods, label, periodLabel) {
  const [width, gap, height] = [12, 3, 60];
  const most = Math.max(1, ...periods.map((p) => p.succeeded + p.failed));
  const chart = svg("svg", {
    viewBox: `0 0 ${periods.length * (width + gap)} ${height}`,
    preserveAspectRatio: "none",
    role: "img",
    "aria-label": label,
    class: "bars",
  });
  periods.forEach((p, i) => {
    const x = i * (width + gap);
    const ok = (p.succeeded / most) * (height - 1);
    const bad = (p.failed / most) * (height - 1);
    const title = svg("title");
    title.textContent = `${periodLabel(p.start)}: ${p.succeeded} succeeded, ${p.failed} failed`;
    chart.append(svg("g", { "data-succeeded": p.succeeded, "data-failed": p.failed }, title,
      svg("rect", { x, y: height - 1, width, height: 1, class: "bar-none" }),
      svg("rect", { x, y: height - ok, width, height: ok, class: "bar-ok" }),
      svg("rect", { x, y: height - ok - bad, width, height: bad, class: "bar-bad" })));
  });
  return chart;
}

function showStats(stats) {
  const endpoint = currentEndpoint();
  const streak = stats.failing_since
    ? `Failing for ${duration(stats.failing_since)}: every attempt since ${formatTime(stats.failing_since)} failed.`
    : stats.last_7d.attempts ? "Not failing: the last attempt succeeded." : "No attempts in the last 7 days.";
  $("ep-streak").textContent = endpoint?.status === "disabled" ? `Disabled. ${streak}` : streak;
  const last = stats.last_failure;
  // The error names the status when there was one ("HTTP 503"); otherwise it says what happened.
  const answer = last && last.status_code !== null && !last.error.includes(String(last.status_code))
    ? `HTTP ${last.status_code} · ` : "";
  $("ep-last-failure").textContent = last ? `Last failure ${formatTime(last.at)}: ${answer}${last.error}` : "";
  $("ep-24h").textContent = totalsText("Last 24 hours", stats.last_24h);
  $("ep-7d").textContent = totalsText("Last 7 days", stats.last_7d);
  const hour = (start) => new Date(start).toLocaleString([], { weekday: "short", hour: "2-digit", minute: "2-digit" });
  const day = (start) => `24 h from ${new Date(start).toLocaleString([], { weekday: "short", hour: "2-digit", minute: "2-digit" })}`;
  $("ep-chart-24h").replaceChildren(barChart(stats.hours.slice(-24), "Attempts by hour, last 24 hours", hour));
  $("ep-chart-7d").replaceChildren(barChart(stats.days, "Attempts by day, last 7 days", day));
}

async function loadEndpointStats() {
  const id = state.endpoint;
  if (!id) return;
  const stats = await api(accountPath(`/endpoints/${encodeURIComponent(id)}/stats`));
  if (state.endpoint === id) showStats(stats);
}

// --- the endpoint form (add and edit) ---------------------------------------------------

function headerRow(name = "", value = "", secret = false, kept = false) {
  const index = $("ep-headers").children.length + 1;
  const row = el("div", { class: "header-row", "data-original": kept ? name : "" },
    el("input", { class: "h-name", "aria-label": `Header ${index} name`, placeholder: "X-Tenant", spellcheck: "false", autocomplete: "off" }),
    el("input", {
      class: "h-value",
      "aria-label": `Header ${index} value`,
      placeholder: kept && secret ? "(secret, unchanged)" : "value",
      spellcheck: "false",
      autocomplete: "off",
    }),
    el("label", { class: "inline" }, el("input", { type: "checkbox", class: "h-secret" }), " secret"),
    el("button", {
      type: "button",
      class: "link",
      text: "Remove",
      "aria-label": `Remove header ${index}`,
      onclick: () => row.remove(),
    }),
  );
  row.querySelector(".h-name").value = name;
  row.querySelector(".h-value").value = value;
  row.querySelector(".h-secret").checked = secret;
  $("ep-headers").append(row);
  return row;
}

function openEndpointForm(endpoint) {
  state.editing = endpoint ? endpoint.id : null;
  $("endpoint-dialog-title").textContent = endpoint ? "Edit endpoint" : "Add endpoint";
  $("ep-url").value = endpoint?.url || "";
  $("ep-description").value = endpoint?.description || "";
  $("ep-event-types").value = endpoint?.event_types ? endpoint.event_types.join(", ") : "";
  $("ep-max-in-flight").value = endpoint ? String(endpoint.max_in_flight) : "";
  $("ep-rate-limit").value = endpoint?.rate_limit_per_second ? String(endpoint.rate_limit_per_second) : "";
  $("ep-headers").replaceChildren();
  for (const [name, h] of Object.entries(endpoint?.headers || {})) {
    headerRow(name, h.secret ? "" : h.value, h.secret, true);
  }
  clearFormError();
  typeChoices();
  $("endpoint-dialog").showModal();
  $("ep-url").focus();
}

// A number typed as digits is sent as one; anything else is sent as typed, and the API
// says what is wrong with it.
function numberOrText(value) {
  return /^\d+$/.test(value) ? Number(value) : value;
}

function typesOf(value) {
  const types = value.split(",").map((t) => t.trim()).filter(Boolean);
  return types.length ? types : null;
}

// The form's headers as the API takes them: on edit, a merge patch of what changed.
function headersOf(endpoint) {
  const patch = {};
  const kept = new Set();
  for (const row of $("ep-headers").children) {
    const name = row.querySelector(".h-name").value.trim();
    const value = row.querySelector(".h-value").value;
    const secret = row.querySelector(".h-secret").checked;
    const original = row.dataset.original;
    if (!name) continue;
    if (original) kept.add(original.toLowerCase());
    if (original && original.toLowerCase() !== name.toLowerCase()) patch[original] = null;
    const before = original ? endpoint?.headers[name.toLowerCase()] : undefined;
    // A secret left empty keeps its value; an unchanged plain one is not sent again.
    if (before?.secret && secret && value === "") continue;
    if (before && !before.secret && !secret && before.value === value) continue;
    patch[name] = secret ? { value, secret: true } : value;
  }
  for (const name of Object.keys(endpoint?.headers || {})) {
    if (!kept.has(name)) patch[name] = null;
  }
  return patch;
}

const FIELD_INPUTS = {
  url: "ep-url",
  description: "ep-description",
  event_types: "ep-event-types",
  max_in_flight: "ep-max-in-flight",
  rate_limit_per_second: "ep-rate-limit",
  headers: "ep-headers-set",
};

function clearFormError() {
  $("endpoint-error").textContent = "";
  for (const id of Object.values(FIELD_INPUTS)) $(id).removeAttribute("aria-invalid");
}

// The API's error names the field at fault: it is marked and given the focus.
function showFormError(error) {
  const field = error.field || "";
  $("endpoint-error").textContent = field && !error.message.startsWith(field)
    ? `${field}: ${error.message}` : error.message;
  const input = FIELD_INPUTS[field.split(/[.[]/)[0]];
  if (input) {
    $(input).setAttribute("aria-invalid", "true");
    $(input).focus();
  }
}

function endpointBody(endpoint) {
  const url = $("ep-url").value.trim();
  const description = $("ep-description").value.trim();
  const types = typesOf($("ep-event-types").value);
  const cap = $("ep-max-in-flight").value.trim();
  const rate = $("ep-rate-limit").value.trim();
  const headers = headersOf(endpoint);
  if (!endpoint) {
    const body = { url };
    if (description) body.description = description;
    if (types) body.event_types = types;
    if (cap) body.max_in_flight = numberOrText(cap);
    if (rate) body.rate_limit_per_second = numberOrText(rate);
    if (Object.keys(headers).length) body.headers = headers;
    return body;
  }
  const body = {};
  if (url !== endpoint.url) body.url = url;
  if (description !== endpoint.description) body.description = description;
  if (JSON.stringify(types) !== JSON.stringify(endpoint.event_types)) body.event_types = types;
  if (cap !== String(endpoint.max_in_flight)) body.max_in_flight = numberOrText(cap);
  const rateBefore = endpoint.rate_limit_per_second === null ? "" : String(endpoint.rate_limit_per_second);
  if (rate !== rateBefore) body.rate_limit_per_second = rate ? numberOrText(rate) : null;
  if (Object.keys(headers).length) body.headers = headers;
  return body;
}

async function submitEndpoint(event) {
  if (event.submitter?.value !== "ok") return;
  event.preventDefault();
  clearFormError();
  const endpoint = state.editing ? state.endpoints.get(state.editing) : null;
  if (!$("ep-url").value.trim()) {
    showFormError({ field: "url", message: "url: enter the address webhooks are sent to" });
    return;
  }
  try {
    const body = endpointBody(endpoint);
    const saved = endpoint
      ? await api(accountPath(`/endpoints/${encodeURIComponent(endpoint.id)}`), { method: "PATCH", body })
      : await api(accountPath("/endpoints"), { method: "POST", body });
    $("endpoint-dialog").close();
    state.endpoints.set(saved.id, saved);
    state.secretShown = false;
    state.endpoint = saved.id;
    showEndpoint();
    $("endpoint-detail").hidden = false;
    notify(endpoint ? `${saved.url} was changed.` : `${saved.url} was added: it receives events from now on.`);
    await Promise.all([loadEndpoints(), loadAudit(), loadEndpointStats()]);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) throw error;
    showFormError(error);
  }
}

// --- deliveries -------------------------------------------------------------------------

function filterQuery() {
  const params = new URLSearchParams();
  const add = (name, value) => { if (value) params.set(name, value); };
  add("endpoint", $("f-endpoint").value);
  add("status", $("f-status").value);
  add("event_type", $("f-event-type").value.trim());
  add("since", localToIso($("f-since").value));
  add("until", localToIso($("f-until").value));
  add("status_code", $("f-status-code").value.trim());
  params.set("limit", "50");
  return params;
}

function endpointLabel(id) {
  return state.endpoints.get(id)?.url || id;
}

function deliveryRow(d) {
  return el("tr", { "data-delivery": d.id, class: state.selected === d.id ? "selected" : "" },
    el("td", { text: formatTime(d.created_at) }),
    el("td", {}, el("div", { text: d.event_type }), el("div", { class: "mono", text: d.event_id })),
    el("td", { class: "mono", text: endpointLabel(d.endpoint_id) }),
    el("td", {}, badge("status", d.status)),
    el("td", { text: String(d.attempts) }),
    el("td", { text: d.last_status === null ? "—" : String(d.last_status) }),
    el("td", { text: d.status === "pending" ? formatTime(d.next_try_at) : "—" }),
    el("td", { class: "error-text", text: d.last_error || "" }),
    el("td", {}, el("button", {
      type: "button",
      class: "link",
      text: "Attempts",
      "aria-label": `Attempts of ${d.event_type} ${d.event_id}`,
      onclick: () => openDelivery(d.id),
    })),
  );
}

async function loadDeliveries(append = false) {
  const params = filterQuery();
  if (append && state.cursor) params.set("cursor", state.cursor);
  const page = await api(`${accountPath("/deliveries")}?${params}`);
  const body = $("deliveries").tBodies[0];
  if (!append) body.replaceChildren();
  for (const d of page.data) body.append(deliveryRow(d));
  state.cursor = page.next_cursor || null;
  $("more").hidden = !state.cursor;
  $("deliveries-empty").hidden = body.rows.length > 0;
}

// Endpoint health changes with every attempt, so it is read again with the log. It is read
// after the log: read at once, it could miss the attempt that made a row shown delivered.
async function refreshLog() {
  await Promise.all([loadEndpoints(), loadDeliveries().then(loadEndpointStats)]);
}

// --- one delivery and its attempts ------------------------------------------------------

function summaryItem(list, term, value) {
  list.append(el("dt", { text: term }), el("dd", {}, value));
}

function attemptItem(a) {
  const headers = el("table", {},
    el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "Header" }), el("th", { scope: "col", text: "Value" }))),
    el("tbody", {}, ...a.response_headers.map(([name, value]) =>
      el("tr", {}, el("td", { class: "mono", text: name }), el("td", { class: "mono", text: value })))),
  );
  const outcome = a.status_code === null ? "no response" : `HTTP ${a.status_code}`;
  return el("li", { "data-attempt": String(a.number) },
    el("div", { class: "row" },
      el("strong", { text: `#${a.number} · ${outcome}` }),
      el("span", { text: `${a.trigger} · ${formatTime(a.started_at)} · ${a.latency_ms} ms` }),
    ),
    a.error ? el("p", { class: "error", text: a.error }) : null,
    el("details", {},
      el("summary", { text: "Response headers" }),
      a.response_headers.length ? headers : el("p", { class: "empty", text: "none" }),
    ),
    el("details", { open: "" },
      el("summary", { text: a.response_body_truncated ? "Response body (truncated)" : "Response body" }),
      el("pre", { text: a.response_body || "(empty)" }),
    ),
  );
}

async function showDelivery(id) {
  // The attempts are read after the delivery, never beside it: read at once, the attempts
  // could come from before an attempt's record and the status from after it, showing
  // "delivered" over the old attempts.
  const delivery = await api(accountPath(`/deliveries/${encodeURIComponent(id)}`));
  const attempts = { data: [] };
  // Attempts come a page at a time (about 1 MiB each); a delivery rarely has more than one.
  for (let cursor = null, pages = 0; pages < 20; pages++) {
    const query = cursor ? `?cursor=${encodeURIComponent(cursor)}` : "";
    const page = await api(accountPath(`/deliveries/${encodeURIComponent(id)}/attempts${query}`));
    attempts.data.push(...page.data);
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  $("detail-title").textContent = `Delivery of ${delivery.event_type}`;
  const summary = $("detail-summary");
  summary.replaceChildren();
  summaryItem(summary, "Status", el("span", { id: "detail-status" }, badge("status", delivery.status)));
  summaryItem(summary, "Event", el("span", { class: "mono", text: delivery.event_id }));
  summaryItem(summary, "Endpoint", el("span", { class: "mono", text: endpointLabel(delivery.endpoint_id) }));
  summaryItem(summary, "Attempts", String(delivery.attempts));
  summaryItem(summary, "Created", formatTime(delivery.created_at));
  if (delivery.status === "pending") summaryItem(summary, "Next try", formatTime(delivery.next_try_at));
  if (delivery.last_error) summaryItem(summary, "Last error", el("span", { class: "error-text", text: delivery.last_error }));
  $("replay").disabled = delivery.status === "pending";
  $("replay").title = delivery.status === "pending" ? "Pending deliveries are still being tried" : "";
  const list = $("attempts");
  list.replaceChildren(...attempts.data.slice().reverse().map(attemptItem));
  $("attempts-empty").hidden = attempts.data.length > 0;
  for (const row of $("deliveries").tBodies[0].rows) {
    row.classList.toggle("selected", row.dataset.delivery === id);
  }
  return delivery;
}

// The payload is read only when asked for: it may be large, and it is the customer's data.
async function showPayload() {
  const payload = $("payload");
  if (!payload.open || !state.selected) return;
  const delivery = await api(accountPath(`/deliveries/${encodeURIComponent(state.selected)}`));
  const event = await api(accountPath(`/events/${encodeURIComponent(delivery.event_id)}`));
  $("payload-body").textContent = event.erased_at
    ? `Erased ${formatTime(event.erased_at)} on request: the payload is no longer stored.`
    : JSON.stringify(event.data, null, 2);
}

async function openDelivery(id) {
  stopPolling();
  state.selected = id;
  const payload = $("payload");
  payload.open = false;
  $("payload-body").textContent = "";
  await showDelivery(id);
  $("detail").hidden = false;
  $("detail").scrollIntoView({ block: "nearest" });
  $("replay").focus();
}

function stopPolling() {
  if (state.poll) clearTimeout(state.poll);
  state.poll = null;
}

// After a replay, follow the delivery until it is final again.
function followDelivery(id, deadline = Date.now() + 60_000) {
  stopPolling();
  state.poll = setTimeout(async () => {
    try {
      const delivery = await showDelivery(id);
      await refreshLog();
      if (delivery.status === "pending" && Date.now() < deadline) followDelivery(id, deadline);
    } catch (error) {
      notify(error.message, true);
    }
  }, 1000);
}

// --- replays ----------------------------------------------------------------------------

function confirmDialog(title, text, okLabel) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = okLabel;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

async function replaySelected() {
  const id = state.selected;
  if (!id) return;
  const ok = await confirmDialog("Replay this delivery?",
    "It is sent again now, as a manual attempt; if it fails, the retry schedule starts over.", "Replay");
  if (!ok) return;
  try {
    await api(accountPath(`/deliveries/${encodeURIComponent(id)}/replay`), { method: "POST" });
    notify("Replay requested: the delivery is pending again.");
    await Promise.all([showDelivery(id), refreshLog(), loadReplays(), loadAudit()]);
    followDelivery(id);
  } catch (error) {
    notify(`Replay refused: ${error.message}`, true);
  }
}

let bulkEndpoint = null;

// A signed `hooklane.test` event to this endpoint only; it shows in the log like any other.
async function sendTestEvent(endpoint) {
  try {
    const event = await api(accountPath(`/endpoints/${encodeURIComponent(endpoint.id)}/test`), { method: "POST" });
    notify(`Test event ${event.id} sent to ${endpoint.url}.`);
    await refreshLog();
  } catch (error) {
    notify(`Test event refused: ${error.message}`, true);
  }
}

function openBulk(endpoint) {
  bulkEndpoint = endpoint;
  $("bulk-endpoint").textContent = endpoint.url;
  $("bulk-error").textContent = "";
  $("bulk").showModal();
}

async function submitBulk(event) {
  const dialog = $("bulk");
  if (event.submitter?.value !== "ok") return;
  event.preventDefault();
  const since = localToIso($("bulk-since").value);
  if (!since) {
    $("bulk-error").textContent = "Choose the time to resend from.";
    return;
  }
  const statuses = [...document.querySelectorAll("input[name=bulk-status]:checked")].map((c) => c.value);
  if (!statuses.length) {
    $("bulk-error").textContent = "Choose at least one status.";
    return;
  }
  const body = { since, statuses };
  const until = localToIso($("bulk-until").value);
  if (until) body.until = until;
  const types = $("bulk-types").value.split(",").map((t) => t.trim()).filter(Boolean);
  if (types.length) body.event_types = types;
  const missed = $("bulk-missed").checked;
  if (missed) body.include_missed = true;
  dialog.close();
  const ok = await confirmDialog("Resend these deliveries?",
    `Every ${statuses.join(" or ")} delivery to ${bulkEndpoint.url} created since ${formatTime(since)}` +
    `${until ? ` and before ${formatTime(until)}` : ""}${types.length ? ` of type ${types.join(", ")}` : ""} is sent again` +
    `${missed ? ", and so is every event of its types it missed while disabled" : ""}.`,
    "Resend");
  if (!ok) return;
  try {
    const replay = await api(accountPath(`/endpoints/${encodeURIComponent(bulkEndpoint.id)}/replay`), { method: "POST", body });
    const noun = replay.count === 1 ? "delivery" : "deliveries";
    const recovered = replay.include_missed
      ? `, ${replay.missed} missed ${replay.missed === 1 ? "event" : "events"} sent`
      : "";
    notify(`${replay.count} ${noun} queued again${recovered}${replay.more ? "; more match: resend again to continue" : ""}.`);
    await Promise.all([refreshLog(), loadReplays(), loadAudit()]);
  } catch (error) {
    notify(`Resend refused: ${error.message}`, true);
  }
}

function replayFilters(r) {
  if (r.scope === "delivery") return "—";
  const parts = [`since ${formatTime(r.since)}`];
  if (r.until) parts.push(`before ${formatTime(r.until)}`);
  parts.push(r.statuses.join(", "));
  if (r.event_types.length) parts.push(r.event_types.join(", "));
  if (r.include_missed) parts.push("with missed events");
  return parts.join(" · ");
}

async function loadReplays() {
  const page = await api(`${accountPath("/replays")}?limit=50`);
  const body = $("replays").tBodies[0];
  body.replaceChildren(...page.data.map((r) => el("tr", {},
    el("td", { text: formatTime(r.requested_at) }),
    el("td", { class: "mono", text: r.actor }),
    el("td", {}, r.scope === "delivery"
      ? el("span", { class: "mono", text: `delivery ${r.delivery_id}` })
      : el("span", { class: "mono", text: `endpoint ${endpointLabel(r.endpoint_id)}` })),
    el("td", { text: replayFilters(r) }),
    el("td", { text: `${r.count}${r.include_missed ? ` + ${r.missed} missed` : ""}${r.more ? " (more match)" : ""}` }),
  )));
  $("replays-empty").hidden = page.data.length > 0;
}

// --- audit log --------------------------------------------------------------------------

function actorLabel(actor) {
  return actor.id ? `${actor.type} ${actor.id}` : actor.type;
}

function detailsLabel(details) {
  return Object.entries(details)
    .map(([key, value]) => `${key}: ${typeof value === "string" ? value : JSON.stringify(value)}`)
    .join(" · ") || "—";
}

// A page of the account's audit log, newest first; `more` appends the next page.
async function loadAudit(more = false) {
  const params = new URLSearchParams({ limit: "20" });
  if (more && state.auditCursor) params.set("cursor", state.auditCursor);
  const page = await api(`${accountPath("/audit")}?${params}`);
  const rows = page.data.map((e) => el("tr", {},
    el("td", { text: formatTime(e.at) }),
    el("td", { class: "mono", text: actorLabel(e.actor) }),
    el("td", { class: "mono", text: e.address || "—" }),
    el("td", { class: "mono", text: e.action }),
    el("td", { class: "mono", text: `${e.target.type} ${e.target.id}` }),
    el("td", { text: detailsLabel(e.details) }),
  ));
  const body = $("audit").tBodies[0];
  if (more) body.append(...rows);
  else body.replaceChildren(...rows);
  state.auditCursor = page.next_cursor || null;
  $("audit-more").hidden = !state.auditCursor;
  $("audit-empty").hidden = body.rows.length > 0;
}

// --- portal links -----------------------------------------------------------------------

// A portal link carries its token in the fragment, which no request sends. It is taken out
// of the address bar (and so out of history and bookmarks) before it is used. Returns
// whether the address was a portal link.
function followPortalLink() {
  const token = new URLSearchParams(window.location.hash.slice(1)).get("token");
  if (!token) return false;
  history.replaceState(null, "", window.location.pathname + window.location.search);
  // A link that would replace the session open in this tab asks first: a link someone else
  // sent must not quietly put the page on their account, where what is typed goes to them.
  const current = state.token || sessionStorage.getItem("hooklane.token");
  if (current && current !== token) {
    const account = linkAccount(token);
    const from = state.account ? `account ${state.account}` : "the account open here";
    const to = account ? `account ${account}` : "another account";
    if (!window.confirm(`This link says it opens ${to} in place of ${from}. Switch?`)) return false;
  }
  const savedAccount = sessionStorage.getItem("hooklane.account") || "";
  signIn(token, "").catch((error) => {
    // Refused before the session changed (the link did not verify): the session that was
    // open stays, or, on a fresh load of the page, is opened again.
    if (current && current !== token && sessionStorage.getItem("hooklane.token") === current) {
      state.token = current;
      notify(`The link was refused (${error.message}); the session open before stays.`, true);
      if (!state.account) signIn(current, savedAccount).catch(() => signOut());
      return;
    }
    state.token = null;
    sessionStorage.removeItem("hooklane.token");
    $("sign-in-error").textContent = error.status === 401
      ? (/expired/.test(error.message)
        ? "This portal link has expired. Ask whoever sent it for a new one."
        : "This portal link is not valid (it was revoked or mistyped). Ask for a new one.")
      : error.message;
  });
  return true;
}

// The account an account token names (its claims are readable; only the server checks
// them); null when it cannot be read.
function linkAccount(token) {
  try {
    const claims = token.replace(/^hl_acct_/, "").split(".")[0];
    return JSON.parse(atob(claims.replace(/-/g, "+").replace(/_/g, "/"))).a || null;
  } catch {
    return null;
  }
}

// --- wiring -----------------------------------------------------------------------------

function guarded(action) {
  return async (event) => {
    try {
      await action(event);
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        notify("The token was refused (expired or invalid). Sign in again.", true);
      } else {
        notify(error.message, true);
      }
    }
  };
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("sign-in-error").textContent = "";
    try {
      await signIn($("token").value.trim(), $("account").value.trim());
    } catch (error) {
      state.token = null;
      $("sign-in-error").textContent = error.status === 401
        ? "That token was refused (expired or invalid)."
        : error.message;
    }
  });
  $("sign-out").addEventListener("click", signOut);
  $("filters").addEventListener("submit", guarded(async (event) => {
    event.preventDefault();
    await refreshLog();
  }));
  $("filters").addEventListener("reset", () => setTimeout(guarded(refreshLog), 0));
  $("more").addEventListener("click", guarded(() => loadDeliveries(true)));
  $("replay").addEventListener("click", guarded(replaySelected));
  $("close-detail").addEventListener("click", () => {
    stopPolling();
    state.selected = null;
    $("detail").hidden = true;
  });
  $("refresh-replays").addEventListener("click", guarded(loadReplays));
  $("refresh-audit").addEventListener("click", guarded(() => loadAudit()));
  $("audit-more").addEventListener("click", guarded(() => loadAudit(true)));
  $("bulk-form").addEventListener("submit", guarded(submitBulk));
  $("payload").addEventListener("toggle", guarded(showPayload));
  $("add-endpoint").addEventListener("click", () => openEndpointForm(null));
  $("ep-add-header").addEventListener("click", () => headerRow().querySelector(".h-name").focus());
  $("endpoint-form").addEventListener("submit", guarded(submitEndpoint));
  // An error stays until the user changes something.
  $("endpoint-form").addEventListener("input", clearFormError);
  $("ep-edit").addEventListener("click", () => openEndpointForm(currentEndpoint()));
  $("ep-rotate").addEventListener("click", rotateSecret);
  $("rotate-form").addEventListener("submit", guarded(submitRotate));
  $("ep-toggle").addEventListener("click", guarded(toggleEndpoint));
  $("ep-delete").addEventListener("click", guarded(deleteEndpoint));
  $("ep-close").addEventListener("click", closeEndpoint);
  $("ep-reveal").addEventListener("click", () => {
    state.secretShown = !state.secretShown;
    showEndpoint();
  });
  $("ep-copy").addEventListener("click", guarded(copySecret));

  window.addEventListener("hashchange", followPortalLink);
  if (followPortalLink()) return;
  const saved = sessionStorage.getItem("hooklane.token");
  if (saved) {
    signIn(saved, sessionStorage.getItem("hooklane.account") || "").catch(() => signOut());
  }
});
