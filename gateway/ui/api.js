// Calls to the gateway's API: the bearer token, error kinds the views explain, and SSE read
// from fetch() streams (EventSource cannot send an Authorization header).

const TOKEN_KEY = "plnt.token";

export function getToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch { return ""; }
}

export function setToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage disabled: the token lives for this page only */ }
  memoryToken = token || "";
}

let memoryToken = "";
function token() { return getToken() || memoryToken; }

// One error type for every failed call; `kind` decides what the page says.
//   unauthorized (401), forbidden (403), not_found (404), conflict (409), runner (502/504),
//   unavailable (503: nothing promoted yet / not ready), unreachable (no answer), error (other).
export class ApiError extends Error {
  constructor(kind, status, message, type) {
    super(message);
    this.kind = kind;
    this.status = status;
    this.type = type || "";
  }
}

const KINDS = { 401: "unauthorized", 403: "forbidden", 404: "not_found", 409: "conflict",
  502: "runner", 503: "unavailable", 504: "runner" };

const listeners = new Set();
// Views and the session bar hear about 401s (show the sign-in form) in one place.
export function onAuthProblem(listener) { listeners.add(listener); return () => listeners.delete(listener); }

async function errorFrom(response) {
  let message = `${response.status} ${response.statusText}`.trim();
  let type = "";
  try {
    const body = await response.json();
    const error = body && body.error;
    if (error && typeof error === "object") {
      if (typeof error.message === "string") message = error.message;
      type = typeof error.type === "string" ? error.type : (typeof error.code === "string" ? error.code : "");
    }
  } catch { /* not JSON: keep the status line */ }
  const kind = KINDS[response.status] || "error";
  const err = new ApiError(kind, response.status, message, type);
  if (kind === "unauthorized") for (const l of listeners) l(err);
  return err;
}

// fetch() with the token; a network failure becomes ApiError("unreachable").
export async function request(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const t = token();
  if (t) headers.set("Authorization", `Bearer ${t}`);
  let response;
  try {
    response = await fetch(path, { ...options, headers, cache: "no-store", credentials: "omit" });
  } catch (exc) {
    if (exc && exc.name === "AbortError") throw exc;
    throw new ApiError("unreachable", 0, "the gateway did not answer (is plnt running?)");
  }
  if (!response.ok) throw await errorFrom(response);
  return response;
}

export async function getJSON(path, options) {
  const response = await request(path, options);
  return response.json();
}

// Read an SSE body as it arrives: calls onEvent({event, data}) per event (comments skipped).
// Lines end in LF, CRLF or CR, as the SSE spec reads them.
export async function readSSE(response, onEvent, signal) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "";
  let data = [];
  const abort = () => reader.cancel().catch(() => {});
  if (signal) signal.addEventListener("abort", abort, { once: true });
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      let text = buffer + decoder.decode(value, { stream: true });
      // A CR at the very end may be half of a CRLF split across chunks: hold it back.
      const held = text.endsWith("\r") ? "\r" : "";
      if (held) text = text.slice(0, -1);
      const lines = text.split(/\r\n|\r|\n/);
      buffer = lines.pop() + held;  // the last piece has no line end yet
      for (const line of lines) {
        if (line === "") {
          if (data.length || event) onEvent({ event: event || "message", data: data.join("\n") });
          event = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
      }
    }
  } finally {
    if (signal) signal.removeEventListener("abort", abort);
  }
}

// The live list of workflows: GET /workflows/events (SSE) with reconnects (backoff 1 s .. 15 s);
// when the gateway has no such endpoint (404), GET /workflows every few seconds instead.
// onRows(rows) on each update; onState({mode, error, retryIn}) for the page's live indicator.
export function watchWorkflows(onRows, onState, pollMs = 3000) {
  const controller = new AbortController();
  let stopped = false;
  let backoff = 1000;
  const sleep = (ms) => new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    controller.signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });

  async function poll() {
    while (!stopped) {
      try {
        onRows(await getJSON("/workflows", { signal: controller.signal }));
        onState({ mode: "polling" });
      } catch (err) {
        if (stopped) return;
        onState({ mode: "error", error: err });
        if (err.kind === "unauthorized" || err.kind === "forbidden") return;
      }
      await sleep(pollMs);
    }
  }

  async function stream() {
    while (!stopped) {
      try {
        const response = await request("/workflows/events", {
          headers: { Accept: "text/event-stream" }, signal: controller.signal });
        onState({ mode: "live" });
        let got = false;
        await readSSE(response, ({ event, data }) => {
          if (event !== "workflows") return;
          try {
            const parsed = JSON.parse(data);
            const rows = Array.isArray(parsed) ? parsed : parsed.workflows;
            if (Array.isArray(rows)) { onRows(rows); got = true; }
          } catch { /* a broken event: wait for the next one */ }
        }, controller.signal);
        if (got) backoff = 1000;
      } catch (err) {
        if (stopped || (err && err.name === "AbortError")) return;
        if (err instanceof ApiError) {
          if (err.kind === "not_found") { poll(); return; }
          onState({ mode: "error", error: err });
          if (err.kind === "unauthorized" || err.kind === "forbidden") return;
        }
        // Anything else (the stream broke mid-read): reconnect below.
      }
      if (stopped) return;
      onState({ mode: "reconnecting", retryIn: backoff });
      await sleep(backoff);
      backoff = Math.min(backoff * 2, 15000);
    }
  }

  stream();
  return () => { stopped = true; controller.abort(); };
}
