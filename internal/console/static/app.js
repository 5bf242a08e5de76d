// llmq console: plain JavaScript, no build step, no dependency. Pages are rendered from the
// console's JSON API (/console/api/); live figures arrive over Server-Sent Events. Every value
// from the server becomes a text node (never HTML), so no job or tenant can inject markup.
'use strict';

const API = '/console/api';
const STATUSES = ['queued', 'running', 'retrying', 'succeeded', 'failed', 'dead', 'canceled'];
let csrf = '';
let live = null; // the open EventSource of the current page
let reopen = 0; // the timer that opens the current page's stream again (follow)
let prefetched = null; // the first load's overview request, made alongside the session's

// takePrefetch returns the prefetched overview once (null when there is none or it failed).
function takePrefetch() {
  const p = prefetched;
  prefetched = null;
  return p || Promise.resolve(null);
}

// h builds an element: h('td', {class: 'num'}, 'text', child, ...).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const $ = (id) => document.getElementById(id);
// show replaces root's children, leaving out the absent ones (null, undefined, false).
const show = (root, ...kids) => root.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false));
const fmtTime = (t) => (t ? new Date(t).toLocaleString() : '–');
const fmtMS = (ms) => (ms === null || ms === undefined ? '–' : ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`);
const clip = (t, n) => (t.length > n ? t.slice(0, n - 1) + '…' : t);
const badge = (s) => h('span', { class: `status ${s}` }, s);
const jobLink = (id) => h('a', { href: `#/job/${id}`, class: 'mono' }, id);

class APIError extends Error {
  constructor(status, type, message) { super(message); this.status = status; this.type = type; }
}

async function api(method, path, body) {
  const opts = { method, headers: {}, credentials: 'same-origin' };
  if (method !== 'GET') opts.headers['X-CSRF-Token'] = csrf;
  if (body !== undefined) {
    opts.headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(API + path, opts);
  } catch (e) {
    // No answer at all (the server restarting, the network down): fetch's own message ("Failed
    // to fetch") says nothing to an operator. An action sent may have been done all the same.
    throw new APIError(0, 'unreachable', `could not reach the console's server (${e.message}); ` +
      (method === 'GET' ? 'try again shortly' : 'the action may or may not have been done: look before trying again'));
  }
  const data = await res.json().catch(() => ({}));
  if (!res.ok) {
    const e = data.error || {};
    if (res.status === 401 && path !== '/login') showLogin(e.message);
    throw new APIError(res.status, e.type || 'error', e.message || `HTTP ${res.status}`);
  }
  return data;
}

// flash shows msg above the page (an empty msg hides it). While the login is shown nothing is:
// an action the ended session refused (401) would flash its error there, and it stayed once the
// operator logged in again; the login says why.
function flash(msg, isError) {
  if (msg && !$('login').hidden) return;
  const f = $('flash');
  f.textContent = msg;
  f.className = isError ? 'error' : '';
  f.hidden = !msg;
}

function confirmAction(text) {
  return new Promise((resolve) => {
    const d = $('confirm');
    $('confirm-text').textContent = text;
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
    d.returnValue = '';
    d.showModal();
  });
}

function showLogin(msg) {
  closeLive();
  flash('');
  csrf = '';
  $('nav').hidden = true;
  $('logout').hidden = true;
  $('who').textContent = '';
  $('page').replaceChildren();
  $('login').hidden = false;
  const le = $('login-error');
  le.textContent = msg || '';
  le.hidden = !msg;
}

function loggedIn(s) {
  csrf = s.csrf_token;
  $('login').hidden = true;
  $('nav').hidden = false;
  $('logout').hidden = false;
  $('who').textContent = s.operator;
}

function closeLive() {
  clearTimeout(reopen);
  reopen = 0;
  if (live) { live.close(); live = null; }
}

// reopenDelay is how long a page waits before it opens again a stream the browser gave up on.
const reopenDelay = 3000;

// follow opens an event stream for the page drawn in root and calls on[name] with the JSON of
// each event of that name; onState(true) when the stream is open, onState(false) when it is lost
// (onState(false, 'purged') when it ended for good: the job is gone).
// A page left before its data arrived (root no longer shown) opens none. The browser reconnects
// by itself after a cut (a server restart, a proxy's idle timeout) and after a refusal that passes
// (the server answers it a stream holding only a jittered retry: the database slow or away), but
// gives up for good on an answer that is not a stream (a proxy's 502 while the API is down, the
// 503 of api.max_streams, a 401, a 404): after
// reopenDelay follow then asks for check (the session, or the page's own data): a 401 shows the
// login, a 404 (a job purged meanwhile) is flashed and ends the following; else it opens the
// stream again, until the page is left.
function follow(root, path, on, onState = () => {}, check = '/session') {
  if (!root.isConnected) return;
  closeLive();
  const es = new EventSource(API + path);
  live = es;
  for (const [name, fn] of Object.entries(on)) es.addEventListener(name, (ev) => fn(JSON.parse(ev.data)));
  es.addEventListener('gone', () => { closeLive(); onState(false, 'purged'); flash('This job no longer exists (purged).', true); });
  es.addEventListener('session_expired', () => showLogin('your session ended; log in again'));
  es.addEventListener('open', () => onState(true));
  es.addEventListener('error', () => {
    if (live !== es) return; // closed by the page
    onState(false);
    if (es.readyState !== EventSource.CLOSED) return; // the browser reconnects
    live = null;
    reopen = setTimeout(async () => {
      reopen = 0;
      try {
        await api('GET', check);
      } catch (e) {
        if (e.status === 401) return; // api showed the login
        if (e.status === 404) {
          if (root.isConnected) { onState(false, 'purged'); flash(e.message, true); }
          return;
        }
      }
      if (!live && !reopen) follow(root, path, on, onState, check);
    }, reopenDelay);
  });
}

// ---- pages -------------------------------------------------------------------------------------

function card(label, value, testid) {
  return h('div', { class: 'card' }, h('div', { class: 'label' }, label),
    h('div', { class: 'value', 'data-testid': testid }, value));
}

function renderOverview(ov) {
  const q = ov.queue || {};
  const dead = Object.entries(ov.dead_by_reason || {});
  return [
    h('h2', {}, 'Jobs submitted in the last hour, waiting or running now, and ended in the last hour'),
    h('div', { class: 'cards' }, card('submitted', ov.jobs_submitted ?? 0, 'submitted'),
      STATUSES.map((s) => card(s, ov.jobs_by_status[s] ?? 0, `count-${s}`))),
    h('h2', {}, 'Queue'),
    h('div', { class: 'cards' }, ['pending', 'active', 'scheduled', 'retry', 'archived'].map((k) => card(k, q[k] ?? '–', `queue-${k}`))),
    h('h2', {}, 'Calls in the last hour'),
    h('div', { class: 'cards' },
      card('attempts', ov.attempts, 'attempts'),
      card('retry rate', ov.retry_rate == null ? '–' : `${(100 * ov.retry_rate).toFixed(1)}%`, 'retry-rate'),
      card('requests per success', ov.requests_per_success == null ? '–' : ov.requests_per_success.toFixed(2), 'requests-per-success'),
      card('submit→result p50', fmtMS(ov.submit_to_result_p50_ms), 'p50'),
      card('submit→result p95', fmtMS(ov.submit_to_result_p95_ms), 'p95')),
    h('h2', {}, 'Dead letters by reason'),
    dead.length === 0 ? h('p', { class: 'muted', 'data-testid': 'dead-none' }, 'No dead letters.') :
      h('table', {}, h('tr', {}, h('th', {}, 'reason'), h('th', { class: 'num' }, 'jobs')),
        dead.map(([r, n]) => h('tr', {}, h('td', {}, h('a', { href: `#/dead?reason=${encodeURIComponent(r)}` }, r || '–')),
          h('td', { class: 'num', 'data-testid': `dead-${r}` }, n)))),
  ];
}

async function pageOverview(root) {
  show(root, h('h1', {}, 'Overview', h('span', { class: 'live stale', id: 'live' }, 'connecting…')), h('div', { id: 'ov' }));
  const el = root.querySelector('#ov');
  const badge = root.querySelector('#live');
  let asOf = null; // of the figures shown, once the server said they are not live
  const setLive = (ok, why) => {
    badge.textContent = ok ? 'live' : `not live: ${why}` + (asOf ? `; figures as of ${fmtTime(asOf)}` : '');
    badge.classList.toggle('stale', !ok);
  };
  let ov = await takePrefetch();
  if (!ov) {
    try {
      ov = await api('GET', '/overview');
    } catch (e) {
      if (e.status === 401) throw e;
      // An outage (the database or the API down): say so, and let the stream bring the
      // figures once they can be computed again.
      show(el, h('p', { class: 'error', id: 'page-error' }, e.message));
      setLive(false, 'reconnecting…');
    }
  }
  if (ov) show(el, renderOverview(ov));
  follow(root, '/overview/live', {
    overview: (o) => { asOf = null; setLive(true); show(el, renderOverview(o)); },
    // overview_stale: the figures could not be recomputed (the database did not answer); the
    // next overview event brings current ones.
    overview_stale: (s) => { asOf = s.as_of || asOf; setLive(false, 'the database did not answer'); },
  }, (open, why = 'reconnecting…') => { if (!open) setLive(false, why); });
}

function jobsTable(jobs, opts = {}) {
  const head = h('tr', {}, opts.select ? h('th', {}, h('input', { type: 'checkbox', id: 'select-all', 'aria-label': 'select all',
    onchange: (e) => document.querySelectorAll('input.sel').forEach((c) => { c.checked = e.target.checked; }) })) : null,
  h('th', {}, 'id'), h('th', {}, 'status'), h('th', {}, 'tenant'), h('th', {}, 'credential'), h('th', { class: 'num' }, 'attempts'),
  opts.dead ? h('th', {}, 'reason') : null, h('th', {}, opts.dead ? 'died' : 'created'), h('th', {}, 'last error'));
  const rows = jobs.map((j) => h('tr', { dataset: { id: j.id } },
    opts.select ? h('td', {}, h('input', { type: 'checkbox', class: 'sel', value: j.id, 'aria-label': `select ${j.id}` })) : null,
    h('td', {}, jobLink(j.id)), h('td', {}, badge(j.status)), h('td', {}, j.tenant),
    // The credential it is on (it served the last attempt), and its own when it failed over: as ctl dead list.
    h('td', { class: 'credential' }, j.current_credential && j.current_credential !== j.credential ? `${j.current_credential} (from ${j.credential})` : j.credential),
    h('td', { class: 'num' }, `${j.attempts}/${j.max_attempts}`),
    opts.dead ? h('td', {}, j.dead_reason || '–') : null,
    h('td', {}, fmtTime(opts.dead ? j.finished_at : j.created_at)),
    h('td', { class: 'wrap' }, j.last_error && j.status !== 'succeeded' ? clip(`${j.last_error.class}${j.last_error.status ? ' ' + j.last_error.status : ''}: ${j.last_error.message}`, 90) : '–')));
  return h('table', { id: opts.id || 'jobs' }, head, rows);
}

function filterForm(fields, params, onsubmit) {
  return h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); onsubmit(new FormData(e.target)); } },
    fields.map(([name, label, options]) => h('label', {}, label, options ?
      h('select', { name }, h('option', { value: '' }, 'any'), options.map((o) => h('option', { value: o, selected: params.get(name) === o }, o))) :
      h('input', { name, value: params.get(name) || '', size: 14 }))),
    h('button', { type: 'submit' }, 'Filter'));
}

