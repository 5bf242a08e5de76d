// The console's browser suite: playwright-core drives Debian's Chromium against a real stack
// (API with the console, worker, simulator) that internal/e2e/console_browser_test.go starts and
// describes in the environment. Each step logs "step: NAME"; any failure exits non-zero.
// Screenshots go to $LLMQ_SCREENSHOTS (default test/browser/out).
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const need = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is required`);
  return v;
};
const CONSOLE = need('LLMQ_CONSOLE_URL') + '/console/';
const API = need('LLMQ_API');
const SIM = need('LLMQ_SIM');
const OPERATOR_TOKEN = need('LLMQ_OPERATOR_TOKEN');
const TENANT_TOKEN = need('LLMQ_TENANT_TOKEN');
const SHOTS = process.env.LLMQ_SCREENSHOTS || join(import.meta.dirname, 'out');
const WAIT = { timeout: 30_000 };

// The Go test kills this process group after its own deadline; end first, cleanly.
const deadline = setTimeout(() => { console.error('browser suite: no end within 170 s'); process.exit(3); }, 170_000);
const step = (name) => console.log(`step: ${name}`);

async function post(url, body) {
  return fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
}
async function faults(f) {
  const r = await post(`${SIM}/_sim/faults`, f);
  assert.ok(r.ok, `set simulator faults: ${r.status}`);
}
async function submit(text) {
  return submitBody({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user', content: text }] });
}
// submitBody submits a job of the provider request body and returns its id.
async function submitBody(request) {
  const r = await post(`${API}/v1/jobs`, { request });
  const body = await r.text();
  assert.equal(r.status, 202, body);
  return JSON.parse(body).id;
}
// waitStatus polls the API (not the browser) until the job has the status.
async function waitStatus(id, status) {
  for (const until = Date.now() + 30_000; Date.now() < until;) {
    const job = await (await fetch(`${API}/v1/jobs/${id}`)).json();
    if (job.status === status) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`job ${id} not ${status} within 30 s`);
}
// deadLetter submits a job of one attempt that the simulator fails (500) and returns its id once
// it is dead (retries_exhausted).
async function deadLetter(text) {
  await faults({ fail_next: 1, fail_next_status: 500 });
  const r = await post(`${API}/v1/jobs`, { max_attempts: 1, request: { model: 'm', max_tokens: 8, messages: [{ role: 'user', content: text }] } });
  assert.equal(r.status, 202);
  const id = (await r.json()).id;
  await waitStatus(id, 'dead');
  return id;
}
const text = (page, sel) => page.locator(sel).first().textContent();
// fitsWindow asserts that the page shown is no wider than the window: a long unbroken value (an
// error message, a request's text, an event's JSON) wraps instead of widening the whole page.
async function fitsWindow(page, what) {
  const { scroll, inner } = await page.evaluate(() => ({ scroll: document.documentElement.scrollWidth, inner: innerWidth }));
  assert.ok(scroll <= inner, `${what} is ${scroll} px wide in a ${inner} px window`);
}
const shot = (page, name) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });

// confirm clicks a button whose action asks for confirmation, checks the dialog's text, and
// answers it.
async function confirm(page, button, expected, answer) {
  await page.click(button);
  const dialog = page.locator('dialog#confirm[open]');
  await dialog.waitFor(WAIT);
  assert.match(await dialog.locator('#confirm-text').textContent(), expected);
  await page.click(answer === 'ok' ? '#confirm-ok' : '#confirm-cancel');
  await page.locator('dialog#confirm[open]').waitFor({ state: 'detached', ...WAIT });
}

const profile = mkdtempSync(join(tmpdir(), 'llmq-chromium-'));
mkdirSync(SHOTS, { recursive: true });
let context;
try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.LLMQ_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1280, height: 800 },
  });
  const errors = [];
  context.on('weberror', (e) => { console.error('page error:', e.error().message); errors.push(e.error().message); });
  const page = context.pages()[0] || await context.newPage();

  step('a finished job to count');
  await faults({});
  const first = await submit('Hello from the browser suite');
  await waitStatus(first, 'succeeded');

  step('a tenant token is refused');
  await page.goto(CONSOLE);
  await page.locator('#login').waitFor(WAIT);
  await page.fill('#token', TENANT_TOKEN);
  await page.click('#login-form button');
  await page.locator('#login-error', { hasText: "tenant's API token" }).waitFor(WAIT);
  assert.equal(await page.locator('#nav').isVisible(), false);
  const bearer = await page.request.get(`${CONSOLE}api/overview`, { headers: { Authorization: `Bearer ${TENANT_TOKEN}` } });
  assert.equal(bearer.status(), 401);

  step('log in; the overview shows the counts');
  await page.fill('#token', OPERATOR_TOKEN);
  await page.click('#login-form button');
  await page.locator('#who', { hasText: 'alice' }).waitFor(WAIT);
  await page.locator('[data-testid=count-succeeded]', { hasText: /^1$/ }).waitFor(WAIT);
  await page.locator('[data-testid=submitted]', { hasText: /^1$/ }).waitFor(WAIT); // as ctl stats' "jobs submitted"
  const cookie = (await context.cookies()).find((c) => c.name === 'llmq_console');
  assert.ok(cookie && cookie.httpOnly && cookie.sameSite === 'Strict', JSON.stringify(cookie));
  assert.equal(await page.evaluate(() => document.cookie.includes('llmq_console')), false, 'HttpOnly: no script reads it');
  const rows = await page.evaluate(() => [...document.querySelectorAll('.cards')].map(
    (c) => new Set([...c.children].map((card) => card.offsetTop)).size));
  assert.deepEqual(rows, rows.map(() => 1), `each row of cards fits the 1280 px window on one line: ${rows}`);

  step('the overview\'s first load: weight and time');
  await page.goto(CONSOLE + '#/overview');
  await page.reload(); // a real load: the session cookie opens it at once
  await page.locator('[data-testid=count-succeeded]', { hasText: /^1$/ }).waitFor(WAIT);
  const load = await page.evaluate(() => {
    const entries = [...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')];
    const api = entries.filter((e) => e.name.includes('/console/api/') && !e.name.includes('/live'))
      .map((e) => `${new URL(e.name).pathname} ${Math.round(e.responseEnd - e.startTime)} ms` +
        (e.serverTiming?.length ? ` [${e.serverTiming.map((t) => `${t.name} ${Math.round(t.duration)} ms`).join(', ')}]` : ''));
    const dcl = Math.round(performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd);
    return { bytes: entries.reduce((n, e) => n + (e.transferSize || 0), 0), ms: Math.round(performance.now()), api, dcl };
  });
  console.log(`overview first load: ${load.bytes} bytes transferred, interactive with figures at ${load.ms} ms ` +
    `(DOMContentLoaded ${load.dcl} ms; ${load.api.join(', ')})`);
  assert.ok(load.bytes <= 200_000, `the overview weighs ${load.bytes} bytes`);

  step('the overview\'s first load in an outage: the page comes back by itself');
  // The API answers 503 (its database down) and a proxy 502 in place of the stream; both end.
  const unavailable = { error: { type: 'unavailable', message: 'the database is unreachable; try again shortly' } };
  await page.route('**/console/api/overview', (r) => r.fulfill({ status: 503, contentType: 'application/json', body: JSON.stringify(unavailable) }));
  await page.route('**/console/api/overview/live', (r) => r.fulfill({ status: 502, contentType: 'text/html', body: 'Bad Gateway' }));
  await page.reload();
  await page.locator('#page-error', { hasText: 'the database is unreachable' }).waitFor(WAIT);
  await page.locator('#live.stale', { hasText: /^not live/ }).waitFor(WAIT);
  await page.evaluate(() => { window.llmqNoReload = true; });
  await page.unrouteAll({ behavior: 'wait' });
  await page.locator('[data-testid=count-succeeded]', { hasText: /^1$/ }).waitFor(WAIT);
  await page.locator('#live:not(.stale)', { hasText: /^live$/ }).waitFor(WAIT);
  assert.equal(await page.evaluate(() => window.llmqNoReload), true, 'came back without a reload');

  step('the overview\'s stream: stale figures, then a cut stream, are not shown live');
  // The stream says its figures are stale, then ends (a server restart); the reconnect meets
  // a proxy's 502 until the route is lifted.
  let opened = 0;
  await page.route('**/console/api/overview/live', (r) => (opened++ === 0 ?
    r.fulfill({ status: 200, contentType: 'text/event-stream', body: 'event: overview_stale\ndata: {"as_of":"2026-01-02T03:04:05Z"}\n\n' }) :
    r.fulfill({ status: 502, contentType: 'text/html', body: 'Bad Gateway' })));
  await page.goto(CONSOLE + '#/jobs');
  await page.locator('#jobs').waitFor(WAIT);
  await page.goto(CONSOLE + '#/overview');
  await page.locator('[data-testid=count-succeeded]', { hasText: /^1$/ }).waitFor(WAIT);
  const asOf = await page.evaluate(() => new Date('2026-01-02T03:04:05Z').toLocaleString());
  await page.locator('#live.stale', { hasText: `figures as of ${asOf}` }).waitFor(WAIT);
  await page.locator('#live.stale', { hasText: /^not live: reconnecting/ }).waitFor(WAIT);
  for (const until = Date.now() + 30_000; opened < 2 && Date.now() < until;) await new Promise((res) => setTimeout(res, 50));
  assert.ok(opened >= 2, 'the page reconnects');
  await page.unrouteAll({ behavior: 'wait' });
  await page.locator('#live:not(.stale)', { hasText: /^live$/ }).waitFor(WAIT);

  step('a dead letter appears on the overview live when a spend cap hits');
  await page.evaluate(() => { window.llmqNoReload = true; });
  await faults({ spend_cap: true });
  const dead = await submit('This one hits the spend cap');
  await page.locator('[data-testid="dead-rate_limited_no_retry_after"]', { hasText: /^1$/ }).waitFor(WAIT);
  await page.locator('[data-testid=submitted]', { hasText: /^2$/ }).waitFor(WAIT);
  assert.equal(await page.evaluate(() => window.llmqNoReload), true, 'updated without a reload');
  await shot(page, 'overview');

  step('a job waits on the paused credential; its page is open');
  const waiting = await submit('This one waits for the resume');
  await page.goto(`${CONSOLE}#/job/${waiting}`);
  await page.locator('[data-testid=job-status]').waitFor(WAIT);
  assert.doesNotMatch(await text(page, '[data-testid=job-status]'), /succeeded/);
  await page.evaluate(() => { window.llmqNoReload = true; });

  step('the dead letter, its attempts');
  const tab = await context.newPage();
  await tab.goto(`${CONSOLE}#/dead`);
  await tab.locator(`#dead tr[data-id="${dead}"]`).waitFor(WAIT);
  await shot(tab, 'dead-letters');
  await tab.click(`#dead tr[data-id="${dead}"] a`);
  await tab.locator('[data-testid=job-status]', { hasText: 'dead' }).waitFor(WAIT);
  await tab.locator('#attempts li').first().waitFor(WAIT);
  assert.match(await text(tab, '#attempts li'), /429/);
  await shot(tab, 'job');
  await fitsWindow(tab, 'the dead letter\'s page');

  step('cancel a waiting job from its page, with a confirmation');
  const doomed = await submit('This one is canceled while it waits');
  await tab.goto(`${CONSOLE}#/job/${doomed}`);
  await tab.locator('#cancel-job').waitFor(WAIT);
  await confirm(tab, '#cancel-job', /^Cancel job [0-9a-f-]{36}\?/, 'ok');
  await tab.locator('#flash', { hasText: `job ${doomed} canceled` }).waitFor(WAIT);
  await tab.locator('[data-testid=job-status]', { hasText: 'canceled' }).waitFor(WAIT);
  assert.equal(await tab.locator('#cancel-job').count(), 0, 'no Cancel on a job that ended');
  assert.equal((await (await fetch(`${API}/v1/jobs/${doomed}`)).json()).status, 'canceled');
  const metrics = await (await fetch(`${need('LLMQ_CONSOLE_URL')}/metrics`)).text(); // the console's own API
  assert.match(metrics, /^llmq_jobs_finished_total\{credential="default",status="canceled"\} 1$/m, 'the API counts its console\'s cancel');

  step('resume the paused credential');
  await tab.goto(`${CONSOLE}#/credentials`);
  await tab.locator('#credentials tr[data-name=default] [data-testid=paused]', { hasText: 'since' }).waitFor(WAIT);
  await shot(tab, 'credentials');
  await faults({});
  await tab.click('#credentials tr[data-name=default] button.resume');
  await tab.locator('#flash', { hasText: 'credential default resumed' }).waitFor(WAIT);
  await tab.locator('#credentials tr[data-name=default] [data-testid=paused]', { hasText: /^no$/ }).waitFor(WAIT);

  step('the open job page goes live to succeeded');
  await page.locator('[data-testid=job-status]', { hasText: 'succeeded' }).waitFor(WAIT);
  assert.equal(await page.evaluate(() => window.llmqNoReload), true, 'updated without a reload');
  await page.locator('#result', { hasText: 'llmsim reply to: This one waits for the resume' }).waitFor(WAIT);

  step('retry the dead letter, with a confirmation naming the count');
  await tab.goto(`${CONSOLE}#/dead`);
  await tab.check(`#dead tr[data-id="${dead}"] input.sel`);
  await confirm(tab, '#retry-selected', /^Retry 1 dead letter\?/, 'cancel');
  await tab.locator(`#dead tr[data-id="${dead}"]`).waitFor(WAIT); // cancel did nothing
  await confirm(tab, '#retry-selected', /^Retry 1 dead letter\?/, 'ok');
  await tab.locator('#flash', { hasText: 'Retried 1 of 1.' }).waitFor(WAIT);
  await tab.locator(`#dead tr[data-id="${dead}"]`).waitFor({ state: 'detached', ...WAIT });
  await tab.goto(`${CONSOLE}#/job/${dead}`);
  await tab.locator('[data-testid=job-status]', { hasText: 'succeeded' }).waitFor(WAIT);

  step('purge a dead letter found by its reason');
  const exhausted = await deadLetter('once');
  await tab.goto(`${CONSOLE}#/dead`);
  await tab.selectOption('select[name=reason]', 'retries_exhausted');
  await tab.click('form.filters button');
  await tab.waitForURL(/reason=retries_exhausted/);
  await tab.locator(`#dead tr[data-id="${exhausted}"]`).waitFor(WAIT);
  assert.equal(await tab.locator('#dead tr[data-id]').count(), 1);
  await tab.check('#select-all');
  await confirm(tab, '#purge-selected', /^Purge 1 dead letter\?/, 'ok');
  await tab.locator('#flash', { hasText: 'Purged 1 of 1.' }).waitFor(WAIT);
  assert.equal((await fetch(`${API}/v1/jobs/${exhausted}`)).status, 404);

  step('purge a dead letter from its page: the dead letters are shown, not an error');
  const purgedHere = await deadLetter('purged from its page');
  await tab.goto(`${CONSOLE}#/job/${purgedHere}`);
  await tab.locator('[data-testid=job-status]', { hasText: 'dead' }).waitFor(WAIT);
  await confirm(tab, '#purge-one', /^Purge 1 dead letter\?/, 'ok');
  await tab.locator('#flash', { hasText: 'Purged 1 of 1.' }).waitFor(WAIT);
  await tab.waitForURL(/#\/dead$/);
  await tab.locator('#dead').waitFor(WAIT);
  assert.equal(await tab.locator('#page-error').count(), 0, 'no error page for the job just purged');
  assert.equal(await tab.locator('#flash.error').count(), 0, 'the purge is not flashed as an error');
  assert.equal((await fetch(`${API}/v1/jobs/${purgedHere}`)).status, 404);

  step('cancel a dead letter from its page, so that no retry sends it');
  const abandoned = await deadLetter('abandoned');
  await tab.goto(`${CONSOLE}#/job/${abandoned}`);
  await tab.locator('[data-testid=job-status]', { hasText: 'dead' }).waitFor(WAIT);
  await tab.locator('#cancel-job').waitFor(WAIT);
  await confirm(tab, '#cancel-job', /^Cancel dead job [0-9a-f-]{36}\? No retry sends it again/, 'ok');
  await tab.locator('#flash', { hasText: `job ${abandoned} canceled` }).waitFor(WAIT);
  await tab.locator('[data-testid=job-status]', { hasText: 'canceled' }).waitFor(WAIT);
  assert.equal(await tab.locator('#retry-one').count(), 0, 'no Retry on a canceled job');
  assert.equal((await (await fetch(`${API}/v1/jobs/${abandoned}`)).json()).status, 'canceled');

  step('a dead letter purged from another tab: its open page says so and drops its actions');
  // The page kept Retry, Cancel and Purge on a job no longer there (each answered "no such job").
  const purgedElsewhere = await deadLetter('purged from another tab');
  await tab.goto(`${CONSOLE}#/job/${purgedElsewhere}`);
  await tab.locator('#purge-one').waitFor(WAIT);
  await tab.locator('#live:not(.stale)', { hasText: /^live$/ }).waitFor(WAIT);
  const elsewhere = await context.newPage();
  await elsewhere.goto(`${CONSOLE}#/dead`);
  await elsewhere.check(`#dead tr[data-id="${purgedElsewhere}"] input.sel`);
  await confirm(elsewhere, '#purge-selected', /^Purge 1 dead letter\?/, 'ok');
  await elsewhere.locator('#flash', { hasText: 'Purged 1 of 1.' }).waitFor(WAIT);
  await elsewhere.close();
  // At once: the purge announces the page's job (llmq_job_changes); the page learnt it at its
  // stream's next keep-alive, 15 s after it opened, and this wait is shorter than that.
  await tab.locator('#live.stale', { hasText: /^not live: purged$/ }).waitFor({ timeout: 5_000 });
  await tab.locator('#flash.error', { hasText: 'no longer exists' }).waitFor(WAIT);
  for (const button of ['#retry-one', '#cancel-job', '#purge-one']) {
    assert.equal(await tab.locator(button).count(), 0, `no ${button} on a purged job`);
  }
  await tab.locator('[data-testid=job-status]', { hasText: 'dead' }).waitFor(WAIT); // the rest as last read

  step('the jobs list');
  await tab.goto(`${CONSOLE}#/jobs`);
  await tab.locator(`#jobs tr[data-id="${dead}"]`).waitFor(WAIT);
  for (const id of [first, waiting, dead]) await tab.locator(`#jobs tr[data-id="${id}"]`).waitFor(WAIT);
  await shot(tab, 'jobs');

  step('a batch job\'s page says it went through a provider batch; a streaming job\'s says it streams');
  const rb = await post(`${API}/v1/jobs`, { lane: 'batch', request: { model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'in a batch' }] } });
  assert.equal(rb.status, 202, await rb.clone().text());
  const batched = (await rb.json()).id;
  await waitStatus(batched, 'succeeded');
  await tab.goto(`${CONSOLE}#/job/${batched}`);
  await tab.locator('[data-testid=lane]', { hasText: /^batch · ended \(.+\)$/ }).waitFor(WAIT);
  const streamed = await submitBody({ stream: true, model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'streamed' }] });
  await waitStatus(streamed, 'succeeded');
  await tab.goto(`${CONSOLE}#/job/${streamed}`);
  await tab.locator('[data-testid=request]', { hasText: /· streamed ·/ }).waitFor(WAIT);
  await tab.locator('[data-testid=lane]', { hasText: /^online$/ }).waitFor(WAIT);

  step('markup in a job\'s fields is shown as text, never run');
  // The first message's text (the job page's request) and the reply quoting it (its result):
  // each must be text. The page's CSP would block an inline handler anyway; what is checked is
  // that no element is made of a field (an img, a script), and that the text reads as sent.
  // (At most 60 characters: the simulator quotes that many.)
  const markup = '<img src=x onerror=llmqXSS=1></script><svg onload=llmqXSS=2>';
  const hostile = await submit(markup);
  await waitStatus(hostile, 'succeeded');
  await tab.goto(`${CONSOLE}#/job/${hostile}`);
  await tab.locator('#result', { hasText: `llmsim reply to: ${markup}` }).waitFor(WAIT);
  await tab.locator('#page dd div.muted', { hasText: `“${markup}”` }).waitFor(WAIT);
  assert.equal(await tab.locator('#page img, #page script, #page svg, img[src=x]').count(), 0, 'no element made of a field');
  assert.equal(await tab.evaluate(() => window.llmqXSS), undefined, 'no markup of a field ran');
  await tab.goto(`${CONSOLE}#/jobs`);
  await tab.locator(`#jobs tr[data-id="${hostile}"]`).waitFor(WAIT);
  assert.equal(await tab.locator('#page img, #page script, #page svg, img[src=x]').count(), 0, 'none in the jobs list');

  step('a long unbroken text wraps on the job page and in the lists');
  const unbroken = await submit('x'.repeat(300));
  await waitStatus(unbroken, 'succeeded');
  await tab.goto(`${CONSOLE}#/job/${unbroken}`);
  await tab.locator('#result', { hasText: 'llmsim reply to: xxx' }).waitFor(WAIT);
  await fitsWindow(tab, 'a job page whose request is one 300-character word');

  step('create a tenant (its token shown once), set its weight, rotate its token, revoke it and delete it');
  await tab.goto(`${CONSOLE}#/tenants`);
  await tab.fill('#tenant-form input[name=name]', 'acme');
  // A double click sends it once: the second sent a create that failed "tenant exists", flashed
  // in red under (or over) the token shown once.
  let creates = 0;
  const countCreate = (req) => { if (req.method() === 'POST' && req.url().endsWith('/console/api/tenants')) creates++; };
  tab.on('request', countCreate);
  await tab.dblclick('#tenant-form button');
  await tab.locator('[data-testid=token]').waitFor(WAIT);
  tab.off('request', countCreate);
  assert.equal(creates, 1, 'a double click on Create tenant sends one create');
  assert.equal(await tab.locator('#flash').isVisible(), false, 'no error flashed under the token');
  const acmeFirst = await text(tab, '[data-testid=token]');
  assert.match(acmeFirst, /^llmq_[A-Za-z0-9_-]{43}$/);
  await shot(tab, 'tenants');
  // The weight box left empty sends no weight (the server refuses 0): the default.
  assert.equal(await tab.inputValue('#tenants tr[data-name=acme] td.weight input'), '1', 'the default weight');
  await tab.fill('#tenants tr[data-name=acme] td.weight input', '3');
  await tab.click('#tenants tr[data-name=acme] button.set-weight');
  await tab.locator('#flash', { hasText: 'tenant acme: weight 3' }).waitFor(WAIT);
  await tab.locator('#tenants tr[data-name=acme] td.weight input[value="3"]').waitFor(WAIT); // drawn again from the server
  // Its token rotated: the new one shown once, the old one's end in the list, both working.
  await confirm(tab, '#tenants tr[data-name=acme] button.rotate', /^Rotate tenant acme's token\? .*24 hours\.$/, 'ok');
  await tab.locator('#new-token [data-testid=token]').waitFor(WAIT);
  const acmeSecond = await text(tab, '#new-token [data-testid=token]');
  assert.match(acmeSecond, /^llmq_[A-Za-z0-9_-]{43}$/);
  assert.notEqual(acmeSecond, acmeFirst, 'a new token');
  await tab.locator('#tenants tr[data-name=acme] td.previous-token-ends', { hasText: /\d/ }).waitFor(WAIT);
  for (const token of [acmeFirst, acmeSecond]) {
    const res = await fetch(`${API}/v1/jobs/00000000-0000-4000-8000-000000000000`, { headers: { Authorization: `Bearer ${token}` } });
    assert.equal(res.status, 404, 'the old and the new token both work during the overlap');
  }
  // A revocation's answer may take seconds (one that cancels jobs waits for the replicas' caches):
  // the page says it is on its way meanwhile (it showed nothing, as if the click were lost). The
  // answer is held until the page says so.
  let told = false;
  await tab.route('**/console/api/tenants/acme/revoke', async (r) => {
    told = await tab.locator('#flash:not(.error)', { hasText: 'Revoking tenant acme…' }).waitFor({ timeout: 5_000 }).then(() => true, () => false);
    await r.continue();
  });
  await confirm(tab, '#tenants tr[data-name=acme] button.revoke', /^Revoke tenant acme\?/, 'ok');
  await tab.locator('#flash', { hasText: 'tenant acme revoked' }).waitFor(WAIT);
  await tab.unrouteAll({ behavior: 'wait' });
  assert.ok(told, 'the page said the revocation was on its way');
  // The table is drawn again after the message: wait for the revocation's date.
  await tab.locator('#tenants tr[data-name=acme] td.revoked', { hasText: /\d/ }).waitFor(WAIT);
  // Revoked, it can be deleted (offboarded): its row goes.
  await confirm(tab, '#tenants tr[data-name=acme] button.delete', /^Delete tenant acme\? .*cannot be undone/, 'ok');
  await tab.locator('#flash', { hasText: 'tenant acme deleted' }).waitFor(WAIT);
  await tab.locator('#tenants tr[data-name=acme]').waitFor({ ...WAIT, state: 'detached' });

  step('an action without the CSRF token is refused');
  const refused = await tab.evaluate(async () => {
    const r = await fetch('/console/api/tenants', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"name":"sneaky"}' });
    return { status: r.status, body: await r.json() };
  });
  assert.equal(refused.status, 403);
  assert.equal(refused.body.error.type, 'csrf');

  step('a session ended mid-use: an action shows the login, and logging in again returns to the page, no stale error');
  await tab.goto(`${CONSOLE}#/tenants`);
  await tab.locator('#tenants').waitFor(WAIT);
  const other = await context.newPage(); // another tab of the same browser logs out: the session ends
  await other.goto(`${CONSOLE}#/audit`);
  await other.locator('#audit').waitFor(WAIT);
  await other.click('#logout');
  await other.locator('#login').waitFor(WAIT);
  await other.close();
  await tab.fill('#tenant-form input[name=name]', 'late');
  await tab.click('#tenant-form button');
  await tab.locator('#login').waitFor(WAIT);
  assert.equal(await tab.locator('#flash').isVisible(), false, 'the login alone says why');
  await tab.fill('#token', OPERATOR_TOKEN);
  await tab.click('#login-form button');
  await tab.locator('#tenants').waitFor(WAIT);
  assert.match(tab.url(), /#\/tenants$/, 'back on the page');
  assert.equal(await tab.locator('#flash').isVisible(), false, 'no error of the ended session left on the page');
  // The first tab's session was the same one: loaded again, it takes the new session's cookie.
  await page.reload();
  await page.locator('#who', { hasText: 'alice' }).waitFor(WAIT);

  step('an unknown job: a clear message');
  await tab.goto(`${CONSOLE}#/job/00000000-0000-4000-8000-000000000000`);
  await tab.locator('#page-error', { hasText: 'no job with that id' }).waitFor(WAIT);

  step('a job page first opened in an outage comes back by itself');
  const jobAPI = `**/console/api/jobs/${first}`;
  await tab.route(jobAPI, (r) => r.fulfill({ status: 503, contentType: 'application/json', body: JSON.stringify(unavailable) }));
  await tab.route(jobAPI + '/live', (r) => r.fulfill({ status: 502, contentType: 'text/html', body: 'Bad Gateway' }));
  await tab.goto(`${CONSOLE}#/job/${first}`);
  await tab.locator('#page-error', { hasText: 'the database is unreachable' }).waitFor(WAIT);
  await tab.locator('#live.stale', { hasText: /^not live: reconnecting/ }).waitFor(WAIT);
  await tab.unrouteAll({ behavior: 'wait' });
  await tab.locator('[data-testid=job-status]', { hasText: 'succeeded' }).waitFor(WAIT);
  await tab.locator('#live:not(.stale)', { hasText: /^live$/ }).waitFor(WAIT);

  step('a job purged while its page\'s stream was down: the page says so and stops reconnecting');
  // The page's first read passes; then its stream meets a proxy's 502, and from then on the job
  // is gone. (Reads before the stream's are the page's own: the jobs list is drawn first, so that
  // the two hash changes are two loads, never one load run twice by coalesced hashchange events.)
  await tab.goto(`${CONSOLE}#/jobs`);
  await tab.locator(`#jobs tr[data-id="${first}"]`).waitFor(WAIT);
  let purged = false;
  await tab.route(jobAPI, (r) => (!purged ? r.continue() :
    r.fulfill({ status: 404, contentType: 'application/json', body: JSON.stringify({ error: { type: 'not_found', message: 'no job with that id (it may have been purged)' } }) })));
  await tab.route(jobAPI + '/live', (r) => { purged = true; return r.fulfill({ status: 502, contentType: 'text/html', body: 'Bad Gateway' }); });
  await tab.goto(`${CONSOLE}#/job/${first}`);
  await tab.locator('#flash.error', { hasText: 'no job with that id' }).waitFor(WAIT);
  await tab.locator('#live.stale', { hasText: /^not live: purged$/ }).waitFor(WAIT);
  await tab.unrouteAll({ behavior: 'wait' });

  step('the server out of reach: a page says so in words, and Filter on the same filters loads the list again');
  // The connection refused (the API restarting): fetch's own "Failed to fetch" said nothing.
  await tab.route('**/console/api/jobs?*', (r) => r.abort('connectionrefused'));
  await tab.goto(`${CONSOLE}#/jobs?status=succeeded`);
  await tab.locator('#page-error', { hasText: 'could not reach the console\'s server' }).waitFor(WAIT);
  await tab.unrouteAll({ behavior: 'wait' });
  await tab.click('#retry-page');
  await tab.locator('#jobs').waitFor(WAIT);
  const fresh = await submit('submitted while the list is open');
  await waitStatus(fresh, 'succeeded');
  await tab.click('form.filters button'); // the same filters: the hash does not change
  await tab.locator(`#jobs tr[data-id="${fresh}"]`).waitFor(WAIT);

  step('a stale page link offers the list\'s first page, its filters kept');
  await tab.goto(`${CONSOLE}#/jobs?status=succeeded&after=stale`);
  await tab.locator('#page-error', { hasText: 'stale or malformed' }).waitFor(WAIT);
  await tab.click('#first-page');
  await tab.waitForURL(/#\/jobs\?status=succeeded$/);
  await tab.locator(`#jobs tr[data-id="${fresh}"]`).waitFor(WAIT);

  step('the audit log lists the actions (its first load failing: Try again loads it)');
  await tab.route('**/console/api/audit', (r) => r.fulfill({ status: 503, contentType: 'application/json', body: JSON.stringify(unavailable) }));
  await tab.goto(`${CONSOLE}#/audit`);
  await tab.locator('#page-error', { hasText: 'the database is unreachable' }).waitFor(WAIT);
  await tab.unrouteAll({ behavior: 'wait' });
  await tab.click('#retry-page');
  for (const action of ['login', 'job.cancel', 'credential.resume', 'dead.retry', 'tenant.create', 'tenant.weight', 'tenant.rotate', 'tenant.revoke']) {
    await tab.locator('#audit td', { hasText: new RegExp(`^${action.replace('.', '\\.')}$`) }).first().waitFor(WAIT);
  }
  await shot(tab, 'audit');

  step('the audit log a page at a time, filtered by operator; an unknown parameter and a stale page link refused');
  // It showed the latest 100 entries, none older, and took any parameter as none.
  // Each page is read once drawn: the URL changes at the click, the page a moment later (the
  // page before it, then an empty one while the next loads, were counted for it).
  const auditPage = async (query) => {
    await tab.locator(`#audit[data-query="${query}"]`).waitFor(WAIT);
    return tab.locator('#audit tr:has(td)').count();
  };
  await tab.goto(`${CONSOLE}#/audit?limit=100`);
  const allRows = await auditPage('limit=100');
  assert.ok(allRows > 4, `${allRows} entries`);
  assert.equal(await tab.locator('#audit-next-page').count(), 0, 'one page holds them all');
  await tab.goto(`${CONSOLE}#/audit?limit=2`);
  let paged = 0;
  for (let pages = 1, query = 'limit=2'; ; pages++) {
    paged += await auditPage(query);
    if (!(await tab.locator('#audit-next-page').count())) break;
    assert.ok(pages < allRows, 'a last page');
    const url = tab.url();
    await tab.click('#audit-next-page');
    await tab.waitForURL((u) => u.toString() !== url);
    query = new URL(tab.url()).hash.split('?')[1];
  }
  assert.equal(paged, allRows, 'the pages hold every entry once');
  await tab.fill('form.filters input[name=operator]', 'nobody');
  await tab.click('form.filters button');
  await tab.waitForURL(/#\/audit\?operator=nobody$/);
  await tab.locator('#audit-none').waitFor(WAIT);
  await tab.goto(`${CONSOLE}#/audit?operator=alice`);
  await tab.locator('#audit tr:has(td)').first().waitFor(WAIT);
  const operators = await tab.locator('#audit tr:has(td) td:nth-child(2)').allTextContents();
  assert.deepEqual([...new Set(operators)], ['alice'], 'alice\'s entries only');
  step('the audit log filtered by action, chosen in its select');
  await tab.selectOption('form.filters select[name=action]', 'login');
  await tab.click('form.filters button');
  await tab.waitForURL(/#\/audit\?operator=alice&action=login$/);
  await tab.locator('#audit[data-query="operator=alice&action=login"] tr:has(td)').first().waitFor(WAIT);
  const logins = await tab.locator('#audit tr:has(td) td:nth-child(3)').allTextContents();
  assert.deepEqual([...new Set(logins)], ['login'], 'alice\'s logins only');
  assert.equal(await tab.locator('form.filters select[name=action]').inputValue(), 'login', 'the select shows the filter');
  await tab.goto(`${CONSOLE}#/audit?action=login.typo`);
  await tab.locator('#page-error', { hasText: 'unknown audit action "login.typo"' }).waitFor(WAIT);
  await tab.goto(`${CONSOLE}#/audit?actions=login`);
  await tab.locator('#page-error', { hasText: 'unknown parameter "actions"' }).waitFor(WAIT);
  await tab.goto(`${CONSOLE}#/audit?operator=alice&after=stale`);
  await tab.locator('#page-error', { hasText: 'stale or malformed' }).waitFor(WAIT);
  await tab.click('#first-page');
  await tab.waitForURL(/#\/audit\?operator=alice$/);
  await tab.locator('#audit').waitFor(WAIT);

  step('the first tab\'s stream is down (a proxy answers 502)');
  const badGateway = (r) => r.fulfill({ status: 502, contentType: 'text/html', body: 'Bad Gateway' });
  await page.route('**/console/api/overview/live', badGateway);
  await page.goto(CONSOLE + '#/overview');
  await page.locator('#live.stale', { hasText: /^not live: reconnecting/ }).waitFor(WAIT);
  // Then the whole API, as a proxy answers while it is down: the page's session checks (one
  // every few seconds) must not meet the other tab's logout, which deletes the cookie, before
  // the ended session's cookie is back below (no cookie is another message).
  await page.route('**/console/api/session', badGateway);

  step('log out');
  await tab.click('#logout');
  await tab.locator('#login').waitFor(WAIT);
  const after = await tab.evaluate(async () => (await fetch('/console/api/session')).status);
  assert.equal(after, 401);

  step('the first tab, its session ended while its stream was down: it says log in again');
  await context.addCookies([cookie]); // the ended session's cookie, as a browser keeps one that expired
  await page.unrouteAll({ behavior: 'wait' });
  await page.locator('#login-error', { hasText: 'your session ended; log in again' }).waitFor(WAIT);
  assert.equal(await page.locator('#nav').isVisible(), false);

  assert.deepEqual(errors, [], 'no script error on any page');
  step('done');
} finally {
  await context?.close();
  rmSync(profile, { recursive: true, force: true });
  clearTimeout(deadline);
}
