// The server's HTTP API, from the page's own origin and path (so --api-prefix just works).

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// "/llm/" or "/llm/index.html" -> "/llm"; "/" -> "".
export function apiBase(pathname) {
  return pathname.replace(/\/index\.html$/, "").replace(/\/+$/, "");
}

async function errorOf(res) {
  let message = `${res.status} ${res.statusText}`.trim();
  try {
    const body = await res.json();
    if (body?.error?.message) message = body.error.message;
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(res.status, message);
}

export class Api {
  constructor(base, apiKey) {
    this.base = base;
    this.apiKey = apiKey; // () => string
  }

  headers(extra = {}) {
    const h = { ...extra };
    const key = this.apiKey();
    if (key) h.Authorization = `Bearer ${key}`;
    return h;
  }

  // {status, body} without throwing on HTTP errors (the caller decides), throws on network errors.
  async probe(path) {
    const res = await fetch(this.base + path, { headers: this.headers(), cache: "no-store" });
    let body = null;
    try {
      body = await res.json();
    } catch {
      body = null;
    }
    return { status: res.status, body };
  }

  async getJSON(path) {
    const res = await fetch(this.base + path, { headers: this.headers(), cache: "no-store" });
    if (!res.ok) throw await errorOf(res);
    return res.json();
  }

  // Yields each parsed SSE chunk of a streamed chat completion. Aborting `signal` cancels the
  // request, which closes the connection: the server cancels the generation and frees the slot.
  async *chat(body, signal) {
    const res = await fetch(this.base + "/v1/chat/completions", {
      method: "POST",
      headers: this.headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ ...body, stream: true }),
      signal,
    });
    if (!res.ok) throw await errorOf(res);
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          for (const line of event.split("\n")) {
            if (!line.startsWith("data:")) continue; // comments (keep-alive pings), other fields
            const data = line.slice(5).trim();
            if (data === "[DONE]") return;
            const chunk = JSON.parse(data);
            if (chunk.error) throw new ApiError(chunk.error.code ?? 500, chunk.error.message ?? "stream error");
            yield chunk;
          }
        }
      }
    } finally {
      reader.releaseLock();
    }
    throw new ApiError(0, "the stream ended without [DONE]");
  }
}