// toHash shows the list of page filtered by form, loading it again when the filters are the
// ones shown (no hashchange then: Filter did nothing, where an operator expects a fresh list).
function toHash(page, form) {
  const p = new URLSearchParams();
  for (const [k, v] of form) if (v) p.set(k, v);
  const hash = `#/${page}${p.size ? '?' + p : ''}`;
  if (location.hash === hash) { flash(''); route(); } else location.hash = hash;
}

async function pageJobs(root, params) {
  const data = await api('GET', `/jobs?${params}`);
  const next = new URLSearchParams(params);
  next.set('after', data.next);
  show(root, h('h1', {}, 'Jobs', h('span', { class: 'muted' }, ' newest first, every tenant')),
    filterForm([['status', 'status', STATUSES], ['tenant', 'tenant'], ['credential', 'credential']], params, (f) => toHash('jobs', f)),
    // A filtered page reads at most 10,000 jobs (jobs.PageScanRows): with fewer matches it ends
    // there, and the next page goes on with older jobs.
    data.jobs.length ? jobsTable(data.jobs) : h('p', { class: 'muted' },
      data.next ? 'No job matches among the next 10,000 read; older jobs: next page.' : 'No jobs match.'),
    h('div', { class: 'pager' }, params.get('after') ? h('a', { href: '#/jobs' + (() => { const p = new URLSearchParams(params); p.delete('after'); return p.size ? '?' + p : ''; })() }, '« first page') : null,
      data.next ? h('a', { href: `#/jobs?${next}`, id: 'next-page' }, 'next page »') : null));
}

