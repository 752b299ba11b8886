// Drives the /ui page in headless Chromium as a platform's customer managing their own
// endpoint from a portal link: a URL the SSRF guard refuses shows its error in the form;
// then they add an endpoint (with custom headers, one secret) pointing at a local receiver,
// reveal and copy its secret, send a test event and see it delivered and counted in the health
// charts, change its event-type filter to a type chosen from the catalog, rotate the secret, see a new event delivered, disable,
// enable and delete it.
// Started by tests/e2e/ui.rs, which checks at the receiver what was sent, and how it was signed.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { need, check, withPage, run } = require("./browser.cjs");

const base = need("HOOKLANE_UI_BASE");
const link = need("HOOKLANE_UI_PORTAL");
const account = need("HOOKLANE_UI_ACCOUNT");
const receiver = need("HOOKLANE_UI_RECEIVER");
const refusedUrl = need("HOOKLANE_UI_REFUSED_URL");
const adminToken = need("HOOKLANE_UI_ADMIN_TOKEN");
const shots = need("HOOKLANE_UI_SCREENSHOTS");
const results = need("HOOKLANE_UI_RESULTS");

// The platform publishing, as its backend would; the page only shows the outcome.
async function publish(type, data) {
  const response = await fetch(`${base}/v1/accounts/${account}/events`, {
    method: "POST",
    headers: { Authorization: `Bearer ${adminToken}`, "Content-Type": "application/json" },
    body: JSON.stringify({ type, data }),
  });
  const body = await response.json();
  check(response.status === 202, `publishing ${type}: ${response.status} ${JSON.stringify(body)}`);
  return body;
}

// Applies the log's filters until the newest row of `type` shows `status`.
async function waitForRow(page, type, status) {
  const row = page.locator("#deliveries tbody tr", { hasText: type }).first();
  for (let i = 0; i < 80; i++) {
    if ((await row.count()) && (await row.locator("td:nth-child(4)").textContent()) === status) return row;
    await page.getByRole("button", { name: "Apply filters" }).click();
    await page.waitForTimeout(250);
  }
  throw new Error(`no ${type} delivery shown ${status}`);
}

async function revealedSecret(page) {
  await page.getByRole("button", { name: "Reveal secret" }).click();
  await page.locator("#ep-secret", { hasText: /^whsec_[A-Za-z0-9+/=]{20,}$/ }).waitFor();
  return page.locator("#ep-secret").textContent();
}

