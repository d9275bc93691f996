// Browser tests of the Tributary web UI: Debian's chromium driven by playwright-core.
// Started by crates/daemon/tests/e2e/browser_ui.rs, which runs nginx and `tributary serve` and passes:
// TRIBUTARY_URL, TRIBUTARY_PASSWORD, TRIBUTARY_TOKEN_FILE, CONF_DIR, NGINX_URL, ALPHA_PORT,
// BETA_PORT, ARTIFACTS (screenshots), PROFILE_DIR (a fresh chromium profile).
// Prints one line per test and ends with "N passed, N failed".
import { chromium } from "playwright-core";
import fs from "node:fs";
import path from "node:path";
import assert from "node:assert/strict";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`environment variable ${k} is not set (run through cargo nextest)`);
  return v;
};
const BASE = env("TRIBUTARY_URL");
const PASSWORD = env("TRIBUTARY_PASSWORD");
const TOKEN = fs.readFileSync(env("TRIBUTARY_TOKEN_FILE"), "utf8").trim();
const CONF_DIR = env("CONF_DIR");
const NGINX = env("NGINX_URL");
const ALPHA = env("ALPHA_PORT");
const ARTIFACTS = env("ARTIFACTS");
const PROFILE = env("PROFILE_DIR");
const SECRET = "browser-secret-value-4711";
const file = (name) => path.join(CONF_DIR, "upstreams", `${name}.conf`);

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