function attemptItem(a) {
  const ok = a.status_code && a.status_code < 300;
  return h('li', { class: ok ? 'ok' : 'bad' },
    h('strong', {}, `#${a.attempt}`), ` ${fmtTime(a.started_at)} · ${a.credential} · `,
    h('span', { class: 'mono' }, `${a.status_code ?? '–'} ${a.class}`),
    ` · latency ${fmtMS(a.latency_ms)}`, a.ttfb_ms != null ? ` · first byte ${fmtMS(a.ttfb_ms)}` : null,
    a.retry_after_ms != null ? ` · retry-after ${fmtMS(a.retry_after_ms)}` : null,
    a.delay_ms != null ? ` · next in ${fmtMS(a.delay_ms)}` : null,
    a.error ? h('div', { class: 'muted' }, a.error.slice(0, 300)) : null);
}

function renderJob(d) {
  const j = d.job;
  const rq = d.request;
  const ended = ['succeeded', 'failed', 'dead', 'canceled'].includes(j.status);
  const actions = j.status === 'dead' ? h('p', { id: 'job-actions' }, h('button', { id: 'retry-one', onclick: () => deadAction('retry', [j.id]) }, 'Retry'), ' ',
    h('button', { class: 'danger', id: 'cancel-job', onclick: () => cancelJob(j.id, true) }, 'Cancel'), ' ',
    h('button', { class: 'danger', id: 'purge-one', onclick: () => deadAction('purge', [j.id], '#/dead') }, 'Purge')) :
    !ended ? h('p', { id: 'job-actions' }, h('button', { class: 'danger', id: 'cancel-job', onclick: () => cancelJob(j.id, false) }, 'Cancel')) : null;
  return [
    h('dl', { class: 'kv' },
      h('dt', {}, 'status'), h('dd', { 'data-testid': 'job-status' }, badge(j.status), j.dead_reason ? ` (${j.dead_reason})` : ''),
      h('dt', {}, 'tenant'), h('dd', {}, j.tenant),
      h('dt', {}, 'credential'), h('dd', {}, j.credential, j.fallbacks?.length ? ` → ${j.fallbacks.join(' → ')}` : ''),
      // The lane, and a batch job's place in it (waiting for a batch, the provider's state of its
      // batch): a job queued for hours in a batch is not a stuck one.
      h('dt', {}, 'lane'), h('dd', { 'data-testid': 'lane' }, j.lane || 'online', j.batch_state ? ` · ${j.batch_state}` : '',
        j.batch_id ? ` (${j.batch_id})` : ''),
      h('dt', {}, 'attempts'), h('dd', {}, `${j.attempts} of ${j.max_attempts}`),
      h('dt', {}, 'created'), h('dd', {}, fmtTime(j.created_at)),
      h('dt', {}, 'finished'), h('dd', {}, fmtTime(j.finished_at),
        j.finished_at ? ` · submit → result ${fmtMS(new Date(j.finished_at) - new Date(j.created_at))}` : ''),
      h('dt', {}, 'request'), h('dd', { 'data-testid': 'request' }, `${rq.model || '?'} · ${rq.messages} message(s)${rq.stream ? ' · streamed' : ''} · max_tokens ${rq.max_tokens || '–'} · ${rq.bytes} bytes`,
        rq.first_text ? h('div', { class: 'muted' }, `“${rq.first_text}”`) : null),
      j.last_error ? [h('dt', {}, 'last error'), h('dd', {}, `${j.last_error.class} ${j.last_error.status || ''}: ${j.last_error.message}`)] : null),
    actions,
    h('h2', {}, `Attempts (${d.attempts.length})`),
    d.attempts.length ? h('ol', { class: 'timeline', id: 'attempts' }, d.attempts.map(attemptItem)) : h('p', { class: 'muted', id: 'attempts' }, 'No attempt yet.'),
    h('h2', {}, 'Events'),
    h('table', { id: 'events' }, h('tr', {}, h('th', { class: 'num' }, '#'), h('th', {}, 'status'), h('th', {}, 'at'), h('th', {}, 'payload')),
      d.events.map((e) => h('tr', {}, h('td', { class: 'num' }, e.seq), h('td', {}, badge(e.type)), h('td', {}, fmtTime(e.created_at)),
        h('td', { class: 'mono wrap' }, e.payload ? JSON.stringify(e.payload).slice(0, 200) : '')))),
    h('h2', {}, 'Result'),
    j.result ? h('pre', { id: 'result' }, JSON.stringify(j.result, null, 2)) : h('p', { class: 'muted', id: 'result' }, 'No result.'),
  ];
}

