// DOM rendering: conversation list, messages, per-message statistics, the slots panel.
// Model text only ever reaches the page through renderMarkdown (escaped) or textContent.

import { renderMarkdown, splitThink } from "./markdown.js";

function el(tag, props = {}, children = []) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "dataset") Object.assign(e.dataset, v);
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c) e.append(c);
  return e;
}

export function renderConversations(ul, convs, currentId, on) {
  ul.replaceChildren(...convs.map((c) => el("li", {
    class: c.id === currentId ? "active" : "", dataset: { id: c.id },
  }, [
    el("button", { type: "button", class: "open", title: c.title, text: c.title, onclick: () => on.open(c.id) }),
    el("button", {
      type: "button", class: "delete", title: "Delete", "aria-label": `Delete ${c.title}`, text: "×",
      onclick: () => on.remove(c.id),
    }),
  ])));
}

// "8 tokens · 4.2 tok/s · prompt 31 tokens, 28 cached (90%)"
export function statsText(s) {
  const parts = [`${s.predicted_n} token${s.predicted_n === 1 ? "" : "s"}`];
  if (s.predicted_per_second > 0) parts.push(`${s.predicted_per_second.toFixed(1)} tok/s`);
  const total = s.prompt_n + s.cache_n;
  if (total > 0) {
    const pct = Math.round((100 * s.cache_n) / total);
    parts.push(`prompt ${total} tokens, ${s.cache_n} cached (${pct}%)`);
  }
  if (s.prompt_ms > 0) parts.push(`prompt ${(s.prompt_ms / 1000).toFixed(2)} s`);
  return parts.join(" · ");
}

function bubbleContent(m, streaming) {
  const frag = document.createDocumentFragment();
  let { reasoning, content } = { reasoning: m.reasoning || "", content: m.content };
  if (m.role === "assistant" && !reasoning) ({ reasoning, content } = splitThink(content));
  if (reasoning) {
    const details = el("details", { class: "reasoning" }, [el("summary", {
      text: streaming && !content ? "Reasoning…" : "Reasoning",
    })]);
    const body = el("div", { class: "reasoning-body" });
    body.innerHTML = renderMarkdown(reasoning);
    details.append(body);
    if (streaming && !content) details.open = true;
    frag.append(details);
  }
  const body = el("div", { class: "content" + (streaming ? " cursor" : "") });
  if (m.role === "user") {
    body.style.whiteSpace = "pre-wrap";
    body.textContent = content;
  } else {
    body.innerHTML = renderMarkdown(content);
    for (const pre of body.querySelectorAll("pre")) {
      pre.append(el("button", {
        type: "button", class: "copy", text: "copy",
        onclick: (ev) => {
          const code = pre.querySelector("code").textContent;
          navigator.clipboard.writeText(code).then(
            () => { ev.target.textContent = "copied"; },
            (e) => { ev.target.textContent = "copy failed"; ev.target.title = String(e); },
          );
        },
      }));
    }
  }
  frag.append(body);
  return frag;
}

function stateOf(m, streaming) {
  if (streaming) return "streaming";
  if (m.error) return "error";
  if (m.stopped) return "stopped";
  return "done";
}

// Fills (or refills) the element of message `i`.
export function fillMessage(node, m, i, streaming, on) {
  node.className = `message ${m.role}`;
  node.dataset.index = String(i);
  node.dataset.state = stateOf(m, streaming);
  const parts = [el("div", { class: "who", text: m.role === "user" ? "You" : "Assistant" })];
  if (streaming || m.content || m.reasoning) parts.push(el("div", { class: "bubble" }, [bubbleContent(m, streaming)]));
  if (m.role === "assistant") {
    if (m.error) parts.push(el("div", { class: "error-text", text: `Error: ${m.error}` }));
    if (m.stats) {
      const s = m.stats;
      const text = statsText(s) + (m.stopped ? " · stopped" : "");
      parts.push(el("div", {
        class: "stats", text,
        dataset: { predictedN: s.predicted_n, promptN: s.prompt_n, cacheN: s.cache_n },
      }));
    } else if (m.stopped) {
      parts.push(el("div", { class: "stats", text: "stopped" }));
    }
  }
  if (!streaming && !on.busy()) {
    const tools = el("div", { class: "tools" });
    if (m.role === "user") tools.append(el("button", { type: "button", class: "edit", text: "Edit", onclick: () => on.edit(i) }));
    else tools.append(el("button", { type: "button", class: "regenerate", text: "Regenerate", onclick: () => on.regenerate(i) }));
    parts.push(tools);
  }
  node.replaceChildren(...parts);
}

export function renderMessages(container, conv, streamingIndex, on) {
  const nodes = (conv?.messages ?? []).map((m, i) => {
    const node = el("div");
    fillMessage(node, m, i, i === streamingIndex, on);
    return node;
  });
  if (!nodes.length) nodes.push(el("div", { class: "muted empty", text: "Send a message to start." }));
  container.replaceChildren(...nodes);
}

// An inline editor in place of a user message: save(text) or cancel().
export function editMessage(node, text, save, cancel) {
  const area = el("textarea", { rows: "4", class: "edit-text" });
  area.value = text;
  node.querySelector(".bubble").replaceChildren(area);
  node.querySelector(".tools")?.replaceChildren(
    el("button", { type: "button", class: "primary save-edit", text: "Save & send", onclick: () => save(area.value) }),
    el("button", { type: "button", class: "cancel-edit", text: "Cancel", onclick: cancel }),
  );
  area.focus();
}

export function renderSlots(ul, summary, slots) {
  if (!Array.isArray(slots)) {
    ul.replaceChildren(el("li", { class: "muted", text: String(slots) }));
    summary.textContent = "";
    return;
  }
  const busy = slots.filter((s) => s.is_processing).length;
  summary.textContent = `${busy}/${slots.length} busy`;
  ul.replaceChildren(...slots.map((s) => {
    const last = s.n_prompt_tokens !== undefined
      ? ` · last prompt ${s.n_prompt_tokens}, ${s.n_prompt_tokens_cache ?? 0} cached` : "";
    return el("li", { dataset: { slot: s.id, busy: String(Boolean(s.is_processing)) } }, [
      el("span", { class: "info", text: `#${s.id} · ctx ${s.n_ctx}${last}` }),
      el("span", { class: "state", text: s.is_processing ? "busy" : "idle" }),
    ]);
  }));
}
