// What the browser tests share: their settings from the environment, Debian's headless
// Chromium with a throwaway profile, and the page's errors collected as problems.
"use strict";

const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (run through tests/e2e/ui.rs)`);
  return value;
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

// Runs `steps(page, problems)` in a fresh browser; on failure takes `failure.png` in `shots`.
async function withPage(shots, steps) {
  const { chromium } = require(path.join(need("HOOKLANE_TEST_NODE_MODULES"), "playwright-core"));
  fs.mkdirSync(shots, { recursive: true });
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "hooklane-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  const problems = [];
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(15_000);
  page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  page.on("console", (message) => {
    if (message.type() === "error") problems.push(`console error: ${message.text()}`);
  });
  page.on("requestfailed", (request) => problems.push(`request failed: ${request.url()}`));
  try {
    await steps(page, problems, context);
  } catch (error) {
    await page.screenshot({ path: path.join(shots, "failure.png"), fullPage: true }).catch(() => {});
    if (problems.length) console.error(problems.join("\n"));
    throw error;
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

function run(name, main) {
  main().catch((error) => {
    console.error(`${name} failed: ${error.stack || error}`);
    process.exit(1);
  });
}

module.exports = { need, check, withPage, run };
