// The chat page's controller: server state, conversations, streaming, settings.

import { Api, ApiError, apiBase } from "./api.js";
import * as store from "./store.js";
import { editMessage, fillMessage, renderConversations, renderMessages, renderSlots } from "./view.js";

const $ = (id) => document.getElementById(id);
const SAMPLING_FIELDS = ["temperature", "top_k", "top_p", "min_p", "max_tokens"];
const SLOTS_POLL_MS = 1500;
const HEALTH_POLL_MS = 1000;

// Settings the user left empty fall back to the server's --ui-config defaults (/props ui_settings,
// under llama-server's Web UI names), then to the server's own defaults (the field is not sent).
const UI_SETTING_NAMES = {
  system: ["systemMessage"], temperature: ["temperature"], top_k: ["top_k"], top_p: ["top_p"],
  min_p: ["min_p"], max_tokens: ["max_tokens"], api_key: ["apiKey"],
};
let settings = store.loadSettings();
let serverUi = {};
const api = new Api(apiBase(location.pathname), () => effective("api_key"));
let conv = null; // the open conversation
let streaming = null; // {controller, index} while a reply streams
let ready = false;

function serverDefault(k) {
  for (const name of UI_SETTING_NAMES[k]) {
    const v = serverUi?.[name];
    if (v !== undefined && v !== null && v !== "") return String(v);
  }
  return "";
}

function effective(k) {
  return settings[k] !== "" ? settings[k] : serverDefault(k);
}

// --- errors and status -----------------------------------------------------------------------
function showError(message, kind = "error") {
  $("error-text").textContent = message;
  $("error").dataset.kind = kind;
  $("error").hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error-text").textContent = "";
}

function setStatus(state, text) {
  $("status").dataset.state = state;
  $("status").textContent = text;
}

function describe(e) {
  if (e instanceof ApiError) return e.status ? `${e.message} (HTTP ${e.status})` : e.message;
  if (e instanceof TypeError) return `cannot reach the server: ${e.message}`;
  return String(e?.message ?? e);
}

window.addEventListener("unhandledrejection", (ev) => showError(`Unexpected error: ${describe(ev.reason)}`));
window.addEventListener("error", (ev) => showError(`Unexpected error: ${ev.message}`));

// --- server state ----------------------------------------------------------------------------
async function waitForHealth() {
  for (;;) {
    let text;
    try {
      const { status, body } = await api.probe("/health");
      if (status === 200) break;
      text = status === 503 ? "Loading model…" : `Server answered ${status}: ${body?.error?.message ?? ""}`;
      setStatus(status === 503 ? "loading" : "error", status === 503 ? "loading" : "error");
    } catch (e) {
      text = `Server unreachable (${describe(e)}), retrying…`;
      setStatus("error", "offline");
    }
    $("loading-text").textContent = text;
    await new Promise((r) => setTimeout(r, HEALTH_POLL_MS));
  }
  ready = true;
  $("loading").hidden = true;
  setStatus("ready", "ready");
  updateComposer();
  await loadProps();
  pollSlots();
}

async function loadProps() {
  try {
    const props = await api.getJSON("/props");
    serverUi = props.ui_settings && typeof props.ui_settings === "object" ? props.ui_settings : {};
    const n_ctx = props.default_generation_settings?.n_ctx;
    $("model").textContent = `${props.model_alias ?? "model"}${n_ctx ? ` · ctx ${n_ctx}` : ""}`;
    $("model").title = props.model_path ?? "";
    return true;
  } catch (e) {
    const hint = e instanceof ApiError && e.status === 401 ? " — set the server's API key in Settings" : "";
    showError(`Could not read /props: ${describe(e)}${hint}`);
    return false;
  }
}

let slotsTimer = null;
async function refreshSlots() {
  let shown;
  try {
    const { status, body } = await api.probe("/slots");
    if (status === 200) shown = body;
    else if (status === 501) shown = "the /slots endpoint is disabled (--no-slots)";
    else if (status === 401) shown = "needs the API key (Settings)";
    else shown = `/slots answered ${status}`;
  } catch (e) {
    shown = describe(e);
  }
  renderSlots($("slots"), $("slots-summary"), shown);
}