async function pageJob(root, id) {
  show(root, h('h1', {}, 'Job ', h('span', { class: 'mono' }, id), h('span', { class: 'live stale', id: 'live' }, 'connecting…')), h('div', { id: 'job' }));
  const el = root.querySelector('#job');
  const badge = root.querySelector('#live');
  const setLive = (open, why = 'reconnecting…') => {
    badge.textContent = open ? 'live' : `not live: ${why}`;
    badge.classList.toggle('stale', !open);
    // A job purged (from another tab, by ctl) has nothing left to retry, cancel or purge: its
    // actions go with it (they answered "no such job"), the rest stays as last read.
    if (why === 'purged') el.querySelector('#job-actions')?.remove();
  };
  const path = `/jobs/${encodeURIComponent(id)}`;
  try {
    show(el, renderJob(await api('GET', path)));
  } catch (e) {
    if (e.status && e.status < 500) throw e; // 401, 404: not an outage
    // An outage (the database or the API down): say so; the stream's first event draws the job.
    show(el, h('p', { class: 'error', id: 'page-error' }, e.message));
    setLive(false);
  }
  follow(root, `${path}/live`, { job: (x) => show(el, renderJob(x)) }, setLive, path);
}

// cancelJob cancels a job that has not ended, or a dead one (so that no retry sends it), after a
// confirmation; its live page shows the end.
async function cancelJob(id, dead) {
  const text = dead ? `Cancel dead job ${id}? No retry sends it again; it ends as canceled, its history kept.` :
    `Cancel job ${id}? It ends as canceled; a call in flight is aborted and its answer not stored.`;
  if (!(await confirmAction(text))) return;
  try { flash((await api('POST', `/jobs/${encodeURIComponent(id)}/cancel`)).message); } catch (e) { flash(e.message, true); }
}

