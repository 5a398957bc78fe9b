// plnt's web UI: five views behind hash routes, built with DOM calls only (text goes in through
// textContent, never innerHTML). Data comes from the gateway's API with the user's bearer token.
//   #/workflows                     every WorkflowRun and ModelDeployment, live (SSE)
//   #/rollouts, #/rollout/NS/NAME[/RUN]   one rollout's timeline and the past rollouts; pause,
//                                         resume, promote or abort the one under way
//   #/playground[/NS/NAME]          invoke or chat, streamed; the invocation log
//   #/plan                          the plan between two revisions, as the PR comment shows it
//   #/usage                         per gateway token and workflow: requests, tokens, cost; the limits

import { ApiError, getJSON, getToken, onAuthProblem, readSSE, request, setToken, watchWorkflows } from "./api.js";
import { renderMarkdown } from "./markdown.js";

// ---- DOM helpers -------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "value" || key === "checked" || key === "selected" || key === "disabled") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const main = () => document.getElementById("main");
const short = (commit) => (typeof commit === "string" && commit ? commit.slice(0, 12) : "");
const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
const fmt = (v, unit) => (num(v) === null ? "–" : `${Math.round(v * 100) / 100}${unit ? ` ${unit}` : ""}`);

function duration(ms) {
  if (num(ms) === null) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

function when(value) {
  if (!value) return "–";
  const date = typeof value === "number" ? new Date(value * (value < 1e12 ? 1000 : 1)) : new Date(value);
  return Number.isNaN(date.getTime()) ? String(value) : date.toLocaleString();
}

const PHASE_CLASS = { Ready: "ok", Canary: "progress", Pending: "progress", Installing: "progress",
  Promoting: "progress", Validating: "progress", RolledBack: "bad", Failed: "bad", Degraded: "bad",
  Removing: "progress", Parked: "muted" };

function badge(text, cls) {
  return h("span", { class: `badge ${cls || PHASE_CLASS[text] || "muted"}` }, text || "unknown");
}

// ---- problems: what the page says when there is no data ----------------------------------

function problem(err, what) {
  const box = h("div", { class: "problem", role: "alert" });
  const title = {
    unauthorized: "Unauthorised: sign in with a gateway token",
    forbidden: "Forbidden: this token may not see this",
    unreachable: "Gateway unreachable",
    runner: err && err.status === 504 ? "Runner timed out (504)" : "Runner down (502)",
    unavailable: err && err.type === "not_ready" ? "Nothing promoted yet (503)" : "Unavailable (503)",
    not_found: "Not found (404)",
    conflict: "Conflict (409)",
  }[err && err.kind] || "Something went wrong";
  append(box, [h("strong", { text: title }), h("p", { text: `${what ? `${what}: ` : ""}${err ? err.message : ""}` })]);
  if (err && err.kind === "unreachable") append(box, [h("p", { class: "muted", text: "Check that plnt is running and reachable from this browser; the live list reconnects on its own." })]);
  return box;
}

// ---- auth: the sign-in form on 401, the token in sessionStorage ---------------------------

const state = {
  rows: null,          // GET /workflows rows, null until the first answer
  rowsError: null,     // the last ApiError of the live list
  live: { mode: "connecting" },
  authProblem: null,   // the 401 that asked for a token
  stopWatch: null,
  rowListeners: new Set(),
  localCalls: [],      // this page's own calls, when the gateway has no GET /calls
};

function startWatch() {
  if (state.stopWatch) state.stopWatch();
  state.rows = null;
  state.rowsError = null;
  state.stopWatch = watchWorkflows((rows) => {
    state.rows = rows;
    state.rowsError = null;
    for (const listener of state.rowListeners) listener(rows);
  }, (live) => {
    state.live = live;
    if (live.error) {
      state.rowsError = live.error;
      for (const listener of state.rowListeners) listener(state.rows);
    }
    renderLive();
  });
}

function renderLive() {
  const el = document.getElementById("live");
  if (!el) return;
  const { mode, retryIn, error } = state.live;
  const text = {
    live: "● live",
    polling: "● polling every 3 s",
    reconnecting: `○ reconnecting in ${Math.round((retryIn || 0) / 1000)} s`,
    connecting: "○ connecting",
    error: `○ ${({ unauthorized: "sign-in needed", forbidden: "forbidden", unreachable: "gateway unreachable",
      runner: "runner down", unavailable: "unavailable" })[error && error.kind] || "error"}`,
  }[mode] || "";
  el.textContent = text;
  el.className = `live mode-${mode}`;
}

function renderSession() {
  const el = document.getElementById("session");
  if (!el) return;
  el.replaceChildren();
  if (getToken()) {
    append(el, [h("span", { class: "muted", text: "Signed in (token in this tab only)" }), " ",
      h("button", { type: "button", class: "link", onclick: signOut }, "Sign out")]);
  } else {
    append(el, [h("button", { type: "button", class: "link", onclick: () => showSignIn(null) }, "Sign in")]);
  }
}

function signOut() {
  setToken("");
  state.authProblem = null;
  renderSession();
  startWatch();
  route(true);
}

function showSignIn(err, rejected) {
  state.authProblem = err || new ApiError("unauthorized", 401, "enter a token to send with every call");
  state.tokenRejected = Boolean(rejected);
  renderSignIn();
}

function renderSignIn() {
  const err = state.authProblem;
  const presented = state.tokenRejected;
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "current-password",
    required: true, spellcheck: "false", "aria-describedby": "signin-why" });
  const form = h("form", { class: "card signin", "aria-labelledby": "signin-title",
    onsubmit: (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      setToken(value);
      state.authProblem = null;
      renderSession();
      startWatch();
      route(true);
    } },
  h("h1", { id: "signin-title", tabindex: "-1", text: "Sign in to the gateway" }),
  h("p", { id: "signin-why", class: "problem", role: "alert" },
    h("strong", { text: presented ? "Unauthorised (401): the gateway rejected this token." : "Unauthorised (401): this gateway needs a bearer token." }),
    " No data is shown without one. ",
    err && err.message ? `The gateway said: ${err.message}.` : ""),
  h("label", { for: "token" }, "Gateway token"),
  input,
  h("p", { class: "muted", text: "A token from the gateway's token file (--tokens-file). It is kept in this browser tab (sessionStorage) and sent as 'Authorization: Bearer' with every call." }),
  h("button", { type: "submit" }, "Sign in"));
  main().replaceChildren(form);
  setNav(null);
  input.focus();
}

