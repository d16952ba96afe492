/*
 * The TACC dashboard's front end (issue 25): one page, hash routes, no build step.
 *
 *   #/         the researcher's home: their jobs, quota and the free GPUs
 *   #/job/ID   one job: state, history, nodes, cancel and halt, usage charts, live logs
 *   #/ops      admins: nodes, queue, 24 h utilisation, alerts
 *
 * It talks only to the per-user dashboard server's JSON API (/api/...). Every piece of text
 * that comes from the API (job names and log lines are the user's own) goes into the page as
 * a text node or through textContent / setAttribute on plain attributes, never parsed as
 * markup. Nothing is loaded from outside the server; the charts are the vendored uPlot
 * (/static/uPlot.iife.min.js). The server's Content-Security-Policy allows no inline script
 * or style, so all behaviour is here and all looks are in style.css.
 *
 * Test hooks kept stable on purpose: #user, #jobs tr[data-job], #quota, #gpus
 * tr[data-gpu-type], #job-state, #job-nodes tr[data-host], #cancel, #halt, #logs,
 * #log-filter, div.chart[data-chart][data-points], #nav-ops, #ops-nodes tr[data-node],
 * #ops-queue tr[data-job], #ops-alerts, .problem, and body[data-ready] ("0" while a view
 * loads, "1" once it has rendered).
 */