function pollSlots() {
  clearTimeout(slotsTimer);
  refreshSlots().finally(() => { slotsTimer = setTimeout(pollSlots, SLOTS_POLL_MS); });
}

// --- conversations ---------------------------------------------------------------------------
const handlers = {
  busy: () => streaming !== null,
  edit: (i) => startEdit(i),
  regenerate: (i) => regenerate(i),
  open: (id) => openConversation(id),
  remove: (id) => removeConversation(id),
};

function persist() {
  try {
    store.saveConversation(conv);
  } catch (e) {
    showError(describe(e));
  }
}

function renderList() {
  renderConversations($("conversations"), store.listConversations(), conv?.id, handlers);
}

function renderAll() {
  renderList();
  renderMessages($("messages"), conv, streaming?.index ?? -1, handlers);
  updateComposer();
}

function openConversation(id) {
  if (streaming) return;
  conv = store.getConversation(id);
  store.setCurrentId(conv?.id ?? null);
  renderAll();
}

function newConversation() {
  if (streaming) return;
  conv = null;
  store.setCurrentId(null);
  renderAll();
  $("input").focus();
}

function removeConversation(id) {
  if (streaming && conv?.id === id) return;
  store.deleteConversation(id);
  if (conv?.id === id) conv = null;
  renderAll();
}

function updateComposer() {
  $("send").disabled = !ready || streaming !== null;
  $("stop").hidden = streaming === null;
  $("send").hidden = streaming !== null;
}

// --- generation ------------------------------------------------------------------------------
function requestBody() {
  const messages = [];
  const system = effective("system");
  if (system.trim()) messages.push({ role: "system", content: system });
  for (const m of conv.messages) {
    if (m.role === "assistant" && !m.content) continue; // failed or stopped before any text
    messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, return_progress: true, timings_per_token: true };
  for (const k of SAMPLING_FIELDS) if (effective(k) !== "") body[k] = Number(effective(k));
  return body;
}

function showProgress(p) {
  const todo = p.total - p.cache;
  const done = Math.max(0, p.processed - p.cache);
  $("progress").hidden = false;
  $("progress-bar").max = Math.max(1, todo);
  $("progress-bar").value = done;
  $("progress-text").textContent =
    `Processing prompt: ${done} / ${todo} tokens${p.cache ? ` (${p.cache} from cache)` : ""}`;
}

async function generate() {
  const body = requestBody();
  const m = { role: "assistant", content: "", reasoning: "", streaming: true };
  conv.messages.push(m);
  const index = conv.messages.length - 1;
  streaming = { controller: new AbortController(), index };
  persist();
  renderAll();
  const node = $("messages").querySelector(`.message[data-index="${index}"]`);
  node.scrollIntoView({ block: "end" });
  let pending = false;
  let saved = Date.now();
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      fillMessage(node, m, index, streaming?.index === index, handlers);
      node.scrollIntoView({ block: "end" });
      if (Date.now() - saved > 2000) { // a reload mid-reply keeps what had arrived
        saved = Date.now();
        persist();
      }
    });
  };
  clearError();
  refreshSlots();
  try {
    for await (const chunk of api.chat(body, streaming.controller.signal)) {
      if (chunk.prompt_progress) showProgress(chunk.prompt_progress);
      if (chunk.timings) m.stats = pickStats(chunk.timings);
      const choice = chunk.choices?.[0];
      const delta = choice?.delta ?? {};
      if (delta.reasoning_content) m.reasoning += delta.reasoning_content;
      if (delta.content) {
        m.content += delta.content;
        $("progress").hidden = true;
      }
      if (choice?.finish_reason) m.finish_reason = choice.finish_reason;
      redraw();
    }
  } catch (e) {
    if (e?.name === "AbortError") {
      m.stopped = true;
    } else {
      m.error = describe(e);
      showError(`Generation failed: ${m.error}`);
    }
  } finally {
    streaming = null;
    $("progress").hidden = true;
    delete m.streaming;
    if (!m.reasoning) delete m.reasoning;
    persist();
    renderAll();
    refreshSlots();
  }
}