onAuthProblem((err) => {
  if (!state.authProblem) {
    const rejected = Boolean(getToken());
    if (rejected) setToken("");  // a rejected token: ask again instead of resending it
    showSignIn(err, rejected);
    renderSession();
  }
});

// ---- routing ---------------------------------------------------------------------------------

let cleanup = null;
let currentHash = null;

function setNav(view) {
  for (const a of document.querySelectorAll("nav a[data-view]")) {
    if (a.dataset.view === view) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

function route(force) {
  const hash = location.hash || "#/workflows";
  if (!hash.startsWith("#/")) return;  // "#main" (the skip link) is no route
  if (!force && hash === currentHash) return;
  currentHash = hash;
  if (cleanup) { cleanup(); cleanup = null; }
  if (state.authProblem) { renderSignIn(); return; }
  const parts = hash.slice(2).split("/").map(decodeURIComponent);
  const [view, ...rest] = parts;
  const views = { workflows: workflowsView, rollouts: rolloutView, rollout: rolloutView, playground: playgroundView, plan: planView, usage: usageView };
  const render = views[view] || workflowsView;
  const container = h("div", { class: "view" });
  main().replaceChildren(container);
  setNav(render === rolloutView ? "rollout" : (views[view] ? view : "workflows"));
  cleanup = render(container, rest) || null;
  const heading = container.querySelector("h1");
  if (heading) { heading.setAttribute("tabindex", "-1"); heading.focus({ preventScroll: true }); }
}

function subscribe(listener) {
  state.rowListeners.add(listener);
  return () => state.rowListeners.delete(listener);
}

function rowOf(namespace, name) {
  return (state.rows || []).find((r) => r.name === name && (r.namespace || "default") === namespace) || null;
}

// ---- smoke gates ---------------------------------------------------------------------------

function gatesOf(metrics, budget) {
  const m = metrics || {};
  const b = budget || {};
  return [
    { key: "p95", label: "p95 latency", value: m.p95_ms, budget: b.p95BudgetMs, unit: "ms" },
    { key: "errors", label: "errors", value: m.error_percent, budget: b.errorBudgetPercent, unit: "%" },
    { key: "ttft", label: "TTFT p95", value: m.ttft_p95_ms, budget: b.ttftBudgetMs, unit: "ms" },
    { key: "tpot", label: "TPOT p95", value: m.tpot_p95_ms, budget: b.tpotBudgetMs, unit: "ms" },
  ].filter((g) => num(g.value) !== null || num(g.budget) !== null)
    .map((g) => ({ ...g, verdict: num(g.value) === null ? "not measured" : num(g.budget) === null ? "no budget"
      : g.value <= g.budget ? "within budget" : "over budget" }));
}

function gateText(g) {
  return `${g.label} ${fmt(g.value, g.unit)}${num(g.budget) !== null ? ` / budget ${fmt(g.budget, g.unit)}` : ""}`;
}

function verdictCell(row) {
  const smoke = row.smokeTest;
  const progress = row.smokeProgress;
  const gateList = (gates) => h("ul", { class: "gates" }, gates.map((g) =>
    h("li", { class: g.verdict === "over budget" ? "over" : "", title: g.verdict }, gateText(g))));
  // A canary under test: its smoke test so far (smoke_progress.py: {done, of, metrics}).
  if (progress && typeof progress === "object" && (row.phase === "Canary" || !smoke)) {
    return h("div", { class: "verdict" }, badge(`smoke test ${progress.done ?? "?"}/${progress.of ?? "?"}`, "progress"),
      gateList(gatesOf(progress.metrics, row.smokeBudget)));
  }
  if (!smoke) return h("span", { class: "muted", text: "no smoke test yet" });
  const gates = gatesOf(smoke.metrics, row.smokeBudget);
  return h("div", { class: "verdict" },
    badge(smoke.passed ? "passed" : "failed", smoke.passed ? "ok" : "bad"),
    gateList(gates),
    !smoke.passed && smoke.reason ? h("div", { class: "reason", text: smoke.reason }) : null);
}

// ---- view: workflows ---------------------------------------------------------------------------

function workflowsView(container) {
  const body = h("div", { "aria-live": "polite" });
  append(container, [
    h("h1", { text: "Workflows" }),
    h("p", { class: "muted", text: "Every WorkflowRun and ModelDeployment the gateway serves; updates arrive without reloading." }),
    body,
  ]);
  const draw = () => {
    if (state.rowsError && !state.rows) { body.replaceChildren(problem(state.rowsError, "GET /workflows")); return; }
    if (!state.rows) { body.replaceChildren(h("p", { class: "muted", text: "Loading workflows…" })); return; }
    const rows = [...state.rows].sort((a, b) => `${a.namespace}/${a.name}`.localeCompare(`${b.namespace}/${b.name}`));
    if (!rows.length) {
      body.replaceChildren(h("div", { class: "empty" }, h("strong", { text: "No workflows yet." }),
        " Commit a WorkflowRun to the specs repository: plnt rolls it out and it appears here."));
      return;
    }
    const table = h("table", { class: "grid", id: "workflows-table" },
      h("caption", { class: "sr-only", text: "Workflows and their rollouts" }),
      h("thead", {}, h("tr", {}, ["Workflow", "Kind", "Phase", "Stable", "Canary", "Signer", "Commit", "Last verdict", ""]
        .map((t) => h("th", { scope: "col", text: t })))),
      h("tbody", {}, rows.map((row) => {
        const ns = row.namespace || "default";
        const id = `${encodeURIComponent(ns)}/${encodeURIComponent(row.name)}`;
        const commit = (row.rollout && row.rollout.commit) || row.observedCommit;
        return h("tr", { "data-workflow": `${ns}/${row.name}`, "data-phase": row.phase || "" },
          h("th", { scope: "row" }, h("div", { class: "name", text: row.name }),
            h("div", { class: "muted small", text: ns }),
            row.lastError ? h("div", { class: "reason", text: row.lastError })
              : row.message ? h("div", { class: "muted small", text: row.message }) : null),
          h("td", { text: row.kind || "WorkflowRun" }),
          h("td", {}, badge(row.phase), row.parked ? h("span", { class: "muted small", text: " parked" }) : null,
            row.preview ? h("span", { class: "muted small", text: ` preview #${row.preview}` }) : null),
          h("td", {}, row.version ? h("code", { text: row.version }) : h("span", { class: "muted", text: "nothing promoted yet" }),
            row.replicasDesired != null ? h("span", { class: "muted small", "data-replicas": "",
              text: ` ${row.replicasLive ?? "?"}/${row.replicasDesired} replicas` }) : null),
          h("td", {}, row.canaryVersion ? [h("code", { text: row.canaryVersion }), ` ${num(row.canaryPercent) ?? 0}%`,
                                            row.canaryStep ? ` step ${row.canaryStep}/${row.canarySteps}` : ""]
            : h("span", { class: "muted", text: "–" })),
          h("td", { class: "signer", text: row.signer || "–" }),
          h("td", {}, commit ? h("code", { title: commit, text: short(commit) }) : "–"),
          h("td", {}, verdictCell(row)),
          h("td", { class: "actions" },
            h("a", { href: `#/rollout/${id}`, "aria-label": `Rollout of ${row.name}` }, "Rollout"), " ",
            h("a", { href: `#/playground/${id}`, "aria-label": `Try ${row.name} in the playground` }, "Try")));
      })));
    body.replaceChildren(state.rowsError ? problem(state.rowsError, "live updates") : "", table);
  };
  draw();
  return subscribe(draw);
}

// ---- view: rollout timeline --------------------------------------------------------------------

const STEP_NAMES = { validate: "commit", pull_recipe: "verification", install_release: "canary",
  smoke_test: "smoke gates", promote_release: "promotion", remove_release: "removal" };

function stepLine(step) {
  if (!step) return h("span", { class: "muted", text: "not run" });
  return h("span", { class: "stepinfo" },
    badge(step.outcome || "?", step.outcome === "completed" ? "ok" : step.outcome === "running" ? "progress" : "bad"),
    ` ${duration(step.duration_ms)} · ${step.attempts || 1} attempt${(step.attempts || 1) === 1 ? "" : "s"}`,
    step.error ? h("div", { class: "reason", text: step.error }) : null);
}

function outcomeOf(history, row, isLatest) {
  const steps = history.steps || [];
  const phase = history.phase || (history.result && history.result.phase) || (isLatest && row ? row.phase : "");
  const reason = history.reason || (history.result && history.result.reason) || (isLatest && row ? row.lastError : "");
  const promoted = steps.some((s) => s.step === "promote_release" && s.outcome === "completed");
  if (phase === "RolledBack" || phase === "Failed" || (!promoted && steps.some((s) => s.step === "remove_release"))) {
    return { text: "rolled back", cls: "bad", reason };
  }
  if (promoted || (phase === "Ready" && history.status !== "RUNNING")) return { text: "promoted", cls: "ok", reason };
  if (history.status === "RUNNING" || !history.closed_at) return { text: "in progress", cls: "progress", reason };
  return { text: String(history.status || phase || "ended").toLowerCase(), cls: "muted", reason };
}

function timeline(history, row, isLatest) {
  const steps = history.steps || [];
  const step = (name) => steps.filter((s) => s.step === name).pop();
  const commit = history.commit || (isLatest && row ? (row.rollout && row.rollout.commit) || row.observedCommit : "");
  const signer = history.signer || (isLatest && row ? row.signer : "");
  const version = history.version || (history.result && history.result.version) || "";
  const smoke = history.smoke || (isLatest && row ? row.smokeTest : null);
  const budget = history.budget || (isLatest && row ? row.smokeBudget : null);
  const gates = smoke ? gatesOf(smoke.metrics, budget) : [];
  const outcome = outcomeOf(history, row, isLatest);
  const detail = (name) => {
    const d = step(name) && step(name).detail;
    if (!d || typeof d !== "object") return null;
    return h("dl", { class: "detail" }, Object.entries(d).flatMap(([k, v]) =>
      [h("dt", { text: k }), h("dd", { text: typeof v === "object" ? JSON.stringify(v) : String(v) })]));
  };
  const item = (label, content, st, name) => h("li", { class: "tl-item", "data-step": label },
    h("h3", { text: label }), h("div", {}, content), st !== undefined ? stepLine(st) : null, name ? detail(name) : null);

  const gateTable = gates.length ? h("table", { class: "grid gatetable", id: "gates" },
    h("caption", { text: `Measured against the budgets${smoke && num(smoke.metrics && smoke.metrics.invocations) !== null ? ` (${smoke.metrics.invocations} invocations)` : ""}` }),
    h("thead", {}, h("tr", {}, ["Gate", "Measured", "Budget", "Verdict"].map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, gates.map((g) => h("tr", { "data-gate": g.key },
      h("th", { scope: "row", text: g.label }), h("td", { text: fmt(g.value, g.unit) }),
      h("td", { text: num(g.budget) !== null ? fmt(g.budget, g.unit) : "no budget" }),
      h("td", {}, badge(g.verdict, g.verdict === "within budget" ? "ok" : g.verdict === "over budget" ? "bad" : "muted"))))))
    : h("p", { class: "muted", text: smoke ? "no gate values recorded" : "no smoke test in this rollout (yet)" });

  return h("ol", { class: "timeline", "aria-label": "Rollout timeline" },
    item("Commit", commit ? h("code", { title: commit, text: short(commit) }) : h("span", { class: "muted", text: "unknown commit" }), step("validate"), "validate"),
    item("Verification", signer ? ["signed by ", h("strong", { class: "signer", text: signer })] : h("span", { class: "muted", text: "signer not recorded" }), step("pull_recipe"), "pull_recipe"),
    item("Canary", version ? ["version ", h("code", { text: version })] : "", step("install_release"), "install_release"),
    item("Smoke gates", [gateTable, smoke && smoke.reason ? h("p", { class: smoke.passed ? "muted" : "reason", text: smoke.reason }) : null], step("smoke_test")),
    h("li", { class: `tl-item outcome ${outcome.cls}`, "data-step": "Outcome", id: "outcome" },
      h("h3", { text: "Outcome" }), badge(outcome.text, outcome.cls),
      outcome.text === "rolled back" && outcome.reason ? h("p", { class: "reason", id: "rollback-reason", text: outcome.reason }) : null,
      // Why it was promoted, as the saga said: its smoke verdict, or a person's promotion skipping steps.
      // (The saga's own reason only: a status' lastError may still be the rollout before's.)
      outcome.text === "promoted" && history.reason ? h("p", { class: "muted", id: "promotion-reason", text: history.reason }) : null,
      step("promote_release") ? stepLine(step("promote_release")) : step("remove_release") ? stepLine(step("remove_release")) : null));
}

// A person's hand on the rollout under way: GET /workflows/NAME/rollout says where it is; each button
// POSTs /workflows/NAME/rollout/VERB naming that commit and spec fingerprint (admin scope), so an
// action meant for this rollout never lands on a newer one (the saga refuses it: 409).
const VERBS = [
  ["pause", "Pause", "Hold before the next step until resume, promote or abort"],
  ["resume", "Resume", "End a pause (a person's, a manual step's, or the rest of a timed one)"],
  ["promote", "Promote now", "Promote the canary now, skipping what is left of its steps"],
  ["abort", "Abort", "Roll the canary back now; it stays rolled back until a new commit"],
];

function rolloutControls(namespace, name, reload) {
  const q = `namespace=${encodeURIComponent(namespace)}`;
  const where = h("p", { id: "rollout-state", text: "Reading the rollout…" });
  const answer = h("p", { id: "rollout-answer", class: "small", role: "status", "aria-live": "polite" });
  const reason = h("input", { id: "rollout-reason", type: "text", maxlength: "500", placeholder: "why (recorded with the action)" });
  const buttons = VERBS.map(([verb, label, title]) => h("button", { type: "button", "data-verb": verb, title, disabled: true, text: label }));
  const box = h("section", { class: "card", id: "rollout-controls", "aria-labelledby": "rc-title" },
    h("h2", { id: "rc-title", text: "Rollout under way" }), where,
    h("label", { for: "rollout-reason", class: "small" }, "Reason "), reason,
    h("div", { class: "buttons" }, buttons), answer);
  let current = null;

  async function read() {
    try {
      current = await getJSON(`/workflows/${encodeURIComponent(name)}/rollout?${q}`);
    } catch (err) {
      current = null;
      where.replaceChildren(err.kind === "not_found" ? h("span", { class: "muted", text: err.message }) : problem(err, "the rollout"));
      buttons.forEach((b) => { b.disabled = true; });
      return;
    }
    const at = current.canary_step ? `step ${current.canary_step}/${current.canary_steps}` : `${current.step} (no traffic yet)`;
    const held = current.paused_by ? ` · paused by ${current.paused_by}` : current.waiting_for_person ? " · waiting for a person" : "";
    where.replaceChildren(h("span", { text: `${current.version || "?"} at ` }), h("code", { title: current.commit, text: short(current.commit) }),
      h("span", { text: ` · ${at}${held}${current.decision ? ` · ${current.decision} decided` : ""}` }));
    const enabled = {
      pause: !current.paused_by && !current.decision,
      resume: Boolean(current.paused_by || current.waiting_for_person) && !current.decision,
      promote: !current.decision,
      abort: !current.decision,
    };
    buttons.forEach((b) => { b.disabled = !enabled[b.dataset.verb]; });
  }

  async function act(verb) {
    if (!current) return;
    if ((verb === "promote" || verb === "abort") && !window.confirm(`${verb === "promote" ? "Promote" : "Abort"} ${current.version} (commit ${short(current.commit)}) now?`)) return;
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const response = await request(`/workflows/${encodeURIComponent(name)}/rollout/${verb}?${q}`, {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ commit: current.commit, fingerprint: current.fingerprint, by: "web UI", reason: reason.value }),
      });
      const done = await response.json();
      answer.className = "small ok";
      answer.textContent = done.message;
      reason.value = "";
    } catch (err) {
      answer.className = "small reason";
      answer.textContent = err.kind === "forbidden" ? `${err.message} (actions need a token with the admin scope)` : err.message;
    }
    await read();
    reload();
  }

  buttons.forEach((b) => b.addEventListener("click", () => act(b.dataset.verb)));
  read();
  return { box, read };
}