(function () {
  'use strict';

  const SESSION_ENDED = 'Your dashboard session has ended: run `tcloud dashboard` again.';

  // States after which a job changes no more (the project's and Slurm's names).
  const TERMINAL = new Set([
    'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'OUT_OF_MEMORY', 'NODE_FAIL',
    'PREEMPTED', 'HALTED', 'BOOT_FAIL', 'DEADLINE', 'REVOKED', 'SPECIAL_EXIT',
  ]);

  const REFRESH_JOBS_MS = 10000;
  const REFRESH_SIDE_MS = 60000;
  const REFRESH_JOB_MS = 15000;
  const REFRESH_OPS_MS = 30000;
  const LOG_LINES_KEPT = 20000;
  const LOG_RECONNECTS = 3;
  const CHART_HEIGHT = 220;

  const JOB_CHARTS = [
    ['cpu', 'CPU'],
    ['memory', 'Memory'],
    ['gpu_utilization', 'GPU utilisation'],
    ['gpu_memory', 'GPU memory'],
  ];
  const OPS_CHARTS = [
    ['gpus_allocated', 'GPUs allocated'],
    ['gpus_total', 'GPUs in the cluster'],
    ['gpu_utilization', 'GPU utilisation (cluster mean)'],
    ['nodes', 'Nodes by state'],
  ];
  const PALETTE = [
    '#2563eb', '#16a34a', '#dc2626', '#9333ea', '#ea580c', '#0891b2',
    '#ca8a04', '#db2777', '#4f46e5', '#65a30d', '#0d9488', '#78716c',
  ];

  let me = null; // /api/me
  let ended = false; // the session is over: nothing renders any more
  let current = null; // the view on screen (its timers, streams, charts)

  // ---------------------------------------------------------------- DOM helpers

  // h('a', {href: '#/', class: 'x'}, 'text', child): attribute names are this file's own;
  // children that are not nodes become text nodes.
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const [key, value] of Object.entries(attrs)) {
        if (value === null || value === undefined || value === false) continue;
        if (key === 'class') el.className = value;
        else el.setAttribute(key, String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function jobHref(id) {
    return '#/job/' + encodeURIComponent(String(id));
  }

  function apiJob(id, tail) {
    return '/api/jobs/' + encodeURIComponent(String(id)) + (tail || '');
  }

  function text(value, empty) {
    if (value === null || value === undefined || value === '') return empty === undefined ? '–' : empty;
    if (typeof value === 'object') return JSON.stringify(value);
    return String(value);
  }

  function stateClass(state) {
    const word = String(state || '').split(/[\s+]/)[0].toUpperCase();
    if (word === 'RUNNING' || word === 'COMPLETING') return 'state-running';
    if (word === 'PENDING' || word === 'QUEUED' || word === 'PROVISIONING' || word === 'REQUEUED'
      || word === 'CONFIGURING' || word === 'SUSPENDED') return 'state-pending';
    if (word === 'COMPLETED') return 'state-completed';
    if (word === 'HALTED') return 'state-halted';
    if (TERMINAL.has(word)) return 'state-failed';
    return 'state-other';
  }

  function badge(state, id) {
    return h('span', { class: 'badge ' + stateClass(state), id: id }, text(state));
  }

  function isTerminal(state) {
    return TERMINAL.has(String(state || '').split(/\s/)[0].toUpperCase());
  }

  function localTime(seconds) {
    if (typeof seconds !== 'number' || !Number.isFinite(seconds)) return '–';
    return new Date(seconds * 1000).toLocaleString();
  }

  function isoTime(value) {
    if (!value) return '–';
    const date = new Date(value);
    return Number.isNaN(date.getTime()) ? String(value) : date.toLocaleString();
  }

  // PsRow's "submitted" is the scheduler's own local time with no zone: shown as it is.
  function submittedTime(value) {
    return value ? String(value).replace('T', ' ') : '–';
  }

  function emptyRow(columns, message) {
    return h('tr', { class: 'empty' }, h('td', { colspan: columns }, message));
  }

  function table(id, headers) {
    const tbody = h('tbody');
    const el = h('table', { id: id, class: 'grid' },
      h('thead', null, h('tr', null, headers.map((name) => h('th', { scope: 'col' }, name)))),
      tbody);
    return { table: el, tbody: tbody, wrap: h('div', { class: 'table-wrap' }, el) };
  }

  // A table of plain objects (quota's associations, QoS, fair share): one column per key.
  function objectTable(rows) {
    const keys = [];
    for (const row of rows) {
      for (const key of Object.keys(row || {})) if (!keys.includes(key)) keys.push(key);
    }
    const t = table(null, keys);
    t.tbody.replaceChildren(...rows.map((row) => h('tr', null,
      keys.map((key) => h('td', null, text(row ? row[key] : null, ''))))));
    return t.wrap;
  }

  // A box with a title, a message line (errors of the last refresh) and a body.
  function panel(title, id, extraClass) {
    const heading = h('h2', null, title);
    const msg = h('div', { class: 'msg' });
    const problem = h('div', { class: 'problem-slot' });
    const body = h('div', { class: 'panel-body' });
    const root = h('section', { class: 'panel' + (extraClass ? ' ' + extraClass : ''), id: id },
      heading, msg, problem, body);
    return {
      root, heading, msg, body,
      ok() { msg.replaceChildren(); },
      fail(err) { msg.replaceChildren(h('p', { class: 'error' }, errorText(err))); },
      problem(line) {
        problem.replaceChildren(...(line ? [h('p', { class: 'problem' }, String(line))] : []));
      },
    };
  }

  // One panel's answer: drawn by `render` (with its "problem" line, if any) while the view
  // is still shown; a failure is said in the panel, unless the whole session has ended.
  async function loadPanel(ctx, p, path, render) {
    try {
      const answer = await api(path);
      if (!ctx.alive) return;
      p.problem(answer.problem);
      render(answer);
      p.ok();
    } catch (err) {
      if (ctx.alive && !ended) p.fail(err);
    }
  }

  function errorText(err) {
    return err && err.message ? err.message : String(err);
  }

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path, options) {
    const opts = options || {};
    let response;
    try {
      response = await fetch(path, {
        method: opts.method || 'GET',
        credentials: 'same-origin',
        cache: 'no-store',
        headers: Object.assign({ Accept: 'application/json' }, opts.headers || {}),
      });
    } catch (err) {
      throw new ApiError(0, 'The dashboard server does not answer (' + errorText(err) + ').');
    }
    const raw = await response.text();
    let body = null;
    if (raw) {
      try {
        body = JSON.parse(raw);
      } catch (_err) {
        body = null;
      }
    }
    const message = body && typeof body.error === 'string' && body.error ? body.error : '';
    if (response.status === 401) {
      endSession(message);
      throw new ApiError(401, message || SESSION_ENDED);
    }
    if (!response.ok) {
      throw new ApiError(response.status,
        message || ('The server answered ' + response.status + ' ' + response.statusText).trim());
    }
    if (body === null || typeof body !== 'object') {
      throw new ApiError(response.status, 'The server sent an answer that is not JSON.');
    }
    return body;
  }

  function post(path) {
    return api(path, { method: 'POST', headers: { 'X-Tacc-Dashboard': '1' } });
  }

  // A 401 anywhere: the page becomes the server's message, and nothing refreshes any more.
  function endSession(message) {
    if (ended) return;
    ended = true;
    if (current) teardown(current);
    current = null;
    const box = h('div', { class: 'session-ended', role: 'alert' },
      h('p', { id: 'session-ended' }, message || SESSION_ENDED));
    document.body.replaceChildren(box);
    document.body.dataset.ended = '1';
    document.body.dataset.ready = '1';
  }

  // ---------------------------------------------------------------- views and their lifetime

  function newView() {
    const ctx = {
      alive: true,
      timers: new Set(),
      sources: new Set(),
      cleanups: [],
      // Run fn every ms after the last run ended (never two at once); fn returning false stops.
      every(ms, fn) {
        const schedule = () => {
          if (!ctx.alive) return;
          const timer = setTimeout(async () => {
            ctx.timers.delete(timer);
            if (!ctx.alive) return;
            let again = true;
            try {
              again = (await fn()) !== false;
            } catch (_err) {
              again = true;
            }
            if (again) schedule();
          }, ms);
          ctx.timers.add(timer);
        };
        schedule();
      },
      after(ms, fn) {
        const timer = setTimeout(() => {
          ctx.timers.delete(timer);
          if (ctx.alive) fn();
        }, ms);
        ctx.timers.add(timer);
      },
    };
    return ctx;
  }

  function teardown(ctx) {
    ctx.alive = false;
    for (const timer of ctx.timers) clearTimeout(timer);
    ctx.timers.clear();
    for (const source of ctx.sources) source.close();
    ctx.sources.clear();
    for (const cleanup of ctx.cleanups.splice(0)) {
      try {
        cleanup();
      } catch (_err) {
        // a chart already gone
      }
    }
  }

  function mainEl() {
    return document.getElementById('view');
  }

  function route() {
    if (ended) return;
    if (current) teardown(current);
    const ctx = newView();
    current = ctx;
    document.body.dataset.ready = '0';
    const hash = location.hash || '#/';
    const jobMatch = /^#\/job\/(.+)$/.exec(hash);
    let view;
    let page = 'home';
    if (jobMatch) {
      let id = jobMatch[1];
      try {
        id = decodeURIComponent(id);
      } catch (_err) {
        // shown as typed
      }
      page = 'home';
      view = jobView(ctx, id);
    } else if (hash === '#/ops') {
      page = 'ops';
      view = opsView(ctx);
    } else {
      view = homeView(ctx);
    }
    markNav(page);
    Promise.resolve(view)
      .catch((err) => {
        if (ctx.alive && !ended) {
          mainEl().replaceChildren(h('p', { class: 'error' }, errorText(err)));
        }
      })
      .finally(() => {
        if (ctx.alive && !ended) document.body.dataset.ready = '1';
      });
  }

  function markNav(page) {
    for (const link of document.querySelectorAll('#nav a')) {
      if (link.getAttribute('data-page') === page) link.setAttribute('aria-current', 'page');
      else link.removeAttribute('aria-current');
    }
  }

  function renderMe() {
    document.getElementById('user').textContent = text(me.user, '');
    document.getElementById('host').textContent = text(me.host, '');
    const version = document.getElementById('version');
    if (version && me.version) version.textContent = 'v' + me.version;
    const existing = document.getElementById('nav-ops');
    if (me.admin === true && !existing) {
      document.getElementById('nav').append(
        h('a', { id: 'nav-ops', href: '#/ops', 'data-page': 'ops' }, 'Ops'));
    } else if (me.admin !== true && existing) {
      existing.remove();
    }
  }

  // ---------------------------------------------------------------- #/ home

  async function homeView(ctx) {
    document.title = 'My jobs · TACC dashboard';
    const jobsPanel = panel('Jobs', 'jobs-panel', 'wide');
    const jobs = table('jobs', ['Job', 'Name', 'State', 'Submitted', 'Nodes']);
    jobsPanel.body.append(jobs.wrap);
    const quotaPanel = panel('Quota', 'quota');
    const hoursPanel = panel('Usage', 'usage-panel');
    const hours = table('usage', ['Month', 'Account', 'Partition', 'Jobs', 'CPU h', 'GPU h']);
    const hoursFoot = h('p', { class: 'muted small' });
    hoursPanel.body.append(hours.wrap, hoursFoot);
    const gpusPanel = panel('Free GPUs', 'gpus-panel');
    const gpus = table('gpus', ['Type', 'Free', 'Total', '']);
    const gpusFoot = h('p', { class: 'muted small' });
    gpusPanel.body.append(gpus.wrap, gpusFoot);
    mainEl().replaceChildren(h('div', { class: 'layout-home' },
      jobsPanel.root,
      h('div', { class: 'side' }, quotaPanel.root, hoursPanel.root, gpusPanel.root)));

    const loadJobs = () => loadPanel(ctx, jobsPanel, '/api/jobs',
      (a) => renderJobs(jobs.tbody, Array.isArray(a.jobs) ? a.jobs : []));
    const loadQuota = () => loadPanel(ctx, quotaPanel, '/api/quota',
      (a) => renderQuota(quotaPanel.body, a));
    const loadHours = () => loadPanel(ctx, hoursPanel, '/api/usage',
      (a) => renderHours(hours.tbody, hoursFoot, a));
    const loadGpus = () => loadPanel(ctx, gpusPanel, '/api/gpus',
      (a) => renderGpus(gpus.tbody, gpusFoot, a));

    await Promise.all([loadJobs(), loadQuota(), loadHours(), loadGpus()]);
    ctx.every(REFRESH_JOBS_MS, loadJobs);
    ctx.every(REFRESH_SIDE_MS, () => Promise.all([loadQuota(), loadHours(), loadGpus()]));
  }

  function renderJobs(tbody, jobs) {
    if (!jobs.length) {
      tbody.replaceChildren(emptyRow(5, 'No jobs yet.'));
      return;
    }
    tbody.replaceChildren(...jobs.map((job) => h('tr', { 'data-job': text(job.job, '') },
      h('td', { class: 'mono' }, h('a', { href: jobHref(job.job) }, text(job.job))),
      h('td', null, text(job.name, ''),
        job.kind === 'session' ? h('span', { class: 'tag' }, 'session') : null),
      h('td', null, badge(job.state)),
      h('td', { class: 'nowrap' }, submittedTime(job.submitted)),
      h('td', { class: 'mono' }, text(job.nodes)))));
  }

  function stat(label, value) {
    return h('div', { class: 'stat' },
      h('span', { class: 'stat-value' }, text(value, '0')),
      h('span', { class: 'stat-label' }, label));
  }

  function renderQuota(body, quota) {
    const parts = [h('div', { class: 'stats' },
      stat('running jobs', quota.running_jobs),
      stat('pending jobs', quota.pending_jobs),
      stat('GPUs in use', quota.gpus_in_use))];
    if (quota.message) parts.push(h('p', { class: 'muted small' }, String(quota.message)));
    const sections = [
      ['Associations', quota.associations],
      ['Fair share', quota.fairshare],
      ['QoS', quota.qos],
    ];
    for (const [title, rows] of sections) {
      if (Array.isArray(rows) && rows.length) parts.push(h('h3', null, title), objectTable(rows));
    }
    body.replaceChildren(...parts);
  }

  // `tcloud usage`: allocated CPU and GPU hours of the caller's jobs (Slurm accounting).
  function renderHours(tbody, foot, usage) {
    const rows = Array.isArray(usage.rows) ? usage.rows : [];
    const hoursOf = (seconds) => ((Number(seconds) || 0) / 3600).toFixed(1);
    if (!rows.length) tbody.replaceChildren(emptyRow(6, 'No jobs in these months.'));
    else {
      tbody.replaceChildren(...rows.map((row) => h('tr', { 'data-usage-month': text(row.month, '') },
        h('td', { class: 'mono nowrap' }, text(row.month)),
        h('td', null, text(row.account)),
        h('td', null, text(row.partition)),
        h('td', { class: 'num' }, String(Number(row.jobs) || 0)),
        h('td', { class: 'num' }, hoursOf(row.cpu_seconds)),
        h('td', { class: 'num' }, hoursOf(row.gpu_seconds)))));
    }
    foot.textContent = usage.since && usage.until
      ? 'Allocated, from ' + String(usage.since).slice(0, 10) + ' to '
        + String(usage.until).slice(0, 10) + ' (Slurm accounting; tcloud usage).' : '';
  }

  function renderGpus(tbody, foot, answer) {
    const types = Array.isArray(answer.types) ? answer.types : [];
    if (!types.length) tbody.replaceChildren(emptyRow(4, 'No GPUs in this cluster.'));
    else {
      tbody.replaceChildren(...types.map((row) => {
        const free = Number(row.free) || 0;
        const total = Number(row.total) || 0;
        return h('tr', { 'data-gpu-type': text(row.type, '') },
          h('td', { class: 'mono' }, text(row.type)),
          h('td', { class: 'num' }, String(free)),
          h('td', { class: 'num' }, String(total)),
          h('td', null, h('meter', {
            min: 0, max: Math.max(total, 1), value: free,
            title: free + ' of ' + total + ' free',
          })));
      }));
    }
    foot.textContent = typeof answer.nodes === 'number'
      ? 'On ' + answer.nodes + (answer.nodes === 1 ? ' GPU node.' : ' GPU nodes.') : '';
  }

  // ---------------------------------------------------------------- #/job/ID

  async function jobView(ctx, id) {
    document.title = 'Job ' + id + ' · TACC dashboard';
    const title = h('h1', null, 'Job ', h('span', { class: 'mono' }, id));
    const subtitle = h('span', { class: 'job-name' });
    const state = badge('…', 'job-state');
    const meta = h('dl', { class: 'meta' });
    const cancel = h('button', { id: 'cancel', type: 'button', class: 'danger' }, 'Cancel');
    const halt = h('button', { id: 'halt', type: 'button' }, 'Halt');
    const answer = h('div', { id: 'action-result', class: 'action-result', role: 'status' });
    const headerMsg = h('div', { class: 'msg' });
    const head = h('section', { class: 'panel job-head wide' },
      h('div', { class: 'job-title' }, h('a', { href: '#/', class: 'back' }, '← My jobs'),
        title, subtitle, state),
      headerMsg, meta, h('div', { class: 'actions' }, cancel, halt, answer));

    const historyPanel = panel('History', 'job-history');
    const history = table('history', ['State', 'Time', 'Detail']);
    historyPanel.body.append(history.wrap);
    const nodesPanel = panel('Nodes', 'job-nodes-panel');
    const nodes = table('job-nodes', ['Host', 'Rank', 'State', 'Exit code']);
    nodesPanel.body.append(nodes.wrap);

    const usagePanel = panel('Usage', 'job-usage', 'wide');
    const charts = chartSet(ctx, usagePanel.body, JOB_CHARTS);

    const logsPanel = panel('Logs', 'job-logs', 'wide');
    const logs = logView(ctx, id, logsPanel);

    mainEl().replaceChildren(h('div', { class: 'layout-job' },
      head, historyPanel.root, nodesPanel.root, usagePanel.root, logsPanel.root));

    let lastState = null;

    async function loadStatus() {
      try {
        const status = await api(apiJob(id));
        if (!ctx.alive) return null;
        lastState = status.state;
        renderStatus(status);
        headerMsg.replaceChildren();
        return null;
      } catch (err) {
        if (ctx.alive && !ended) headerMsg.replaceChildren(h('p', { class: 'error' }, errorText(err)));
        return err;
      }
    }
    async function loadUsage() {
      try {
        const usage = await api(apiJob(id, '/usage'));
        if (!ctx.alive) return;
        usagePanel.problem(usage.problem);
        charts.update(Array.isArray(usage.series) ? usage.series : []);
        usagePanel.ok();
      } catch (err) {
        if (ctx.alive && !ended) {
          usagePanel.fail(err);
          charts.update(null);
        }
      }
    }

    function renderStatus(status) {
      subtitle.textContent = status.name ? String(status.name) : '';
      state.textContent = text(status.state);
      state.className = 'badge ' + stateClass(status.state);
      const rows = [
        ['Exit code', status.exit_code],
        ['Reason', status.reason],
        ['Slurm state', status.slurm_state],
        ['Work directory', status.workdir],
      ];
      meta.replaceChildren(...rows
        .filter(([label, value]) => label === 'Exit code' || (value !== undefined && value !== null && value !== ''))
        .flatMap(([label, value]) => [h('dt', null, label), h('dd', { class: 'mono' }, text(value))]));
      if (Array.isArray(status.warnings) && status.warnings.length) {
        meta.append(h('dt', null, 'Warnings'),
          h('dd', null, h('ul', { class: 'warnings' }, status.warnings.map((w) => h('li', null, text(w))))));
      }
      const done = isTerminal(status.state);
      cancel.disabled = done;
      halt.disabled = done;
      const hint = done ? 'The job has finished.' : null;
      for (const button of [cancel, halt]) {
        if (hint) button.setAttribute('title', hint);
        else button.removeAttribute('title');
      }

      const events = Array.isArray(status.history) ? status.history : [];
      if (!events.length) history.tbody.replaceChildren(emptyRow(3, 'No history yet.'));
      else {
        history.tbody.replaceChildren(...events.map((event) => {
          const detail = Object.entries(event || {})
            .filter(([key]) => key !== 'state' && key !== 'time')
            .map(([key, value]) => key + ': ' + text(value)).join('; ');
          return h('tr', null, h('td', null, badge(event.state)),
            h('td', { class: 'nowrap' }, localTime(event.time)), h('td', { class: 'small' }, detail));
        }));
      }

      const hosts = Array.isArray(status.nodes) ? status.nodes : [];
      if (!hosts.length) nodes.tbody.replaceChildren(emptyRow(4, 'No nodes yet.'));
      else {
        nodes.tbody.replaceChildren(...hosts.map((node) => h('tr', { 'data-host': text(node.host, '') },
          h('td', { class: 'mono' }, text(node.host)),
          h('td', { class: 'num' }, text(node.rank)),
          h('td', null, badge(node.state)),
          h('td', { class: 'num' }, text(node.exit_code)))));
      }
    }

    async function act(verb, question, describe) {
      if (!window.confirm(question)) return;
      cancel.disabled = true;
      halt.disabled = true;
      answer.className = 'action-result';
      answer.textContent = (verb === 'cancel' ? 'Cancelling' : 'Halting') + ' job ' + id + '…';
      try {
        const reply = await post(apiJob(id, '/' + verb));
        if (!ctx.alive) return;
        answer.textContent = describe(reply);
        answer.className = 'action-result ok';
      } catch (err) {
        if (!ctx.alive || ended) return;
        answer.textContent = errorText(err);
        answer.className = 'action-result error';
      }
      await Promise.all([loadStatus(), loadUsage()]);
      if (ctx.alive && !isTerminal(lastState)) {
        cancel.disabled = false;
        halt.disabled = false;
      }
    }

    cancel.addEventListener('click', () => act('cancel',
      'Cancel job ' + id + '? Its program is stopped on every node.',
      (reply) => {
        const rows = Array.isArray(reply.cancelled) ? reply.cancelled : [];
        if (!rows.length) return 'Nothing to cancel.';
        return rows.map((row) => (row.cancelled ? 'Cancelled job ' : 'Did not cancel job ')
          + text(row.job_id) + ' (state ' + text(row.state) + ').').join(' ');
      }));
    halt.addEventListener('click', () => act('halt',
      'Halt job ' + id + '? Every rank gets the checkpoint signal, then the job is requeued on '
        + 'hold until `tcloud resume ' + id + '`.',
      (reply) => {
        const row = reply.halted || {};
        let line = 'Halted job ' + text(row.job_id) + ' (state ' + text(row.state) + ')';
        if (row.checkpoint_signal === true) line += ': checkpoint signal sent';
        else if (row.checkpoint_signal === false) line += ': no checkpoint signal (not running)';
        if (row.exited_in_grace === true) line += '; the program exited within the grace period';
        else if (row.exited_in_grace === false) line += '; the program was stopped after the grace period';
        return line + '.';
      }));

    const [failed] = await Promise.all([loadStatus(), loadUsage()]);
    if (!ctx.alive) return;
    if (failed && failed.status >= 400 && failed.status < 500) {
      // no such job of the caller's (404) or not theirs (403): the error alone
      mainEl().replaceChildren(h('section', { class: 'panel' },
        h('div', { class: 'job-title' }, h('a', { href: '#/', class: 'back' }, '← My jobs'), title),
        h('p', { class: 'error' }, errorText(failed))));
      return;
    }
    logs.start(() => {
      // the stream said "end": show the final state and plots
      loadStatus();
      loadUsage();
    });
    if (!isTerminal(lastState)) {
      ctx.every(REFRESH_JOB_MS, async () => {
        await Promise.all([loadStatus(), loadUsage()]);
        return !isTerminal(lastState);
      });
    }
  }

  // The job's log stream: one text node per line in <pre id="logs">, a filter by node:rank.
  function logView(ctx, id, logsPanel) {
    const filter = h('select', { id: 'log-filter', 'aria-label': 'Show the lines of' },
      h('option', { value: '' }, 'All'));
    const status = h('span', { class: 'muted small log-status' }, 'connecting…');
    const pre = h('pre', { id: 'logs', class: 'logs', tabindex: 0 });
    logsPanel.heading.after(h('div', { class: 'log-bar' },
      h('label', null, 'Show ', filter), status));
    logsPanel.body.append(pre);

    const lines = []; // {key, node}
    const keys = new Set();
    let pending = [];
    let flushQueued = false;
    let stuckToBottom = true;
    let source = null;
    let finished = false;
    let failures = 0;
    let problem = false; // the stream said why it stops: no reconnecting then

    pre.addEventListener('scroll', () => {
      stuckToBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 8;
    });

    filter.addEventListener('change', () => {
      const want = filter.value;
      const frag = document.createDocumentFragment();
      for (const line of lines) if (!want || line.key === want) frag.append(line.node);
      pre.replaceChildren(frag);
      stuckToBottom = true;
      pre.scrollTop = pre.scrollHeight;
    });

    function flush() {
      flushQueued = false;
      if (!ctx.alive || !pending.length) return;
      const want = filter.value;
      const frag = document.createDocumentFragment();
      for (const line of pending) {
        lines.push(line);
        if (!want || line.key === want) frag.append(line.node);
      }
      pending = [];
      pre.append(frag);
      while (lines.length > LOG_LINES_KEPT) {
        const old = lines.shift();
        if (old.node.parentNode) old.node.remove();
      }
      if (stuckToBottom) pre.scrollTop = pre.scrollHeight;
    }

    function add(data) {
      // a line the server could not place (node null) is the agent's own, like "[job] ..."
      const node = data.node === null || data.node === undefined ? 'job' : String(data.node);
      const hasRank = data.rank !== null && data.rank !== undefined;
      const trial = data.trial !== null && data.trial !== undefined ? 'trial ' + data.trial + ' ' : '';
      const key = trial + (hasRank ? node + ':' + data.rank : node);
      if (!keys.has(key)) {
        keys.add(key);
        filter.append(h('option', { value: key }, key));
      }
      let body = text(data.text, '');
      // the agent's own lines may carry their "[job] " already: shown once
      if (!hasRank && body.startsWith('[' + key + '] ')) body = body.slice(key.length + 3);
      if (!body.endsWith('\n')) body += '\n';
      pending.push({ key: key, node: document.createTextNode('[' + key + '] ' + body) });
      if (!flushQueued) {
        flushQueued = true;
        // batched per frame; a timer too, for a tab that draws no frames
        requestAnimationFrame(flush);
        setTimeout(flush, 250);
      }
    }

    function parse(event) {
      try {
        return JSON.parse(event.data);
      } catch (_err) {
        return null;
      }
    }

    function connect(onEnd) {
      if (!ctx.alive || finished) return;
      source = new EventSource(apiJob(id, '/logs'));
      ctx.sources.add(source);
      source.addEventListener('open', () => {
        status.textContent = 'following';
      });
      source.addEventListener('line', (event) => {
        const data = parse(event);
        failures = 0;
        if (data) add(data);
      });
      source.addEventListener('problem', (event) => {
        const data = parse(event);
        problem = true;
        logsPanel.problem(data && data.error ? data.error : 'The log stream reported a problem.');
      });
      source.addEventListener('end', (event) => {
        const data = parse(event);
        finished = true;
        close();
        flush();
        status.textContent = 'ended' + (data && data.state ? ' (' + data.state + ')' : '');
        onEnd();
      });
      source.addEventListener('error', () => {
        if (finished || !ctx.alive) return;
        if (problem) {
          finished = true;
          close();
          flush();
          status.textContent = 'stopped';
          return;
        }
        // The browser would reconnect and the server would replay the log from its start:
        // reconnect ourselves instead, on an emptied view, a few times.
        close();
        failures += 1;
        api('/api/me').then(() => {
          if (!ctx.alive || finished) return;
          if (failures > LOG_RECONNECTS) {
            status.textContent = 'the log stream stopped; reload the page to try again';
            return;
          }
          status.textContent = 'reconnecting…';
          ctx.after(3000 * failures, () => {
            reset();
            connect(onEnd);
          });
        }, () => {
          // a 401 has replaced the page; any other error: say so and stop
          if (ctx.alive && !ended) status.textContent = 'the dashboard server does not answer';
        });
      });
    }

    function close() {
      if (source) {
        source.close();
        ctx.sources.delete(source);
        source = null;
      }
    }

    function reset() {
      lines.length = 0;
      pending = [];
      pre.replaceChildren();
      stuckToBottom = true;
    }

    return { start: connect };
  }

  // ---------------------------------------------------------------- charts (uPlot)

  const MiB = 1024 * 1024;
  // Tick steps for counts (GPUs, nodes): never half a node.
  const INTEGER_STEPS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000];
  const GiB = 1024 * MiB;

  function numeric(value) {
    const v = typeof value === 'string' ? Number(value) : value;
    return typeof v === 'number' && Number.isFinite(v) ? v : null;
  }

  // How a chart shows its unit: data scaled by `scale`, axis labelled `suffix`.
  function unitOf(list) {
    const unit = list.length ? String(list[0].unit || '') : '';
    if (unit === 'bytes') {
      let max = 0;
      for (const s of list) for (const p of s.points || []) max = Math.max(max, numeric(p[1]) || 0);
      return max >= GiB ? { scale: 1 / GiB, suffix: 'GiB', digits: 2 } : { scale: 1 / MiB, suffix: 'MiB', digits: 1 };
    }
    if (unit === 'ratio') return { scale: 100, suffix: '%', digits: 1, percent: true };
    if (unit === 'cores') return { scale: 1, suffix: 'cores', digits: 2 };
    if (unit === 'gpus') return { scale: 1, suffix: 'GPUs', digits: 0, integer: true };
    if (unit === 'nodes') return { scale: 1, suffix: 'nodes', digits: 0, integer: true };
    return { scale: 1, suffix: unit, digits: 2 };
  }

  function formatNumber(value, digits) {
    if (value === null || value === undefined) return '–';
    return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits });
  }

  // Series of one name -> uPlot's [xs, ys...] on the union of their timestamps.
  function align(list, scale) {
    const xs = new Set();
    const maps = list.map((s) => {
      const map = new Map();
      for (const point of Array.isArray(s.points) ? s.points : []) {
        if (!Array.isArray(point)) continue;
        const t = numeric(point[0]);
        const v = numeric(point[1]);
        if (t === null || v === null) continue;
        map.set(t, v * scale);
        xs.add(t);
      }
      return map;
    });
    const times = Array.from(xs).sort((a, b) => a - b);
    let count = 0;
    for (const map of maps) count += map.size;
    const data = [times, ...maps.map((map) => times.map((t) => (map.has(t) ? map.get(t) : null)))];
    return { data: data, count: count };
  }

  // One chart per series name: fixed ones always shown (empty or not), others as they come.
  function chartSet(ctx, parent, fixed) {
    const grid = h('div', { class: 'charts' });
    parent.append(grid);
    const slots = new Map();

    function slot(name, title) {
      if (slots.has(name)) return slots.get(name);
      const box = h('div', { class: 'chart', 'data-chart': name, 'data-points': '0' });
      const empty = h('p', { class: 'muted small chart-empty' }, 'No data yet.');
      const unitLabel = h('span', { class: 'muted small' });
      const card = h('figure', { class: 'chart-card' },
        h('figcaption', null, title || name, ' ', unitLabel), box, empty);
      grid.append(card);
      const entry = { name: name, box: box, empty: empty, unitLabel: unitLabel, plot: null, key: '', observer: null };
      slots.set(name, entry);
      return entry;
    }
    for (const [name, title] of fixed) slot(name, title);

    function destroy(entry) {
      if (entry.observer) entry.observer.disconnect();
      if (entry.plot) entry.plot.destroy();
      entry.observer = null;
      entry.plot = null;
      entry.key = '';
    }
    ctx.cleanups.push(() => {
      for (const entry of slots.values()) destroy(entry);
    });

    function draw(entry, list) {
      if (!list.length) {
        destroy(entry);
        entry.empty.hidden = false;
        entry.unitLabel.textContent = '';
        entry.box.setAttribute('data-points', '0');
        return;
      }
      const unit = unitOf(list);
      const aligned = align(list, unit.scale);
      entry.unitLabel.textContent = unit.suffix ? '(' + unit.suffix + ')' : '';
      entry.empty.hidden = aligned.count > 0;
      if (typeof window.uPlot !== 'function') {
        entry.empty.hidden = false;
        entry.empty.textContent = 'Charts are unavailable: /static/uPlot.iife.min.js did not load.';
        entry.box.setAttribute('data-points', '0');
        return;
      }
      const key = unit.suffix + '|' + list.map((s) => String(s.label || s.name)).join('\u0000');
      if (entry.plot && entry.key === key) {
        entry.plot.setData(aligned.data);
      } else {
        destroy(entry);
        entry.key = key;
        entry.plot = new window.uPlot(chartOptions(entry.box, list, unit), aligned.data, entry.box);
        if (typeof ResizeObserver === 'function') {
          entry.observer = new ResizeObserver(() => {
            const width = entry.box.clientWidth;
            if (entry.plot && width > 0 && width !== entry.plot.width) {
              entry.plot.setSize({ width: width, height: CHART_HEIGHT });
            }
          });
          entry.observer.observe(entry.box);
        }
      }
      entry.box.setAttribute('data-points', String(aligned.count));
    }

    return {
      // series: the answer's list, or null when it could not be fetched (charts kept).
      update(series) {
        if (!ctx.alive || series === null) return;
        const byName = new Map();
        for (const s of series) {
          if (!s || !s.name) continue;
          if (!byName.has(s.name)) byName.set(s.name, []);
          byName.get(s.name).push(s);
        }
        for (const [name] of fixed) draw(slot(name), byName.get(name) || []);
        for (const [name, list] of byName) {
          if (!fixed.some(([known]) => known === name)) draw(slot(name, name), list);
        }
        for (const [name, entry] of slots) {
          if (!byName.has(name) && !fixed.some(([known]) => known === name)) draw(entry, []);
        }
      },
    };
  }

  function chartOptions(box, list, unit) {
    const fmt = (v) => formatNumber(v, unit.digits);
    const yAxis = {
      stroke: '#4b5563',
      grid: { stroke: '#eef0f3' },
      ticks: { stroke: '#e5e7eb' },
      size: 64,
      values: (_u, splits) => splits.map((v) => fmt(v) + (unit.percent ? '%' : '')),
    };
    if (unit.integer) yAxis.incrs = INTEGER_STEPS;
    return {
      width: Math.max(box.clientWidth, 200),
      height: CHART_HEIGHT,
      cursor: { drag: { x: true, y: false } },
      legend: { live: true },
      scales: {
        y: {
          range: (_u, _min, max) => {
            if (unit.percent) return [0, Math.max(100, max || 0)];
            return [0, max > 0 ? max * 1.08 : 1];
          },
        },
      },
      axes: [
        { stroke: '#4b5563', grid: { stroke: '#eef0f3' }, ticks: { stroke: '#e5e7eb' } },
        yAxis,
      ],
      series: [
        { label: 'time', value: (_u, ts) => (ts === null || ts === undefined ? '–' : localTime(ts)) },
        ...list.map((s, i) => ({
          label: String(s.label || s.name),
          stroke: PALETTE[i % PALETTE.length],
          width: 1.5,
          spanGaps: true,
          points: { show: false },
          value: (_u, v) => (v === null || v === undefined ? '–' : fmt(v) + ' ' + unit.suffix),
        })),
      ],
    };
  }

  // ---------------------------------------------------------------- #/ops

  async function opsView(ctx) {
    document.title = 'Ops · TACC dashboard';
    const intro = h('div', { class: 'msg' });
    if (me && me.admin !== true) {
      intro.append(h('p', { class: 'error' }, 'This page is for the cluster\'s admins.'));
    }
    const nodesPanel = panel('Nodes', 'ops-nodes-panel', 'wide');
    const nodes = table('ops-nodes', ['Node', 'State', 'Reason', 'Partitions', 'CPUs alloc / total', 'GPUs free / total']);
    nodesPanel.body.append(nodes.wrap);
    const queuePanel = panel('Queue', 'ops-queue-panel', 'wide');
    const queue = table('ops-queue', ['Job', 'User', 'Name', 'State', 'Partition', 'Nodes', 'Time']);
    queuePanel.body.append(queue.wrap);
    const utilPanel = panel('Utilisation, last 24 h', 'ops-utilisation', 'wide');
    const charts = chartSet(ctx, utilPanel.body, OPS_CHARTS);
    const alertsPanel = panel('Alerts', 'ops-alerts-panel', 'wide');
    const alerts = table('ops-alerts', ['Alert', 'Severity', 'Instance', 'Summary', 'Since']);
    alertsPanel.body.append(alerts.wrap);
    mainEl().replaceChildren(h('div', { class: 'layout-ops' },
      intro, nodesPanel.root, alertsPanel.root, queuePanel.root, utilPanel.root));

    const loadAll = () => Promise.all([
      loadPanel(ctx, nodesPanel, '/api/ops/nodes', (a) => renderOpsNodes(nodes.tbody, a.nodes)),
      loadPanel(ctx, queuePanel, '/api/ops/queue', (a) => renderOpsQueue(queue.tbody, a.jobs)),
      loadPanel(ctx, utilPanel, '/api/ops/utilisation', (a) => charts.update(Array.isArray(a.series) ? a.series : [])),
      loadPanel(ctx, alertsPanel, '/api/ops/alerts', (a) => renderOpsAlerts(alerts.tbody, a.alerts)),
    ]);
    await loadAll();
    ctx.every(REFRESH_OPS_MS, loadAll);
  }

  function nodeRowClass(state) {
    const s = String(state || '').toUpperCase();
    if (/DOWN|FAIL|NOT_RESPONDING|\*$/.test(s)) return 'row-down';
    if (/DRAIN/.test(s)) return 'row-drain';
    return null;
  }

  function nodeBadgeClass(state) {
    const s = String(state || '').toUpperCase();
    if (/DOWN|FAIL|NOT_RESPONDING|\*$/.test(s)) return 'state-failed';
    if (/DRAIN/.test(s)) return 'state-pending';
    if (/^IDLE/.test(s)) return 'state-running';
    if (/^(ALLOC|MIX)/.test(s)) return 'state-busy';
    return 'state-other';
  }

  function renderOpsNodes(tbody, rows) {
    const list = Array.isArray(rows) ? rows : [];
    if (!list.length) {
      tbody.replaceChildren(emptyRow(6, 'No nodes.'));
      return;
    }
    tbody.replaceChildren(...list.map((node) => h('tr', { 'data-node': text(node.name, ''), class: nodeRowClass(node.state) },
      h('td', { class: 'mono' }, text(node.name)),
      h('td', null, h('span', { class: 'badge ' + nodeBadgeClass(node.state) }, text(node.state))),
      h('td', { class: 'small' }, text(node.reason, '')),
      h('td', null, Array.isArray(node.partitions) ? node.partitions.join(', ') : text(node.partitions, '')),
      h('td', { class: 'num' }, text(node.cpus_allocated, '0') + ' / ' + text(node.cpus, '0')),
      h('td', { class: 'num' }, node.gpus ? text(node.gpus_free, '0') + ' / ' + text(node.gpus, '0') : '–'))));
  }

  function renderOpsQueue(tbody, rows) {
    const list = Array.isArray(rows) ? rows : [];
    if (!list.length) {
      tbody.replaceChildren(emptyRow(7, 'The queue is empty.'));
      return;
    }
    tbody.replaceChildren(...list.map((job) => h('tr', { 'data-job': text(job.job, '') },
      h('td', { class: 'mono' }, text(job.job)),
      h('td', null, text(job.user)),
      h('td', null, text(job.name, '')),
      h('td', null, badge(job.state)),
      h('td', null, text(job.partition)),
      h('td', { class: 'mono' }, text(job.nodes)),
      h('td', { class: 'num' }, text(job.time)))));
  }

  function renderOpsAlerts(tbody, rows) {
    const list = Array.isArray(rows) ? rows : [];
    if (!list.length) {
      tbody.replaceChildren(emptyRow(5, 'No alerts firing.'));
      return;
    }
    tbody.replaceChildren(...list.map((alert) => {
      const severity = String(alert.severity || '').toLowerCase();
      const cls = severity === 'critical' || severity === 'error' ? 'state-failed'
        : severity === 'warning' ? 'state-pending' : 'state-other';
      return h('tr', { 'data-alert': text(alert.name, '') },
        h('td', null, text(alert.name)),
        h('td', null, h('span', { class: 'badge ' + cls }, text(alert.severity))),
        h('td', { class: 'mono' }, text(alert.instance, '')),
        h('td', null, text(alert.summary, '')),
        h('td', { class: 'nowrap' }, isoTime(alert.since)));
    }));
  }

  // ---------------------------------------------------------------- start

  async function start() {
    window.addEventListener('hashchange', route);
    window.addEventListener('pagehide', () => {
      if (current) teardown(current);
    });
    window.addEventListener('pageshow', (event) => {
      if (event.persisted) route();
    });
    try {
      me = await api('/api/me');
      renderMe();
    } catch (err) {
      if (ended) return;
      document.getElementById('header-msg').textContent = errorText(err);
    }
    route();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
