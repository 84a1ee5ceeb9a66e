// The portal's playground: a conversation with one of the user's models, streamed from
// /v1/chat/completions with fetch() and read as server-sent events.
//
// The key is one the portal makes for the playground (a POST with the CSRF token); its
// plaintext lives in this tab's sessionStorage only, and is sent to the API alone,
// without the site's cookies. Answers are written as text, never as HTML.
"use strict";

(() => {
  const form = document.getElementById("playground");
  if (!form) return;
  const field = (id) => document.getElementById(`playground-${id}`);
  const [model, maxTokens, temperature, transcript, prompt, send, stop, clear] = [
    "model", "max-tokens", "temperature", "transcript", "prompt", "send", "stop", "clear",
  ].map(field);
  const csrfToken = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  const STORED_KEY = "chatparity-playground-key";
  const KEY_MARGIN_MS = 60_000; // a key this close to its expiry is replaced first
  const LOG_POLLS = 40; // the request's row is written just after the answer
  const LOG_POLL_MS = 250;
  const numbers = new Intl.NumberFormat();
  const dollars = new Intl.NumberFormat(undefined, {
    style: "currency",
    currency: "USD",
    minimumFractionDigits: 2,
    maximumFractionDigits: 6,
  });
  let history = [];
  let controller = null;

  async function json(response) {
    try {
      return await response.json();
    } catch {
      return null;
    }
  }

  function storedKey() {
    try {
      const stored = JSON.parse(sessionStorage.getItem(STORED_KEY));
      if (stored && Date.parse(stored.expires_at) - Date.now() > KEY_MARGIN_MS) return stored.key;
    } catch {
      // nothing usable stored
    }
    return null;
  }

  async function newKey() {
    sessionStorage.removeItem(STORED_KEY);
    const response = await fetch(form.dataset.keyUrl, {
      method: "POST",
      headers: { "X-CSRFToken": csrfToken },
      credentials: "same-origin",
      cache: "no-store",
    });
    const body = await json(response);
    if (response.status !== 201 || !body) {
      const reason = body && body.error ? body.error : `HTTP ${response.status}; sign in again?`;
      throw new Error(`No playground key: ${reason}`);
    }
    sessionStorage.setItem(STORED_KEY, JSON.stringify(body));
    return body.key;
  }

  function complete(key, body, signal) {
    return fetch(form.dataset.chatUrl, {
      method: "POST",
      credentials: "omit", // the key alone says who asks
      cache: "no-store",
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal,
    });
  }

  // The data of each server-sent event: events end at a blank line; the "data:" lines of
  // one event are its data, joined by newlines.
  async function* events(response) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer = (buffer + value).replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) !== -1) {
        const lines = buffer.slice(0, end).split("\n");
        buffer = buffer.slice(end + 2);
        const data = lines
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""));
        if (data.length) yield data.join("\n");
      }
    }
  }

  function addTurn(role, label, text) {
    const turn = document.createElement("div");
    turn.className = `turn ${role}`;
    const name = document.createElement("div");
    name.className = "role";
    name.textContent = label;
    const content = document.createElement("div");
    content.className = "text";
    content.textContent = text;
    const stats = document.createElement("div");
    stats.className = "stats";
    turn.append(name, content, stats);
    transcript.append(turn);
    turn.scrollIntoView({ block: "end" });
    return { turn, content, stats };
  }

  function busy(on) {
    send.disabled = on;
    clear.disabled = on;
    stop.disabled = !on;
  }

  function showTokens(turn, usage, finish) {
    if (!usage) return;
    Object.assign(turn.stats.dataset, {
      promptTokens: usage.prompt_tokens,
      completionTokens: usage.completion_tokens,
      totalTokens: usage.total_tokens,
    });
    turn.stats.textContent =
      `${numbers.format(usage.prompt_tokens)} prompt + ` +
      `${numbers.format(usage.completion_tokens)} completion = ` +
      `${numbers.format(usage.total_tokens)} tokens` +
      (finish && finish !== "stop" ? ` · finished: ${finish}` : "");
  }

  // The cost, as the log has it: the row of this completion once written.
  async function showCost(turn, completionId) {
    const url = `${form.dataset.requestUrl}?id=${encodeURIComponent(completionId)}`;
    for (let poll = 0; poll < LOG_POLLS; poll++) {
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (response.ok) {
        const row = await json(response);
        turn.stats.dataset.cost = row.cost;
        turn.stats.append(
          ` · ${dollars.format(Number(row.cost))} · ` +
            `${numbers.format(Math.round(row.duration_ms))} ms`,
        );
        return;
      }
      if (response.status !== 404) break;
      await new Promise((resolve) => setTimeout(resolve, LOG_POLL_MS));
    }
    turn.stats.append(" · cost: see your requests");
  }

  async function ask(text) {
    const request = {
      model: model.value,
      messages: [...history, { role: "user", content: text }],
      stream: true,
      stream_options: { include_usage: true },
    };
    if (maxTokens.value) request.max_tokens = Number(maxTokens.value);
    if (temperature.value !== "") request.temperature = Number(temperature.value);
    addTurn("user", "You", text);
    const turn = addTurn("assistant", model.value, "");
    turn.turn.classList.add("streaming");
    controller = new AbortController();
    busy(true);
    let answer = "";
    try {
      let response = await complete(storedKey() || (await newKey()), request, controller.signal);
      if (response.status === 401) {
        // The tab's key expired or was revoked (signed out elsewhere): a new one, once.
        response = await complete(await newKey(), request, controller.signal);
      }
      if (!response.ok) {
        const body = await json(response);
        throw new Error(body && body.error ? body.error.message : `HTTP ${response.status}`);
      }
      let usage = null;
      let finish = null;
      let completionId = null;
      for await (const data of events(response)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        completionId = completionId || chunk.id;
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          if (choice.delta && choice.delta.content) {
            answer += choice.delta.content;
            turn.content.textContent = answer;
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      }
      history = [...request.messages, { role: "assistant", content: answer }];
      showTokens(turn, usage, finish);
      turn.turn.classList.remove("streaming");
      busy(false);
      if (completionId) await showCost(turn, completionId);
    } catch (error) {
      const stopped = error.name === "AbortError";
      turn.turn.classList.remove("streaming");
      turn.turn.classList.add(stopped ? "stopped" : "failed");
      if (stopped) {
        history = [...request.messages, { role: "assistant", content: answer }];
        turn.stats.textContent = "Stopped.";
      } else {
        turn.stats.textContent = error.message;
      }
      busy(false);
    } finally {
      controller = null;
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = prompt.value.trim();
    if (!text || controller) return;
    prompt.value = "";
    ask(text);
  });
  prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  stop.addEventListener("click", () => controller && controller.abort());
  clear.addEventListener("click", () => {
    history = [];
    transcript.replaceChildren();
    prompt.focus();
  });
})();