// deadAction retries or purges the selected dead letters after a confirmation naming the count,
// then draws the page again, or the page of hash once it is done (a job's page, whose job a purge
// deleted, goes to the dead letters: drawn again, it was an error page). The hash replaces the
// page's in the history (Back does not lead to the purged job), and the outcome stays flashed.
async function deadAction(action, ids, hash) {
  if (!ids.length) { flash('Select at least one dead letter.', true); return; }
  const n = ids.length;
  const what = `${n} dead letter${n === 1 ? '' : 's'}`;
  const text = action === 'retry' ? `Retry ${what}? They go back to the queue with a fresh attempt budget.` :
    `Purge ${what}? They are deleted with their history; this cannot be undone.`;
  if (!(await confirmAction(text))) return;
  try {
    const res = await api('POST', `/dead/${action}`, { ids });
    const verb = action === 'retry' ? 'Retried' : 'Purged';
    const skipped = Object.entries(res.skipped);
    flash(`${verb} ${res.done.length} of ${res.requested}.` + (skipped.length ? ' Left alone: ' +
      skipped.map(([id, why]) => `${id.slice(0, 8)}… ${why}`).join('; ') : ''), skipped.length > 0);
    if (hash && res.done.length) history.replaceState(null, '', hash); // no hashchange: the flash stays
    route();
  } catch (e) { flash(e.message, true); }
}

async function pageDead(root, params) {
  const data = await api('GET', `/dead?${params}`);
  const selected = () => [...document.querySelectorAll('input.sel:checked')].map((c) => c.value);
  show(root, h('h1', {}, 'Dead letters'),
    filterForm([['reason', 'reason', ['rate_limited_no_retry_after', 'retries_exhausted', 'credential_not_configured']], ['credential', 'credential']], params, (f) => toHash('dead', f)),
    h('p', {}, h('button', { id: 'retry-selected', onclick: () => deadAction('retry', selected()) }, 'Retry selected'), ' ',
      h('button', { id: 'purge-selected', class: 'danger', onclick: () => deadAction('purge', selected()) }, 'Purge selected')),
    data.jobs.length ? jobsTable(data.jobs, { select: true, dead: true, id: 'dead' }) : h('p', { class: 'muted', id: 'dead' }, 'No dead letters.'),
    h('div', { class: 'pager' }, params.get('after') ? h('a', { href: '#/dead' + (() => { const p = new URLSearchParams(params); p.delete('after'); return p.size ? '?' + p : ''; })() }, '« newest') : null,
      data.next ? h('a', { href: `#/dead?${(() => { const p = new URLSearchParams(params); p.set('after', data.next); return p; })()}`, id: 'dead-next-page' }, 'older »') : null));
}

