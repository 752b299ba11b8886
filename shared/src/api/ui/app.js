// The delivery-log page: plain DOM, no framework, no build step. Everything shown from the
// API is set with textContent, never parsed as HTML: response bodies come from strangers.
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
  }
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Authorization: `Bearer ${state.token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
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
  await Promise.all([loadEndpoints(), loadDeliveries(), loadReplays(), loadAudit()]);
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
  const list = await api(accountPath("/endpoints"));
  state.endpoints = new Map(list.data.map((e) => [e.id, e]));
  const body = $("endpoints").tBodies[0];
  body.replaceChildren();
  const select = $("f-endpoint");
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "", text: "All" }));
  for (const endpoint of list.data) {
    const [healthKind, healthText] = health(endpoint);
    body.append(
      el("tr", { "data-endpoint": endpoint.id },
        el("td", { class: "mono", text: endpoint.url }),
        el("td", {}, badge("status", endpoint.status)),
        el("td", {}, el("span", { class: `health-${healthKind}`, text: healthText })),
        el("td", { text: String(endpoint.max_in_flight) }),
        el("td", {}, el("div", { class: "actions" },
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

// Endpoint health changes with every attempt, so it is read again with the log.
async function refreshLog() {
  await Promise.all([loadEndpoints(), loadDeliveries()]);
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
  const [delivery, attempts] = await Promise.all([
    api(accountPath(`/deliveries/${encodeURIComponent(id)}`)),
    api(accountPath(`/deliveries/${encodeURIComponent(id)}/attempts`)),
  ]);
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

async function openDelivery(id) {
  stopPolling();
  state.selected = id;
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
  dialog.close();
  const ok = await confirmDialog("Resend these deliveries?",
    `Every ${statuses.join(" or ")} delivery to ${bulkEndpoint.url} created since ${formatTime(since)}` +
    `${until ? ` and before ${formatTime(until)}` : ""}${types.length ? ` of type ${types.join(", ")}` : ""} is sent again.`,
    "Resend");
  if (!ok) return;
  try {
    const replay = await api(accountPath(`/endpoints/${encodeURIComponent(bulkEndpoint.id)}/replay`), { method: "POST", body });
    const noun = replay.count === 1 ? "delivery" : "deliveries";
    notify(`${replay.count} ${noun} queued again${replay.more ? "; more match: resend again to continue" : ""}.`);
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
    el("td", { text: `${r.count}${r.more ? " (more match)" : ""}` }),
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
  signIn(token, "").catch((error) => {
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

  window.addEventListener("hashchange", followPortalLink);
  if (followPortalLink()) return;
  const saved = sessionStorage.getItem("hooklane.token");
  if (saved) {
    signIn(saved, sessionStorage.getItem("hooklane.account") || "").catch(() => signOut());
  }
});
