// Load pages of the web console in headless Chromium (Debian's, via playwright-core)
// and report what each shows; tests/test_web_console.py asserts on the report.
//
//   node console_pages.mjs SPEC.json REPORT.json
//
// SPEC: {"executable": path, "base": "http://host:port", "screenshots": dir,
//        "pages": [{"name", "path", "wait": selector, "charts": [selector...],
//                   "clicks": [selector...]}]}
// For each page: HTTP status, title, <h1>, the facts (label -> value), every
// table (id -> rows of cell texts, links as {text, href}), console errors and
// failed requests; each chart in "charts" is awaited until it has drawn 3
// points and a non-zero rate (the test produces and consumes meanwhile). Each
// link in "clicks" is then followed in turn (the pager's next/previous links),
// and each page it leads to is reported the same way, under "steps", with its
// URL, the bytes of its HTML and how long it took to load.
import { readFileSync, writeFileSync } from "node:fs";
import { chromium } from "playwright-core";

const [specPath, reportPath] = process.argv.slice(2);
const spec = JSON.parse(readFileSync(specPath, "utf8"));
const browser = await chromium.launch({
  executablePath: spec.executable,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const report = {};
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  for (const wanted of spec.pages) {
    const page = await context.newPage();
    const problems = [];
    page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()}`));
    page.on("request", (r) => {
      if (!r.url().startsWith(spec.base)) problems.push(`request outside the gateway: ${r.url()}`);
    });
    const response = await page.goto(spec.base + wanted.path, { waitUntil: "load" });
    if (wanted.wait) await page.waitForSelector(wanted.wait, { timeout: 30000 });
    const charts = {};
    for (const selector of wanted.charts || []) {
      await page.waitForFunction((sel) => {
        const section = document.querySelector(sel);
        if (!section || Number(section.dataset.points || 0) < 3) return false;
        return Object.values(JSON.parse(section.dataset.last)).some((v) => v > 0);
      }, selector, { timeout: 60000, polling: 250 });
      charts[selector] = await page.$eval(selector, (s) => ({
        points: Number(s.dataset.points), last: JSON.parse(s.dataset.last),
        canvas: !!s.querySelector("canvas"), legend: s.querySelector(".u-legend")?.textContent,
      }));
    }
    const show = () => page.evaluate(() => {
      const text = (el) => el.textContent.trim();
      const tables = {};
      for (const table of document.querySelectorAll("table[id]")) {
        tables[table.id] = [...table.querySelectorAll("tbody tr")].map((tr) =>
          [...tr.querySelectorAll("td")].map((td) => {
            const a = td.querySelector("a");
            return a ? { text: text(a), href: a.getAttribute("href") } : text(td);
          }));
      }
      const facts = {};
      for (const fact of document.querySelectorAll(".fact")) {
        facts[text(fact.querySelector("dt"))] = text(fact.querySelector("dd"));
      }
      return {
        title: document.title, h1: text(document.querySelector("h1")), tables, facts,
        nav: document.querySelector("nav a.active")?.textContent,
        headers: [...document.querySelectorAll("th")].map(text),
        pager: document.querySelector("nav.pager")?.textContent.trim(),
      };
    });
    const shown = await show();
    shown.bytes = (await response.body()).length;
    const steps = [];
    for (const selector of wanted.clicks || []) {
      const started = Date.now();
      const [next] = await Promise.all([
        page.waitForNavigation({ waitUntil: "load" }),
        page.click(selector),
      ]);
      if (wanted.wait) await page.waitForSelector(wanted.wait, { timeout: 30000 });
      steps.push({ url: page.url().slice(spec.base.length), status: next.status(),
                   bytes: (await next.body()).length, ms: Date.now() - started,
                   ...(await show()) });
    }
    const screenshot = `${spec.screenshots}/${wanted.name}.png`;
    await page.screenshot({ path: screenshot, fullPage: true });
    report[wanted.name] = { status: response.status(), ...shown, charts, steps, problems,
                            screenshot };
    await page.close();
  }
} finally {
  await browser.close();
}
writeFileSync(reportPath, JSON.stringify(report, null, 2));