async function main() {
  await withPage(shots, async (page, problems, context) => {
    await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: base });
    // The log's reads are held back, as a busy server may answer them after the health panel's:
    // a row shown delivered must still come with health that counts its attempt.
    await page.route(/\/deliveries(\?|$)/, async (route) => {
      await new Promise((resolve) => setTimeout(resolve, 700));
      await route.continue();
    });
    await page.goto(link);
    await page.locator("#who", { hasText: `Account ${account} ·` }).waitFor();
    await page.locator("#endpoints-empty").waitFor({ state: "visible" });

    // The catalog: what the platform sends, an example on demand, the deprecated type marked.
    await page.locator("#catalog li").nth(2).waitFor();
    const listed = await page.locator("#catalog li strong").allTextContents();
    check(JSON.stringify(listed) === '["invoice.paid","legacy.ping","order.created"]', `catalog: ${listed}`);
    const paid = page.locator('#catalog li[data-type="invoice.paid"]');
    check(!(await paid.locator("pre").isVisible()), "the example is shown unasked");
    await paid.locator("summary", { hasText: "Example payload" }).click();
    await paid.locator("pre", { hasText: '"invoice_id": "in_1"' }).waitFor();
    await page.locator('#catalog li[data-type="legacy.ping"] .badge', { hasText: "deprecated" }).waitFor();

    // An address the SSRF guard refuses: the form stays open and says why, at the field.
    await page.getByRole("button", { name: "Add endpoint" }).click();
    const dialog = page.locator("#endpoint-dialog");
    await dialog.waitFor({ state: "visible" });
    await page.getByLabel("URL", { exact: true }).fill(refusedUrl);
    await page.getByRole("button", { name: "Save endpoint" }).click();
    const refusal = await page.locator("#endpoint-error", { hasText: "url" }).textContent();
    check(/private|not allowed|refused|metadata|link-local/i.test(refusal), `refusal shown as: ${refusal}`);
    check(await dialog.isVisible(), "the form closed on a refused URL");
    check((await page.getByLabel("URL", { exact: true }).getAttribute("aria-invalid")) === "true", "the URL field is not marked");
    await page.screenshot({ path: path.join(shots, "10-endpoint-refused.png") });

    // The endpoint, with a plain header and a secret one.
    await page.getByLabel("URL", { exact: true }).fill(receiver);
    check((await page.locator("#endpoint-error").textContent()) === "", "the refusal stayed after the URL was changed");
    await page.getByLabel("Description", { exact: true }).fill("Invoices into the ERP");
    await page.getByLabel("Event types", { exact: true }).fill("invoice.*");
    await page.getByLabel("In-flight cap", { exact: true }).fill("2");
    await page.getByRole("button", { name: "Add header" }).click();
    await page.getByLabel("Header 1 name").fill("X-Tenant");
    await page.getByLabel("Header 1 value").fill("t-42");
    await page.getByRole("button", { name: "Add header" }).click();
    await page.getByLabel("Header 2 name").fill("Authorization");
    await page.getByLabel("Header 2 value").fill("Bearer let-me-in");
    await page.locator("#ep-headers .header-row").nth(1).locator(".h-secret").check();
    await page.screenshot({ path: path.join(shots, "11-endpoint-form.png") });
    await page.getByRole("button", { name: "Save endpoint" }).click();
    await dialog.waitFor({ state: "hidden" });
    await page.locator("#endpoint-detail").waitFor({ state: "visible" });
    await page.locator("#endpoints tbody tr", { hasText: receiver }).waitFor();
    const headers = await page.locator("#ep-header-list").textContent();
    check(headers.includes("x-tenant: t-42") && headers.includes("authorization: (secret)")
      && !headers.includes("let-me-in"), `headers shown as: ${headers}`);

    // The secret: hidden until asked for, then shown and copied.
    check((await page.locator("#ep-secret").textContent()).includes("••••"), "the secret was shown unasked");
    const before = await revealedSecret(page);
    await page.getByRole("button", { name: "Copy secret" }).click();
    await page.locator("#notice", { hasText: "copied" }).waitFor();
    const copied = await page.evaluate(() => navigator.clipboard.readText());
    check(copied === before, "the clipboard does not hold the secret shown");
    await page.screenshot({ path: path.join(shots, "12-endpoint-secret.png"), fullPage: true });

    // No attempts yet.
    await page.locator("#ep-24h", { hasText: "Last 24 hours: no attempts" }).waitFor();
    check((await page.locator("#ep-chart-24h svg g").count()) === 24, "the 24-hour chart has not 24 bars");
    check((await page.locator("#ep-chart-7d svg g").count()) === 7, "the 7-day chart has not 7 bars");

    // A test event, seen delivered in the log (the receiver fails each webhook's first request).
    await page.getByRole("button", { name: `Send a test event to ${receiver}` }).click();
    await page.locator("#notice", { hasText: /Test event evt_\w+ sent to/ }).waitFor();
    await waitForRow(page, "hooklane.test", "delivered");
    // Health at a glance: one failure, then a success.
    await page.locator("#ep-24h", { hasText: "Last 24 hours: 2 attempts, 50.0% succeeded" }).waitFor();
    await page.locator("#ep-7d", { hasText: "Last 7 days: 2 attempts, 50.0% succeeded" }).waitFor();
    await page.locator("#ep-last-failure", { hasText: "HTTP 503" }).waitFor();
    await page.locator("#ep-streak", { hasText: "Not failing" }).waitFor();
    const bars = await page.locator("#ep-chart-24h svg g").evaluateAll((all) =>
      all.reduce((sum, g) => [sum[0] + Number(g.dataset.succeeded), sum[1] + Number(g.dataset.failed)], [0, 0]));
    check(JSON.stringify(bars) === "[1,1]", `the 24-hour chart shows ${bars}`);
    const tall = await page.locator("#ep-chart-24h svg .bar-bad").evaluateAll((all) =>
      all.filter((r) => Number(r.getAttribute("height")) > 0).length);
    check(tall === 1, `${tall} bars show failures`);
    await page.screenshot({ path: path.join(shots, "13-test-event.png"), fullPage: true });

    // From invoices to orders; the secret header is kept without being typed again.
    await page.getByRole("button", { name: "Edit", exact: true }).click();
    await dialog.waitFor({ state: "visible" });
    const rows = await page.locator("#ep-headers .header-row").evaluateAll((all) => all.map((row) =>
      [row.querySelector(".h-name").value, row.querySelector(".h-value").value, row.querySelector(".h-secret").checked]));
    check(JSON.stringify(rows) === JSON.stringify([["authorization", "", true], ["x-tenant", "t-42", false]]),
      `the form's headers: ${JSON.stringify(rows)} (a secret's value must not be put in it)`);
    // Chosen from the catalog: the deprecated type is not offered.
    const offered = await page.locator("#ep-type-choices button").allTextContents();
    check(JSON.stringify(offered) === '["invoice.paid","order.created"]', `offered: ${offered}`);
    await page.getByLabel("Event types", { exact: true }).fill("");
    await page.getByRole("button", { name: "Add order.created" }).click();
    check((await page.getByLabel("Event types", { exact: true }).inputValue()) === "order.created", "the chosen type is not in the field");
    await page.getByRole("button", { name: "Save endpoint" }).click();
    await dialog.waitFor({ state: "hidden" });
    await page.locator("#ep-types", { hasText: "order.created" }).waitFor();
    check((await page.locator("#ep-header-list").textContent()).includes("authorization: (secret)"),
      "the secret header was lost on edit");
    await page.screenshot({ path: path.join(shots, "14-endpoint-edited.png"), fullPage: true });

    // A rotation with the default grace period: both secrets sign for a day.
    await page.getByRole("button", { name: "Rotate secret…" }).click();
    await page.locator("#rotate").waitFor({ state: "visible" });
    await page.screenshot({ path: path.join(shots, "15-rotate.png") });
    await page.locator("#rotate").getByRole("button", { name: "Rotate" }).click();
    await page.locator("#notice", { hasText: "New signing secret" }).waitFor();
    await page.locator("#ep-retiring", { hasText: "previous secret also signs until" }).waitFor();
    check((await page.locator("#ep-secret").textContent()).includes("••••"), "the new secret was shown unasked");
    const after = await revealedSecret(page);
    check(after !== before, "the secret did not change");

    const skipped = await publish("invoice.paid", { invoice: "in_1" });
    check(skipped.deliveries.length === 0, `invoice.paid still goes to the endpoint: ${JSON.stringify(skipped)}`);
    const sent = await publish("order.created", { order: "ord_1" });
    check(sent.deliveries.length === 1, `order.created: ${JSON.stringify(sent)}`);
    await waitForRow(page, "order.created", "delivered");
    await page.locator("#ep-24h", { hasText: "Last 24 hours: 4 attempts, 50.0% succeeded" }).waitFor();
    await page.screenshot({ path: path.join(shots, "16-rotated-and-delivered.png"), fullPage: true });

    // Disable (confirmed), enable, delete (confirmed).
    const confirm = page.locator("#confirm");
    await page.getByRole("button", { name: "Disable…" }).click();
    await confirm.waitFor({ state: "visible" });
    await confirm.getByRole("button", { name: "Disable" }).click();
    await page.locator("#ep-status", { hasText: "disabled" }).waitFor();
    await page.locator("#endpoints tbody tr", { hasText: receiver }).locator(".status-disabled").waitFor();
    await page.screenshot({ path: path.join(shots, "17-endpoint-disabled.png"), fullPage: true });
    await page.getByRole("button", { name: "Enable", exact: true }).click();
    await page.locator("#ep-status", { hasText: "active" }).waitFor();
    await page.getByRole("button", { name: "Delete…" }).click();
    await confirm.waitFor({ state: "visible" });
    await confirm.getByRole("button", { name: "Delete" }).click();
    await page.locator("#endpoint-detail").waitFor({ state: "hidden" });
    await page.locator("#endpoints-empty").waitFor({ state: "visible" });
    // The delivery history stays after the endpoint is gone.
    await waitForRow(page, "order.created", "delivered");
    await page.screenshot({ path: path.join(shots, "18-endpoint-deleted.png"), fullPage: true });

    const unexpected = problems.filter((p) => !p.includes("status of 400") && !p.includes("status of 422"));
    check(unexpected.length === 0, `the page reported problems:\n${unexpected.join("\n")}`);
    fs.writeFileSync(results, JSON.stringify({ before, after, test_event: true }));
    console.log(`ui endpoints: refused, added, revealed, copied, tested, edited, rotated, disabled, enabled, deleted; screenshots in ${shots}`);
  });
}

run("ui endpoints test", main);
