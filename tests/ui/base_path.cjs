// Drives the /ui page mounted under a base path, as behind a reverse proxy or an API Gateway
// base-path mapping: a portal link to …/base/ui opens the account, and so does …/base/ui/,
// with every file and API call kept under /base/. Started by tests/e2e/ui.rs, whose proxy
// answers 404 to anything outside /base/.
"use strict";

const path = require("node:path");
const { need, check, withPage, run } = require("./browser.cjs");

const link = need("HOOKLANE_UI_PORTAL");
const mount = need("HOOKLANE_UI_MOUNT");
const account = need("HOOKLANE_UI_ACCOUNT");
const endpoint = need("HOOKLANE_UI_ENDPOINT");
const delivery = need("HOOKLANE_UI_DELIVERY");
const shots = need("HOOKLANE_UI_SCREENSHOTS");

async function main() {
  await withPage(shots, async (page, problems) => {
    // A request that left the mount is named as soon as it is answered, not waited out.
    const outside = [];
    let leave;
    const left = new Promise((_, reject) => { leave = reject; });
    left.catch(() => {});
    const leftMessage = (where) => `${where}: requests left the mount ${mount}:\n${outside.join("\n")}`;
    page.on("response", (response) => {
      const url = response.url();
      if (!url.startsWith(mount) || response.status() === 404) {
        outside.push(`${response.request().method()} ${url} → ${response.status()}`);
        leave();
      }
    });
    const stayedInside = (where) => check(outside.length === 0, leftMessage(where));
    const shown = (where, locator) => Promise.race([
      locator.waitFor(),
      left.catch(() => { throw new Error(leftMessage(where)); }),
    ]);

    // The portal link names the page without a trailing slash.
    check(link.startsWith(`${mount}ui#token=`), `the portal link is not under the mount: ${link}`);
    await page.goto(link);
    stayedInside("loading the page");
    await shown("the portal link", page.locator("#who", { hasText: `Account ${account} ·` }));
    await shown("the portal link", page.locator(`#endpoints tr[data-endpoint="${endpoint}"]`));
    await shown("the portal link", page.locator(`#deliveries tr[data-delivery="${delivery}"]`));
    // The health panel: its own calls, under the mount too.
    await page.locator(`#endpoints tr[data-endpoint="${endpoint}"]`)
      .getByRole("button", { name: /^Manage / }).click();
    await shown("the health panel", page.locator("#ep-24h", { hasText: /\S/ }));
    await page.screenshot({ path: path.join(shots, "20-base-path.png"), fullPage: true });
    stayedInside("the portal link");

    // The same page with a trailing slash, the session kept in the tab.
    await page.goto(`${mount}ui/`);
    stayedInside("loading the page at ui/");
    await shown("the page at ui/", page.locator("#who", { hasText: `Account ${account} ·` }));
    await shown("the page at ui/", page.locator(`#deliveries tr[data-delivery="${delivery}"]`));
    await page.screenshot({ path: path.join(shots, "21-base-path-slash.png"), fullPage: true });
    stayedInside("the page at ui/");
    check(problems.length === 0, `the page reported problems:\n${problems.join("\n")}`);
  });
  console.log(`base path: the page and its API calls stayed under ${mount}`);
}

run("base_path", main);
