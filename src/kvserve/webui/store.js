// Conversations and settings, kept in the browser's localStorage.
//
// A conversation: {id, title, created, updated, messages: [message]}
// A message: {role: "user"|"assistant", content, reasoning?, stats?, error?, stopped?}
// Export/import format: {"format": "kvserve-conversations", "version": 1, "conversations": [...]}

const CONVERSATIONS = "kvserve.conversations.v1";
const CURRENT = "kvserve.current.v1";
const SETTINGS = "kvserve.settings.v1";
const FORMAT = "kvserve-conversations";

export const DEFAULT_SETTINGS = Object.freeze({
  system: "",
  temperature: "",
  top_k: "",
  top_p: "",
  min_p: "",
  max_tokens: "",
  api_key: "",
});

function readJSON(key, fallback) {
  const raw = localStorage.getItem(key);
  if (raw === null) return fallback;
  try {
    return JSON.parse(raw);
  } catch (e) {
    throw new Error(`stored ${key} is not valid JSON: ${e.message}`);
  }
}

function writeJSON(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (e) {
    throw new Error(`could not save to the browser's storage: ${e.message}`);
  }
}

export function newId() {
  const a = new Uint32Array(2);
  crypto.getRandomValues(a);
  return Date.now().toString(36) + "-" + a[0].toString(36) + a[1].toString(36);
}

function byId() {
  const all = readJSON(CONVERSATIONS, {});
  return all && typeof all === "object" && !Array.isArray(all) ? all : {};
}

// Newest first.
export function listConversations() {
  return Object.values(byId()).sort((a, b) => b.updated - a.updated);
}

export function getConversation(id) {
  return byId()[id] ?? null;
}

export function createConversation() {
  const now = Date.now();
  return { id: newId(), title: "New chat", created: now, updated: now, messages: [] };
}

export function saveConversation(conv) {
  const all = byId();
  conv.updated = Date.now();
  if (conv.title === "New chat") {
    const first = conv.messages.find((m) => m.role === "user" && m.content.trim());
    if (first) conv.title = first.content.trim().replace(/\s+/g, " ").slice(0, 48);
  }
  all[conv.id] = conv;
  writeJSON(CONVERSATIONS, all);
}

export function deleteConversation(id) {
  const all = byId();
  delete all[id];
  writeJSON(CONVERSATIONS, all);
  if (currentId() === id) localStorage.removeItem(CURRENT);
}

export function currentId() {
  return localStorage.getItem(CURRENT);
}

export function setCurrentId(id) {
  if (id) localStorage.setItem(CURRENT, id);
  else localStorage.removeItem(CURRENT);
}

export function exportConversations() {
  return JSON.stringify({ format: FORMAT, version: 1, conversations: listConversations() }, null, 2);
}

function validMessage(m) {
  return m && typeof m === "object" && (m.role === "user" || m.role === "assistant") &&
    typeof m.content === "string";
}

// Adds (or replaces, by id) the conversations in an export; returns how many were imported.
export function importConversations(text) {
  let data;
  try {
    data = JSON.parse(text);
  } catch (e) {
    throw new Error(`not a JSON file: ${e.message}`);
  }
  if (!data || data.format !== FORMAT || !Array.isArray(data.conversations)) {
    throw new Error(`not a conversation export (expected "format": "${FORMAT}")`);
  }
  const all = byId();
  let n = 0;
  for (const c of data.conversations) {
    if (!c || typeof c.id !== "string" || !Array.isArray(c.messages) || !c.messages.every(validMessage)) {
      throw new Error(`conversation #${n + 1} is malformed`);
    }
    all[c.id] = {
      id: c.id,
      title: typeof c.title === "string" ? c.title : "Imported chat",
      created: Number(c.created) || Date.now(),
      updated: Number(c.updated) || Date.now(),
      messages: c.messages,
    };
    n++;
  }
  writeJSON(CONVERSATIONS, all);
  return n;
}

export function loadSettings() {
  const s = readJSON(SETTINGS, {});
  const out = { ...DEFAULT_SETTINGS };
  for (const k of Object.keys(DEFAULT_SETTINGS)) if (typeof s?.[k] === "string") out[k] = s[k];
  return out;
}

export function saveSettings(s) {
  writeJSON(SETTINGS, s);
}
