// A small, safe Markdown renderer for model output.
//
// Safety rule: every piece of source text is HTML-escaped before any markup is added, and the
// only markup added is a fixed set of tags without attributes, except <a href> (http, https and
// mailto only, already escaped) and the code block's data-lang (escaped). Nothing the model
// writes can become a tag, an attribute or a script.
//
// Supported: fenced code blocks (an unclosed fence runs to the end, as while streaming),
// inline code, headings, paragraphs with line breaks, bullet and numbered lists, block quotes,
// horizontal rules, **bold**, *italic* / _italic_, ~~strike~~ and [links](https://…).

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;

// Inline markup on one line of escaped text. Code spans are cut out first so that nothing
// inside them is formatted.
function inline(escaped) {
  const parts = escaped.split(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/);
  let out = "";
  for (let i = 0; i < parts.length; i += 3) {
    out += emphasis(parts[i]);
    if (i + 2 < parts.length) out += "<code>" + parts[i + 2] + "</code>";
  }
  return out;
}

function emphasis(s) {
  return s
    .replace(/\[([^\]]+)\]\(((?:https?:\/\/|mailto:)[^\s()]+)\)/g,
      '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>')
    .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/__(?=\S)([\s\S]*?\S)__/g, "<strong>$1</strong>")
    .replace(/(^|[^*\w])\*(?=[^\s*])([^*]*?[^\s*])\*(?![*\w])/g, "$1<em>$2</em>")
    .replace(/(^|[^_\w])_(?=[^\s_])([^_]*?[^\s_])_(?![_\w])/g, "$1<em>$2</em>")
    .replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
}

function codeBlock(lang, lines) {
  const attr = lang ? ` data-lang="${escapeHtml(lang)}"` : "";
  return `<pre${attr}><code>${escapeHtml(lines.join("\n"))}</code></pre>`;
}

const BLOCK_RULES = [
  // [kind, pattern on the raw line]
  ["hr", /^\s{0,3}([-*_])(\s*\1){2,}\s*$/],
  ["heading", /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/],
  ["quote", /^\s{0,3}>\s?(.*)$/],
  ["ul", /^\s{0,3}[-*+]\s+(.*)$/],
  ["ol", /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/],
];

function classify(line) {
  if (!line.trim()) return ["blank", null];
  for (const [kind, re] of BLOCK_RULES) {
    const m = line.match(re);
    if (m) return [kind, m];
  }
  return ["text", null];
}

export function renderMarkdown(source) {
  const lines = String(source ?? "").replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let para = [];
  let list = null; // {tag, items}
  let quote = [];

  const flushPara = () => {
    if (para.length) out.push("<p>" + para.map((l) => inline(escapeHtml(l))).join("<br>") + "</p>");
    para = [];
  };
  const flushList = () => {
    if (list) {
      const items = list.items.map((t) => "<li>" + inline(escapeHtml(t)) + "</li>").join("");
      const start = list.tag === "ol" && list.start !== 1 ? ` start="${list.start}"` : "";
      out.push(`<${list.tag}${start}>${items}</${list.tag}>`);
    }
    list = null;
  };
  const flushQuote = () => {
    if (quote.length) out.push("<blockquote>" + renderMarkdown(quote.join("\n")) + "</blockquote>");
    quote = [];
  };
  const flushAll = () => { flushPara(); flushList(); flushQuote(); };

  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      flushAll();
      const body = [];
      let j = i + 1;
      while (j < lines.length && !new RegExp("^\\s{0,3}" + fence[1][0] + "{" + fence[1].length + ",}\\s*$").test(lines[j])) {
        body.push(lines[j]);
        j++;
      }
      out.push(codeBlock(fence[2], body));
      i = j; // the closing fence (or the end)
      continue;
    }
    const [kind, m] = classify(line);
    if (kind !== "quote") flushQuote();
    if (kind !== "ul" && kind !== "ol" && !(kind === "text" && list && /^\s+\S/.test(line))) flushList();
    switch (kind) {
      case "blank":
        flushPara();
        break;
      case "hr":
        flushPara();
        out.push("<hr>");
        break;
      case "heading": {
        flushPara();
        const n = m[1].length;
        out.push(`<h${n}>${inline(escapeHtml(m[2]))}</h${n}>`);
        break;
      }
      case "quote":
        flushPara();
        quote.push(m[1]);
        break;
      case "ul":
      case "ol": {
        flushPara();
        if (list && list.tag !== kind) flushList();
        if (!list) list = { tag: kind, items: [], start: kind === "ol" ? Number(m[1]) : 1 };
        list.items.push(kind === "ol" ? m[2] : m[1]);
        break;
      }
      default:
        if (list) list.items[list.items.length - 1] += " " + line.trim(); // a continuation line
        else para.push(line);
    }
  }
  flushAll();
  return out.join("\n");
}

// Split "<think>…</think>" reasoning that a server left in the content (reasoning_format none).
// Returns {reasoning, content}; an unclosed <think> (still streaming) is all reasoning.
export function splitThink(text) {
  const s = String(text ?? "");
  const open = s.indexOf("<think>");
  if (open < 0 || s.slice(0, open).trim()) return { reasoning: "", content: s };
  const close = s.indexOf("</think>", open);
  if (close < 0) return { reasoning: s.slice(open + 7), content: "" };
  return { reasoning: s.slice(open + 7, close), content: s.slice(close + 8).replace(/^\s+/, "") };
}
