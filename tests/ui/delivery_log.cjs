// Drives the /ui page in Debian's headless Chromium, as a customer would: sign in with an
// account token, filter to failed deliveries, open one's attempts, replay it and see it
// delivered, then resend the rest of the endpoint's failures in bulk; then open the same
// log as support does, with the admin token and the account id; then follow portal links
// (read-only, to another account, expired). Started by tests/e2e/ui.rs, which seeds the
// server and checks the outcome through the API too.
"use strict";

const path = require("node:path");
const { need, check, withPage, run } = require("./browser.cjs");

const base = need("HOOKLANE_UI_BASE");
const token = need("HOOKLANE_UI_TOKEN");
const replayed = need("HOOKLANE_UI_REPLAY_DELIVERY");
const bulkRest = need("HOOKLANE_UI_BULK_DELIVERY");
const delivered = need("HOOKLANE_UI_DELIVERED_DELIVERY");
const shots = need("HOOKLANE_UI_SCREENSHOTS");
const adminToken = need("HOOKLANE_UI_ADMIN_TOKEN");
const readOnlyLink = need("HOOKLANE_UI_PORTAL_READ_ONLY");
const otherLink = need("HOOKLANE_UI_PORTAL_OTHER");
const expiredLink = need("HOOKLANE_UI_PORTAL_EXPIRED");