async function pageCredentials(root) {
  const data = await api('GET', '/credentials');
  const resume = async (name) => {
    try { flash((await api('POST', `/credentials/${encodeURIComponent(name)}/resume`)).message); route(); } catch (e) { flash(e.message, true); }
  };
  show(root, h('h1', {}, 'Credentials'),
    h('table', { id: 'credentials' }, h('tr', {}, ['name', 'provider', 'limit in force', 'token limits', 'breaker', 'paused', 'pushed back', ''].map((t) => h('th', {}, t))),
      data.credentials.map((c) => h('tr', { dataset: { name: c.name } }, h('td', {}, c.name), h('td', {}, c.provider),
        !c.known ? h('td', { colspan: 6, class: 'muted' }, 'no worker has started with this credential yet') : [
          h('td', {}, c.requests_per_second || c.burst ? `${+c.requests_per_second.toPrecision(4)}/s, burst ${c.burst} (${c.limit_source})` : 'not learned yet'),
          h('td', {}, c.token_limits.length ? c.token_limits.map((t) => `${t.bucket} ${t.per_minute}/min (${t.source})`).join(', ') : '–'),
          h('td', {}, c.breaker, c.breaker_until ? ` until ${fmtTime(c.breaker_until)}` : ''),
          h('td', { 'data-testid': 'paused' }, c.paused ? [`since ${fmtTime(c.paused_since)} (${c.pause_reason}, first job `, jobLink(c.pause_first_job_id), ')'] : 'no'),
          h('td', {}, c.pushed_back_until ? `until ${fmtTime(c.pushed_back_until)} (${c.push_back_reason})` : 'no'),
          h('td', {}, c.paused || c.pushed_back_until ? h('button', { class: 'resume', onclick: () => resume(c.name) }, 'Resume') : null)]))));
}