async function shot(page, name) {
  await page.screenshot({ path: path.join(ARTIFACTS, name), fullPage: true });
}
async function api(method, p, body) {
  const r = await fetch(BASE + p, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json" },
    body: body ? JSON.stringify(body) : undefined,
  });
  return { status: r.status, text: await r.text() };
}
async function upstreamBody(name) {
  const r = await fetch(`${NGINX}/u/${name}/`);
  return (await r.text()).trim();
}
async function waitFor(cond, what, ms = 20000) {
  const end = Date.now() + ms;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

let ctx, page;

test("unauthenticated pages redirect to the login, which refuses a wrong password", async () => {
  await page.goto(`${BASE}/ui/bindings`);
  assert.match(page.url(), /\/login$/);
  await shot(page, "login.png");
  await page.fill("#password", "not the password");
  await page.click("button[type=submit]");
  await page.waitForSelector("text=Wrong password.");
  assert.match(page.url(), /\/login$/);
});

test("logs in; the session cookie is HttpOnly and SameSite=Strict", async () => {
  await page.fill("#password", PASSWORD);
  await page.click("button[type=submit]");
  await page.waitForURL(`${BASE}/ui/bindings`);
  await page.waitForSelector("text=No bindings yet");
  const c = (await ctx.cookies()).find((c) => c.name === "tributary_session");
  assert.ok(c, "session cookie set");
  assert.equal(c.httpOnly, true);
  assert.equal(c.sameSite, "Strict");
});

test("the form shows each invalid field's message next to it and creates nothing", async () => {
  await page.click("text=New binding");
  await page.click("text=Static list");
  assert.equal(await page.getAttribute("#cfg-targets", "type"), "text");
  // Required marks come from the provider's configuration.fields.
  assert.ok(await page.isVisible("label[for=cfg-targets] .req"));
  await page.fill("#f-name", "web");
  await page.fill("#f-service", "demo");
  await page.fill("#f-interval", "soon");
  await page.click("button[value=save]");
  await page.waitForSelector("#err-interval_secs");
  assert.match(await page.textContent("#err-interval_secs"), /whole number of seconds/);
  await page.fill("#f-interval", "5");
  await page.click("button[value=save]");
  await page.waitForSelector("#err-interval_secs");
  assert.match(await page.textContent("#err-interval_secs"), /too short/);
  await page.fill("#f-interval", "30");
  await page.click("button[value=save]");
  await page.waitForSelector("#err-targets");
  assert.match(await page.textContent("#err-targets"), /targets/);
  await shot(page, "binding-form-errors.png");
  const r = await api("GET", "/api/v1/bindings");
  assert.equal(JSON.parse(r.text).bindings.length, 0, "nothing was created");
});

test("test resolve shows what would be written without applying it", async () => {
  await page.fill("#cfg-targets", `127.0.0.1:${ALPHA}`);
  await page.fill("#f-directives", "keepalive 8;");
  await page.click("button[value=test]");
  await page.waitForSelector("#preview-file");
  const text = await page.textContent("#preview-file");
  assert.match(text, new RegExp(`server 127\\.0\\.0\\.1:${ALPHA} weight=1;`));
  assert.match(text, /keepalive 8;/);
  assert.equal(fs.existsSync(file("web")), false, "test resolve wrote no file");
  await shot(page, "test-resolve.png");
});

test("saving resolves the binding: the file appears, nginx serves it, the page shows it", async () => {
  await page.click("button[value=save]");
  await page.waitForURL(`${BASE}/ui/bindings/web`);
  assert.equal((await page.textContent("h1 .state")).trim(), "ok");
  assert.ok(fs.existsSync(file("web")), "upstreams/web.conf written");
  assert.match(fs.readFileSync(file("web"), "utf8"), new RegExp(`server 127\\.0\\.0\\.1:${ALPHA}`));
  assert.match(await page.textContent("#generated-file"), /upstream web \{/);
  assert.equal((await page.textContent("#include-line")).trim(), "include upstreams/web.conf;");
  assert.match(await page.textContent("table.servers"), new RegExp(ALPHA));
  await waitFor(async () => (await upstreamBody("web")) === "alpha", "nginx to serve through web");
  await page.click("button[data-copy=include-line]");
  await page.waitForSelector("button[data-copy=include-line]:has-text('Copied')");
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  assert.equal(copied, "include upstreams/web.conf;");
  await shot(page, "binding-detail.png");
});

test("the list shows name, service, provider, state, servers, last resolution, next refresh", async () => {
  await page.click("nav >> text=Bindings");
  const row = page.locator("tr[data-binding=web]");
  const text = await row.textContent();
  for (const part of ["web", "demo", "static/static", "ok", "1"]) assert.ok(text.includes(part), `${part} in ${text}`);
  assert.match(text, /in \d+ s|resolving/);
  assert.notEqual(await row.getAttribute("class"), "failing");
  await shot(page, "bindings-list.png");
});

test("refresh now resolves again and adds to the history", async () => {
  await page.goto(`${BASE}/ui/bindings/web`);
  const before = await page.locator("table.history tbody tr").count();
  await page.click("text=Refresh now");
  await page.waitForURL(`${BASE}/ui/bindings/web`);
  const after = await page.locator("table.history tbody tr").count();
  assert.equal(after, before + 1);
  assert.match(await page.textContent("table.history tbody tr:first-child"), /unchanged/);
  assert.ok(await page.isVisible("figure.chart svg"));
});

test("a target set nginx rejects: the failure shows nginx's message and the old servers stay", async () => {
  const good = fs.readFileSync(file("web"), "utf8");
  await page.click("text=Edit");
  assert.equal(await page.inputValue("#cfg-targets"), `127.0.0.1:${ALPHA}`);
  await page.fill("#cfg-targets", "nonexistent.invalid:80");
  await page.click("button[value=save]");
  await page.waitForURL(`${BASE}/ui/bindings/web`);
  assert.equal((await page.textContent("h1 .state")).trim(), "failing");
  assert.match(await page.textContent("pre.nginx-error"), /host not found in upstream/);
  assert.match(await page.textContent("table.servers"), new RegExp(ALPHA), "old servers still shown");
  assert.equal(fs.readFileSync(file("web"), "utf8"), good, "the previous file was restored");
  assert.equal(await upstreamBody("web"), "alpha");
  await shot(page, "binding-failing.png");
  await page.click("nav >> text=Bindings");
  assert.equal(await page.getAttribute("tr[data-binding=web]", "class"), "failing");
  await shot(page, "bindings-list-failing.png");
});

test("a plugin error shows its code and the field at fault; the servers stay", async () => {
  await page.goto(`${BASE}/ui/bindings/web/edit`);
  await page.fill("#cfg-targets", "this is not a target list");
  await page.click("button[value=save]");
  await page.waitForURL(`${BASE}/ui/bindings/web`);
  assert.equal((await page.textContent("h1 .state")).trim(), "failing");
  assert.equal((await page.textContent("dd.code")).trim(), "-32003");
  assert.equal((await page.textContent("dd.field")).trim(), "targets");
  assert.match(await page.textContent("table.servers"), new RegExp(ALPHA));
  assert.equal(await upstreamBody("web"), "alpha");
});

test("dropped targets are listed with their reasons", async () => {
  await page.goto(`${BASE}/ui/bindings/web/edit`);
  await page.fill("#cfg-targets", `127.0.0.1:${ALPHA} bad_host:80`);
  await page.click("button[value=save]");
  await page.waitForURL(`${BASE}/ui/bindings/web`);
  assert.notEqual((await page.textContent("h1 .state")).trim(), "failing");
  const dropped = await page.textContent("ul.dropped");
  assert.match(dropped, /bad_host/);
  assert.match(dropped, /bad address/);
  assert.ok(!fs.readFileSync(file("web"), "utf8").includes("bad_host"), "dropped target not written");
});

test("secret fields are password inputs, write-only: never sent back to the browser", async () => {
  await page.goto(`${BASE}/ui/new?plugin=testplug&provider=t`);
  assert.equal(await page.getAttribute("#cfg-token", "type"), "password");
  await page.fill("#f-name", "sec");
  await page.fill("#f-service", "ok");
  await page.fill("#cfg-token", SECRET);
  await page.fill("#cfg-note", "visible note");
  await page.click("button[value=save]");
  await page.waitForURL(`${BASE}/ui/bindings/sec`);
  let html = await page.content();
  assert.ok(!html.includes(SECRET), "detail page has no secret");
  assert.match(html, /secret, set/);
  assert.match(html, /visible note/);
  await page.click("text=Edit");
  assert.equal(await page.inputValue("#cfg-token"), "");
  assert.ok(!(await page.content()).includes(SECRET), "edit page has no secret");
  // Saving the edit with the secret left empty keeps it.
  await page.fill("#cfg-note", "changed note");
  await page.click("button[value=save]");
  await page.waitForURL(`${BASE}/ui/bindings/sec`);
  assert.match(await page.content(), /secret, set/);
  for (const p of ["/ui/bindings", "/ui/bindings/sec", "/ui/nginx", "/metrics"]) {
    await page.goto(BASE + p);
    assert.ok(!(await page.content()).includes(SECRET), `${p} has no secret`);
  }
  for (const p of ["/api/v1/bindings", "/api/v1/bindings/sec", "/api/v1/bindings/sec/history", "/api/v1/openapi.json"]) {
    const r = await api("GET", p);
    assert.equal(r.status, 200, p);
    assert.ok(!r.text.includes(SECRET), `${p} has no secret`);
  }
  const r = await api("GET", "/api/v1/bindings/sec");
  assert.equal(JSON.parse(r.text).binding.secrets.token, true);
});

test("metrics are readable with the session", async () => {
  const r = await page.goto(`${BASE}/metrics`);
  assert.equal(r.status(), 200);
  const text = await page.textContent("body");
  assert.match(text, /tributary_resolutions_total\{outcome="failed"\} [1-9]/);
  assert.match(text, /tributary_nginx_test_failures_total [1-9]/);
  assert.match(text, /tributary_binding_staleness_seconds\{binding="web"\}/);
});

test("the nginx page shows the last refused change", async () => {
  await page.goto(`${BASE}/ui/nginx`);
  assert.match(await page.textContent("main"), /host not found in upstream/);
  await shot(page, "nginx.png");
});

test("a form posted without its CSRF token is refused and changes nothing", async () => {
  const status = await page.evaluate(async () => {
    const r = await fetch("/ui/bindings/web/delete", { method: "POST", body: new URLSearchParams({ csrf: "forged" }) });
    return r.status;
  });
  assert.equal(status, 403);
  assert.ok(fs.existsSync(file("web")));
});

test("delete removes the binding and its file", async () => {
  await page.goto(`${BASE}/ui/bindings/web`);
  page.once("dialog", (d) => d.accept());
  await page.click("button.danger");
  await page.waitForURL(/\/ui\/bindings\?deleted=web$/);
  await page.waitForSelector("text=Deleted binding web");
  assert.equal(await page.locator("tr[data-binding=web]").count(), 0);
  assert.equal(fs.existsSync(file("web")), false);
});

test("log out ends the session", async () => {
  await page.click("text=Log out");
  await page.waitForURL(`${BASE}/login`);
  await page.goto(`${BASE}/ui/bindings`);
  assert.match(page.url(), /\/login$/);
});

async function main() {
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  fs.mkdirSync(PROFILE, { recursive: true });
  ctx = await chromium.launchPersistentContext(PROFILE, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--no-first-run",
    ],
    viewport: { width: 1280, height: 900 },
  });
  await ctx.grantPermissions(["clipboard-read", "clipboard-write"], { origin: BASE });
  page = ctx.pages()[0] || (await ctx.newPage());
  page.setDefaultTimeout(30000);
  let passed = 0;
  let failed = 0;
  try {
    for (const t of tests) {
      try {
        await t.fn();
        passed++;
        console.log(`ok - ${t.name}`);
      } catch (e) {
        failed++;
        console.log(`FAILED - ${t.name}\n  ${String(e && e.stack || e).split("\n").join("\n  ")}`);
        await shot(page, `failure-${passed + failed}.png`).catch(() => {});
      }
    }
  } finally {
    await ctx.close();
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exitCode = failed === 0 ? 0 : 1;
}

main().catch((e) => {
  console.error(e);
  console.log("0 passed, 1 failed");
  process.exitCode = 1;
});