function pickStats(t) {
  return {
    predicted_n: t.predicted_n ?? 0,
    predicted_per_second: t.predicted_per_second ?? 0,
    prompt_n: t.prompt_n ?? 0,
    cache_n: t.cache_n ?? 0,
    prompt_ms: t.prompt_ms ?? 0,
  };
}

function send(text) {
  if (!ready || streaming || !text.trim()) return;
  if (!conv) {
    conv = store.createConversation();
    store.setCurrentId(conv.id);
  }
  conv.messages.push({ role: "user", content: text });
  $("input").value = "";
  generate();
}

function startEdit(i) {
  if (streaming) return;
  const node = $("messages").querySelector(`.message[data-index="${i}"]`);
  editMessage(node, conv.messages[i].content, (text) => {
    if (!text.trim()) return;
    conv.messages = conv.messages.slice(0, i);
    conv.messages.push({ role: "user", content: text });
    generate();
  }, () => renderAll());
}

function regenerate(i) {
  if (streaming) return;
  conv.messages = conv.messages.slice(0, i);
  if (conv.messages.at(-1)?.role === "user") generate();
  else renderAll();
}

// --- settings --------------------------------------------------------------------------------
function openSettings() {
  const form = $("settings-form");
  for (const [k, v] of Object.entries(settings)) {
    const field = form.elements[k];
    if (!field) continue;
    field.value = v;
    const fallback = serverDefault(k);
    if (k !== "api_key") field.placeholder = fallback ? `${fallback} (server UI default)` : "server default";
  }
  $("settings").showModal();
}

async function saveSettings(ev) {
  ev.preventDefault();
  const form = $("settings-form");
  const next = { ...settings };
  for (const k of Object.keys(store.DEFAULT_SETTINGS)) next[k] = form.elements[k].value.trim();
  next.system = form.elements.system.value;
  for (const k of SAMPLING_FIELDS) {
    if (next[k] !== "" && !Number.isFinite(Number(next[k]))) {
      showError(`${k} must be a number`);
      return;
    }
  }
  const keyChanged = next.api_key !== settings.api_key;
  settings = next;
  try {
    store.saveSettings(settings);
  } catch (e) {
    showError(describe(e));
  }
  $("settings").close();
  if (keyChanged && ready) {
    clearError();
    await loadProps();
    refreshSlots();
  }
}

// --- import / export -------------------------------------------------------------------------
function exportAll() {
  const blob = new Blob([store.exportConversations()], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `kvserve-conversations-${new Date().toISOString().slice(0, 10)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
}

async function importFile(ev) {
  const file = ev.target.files?.[0];
  ev.target.value = "";
  if (!file) return;
  try {
    const n = store.importConversations(await file.text());
    renderList();
    showError(`Imported ${n} conversation${n === 1 ? "" : "s"}.`, "info");
  } catch (e) {
    showError(`Import failed: ${describe(e)}`);
  }
}

// --- wiring ----------------------------------------------------------------------------------
function start() {
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    send($("input").value);
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      send($("input").value);
    }
  });
  $("stop").addEventListener("click", () => streaming?.controller.abort());
  $("new-chat").addEventListener("click", newConversation);
  $("export").addEventListener("click", exportAll);
  $("import-file").addEventListener("change", importFile);
  $("open-settings").addEventListener("click", openSettings);
  $("settings-form").addEventListener("submit", saveSettings);
  $("settings-cancel").addEventListener("click", () => $("settings").close());
  $("error-close").addEventListener("click", clearError);
  try {
    const id = store.currentId();
    conv = id ? store.getConversation(id) : null;
    for (const m of conv?.messages ?? []) {
      if (m.streaming) { // the page was closed or reloaded while this reply streamed
        delete m.streaming;
        m.stopped = true;
      }
    }
  } catch (e) {
    showError(describe(e));
  }
  renderAll();
  waitForHealth();
}

start();