async function pageTenants(root) {
  const data = await api('GET', '/tenants');
  const create = async (e) => {
    e.preventDefault();
    // Sent once: the button is off while the create is on its way (a double click sent a second
    // create, refused "tenant exists" and flashed as an error with the new token).
    const button = e.target.querySelector('button[type=submit]');
    if (button.disabled) return;
    button.disabled = true;
    const f = new FormData(e.target);
    const creds = String(f.get('credentials') || '').split(',').map((s) => s.trim()).filter(Boolean);
    try {
      // An empty weight box sends no weight: the server's default, as ctl's without --weight.
      const weight = String(f.get('weight') || '').trim();
      const res = await api('POST', '/tenants', { name: f.get('name'), credentials: creds.length ? creds : null,
        ...(weight ? { weight: Number.isFinite(Number(weight)) ? Number(weight) : weight } : {}) });
      await pageTenants(root);
      root.prepend(h('div', { class: 'token', id: 'new-token' }, `Tenant ${res.tenant.name} created. Its API token, shown this once: `,
        h('code', { 'data-testid': 'token' }, res.token)));
      flash('');
    } catch (err) { flash(err.message, true); } finally { button.disabled = false; }
  };
  const setWeight = async (name, input) => {
    try { flash((await api('POST', `/tenants/${encodeURIComponent(name)}/weight`, { weight: Number(input.value) })).message); route(); } catch (e) { flash(e.message, true); }
  };
  const revoke = async (name, cancelJobs, revoked) => {
    const text = revoked ? `Cancel every job of tenant ${name} that has not ended (calls in flight are aborted), and its dead letters?`
      : cancelJobs ? `Revoke tenant ${name} and cancel every job of it that has not ended (calls in flight are aborted), and its dead letters? Its token stops working within seconds.`
        : `Revoke tenant ${name}? Its token stops working within seconds; its jobs that have not ended still run.`;
    if (!(await confirmAction(text))) return;
    // Its answer may take seconds (a cancel of its jobs waits for the replicas' caches): said meanwhile.
    flash(revoked ? `Canceling the jobs of tenant ${name}…` : cancelJobs ? `Revoking tenant ${name} and canceling its jobs…` : `Revoking tenant ${name}…`);
    try { flash((await api('POST', `/tenants/${encodeURIComponent(name)}/revoke`, cancelJobs ? { cancel_jobs: true } : undefined)).message); route(); } catch (e) { flash(e.message, true); route(); }
  };
  const remove = async (name) => {
    if (!(await confirmAction(`Delete tenant ${name}? Its jobs that have not ended are canceled (calls in flight are aborted), then every job of it is deleted with its history, then the tenant and its tokens. This cannot be undone; the audit log keeps its entries.`))) return;
    flash(`Deleting tenant ${name}…`); // as a revocation's, its answer may take seconds
    try { flash((await api('POST', `/tenants/${encodeURIComponent(name)}/delete`)).message); route(); } catch (e) { flash(e.message, true); route(); }
  };
  const rotate = async (name, overlapSeconds) => {
    const text = overlapSeconds > 0
      ? `Rotate tenant ${name}'s token? The new one is shown once; the old one keeps working for 24 hours.`
      : `Rotate tenant ${name}'s token and end the old one now (a leaked token)? Its clients fail until they take the new one.`;
    if (!(await confirmAction(text))) return;
    try {
      const res = await api('POST', `/tenants/${encodeURIComponent(name)}/rotate`, { overlap_seconds: overlapSeconds });
      await pageTenants(root);
      root.prepend(h('div', { class: 'token', id: 'new-token' }, `Tenant ${name} has a new API token (the old one ends ${fmtTime(res.previous_token_ends_at)}), shown this once: `,
        h('code', { 'data-testid': 'token' }, res.token)));
      flash('');
    } catch (e) { flash(e.message, true); }
  };
  show(root, h('h1', {}, 'Tenants'),
    h('form', { class: 'filters', id: 'tenant-form', onsubmit: create },
      h('label', {}, 'name', h('input', { name: 'name', required: true, size: 16 })),
      h('label', {}, 'credentials (comma-separated; empty: all)', h('input', { name: 'credentials', size: 24 })),
      h('label', {}, 'weight', h('input', { name: 'weight', type: 'number', min: 1, max: 1000, placeholder: '1', size: 4 })),
      h('button', { type: 'submit' }, 'Create tenant')),
    h('table', { id: 'tenants' }, h('tr', {}, ['name', 'credentials', 'weight', 'created', 'revoked', 'old token ends', ''].map((t) => h('th', {}, t))),
      data.tenants.map((t) => h('tr', { dataset: { name: t.name } }, h('td', {}, t.name), h('td', {}, t.credentials ? t.credentials.join(', ') : 'all'),
        h('td', { class: 'weight' }, ((input) => [input, ' ', h('button', { class: 'set-weight', onclick: () => setWeight(t.name, input) }, 'Set')])(
          h('input', { type: 'number', min: 1, max: 1000, value: t.weight, size: 4, 'aria-label': `weight of ${t.name}` }))),
        h('td', {}, fmtTime(t.created_at)), h('td', { class: 'revoked' }, t.revoked_at ? fmtTime(t.revoked_at) : '–'),
        h('td', { class: 'previous-token-ends' }, t.previous_token_ends_at ? fmtTime(t.previous_token_ends_at) : '–'),
        h('td', {}, t.revoked_at ? [h('button', { class: 'danger cancel-jobs', onclick: () => revoke(t.name, true, true) }, 'Cancel its jobs'), ' ',
          h('button', { class: 'danger delete', onclick: () => remove(t.name) }, 'Delete')]
          : [h('button', { class: 'rotate', onclick: () => rotate(t.name, 86400) }, 'Rotate token'), ' ',
            h('button', { class: 'danger rotate-now', onclick: () => rotate(t.name, 0) }, 'Rotate, end old now'), ' ',
            h('button', { class: 'danger revoke', onclick: () => revoke(t.name, false, false) }, 'Revoke'), ' ',
            h('button', { class: 'danger revoke-cancel', onclick: () => revoke(t.name, true, false) }, 'Revoke, cancel its jobs')])))));
}