async function main() {
  await withPage(shots, async (page, problems) => {
    await page.goto(`${base}/ui`);
    // A token that does not verify is refused, and the log stays closed.
    await page.getByLabel("Token").fill(`${token.slice(0, -3)}xyz`);
    await page.getByRole("button", { name: "Open" }).click();
    await page.locator("#sign-in-error", { hasText: "refused" }).waitFor();
    check(await page.locator("#app").isHidden(), "the log opened with a bad token");
    await page.screenshot({ path: path.join(shots, "0-sign-in.png") });
    // Chromium logs the refused request itself; that one is expected.
    const expected = problems.splice(0).filter((p) => !p.includes("status of 401"));
    check(expected.length === 0, `the page reported problems:\n${expected.join("\n")}`);
    await page.getByLabel("Token").fill(token);
    await page.getByRole("button", { name: "Open" }).click();
    await page.locator("#app").waitFor({ state: "visible" });
    await page.locator("#endpoints tbody tr").first().waitFor();
    const who = await page.locator("#who").textContent();
    check(who.includes("acme"), `header does not name the account: ${who}`);

    // Filter to failed deliveries: the delivered one disappears, the failed ones stay.
    await page.locator(`#deliveries tr[data-delivery="${delivered}"]`).waitFor();
    await page.locator("#f-status").selectOption("failed");
    await page.getByRole("button", { name: "Apply filters" }).click();
    await page.locator(`#deliveries tr[data-delivery="${delivered}"]`).waitFor({ state: "detached" });
    const row = page.locator(`#deliveries tr[data-delivery="${replayed}"]`);
    await row.waitFor();
    const statuses = await page.locator("#deliveries tbody tr td:nth-child(4)").allTextContents();
    check(statuses.length >= 2 && statuses.every((s) => s === "failed"), `filtered statuses: ${statuses}`);

    // Its attempts: status, trigger, response body and headers.
    await row.getByRole("button", { name: /Attempts of/ }).click();
    await page.locator("#detail").waitFor({ state: "visible" });
    const attempts = page.locator("#attempts > li");
    await attempts.nth(1).waitFor();
    const first = await attempts.first().textContent();
    check(first.includes("HTTP 500") && first.includes("scheduled"), `attempt shown as: ${first}`);
    check((await page.locator("#attempts pre").first().textContent()).length > 0, "no response body shown");
    await attempts.first().locator("summary", { hasText: "Response headers" }).click();
    check((await attempts.first().locator("details table td").count()) > 0, "no response headers shown");
    // The event's payload, on demand.
    check((await page.locator("#payload-body").textContent()) === "", "the payload was read unasked");
    await page.locator("#payload summary").click();
    await page.locator("#payload-body", { hasText: '"invoice": 0' }).waitFor();
    await page.screenshot({ path: path.join(shots, "1-failed-delivery.png"), fullPage: true });

    // Replay it, confirm, and watch it get delivered.
    await page.getByRole("button", { name: "Replay this delivery" }).click();
    const confirm = page.locator("#confirm");
    await confirm.waitFor({ state: "visible" });
    await page.screenshot({ path: path.join(shots, "2-confirm.png") });
    await confirm.getByRole("button", { name: "Replay" }).click();
    await page.locator("#detail-status", { hasText: "delivered" }).waitFor({ timeout: 30_000 });
    const newest = await attempts.first().textContent();
    check(newest.includes("HTTP 200") && newest.includes("manual"), `replayed attempt shown as: ${newest}`);
    await page.locator("#replays tbody tr", { hasText: replayed }).waitFor();
    // The audit log shows the replay: by this account token, from this browser's address.
    const audited = page.locator("#audit tbody tr", { hasText: "replay.created" }).first();
    await audited.waitFor();
    const entry = await audited.textContent();
    check(entry.includes("token tok_") && entry.includes("127.0.0.1"), `audit entry shown as: ${entry}`);

    // Resend the endpoint's other failures in bulk, with a confirmation.
    await page.getByRole("button", { name: /Resend deliveries of/ }).first().click();
    await page.locator("#bulk").waitFor({ state: "visible" });
    await page.getByLabel("Created since").fill("2000-01-01T00:00:00");
    // The endpoint was never disabled: asking for its missed events finds none.
    await page.getByLabel("Also send the events it missed while disabled").check();
    await page.screenshot({ path: path.join(shots, "4-bulk.png") });
    await page.getByRole("button", { name: "Resend…" }).click();
    await confirm.waitFor({ state: "visible" });
    check((await confirm.textContent()).includes("it missed while disabled"), "the confirmation does not name the missed events");
    await confirm.getByRole("button", { name: "Resend" }).click();
    await page.locator("#notice", { hasText: "1 delivery queued again, 0 missed events sent" }).waitFor();
    await page.locator("#replays tbody tr", { hasText: "endpoint" }).filter({ hasText: "1 + 0 missed" }).waitFor();

    // The log, unfiltered, shows everything delivered.
    await page.getByRole("button", { name: "Clear" }).click();
    const bulkRow = page.locator(`#deliveries tr[data-delivery="${bulkRest}"]`);
    for (let i = 0; i < 60; i++) {
      await page.getByRole("button", { name: "Apply filters" }).click();
      await page.waitForTimeout(250);
      if ((await bulkRow.locator("td:nth-child(4)").textContent()) === "delivered") break;
    }
    check((await bulkRow.locator("td:nth-child(4)").textContent()) === "delivered", "bulk-replayed delivery not delivered");
    await page.locator(`#deliveries tr[data-delivery="${replayed}"]`).getByRole("button").click();
    await page.locator("#detail-status", { hasText: "delivered" }).waitFor();
    // A success clears the endpoint's failure clock.
    await page.locator("#endpoints tbody tr", { hasText: "/ep/shop" }).locator(".health-healthy").waitFor();
    await page.screenshot({ path: path.join(shots, "3-after-replay.png"), fullPage: true });

    // A test event to the healthy endpoint shows in the log, delivered.
    await page.getByRole("button", { name: /Send a test event to .*\/ep\/books/ }).click();
    await page.locator("#notice", { hasText: /Test event evt_\w+ sent to/ }).waitFor();
    const testRow = page.locator("#deliveries tbody tr", { hasText: "hooklane.test" }).first();
    for (let i = 0; i < 60; i++) {
      if ((await testRow.count()) && (await testRow.textContent()).includes("delivered")) break;
      await page.getByRole("button", { name: "Apply filters" }).click();
      await page.waitForTimeout(250);
    }
    check((await testRow.textContent()).includes("delivered"), "the test event is not shown delivered");
    await page.screenshot({ path: path.join(shots, "5-test-event.png"), fullPage: true });

    // Support opens the same log with the admin token and the account id.
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.locator("#sign-in").waitFor({ state: "visible" });
    await page.getByLabel("Token").fill(adminToken);
    await page.getByRole("button", { name: "Open" }).click();
    await page.locator("#sign-in-error", { hasText: "account id" }).waitFor();
    await page.getByLabel("Account id").fill("acme");
    await page.getByRole("button", { name: "Open" }).click();
    await page.locator("#who", { hasText: "Admin · account acme" }).waitFor();
    await page.locator(`#deliveries tr[data-delivery="${replayed}"]`).waitFor();

    // A read-only portal link signs in by itself, leaves no token in the address bar,
    // and offers nothing that changes anything.
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.locator("#sign-in").waitFor({ state: "visible" });
    await page.goto(readOnlyLink);
    await page.locator("#who", { hasText: "Account acme · read only" }).waitFor();
    check(!page.url().includes("token"), `the token stayed in the address bar: ${page.url()}`);
    const history = await page.evaluate(() => window.location.hash);
    check(history === "", `the fragment stayed: ${history}`);
    await page.locator(`#deliveries tr[data-delivery="${replayed}"]`).waitFor();
    await page.locator("#endpoints tbody tr").first().waitFor();
    for (const name of [/Send a test event to/, /Resend deliveries of/, "Add endpoint"]) {
      // Role queries see only what is shown: the buttons are there, hidden.
      const offered = await page.getByRole("button", { name }).count();
      check(offered === 0, `a read-only link offers ${name}`);
      const present = await page.getByRole("button", { name, includeHidden: true }).count();
      check(present > 0, `no ${name} buttons at all, hidden or not`);
    }
    // The endpoint panel opens, with nothing in it that changes the endpoint.
    await page.getByRole("button", { name: /Manage .*\/ep\/shop/ }).click();
    await page.locator("#endpoint-detail").waitFor({ state: "visible" });
    for (const id of ["ep-edit", "ep-rotate", "ep-toggle", "ep-delete", "ep-reveal", "ep-copy"]) {
      check(await page.locator(`#${id}`).isHidden(), `a read-only link offers #${id}`);
    }
    const secretShown = await page.locator("#ep-secret").textContent();
    check(secretShown.includes("shown to those who may change the endpoint"),
      `a read-only link's secret field: ${secretShown}`);
    await page.locator(`#deliveries tr[data-delivery="${replayed}"]`).getByRole("button").click();
    await page.locator("#detail").waitFor({ state: "visible" });
    check(await page.locator("#replay").isHidden(), "a read-only link offers Replay");
    await page.screenshot({ path: path.join(shots, "6-portal-read-only.png"), fullPage: true });

    // Followed while a session is open, a link to another account asks first; declined,
    // the page stays where it was.
    let asked = null;
    page.once("dialog", (dialog) => {
      asked = dialog.message();
      dialog.dismiss();
    });
    await page.goto(otherLink);
    await page.waitForFunction(() => !window.location.hash.includes("token"));
    check(asked !== null && asked.includes("globex"), `switching accounts did not ask: ${asked}`);
    const stayed = await page.locator("#who").textContent();
    check(stayed.includes("Account acme"), `a declined link switched the page: ${stayed}`);
    // A forged link, accepted, is refused by the server and leaves the session as it was.
    const forged = otherLink.replace(/.$/, (c) => (c === "A" ? "B" : "A"));
    page.once("dialog", (dialog) => dialog.accept());
    await page.goto(forged);
    await page.waitForFunction(() => !window.location.hash.includes("token"));
    await page.locator("#notice", { hasText: "refused" }).waitFor({ timeout: 5000 });
    const kept = await page.evaluate(() => sessionStorage.getItem("hooklane.token"));
    check(kept !== null, "a forged link's failure ended the open session");
    const still = await page.locator("#who").textContent();
    check(still.includes("Account acme"), `a forged link switched the page: ${still}`);

    // A link to another account shows that account, and nothing of acme.
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.locator("#sign-in").waitFor({ state: "visible" });
    await page.goto(otherLink);
    await page.locator("#who", { hasText: "Account globex ·" }).waitFor();
    await page.locator("#endpoints tbody tr", { hasText: "/globex-hook" }).waitFor();
    const shown = await page.locator("#app").textContent();
    check(!shown.includes("/ep/shop") && !shown.includes(replayed), "acme's data on globex's page");
    await page.screenshot({ path: path.join(shots, "7-portal-other-account.png"), fullPage: true });

    // An expired link is refused, saying so.
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.locator("#sign-in").waitFor({ state: "visible" });
    await page.goto(expiredLink);
    await page.locator("#sign-in-error", { hasText: "This portal link has expired" }).waitFor();
    check(await page.locator("#app").isHidden(), "an expired link opened the page");
    check(!page.url().includes("token"), `the expired token stayed in the address bar: ${page.url()}`);
    await page.screenshot({ path: path.join(shots, "8-portal-expired.png") });
    const unexpected = problems.filter((p) => !p.includes("status of 401"));
    check(unexpected.length === 0, `the page reported problems:\n${unexpected.join("\n")}`);
    console.log(`ui: signed in, filtered, opened attempts, replayed, bulk-resent, followed portal links; screenshots in ${shots}`);
  });
}

run("ui test", main);