function peopleActions(history) {
  const actions = history.actions || [];
  if (!actions.length) return null;
  return h("section", { class: "card", id: "people-actions", "aria-labelledby": "pa-title" },
    h("h2", { id: "pa-title", text: "What people did" }),
    h("ul", {}, actions.map((a) => h("li", { "data-verb": a.verb },
      h("strong", { text: a.verb }), ` by ${a.by || "someone"} · ${when(a.at)}`, a.reason ? h("span", { class: "muted", text: ` · ${a.reason}` }) : null))));
}

function stepsTable(history) {
  const steps = history.steps || [];
  if (!steps.length) return h("p", { class: "muted", text: "No steps recorded yet." });
  return h("table", { class: "grid small" },
    h("caption", { text: "Every saga step (Temporal history)" }),
    h("thead", {}, h("tr", {}, ["Step", "Started", "Duration", "Attempts", "Outcome", "Error"].map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, steps.map((s) => h("tr", {},
      h("th", { scope: "row" }, h("code", { text: s.step }), STEP_NAMES[s.step] ? h("span", { class: "muted small", text: ` ${STEP_NAMES[s.step]}` }) : null),
      h("td", { text: when(s.started_at) }), h("td", { text: duration(s.duration_ms) }), h("td", { text: String(s.attempts ?? "–") }),
      h("td", { text: s.outcome || "–" }), h("td", { class: "reason", text: s.error || "" })))));
}

function rolloutView(container, rest) {
  const [namespace, name, runId] = rest;
  append(container, [h("h1", { text: name ? `Rollout: ${name}` : "Rollouts" })]);
  if (!name) {
    const list = h("div");
    append(container, [h("p", { class: "muted", text: "Pick a workflow to see its rollouts." }), list]);
    const draw = () => {
      if (!state.rows) { list.replaceChildren(state.rowsError ? problem(state.rowsError, "GET /workflows") : h("p", { class: "muted", text: "Loading…" })); return; }
      if (!state.rows.length) { list.replaceChildren(h("p", { class: "empty", text: "No workflows yet: nothing has been rolled out." })); return; }
      list.replaceChildren(h("ul", { class: "picklist" }, state.rows.map((r) => h("li", {},
        h("a", { href: `#/rollout/${encodeURIComponent(r.namespace || "default")}/${encodeURIComponent(r.name)}` }, r.name),
        " ", badge(r.phase)))));
    };
    draw();
    return subscribe(draw);
  }
  const q = `namespace=${encodeURIComponent(namespace)}`;
  const past = h("nav", { class: "past", "aria-label": "Past rollouts" });
  const body = h("div", { class: "rollout", "aria-live": "polite" });
  append(container, [h("div", { class: "split" }, past, body)]);
  let rollouts = null;
  let loading = false;
  let again = false;
  let lastKey = "";
  let stopped = false;
  let followUp = 0;

  async function load() {
    if (loading) { again = true; return; }
    loading = true;
    try {
      try {
        rollouts = await getJSON(`/workflows/${encodeURIComponent(name)}/rollouts?${q}&limit=20`);
      } catch (err) {
        if (err.kind === "unauthorized") return;
        rollouts = err.kind === "not_found" ? [] : err;
      }
      let history;
      try {
        history = await getJSON(`/workflows/${encodeURIComponent(name)}/history?${q}${runId ? `&run=${encodeURIComponent(runId)}` : ""}`);
      } catch (err) {
        history = err;
      }
      if (stopped) return;
      drawPast();
      drawHistory(history);
      // A saga closes a moment after its last phase change: look again until nothing listed runs.
      const running = Array.isArray(rollouts) && rollouts.some((r) => r.status === "RUNNING");
      clearTimeout(followUp);
      if (running) followUp = setTimeout(() => { if (!stopped) load(); }, 2000);
    } finally {
      loading = false;
      if (again && !stopped) { again = false; load(); }
    }
  }

  function drawPast() {
    past.replaceChildren(h("h2", { text: "Past rollouts" }));
    if (rollouts instanceof ApiError) { past.appendChild(problem(rollouts, "past rollouts")); return; }
    if (!rollouts || !rollouts.length) { past.appendChild(h("p", { class: "muted", text: "No past rollouts listed." })); return; }
    const base = `#/rollout/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`;
    past.appendChild(h("ol", { class: "picklist" }, rollouts.map((r, i) => {
      const current = runId ? r.runId === runId : i === 0;
      return h("li", {}, h("a", { href: `${base}/${encodeURIComponent(r.runId)}`, "aria-current": current ? "true" : null },
        h("span", { class: "rl-version", text: r.version || "?" }), " ",
        badge(r.phase || r.status, PHASE_CLASS[r.phase] || (r.status === "COMPLETED" ? "ok" : r.status === "RUNNING" ? "progress" : "muted")),
        h("div", { class: "muted small", text: `${short(r.commit)} · ${when(r.startedAt)} · ${duration(r.durationMs)}` })));
    })));
  }

  // One controls box per view, kept across redraws (every 2 s while the saga runs): a reason being
  // typed stays; each redraw reads the rollout again.
  let controls = null;
  function controlsBox() {
    if (!controls) controls = rolloutControls(namespace, name, load);
    else controls.read();
    return controls.box;
  }

  function drawHistory(history) {
    if (history instanceof ApiError) {
      if (history.kind === "not_found") {
        body.replaceChildren(h("div", { class: "empty" }, h("strong", { text: "No rollout yet." }),
          ` plnt has not run a saga for ${namespace}/${name}: nothing promoted yet.`));
      } else body.replaceChildren(problem(history, "rollout history"));
      return;
    }
    const row = rowOf(namespace, name);
    const isLatest = !runId || (rollouts && !(rollouts instanceof ApiError) && rollouts[0] && rollouts[0].runId === runId);
    body.replaceChildren(
      h("p", { class: "muted small" }, `saga ${history.workflow_id || ""} · run ${history.run_id || ""} · started ${when(history.started_at)}`,
        history.closed_at ? ` · closed ${when(history.closed_at)}` : " · running"),
      isLatest && history.status === "RUNNING" ? controlsBox() : null,
      timeline(history, row, isLatest),
      peopleActions(history),
      h("details", {}, h("summary", { text: "All steps" }), stepsTable(history)));
  }

  load();
  // Live: reload when the workflow's phase, saga or verdict changes (the stream tells).
  const unsubscribe = subscribe(() => {
    const row = rowOf(namespace, name);
    const key = row ? JSON.stringify([row.phase, row.sagaId, row.version, row.canaryVersion, row.smokeTest && row.smokeTest.passed]) : "";
    if (key !== lastKey) { const first = lastKey === ""; lastKey = key; if (!first) load(); }
  });
  const row0 = rowOf(namespace, name);
  lastKey = row0 ? JSON.stringify([row0.phase, row0.sagaId, row0.version, row0.canaryVersion, row0.smokeTest && row0.smokeTest.passed]) : "";
  return () => { stopped = true; clearTimeout(followUp); unsubscribe(); };
}

// ---- view: playground --------------------------------------------------------------------------

function recordLocalCall(entry) {
  state.localCalls.unshift(entry);
  state.localCalls.length = Math.min(state.localCalls.length, 50);
}

function playgroundView(container, rest) {
  const [wantNs, wantName] = rest;
  const modeInvoke = h("input", { type: "radio", name: "mode", id: "mode-invoke", value: "invoke", checked: true });
  const modeChat = h("input", { type: "radio", name: "mode", id: "mode-chat", value: "chat" });
  const target = h("select", { id: "pg-workflow", name: "workflow" });
  const model = h("select", { id: "pg-model", name: "model" });
  const track = h("select", { id: "pg-track", name: "track" },
    h("option", { value: "", text: "gateway's choice (canary share)" }),
    h("option", { value: "stable", text: "stable" }),
    h("option", { value: "canary", text: "canary" }));
  const rawToggle = h("input", { type: "checkbox", id: "pg-raw" });
  const fields = h("div", { class: "fields" });
  const raw = h("textarea", { id: "pg-json", rows: "6", spellcheck: "false" });
  const message = h("textarea", { id: "pg-message", rows: "4" });
  const run = h("button", { type: "submit", id: "pg-run" }, "Invoke");
  const stop = h("button", { type: "button", id: "pg-stop", disabled: true }, "Stop");
  const meta = h("p", { id: "pg-meta", class: "meta", role: "status" },
    h("span", { class: "muted", text: "Pick a workflow, fill its inputs and invoke: the output streams in here." }));
  const tokens = h("pre", { id: "pg-output", class: "output", "aria-live": "polite", "aria-label": "Streamed output" });
  const result = h("pre", { id: "pg-result", class: "output result", "aria-label": "Result" });
  const errorBox = h("div", { id: "pg-error" });
  const callsBox = h("div", { id: "pg-calls" });
  let controller = null;
  let inputNames = null;
  let shownFor = "";

  const invokeOnly = h("div", { class: "invoke-only" },
    h("div", { class: "field" }, h("label", { for: "pg-workflow" }, "Workflow"), target),
    h("fieldset", {}, h("legend", { text: "Inputs" }),
      h("div", { class: "check" }, rawToggle, h("label", { for: "pg-raw" }, "Write the inputs as raw JSON")),
      fields, h("div", { class: "field rawjson" }, h("label", { for: "pg-json" }, "Inputs (JSON object)"), raw)));
  const chatOnly = h("div", { class: "chat-only", hidden: true },
    h("div", { class: "field" }, h("label", { for: "pg-model" }, "Model (GET /v1/models)"), model),
    h("div", { class: "field" }, h("label", { for: "pg-message" }, "Message"), message));

  const form = h("form", { class: "card", "aria-labelledby": "pg-title", onsubmit: (e) => { e.preventDefault(); go(); } },
    h("fieldset", { class: "modes" }, h("legend", { text: "Call" }),
      h("span", { class: "check" }, modeInvoke, h("label", { for: "mode-invoke" }, "Invoke (streamed)")),
      h("span", { class: "check" }, modeChat, h("label", { for: "mode-chat" }, "Chat (/v1/chat/completions)"))),
    invokeOnly, chatOnly,
    h("div", { class: "field" }, h("label", { for: "pg-track" }, "Track (X-Plnt-Track)"), track),
    h("div", { class: "buttons" }, run, stop));

  append(container, [
    h("h1", { id: "pg-title", text: "Playground" }),
    h("div", { class: "split wide" }, form,
      h("section", { class: "card", "aria-labelledby": "out-title" }, h("h2", { id: "out-title", text: "Output" }), meta, errorBox, tokens, result)),
    h("section", { "aria-labelledby": "calls-title" }, h("h2", { id: "calls-title", text: "Invocation log" }), callsBox),
  ]);

  const isChat = () => modeChat.checked;
  const selectedRow = () => {
    const [ns, ...name] = (target.value || "").split("/");
    return rowOf(ns, name.join("/"));
  };
  // In chat mode the track (and its versions) is the picked model's: an id of GET /v1/models is
  // `name`, or `namespace/name` when the name is in several namespaces; owned_by is the namespace.
  const modelOwners = new Map();
  const modelRow = () => {
    const id = model.value || "";
    return rowOf(modelOwners.get(id) || "default", id.includes("/") ? id.slice(id.indexOf("/") + 1) : id);
  };
  let modePicked = false;  // "Try" on a ModelDeployment opens the chat, until the user picks a mode
  function pickModeFor() {
    const row = !modePicked && wantName ? rowOf(wantNs, wantName) : null;
    if (!row) return;
    modePicked = true;
    if (row.kind === "ModelDeployment") { modeChat.checked = true; setMode(); }
  }

  function fillTargets() {
    const rows = (state.rows || []).filter((r) => (r.kind || "WorkflowRun") !== "ModelDeployment");
    const current = target.value || (wantName ? `${wantNs}/${wantName}` : "");
    const keys = rows.map((r) => `${r.namespace || "default"}/${r.name}`);
    if (keys.join("\n") !== [...target.options].map((o) => o.value).join("\n")) {
      target.replaceChildren(...(rows.length ? rows.map((r, i) => h("option", { value: keys[i], text: `${r.name} (${r.namespace || "default"})` }))
        : [h("option", { value: "", text: state.rows ? "no workflows yet" : "loading…" })]));
      if (keys.includes(current)) target.value = current;
    }
    updateTrack();
    drawFields();
    pickModeFor();
  }

  function updateTrack() {
    const row = isChat() ? modelRow() : selectedRow();
    const canary = track.querySelector('option[value="canary"]');
    const hasCanary = Boolean(row && row.canaryVersion);
    canary.disabled = !hasCanary && !isChat();
    canary.textContent = hasCanary ? `canary ${row.canaryVersion} (${num(row.canaryPercent) ?? 0}%)` : "canary (none running)";
    const stable = track.querySelector('option[value="stable"]');
    stable.textContent = row && row.version ? `stable ${row.version}` : "stable";
    if (track.value === "canary" && canary.disabled) track.value = "";
  }

  function drawFields() {
    const row = selectedRow();
    const key = row ? `${row.namespace}/${row.name}:${JSON.stringify(row.inputs || null)}` : "";
    if (key === shownFor) return;
    shownFor = key;
    inputNames = row && Array.isArray(row.inputs) && row.inputs.length ? row.inputs : null;
    fields.replaceChildren();
    if (inputNames) {
      for (const input of inputNames) {
        const id = `in-${input.replace(/[^A-Za-z0-9_-]/g, "_")}`;
        fields.appendChild(h("div", { class: "field" }, h("label", { for: id }, input),
          h("textarea", { id, name: input, rows: "2", "data-input": input })));
      }
      rawToggle.disabled = false;
    } else {
      fields.appendChild(h("p", { class: "muted small", text: "This workflow's inputs are not listed: write them as a JSON object." }));
      rawToggle.checked = true;
    }
    if (!raw.value.trim()) raw.value = JSON.stringify(Object.fromEntries((inputNames || []).map((n) => [n, ""])), null, 2);
    syncRaw();
  }

  function syncRaw() {
    const useRaw = rawToggle.checked || !inputNames;
    fields.hidden = useRaw && Boolean(inputNames);
    invokeOnly.querySelector(".rawjson").hidden = !useRaw;
  }

  async function fillModels() {
    try {
      const body = await getJSON("/v1/models");
      const ids = (body.data || []).map((m) => m.id);
      for (const m of body.data || []) modelOwners.set(m.id, m.owned_by);
      model.replaceChildren(...(ids.length ? ids.map((id) => h("option", { value: id, text: id })) : [h("option", { value: "", text: "no models" })]));
      if (wantName && ids.includes(wantName)) model.value = wantName;
      updateTrack();
    } catch (err) {
      if (err.kind !== "unauthorized") model.replaceChildren(h("option", { value: "", text: `models unavailable: ${err.message}` }));
    }
  }

  function inputsValue() {
    if (rawToggle.checked || !inputNames) {
      const parsed = JSON.parse(raw.value || "{}");
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("the inputs must be a JSON object");
      return parsed;
    }
    const out = {};
    for (const el of fields.querySelectorAll("[data-input]")) out[el.dataset.input] = el.value;
    return out;
  }

  function showMeta(info) {
    meta.replaceChildren(...[
      info.status ? h("span", {}, "status ", h("strong", { id: "pg-status", text: String(info.status) })) : null,
      info.version ? h("span", {}, "version ", h("code", { id: "pg-version", text: info.version })) : null,
      info.track ? h("span", {}, "track ", h("strong", { id: "pg-track-used", text: info.track })) : null,
      num(info.ttft) !== null ? h("span", { text: `first output ${duration(info.ttft)}` }) : null,
      num(info.total) !== null ? h("span", { id: "pg-latency", text: `total ${duration(info.total)}` }) : null,
      info.chunks ? h("span", { id: "pg-chunks", text: `${info.chunks} streamed piece${info.chunks === 1 ? "" : "s"}` }) : null,
      info.state ? h("span", { class: "muted", text: info.state }) : null,
    ].filter(Boolean));
  }

  async function go() {
    if (controller) return;
    errorBox.replaceChildren();
    tokens.textContent = "";
    result.textContent = "";
    const chat = isChat();
    let path;
    let body;
    const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
    if (track.value) headers["X-Plnt-Track"] = track.value;
    try {
      if (chat) {
        if (!model.value) throw new Error("pick a model");
        path = "/v1/chat/completions";
        body = { model: model.value, messages: [{ role: "user", content: message.value }], stream: true };
      } else {
        const row = selectedRow();
        if (!row) throw new Error("pick a workflow");
        path = `/workflows/${encodeURIComponent(row.name)}/invoke?namespace=${encodeURIComponent(row.namespace || "default")}`;
        body = inputsValue();
      }
    } catch (err) {
      errorBox.replaceChildren(h("div", { class: "problem", role: "alert", text: `Cannot send: ${err.message}` }));
      return;
    }
    controller = new AbortController();
    run.disabled = true;
    stop.disabled = false;
    const t0 = performance.now();
    const info = { state: "sending…", chunks: 0 };
    showMeta(info);
    const target = chat ? model.value : (selectedRow() || {}).name;
    let status = 0;
    try {
      const response = await request(path, { method: "POST", headers, body: JSON.stringify(body), signal: controller.signal });
      status = response.status;
      Object.assign(info, { status, version: response.headers.get("x-plnt-version") || "", track: response.headers.get("x-plnt-track") || "", state: "streaming…" });
      showMeta(info);
      const type = response.headers.get("content-type") || "";
      const piece = (text) => {
        if (!text) return;
        if (info.ttft === undefined) info.ttft = performance.now() - t0;
        info.chunks += 1;
        tokens.appendChild(document.createTextNode(text));
        showMeta(info);
      };
      if (!type.includes("text/event-stream")) {
        result.textContent = JSON.stringify(await response.json(), null, 2);
      } else if (chat) {
        await readSSE(response, ({ data }) => {
          if (data === "[DONE]") return;
          let chunk;
          try { chunk = JSON.parse(data); } catch { return; }
          if (chunk.error) { errorBox.replaceChildren(problem(new ApiError("error", 200, chunk.error.message || "stream error"), "the stream")); status = "error"; return; }
          const choice = (chunk.choices || [])[0];
          if (choice && choice.delta && typeof choice.delta.content === "string") piece(choice.delta.content);
        }, controller.signal);
      } else {
        await readSSE(response, ({ event, data }) => {
          let parsed;
          try { parsed = JSON.parse(data); } catch { parsed = data; }
          if (event === "token") piece(parsed && parsed.text);
          else if (event === "result") {
            result.textContent = JSON.stringify(parsed, null, 2);
            if (parsed && parsed.version && !info.version) info.version = parsed.version;
          } else if (event === "error") {
            const e = (parsed && parsed.error) || {};
            status = "error";
            errorBox.replaceChildren(problem(new ApiError("error", 200, `${e.type ? `${e.type}: ` : ""}${e.message || "the workflow failed"}`), "the workflow"));
          }
        }, controller.signal);
      }
      info.state = "done";
    } catch (err) {
      if (err && err.name === "AbortError") info.state = "stopped";
      else {
        status = err.status || err.kind;
        info.status = status;
        info.state = "failed";
        if (err.kind !== "unauthorized") {
          const extra = err.type === "no_canary" ? "No canary runs now: pick stable or the gateway's choice." : "";
          errorBox.replaceChildren(problem(err, `POST ${path.split("?")[0]}`), extra ? h("p", { class: "muted", text: extra }) : "");
        }
      }
    } finally {
      info.total = performance.now() - t0;
      showMeta(info);
      controller = null;
      run.disabled = false;
      stop.disabled = true;
      recordLocalCall({ at: new Date().toISOString(), api: chat ? "chat" : "invoke", workflow: target, version: info.version,
        track: info.track, code: status, latencyMs: info.total });
      loadCalls();
    }
  }

  async function loadCalls() {
    let calls;
    let note = "";
    try {
      calls = await getJSON("/calls?limit=20");
      if (!Array.isArray(calls)) calls = calls.calls || [];
    } catch (err) {
      if (err.kind === "unauthorized") return;
      calls = state.localCalls;
      note = err.kind === "not_found" ? "The gateway keeps no call log (GET /calls is missing): these are this page's calls."
        : `The gateway's call log is not readable (${err.message}): these are this page's calls.`;
    }
    const table = calls.length ? h("table", { class: "grid small", id: "calls-table" },
      h("caption", { class: "sr-only", text: "Last calls" }),
      h("thead", {}, h("tr", {}, ["Time", "Call", "Workflow", "Latency", "Version", "Track", "Status"].map((t) => h("th", { scope: "col", text: t })))),
      h("tbody", {}, calls.map((c) => h("tr", {},
        h("td", { text: when(c.at) }), h("td", { text: c.api || "–" }),
        h("td", { text: `${c.namespace ? `${c.namespace}/` : ""}${c.workflow || "–"}` }),
        h("td", { text: duration(c.latencyMs) }), h("td", { text: c.version || "–" }), h("td", { text: c.track || "–" }),
        h("td", {}, badge(`${c.code ?? "–"}${c.errorType ? ` ${c.errorType}` : ""}`, typeof c.code === "number" && c.code < 400 ? "ok" : "bad"))))))
      : h("p", { class: "empty", text: "No calls yet." });
    callsBox.replaceChildren(note ? h("p", { class: "muted small", text: note }) : "", table);
  }

  const setMode = () => {
    const chat = isChat();
    modePicked = true;
    invokeOnly.hidden = chat;
    chatOnly.hidden = !chat;
    run.textContent = chat ? "Send" : "Invoke";
    updateTrack();
  };
  modeInvoke.addEventListener("change", setMode);
  modeChat.addEventListener("change", setMode);
  rawToggle.addEventListener("change", () => {
    if (rawToggle.checked && inputNames) {
      try { raw.value = JSON.stringify(inputsValue(), null, 2); } catch { /* keep what is there */ }
    }
    syncRaw();
  });
  target.addEventListener("change", () => { updateTrack(); drawFields(); });
  model.addEventListener("change", updateTrack);
  stop.addEventListener("click", () => controller && controller.abort());
  message.value = "Great service but slow parking";

  fillTargets();
  fillModels();
  loadCalls();
  const unsubscribe = subscribe(fillTargets);
  return () => { unsubscribe(); if (controller) controller.abort(); };
}

// ---- view: plan preview --------------------------------------------------------------------

function planView(container) {
  const base = h("select", { id: "plan-base", name: "base" });
  const head = h("select", { id: "plan-head", name: "head" });
  const out = h("div", { id: "plan-out", "aria-live": "polite" });
  const form = h("form", { class: "card inline", onsubmit: (e) => { e.preventDefault(); show(); } },
    h("div", { class: "field" }, h("label", { for: "plan-base" }, "Base revision"), base),
    h("div", { class: "field" }, h("label", { for: "plan-head" }, "Head revision"), head),
    h("button", { type: "submit", id: "plan-show" }, "Show plan"));
  append(container, [h("h1", { text: "Plan preview" }),
    h("p", { class: "muted", text: "What plnt would do going from one revision of the specs to another, as the pull request comment shows it." }),
    form, out]);

  let asked = 0;  // only the newest request's answer is shown (an older one may come back later)
  async function show() {
    if (!base.value || !head.value) return;
    const mine = ++asked;
    out.replaceChildren(h("p", { class: "muted", text: "Planning…" }));
    try {
      const plan = await getJSON(`/plan?base=${encodeURIComponent(base.value)}&head=${encodeURIComponent(head.value)}`);
      if (mine !== asked) return;
      out.replaceChildren(h("article", { class: "card plan", "aria-label": plan.title || "plan" }, renderMarkdown(plan.markdown || "")));
    } catch (err) {
      if (mine === asked && err.kind !== "unauthorized") out.replaceChildren(problem(err, "GET /plan"));
    }
  }

  (async () => {
    let revisions;
    try {
      revisions = await getJSON("/plan/revisions?limit=50");
    } catch (err) {
      if (err.kind === "unauthorized") return;
      out.replaceChildren(err.kind === "not_found"
        ? h("div", { class: "empty" }, h("strong", { text: "Plan preview is not available on this gateway." }), " (GET /plan/revisions answered 404.)")
        : problem(err, "GET /plan/revisions"));
      return;
    }
    if (!Array.isArray(revisions) || !revisions.length) {
      out.replaceChildren(h("p", { class: "empty", text: "No revisions yet: the specs repository has no commits plnt has read." }));
      return;
    }
    const options = () => revisions.map((r) => h("option", { value: r.commit, text: `${r.short || short(r.commit)} ${r.subject || ""}`.trim() }));
    base.replaceChildren(...options());
    head.replaceChildren(...options());
    head.value = revisions[0].commit;
    base.value = revisions[Math.min(1, revisions.length - 1)].commit;
    show();
  })();
}

// ---- view: usage -----------------------------------------------------------------------------

function usageView(container) {
  const out = h("div", { id: "usage-out", "aria-live": "polite" });
  append(container, [h("h1", { text: "Usage" }),
    h("p", { class: "muted", text: "What each gateway token used since the gateway started, per workflow or model, and the limits of the GatewayPolicy in git. An admin token sees every token; others their own." }),
    out]);
  const cost = (value, currency) => `${Number(value).toPrecision(4).replace(/\.?0+$/, "")} ${currency || ""}`.trim();
  const limit = (value) => (value === null || value === undefined ? "–" : Number(value).toLocaleString("en"));
  async function load() {
    let body;
    try {
      body = await getJSON("/usage");
    } catch (err) {
      if (err.kind !== "unauthorized") out.replaceChildren(problem(err, "GET /usage"));
      return;
    }
    const rows = body.usage || [];
    const limits = body.limits || [];
    out.replaceChildren(
      rows.length ? h("table", { class: "grid", id: "usage-table" },
        h("caption", { class: "sr-only", text: "Usage per token and workflow" }),
        h("thead", {}, h("tr", {}, ["Token", "Workflow", "Requests", "Prompt tokens", "Completion tokens", "Cost"]
          .map((t) => h("th", { scope: "col", text: t })))),
        h("tbody", {}, rows.map((r) => h("tr", { "data-token": r.token, "data-workflow": `${r.namespace}/${r.workflow}` },
          h("th", { scope: "row", text: r.token }),
          h("td", { text: `${r.namespace}/${r.workflow}` }),
          h("td", { text: String(r.requests) }),
          h("td", { text: String(r.promptTokens) }),
          h("td", { text: String(r.completionTokens) }),
          h("td", { text: cost(r.cost, body.currency) })))))
        : h("p", { class: "empty", text: "No usage yet." }),
      h("h2", { text: "Limits" }),
      limits.length ? h("table", { class: "grid small", id: "limits-table" },
        h("caption", { class: "sr-only", text: "Limits per token" }),
        h("thead", {}, h("tr", {}, ["Token", "Requests per minute", "LLM tokens per minute", "Budget"]
          .map((t) => h("th", { scope: "col", text: t })))),
        h("tbody", {}, limits.map((l) => h("tr", { "data-token": l.token },
          h("th", { scope: "row", text: l.token === "*" ? "every other token" : l.token }),
          h("td", { text: limit(l.requestsPerMinute) }),
          h("td", { text: limit(l.tokensPerMinute) }),
          h("td", { text: l.budget ? `${cost(l.budget.amount, l.budget.currency)} per ${l.budget.per}` : "–" })))))
        : h("p", { class: "muted", text: "No limits: the specs hold no GatewayPolicy naming this token." }));
  }
  load();
  const timer = setInterval(load, 5000);
  return () => clearInterval(timer);
}

// ---- start -----------------------------------------------------------------------------------

window.addEventListener("hashchange", () => route(false));
renderSession();
renderLive();
startWatch();
route(true);