// pageAudit shows a page of the audit log, newest first, filtered by operator and action as ctl
// audit --operator and --action; "older »" goes on from the page's next. A page filtered by
// action reads at most data.scan_rows entries: with fewer matches than its limit it ends there,
// said so, and "older »" goes on from the last entry read.
async function pageAudit(root, params) {
  const data = await api('GET', params.size ? `/audit?${params}` : '/audit');
  const newest = new URLSearchParams(params);
  newest.delete('after');
  const older = new URLSearchParams(params);
  older.set('after', data.next);
  show(root, h('h1', {}, 'Audit log', h('span', { class: 'muted' }, ' newest first')),
    filterForm([['operator', 'operator'], ['action', 'action', data.actions]], params, (f) => toHash('audit', f)),
    // data-query names the page drawn (its filter, limit and cursor), for a reader that must tell
    // it from the one before it.
    h('table', { id: 'audit', 'data-query': params.toString() }, h('tr', {}, ['at', 'operator', 'action', 'target', 'count'].map((t) => h('th', {}, t))),
      data.entries.map((e) => h('tr', {}, h('td', {}, fmtTime(e.at)), h('td', {}, e.operator), h('td', {}, e.action),
        h('td', { class: 'mono wrap' }, e.target || '–'), h('td', { class: 'num' }, e.count)))),
    data.next && data.entries.length < data.limit ? h('p', { class: 'muted', id: 'audit-scan-stopped' },
      `No more matching entries in the last ${data.scan_rows.toLocaleString('en')} read; older ones: older »`) :
      data.entries.length ? null : h('p', { class: 'muted', id: 'audit-none' }, 'No actions match.'),
    h('div', { class: 'pager' }, params.get('after') ? h('a', { href: '#/audit' + (newest.size ? '?' + newest : ''), id: 'audit-newest' }, '« newest') : null,
      data.next ? h('a', { href: `#/audit?${older}`, id: 'audit-next-page' }, 'older »') : null));
}

// ---- routing -----------------------------------------------------------------------------------

async function route() {
  if (!csrf) return;
  closeLive();
  const [path, query] = (location.hash.slice(1) || '/overview').split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean);
  document.querySelectorAll('#nav a').forEach((a) => a.classList.toggle('active', a.getAttribute('href') === `#/${parts[0]}`));
  // Each visit draws into an element of its own: a page whose data arrives after the operator
  // moved on (a slow list, a refresh after an action) draws into a detached element, never over
  // the page now shown.
  const root = document.createElement('div');
  $('page').replaceChildren(root);
  try {
    switch (parts[0]) {
      case 'jobs': await pageJobs(root, params); break;
      case 'job': await pageJob(root, parts[1] || ''); break;
      case 'dead': await pageDead(root, params); break;
      case 'credentials': await pageCredentials(root); break;
      case 'tenants': await pageTenants(root); break;
      case 'audit': await pageAudit(root, params); break;
      default: await pageOverview(root);
    }
  } catch (e) {
    if (e.status === 401) return;
    // Try again: the nav's link to this page changes no hash, so it would not load it again.
    // A stale page link (stale_page) fails again however often it is tried: its list's first page
    // instead, with the filters kept.
    const first = new URLSearchParams(params);
    first.delete('after');
    show(root, h('h1', {}, 'Cannot show this page'), h('p', { class: 'error', id: 'page-error' }, e.message),
      h('p', {}, e.type === 'stale_page' ? h('a', { id: 'first-page', href: `#/${parts[0]}${first.size ? '?' + first : ''}` }, 'First page') :
        h('button', { id: 'retry-page', onclick: () => { flash(''); route(); } }, 'Try again'), ' ',
      h('a', { href: '#/overview' }, 'Back to the overview')));
  }
}

async function start() {
  $('login-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      loggedIn(await api('POST', '/login', { token: $('token').value }));
      $('token').value = '';
      route();
    } catch (err) {
      const le = $('login-error');
      le.textContent = err.message;
      le.hidden = false;
    }
  });
  $('logout').addEventListener('click', async () => {
    try { await api('POST', '/logout'); } catch (e) { /* the session is gone either way */ }
    flash('');
    showLogin('Logged out.');
  });
  window.addEventListener('hashchange', () => { flash(''); route(); });
  // The overview's figures are asked for with the session, not after it: one round trip less
  // on the first load.
  if ((location.hash || '#/overview').startsWith('#/overview')) prefetched = api('GET', '/overview').catch(() => null);
  try {
    loggedIn(await api('GET', '/session'));
    route();
  } catch (e) { if (e.status !== 401) showLogin(e.message); }
}

start();
