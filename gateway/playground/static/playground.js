// Logprob playground: streams POST v1/responses from this gateway and shows every token with its
// exact bytes, probability and ranked alternatives. Plain browser JavaScript, no dependencies.
// The terminal twin is gateway/inspect_view.py: same buckets, same way of showing split characters.
"use strict";

(() => {
  // Lower bounds of the shading buckets; bucket i is CSS class p<i> (p0 = most confident).
  const BUCKETS = [0.9, 0.6, 0.3, 0.1, 0];
  const LEAST_CONFIDENT = 5;
  const SENTINEL_LOGPROB = -9999;
  const LOGPROBS_INCLUDE = "message.output_text.logprobs";

  const $ = (id) => document.getElementById(id);
  const ui = {
    form: $("request-form"), model: $("model"), input: $("input"), instructions: $("instructions"),
    topLogprobs: $("top-logprobs"), temperature: $("temperature"), maxTokens: $("max-output-tokens"),
    apiKey: $("api-key"), extra: $("extra"), send: $("send"), stop: $("stop"), status: $("status"),
    tokens: $("tokens"), tooltip: $("tooltip"), least: $("least"),
    count: $("sum-count"), total: $("sum-total"), perplexity: $("sum-perplexity"), mean: $("sum-mean"),
    splits: $("sum-splits"), finish: $("sum-finish"),
  };

  const state = {
    tokens: [],    // {index, bytes, logprob, top: [{bytes, logprob}], el, split}
    pending: [],   // tokens that end inside a character, waiting for the rest of it
    splits: [],    // {char, bytes, tokens: [index]}
    controller: null,
    finish: null,  // {status, reason, error, usage}
    tooltipFor: null,
    dismissed: null,  // the token whose tooltip Escape closed (hover does not reopen it at once)
    summaryQueued: false,
  };

  // ---- numbers ------------------------------------------------------------------------------

  function probability(logprob) {
    if (logprob === null || logprob === undefined || logprob <= SENTINEL_LOGPROB) return 0;
    return Math.exp(Math.min(logprob, 0));
  }

  function bucket(p) {
    const index = BUCKETS.findIndex((lower) => p >= lower);
    return index < 0 ? BUCKETS.length - 1 : index;
  }

  function formatProbability(p) {
    if (p >= 0.001) return `${(p * 100).toFixed(1)}%`;
    if (p <= 0) return "0%";
    return `${Number((p * 100).toPrecision(2))}%`;
  }

  function formatNumber(x, digits) {
    if (x === null || x === undefined) return "—";
    if (!Number.isFinite(x)) return x > 0 ? "∞" : "−∞";
    return x.toFixed(digits).replace("-", "−");
  }

  // ---- bytes and characters ------------------------------------------------------------------

  const strictDecoder = new TextDecoder("utf-8", { fatal: true });
  const encoder = new TextEncoder();

  function sequenceLength(lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xc2 && lead <= 0xdf) return 2;
    if (lead >= 0xe0 && lead <= 0xef) return 3;
    if (lead >= 0xf0 && lead <= 0xf4) return 4;
    return 0;
  }

  const isContinuation = (b) => b >= 0x80 && b <= 0xbf;

  function decodeStrict(bytes) {
    try {
      return strictDecoder.decode(bytes);
    } catch {
      return null;
    }
  }

  // [{begin, end, char}] over bytes; a run that forms no character gets char null.
  function characterSpans(bytes) {
    const spans = [];
    let i = 0;
    while (i < bytes.length) {
      const length = sequenceLength(bytes[i]);
      if (length) {
        const char = i + length <= bytes.length ? decodeStrict(bytes.subarray(i, i + length)) : null;
        if (char !== null) {
          spans.push({ begin: i, end: i + length, char });
          i += length;
          continue;
        }
      }
      let end = i + 1;  // a cut or broken sequence: its lead byte and the continuation bytes after it
      while (length && end < Math.min(bytes.length, i + length) && isContinuation(bytes[end])) end += 1;
      spans.push({ begin: i, end, char: null });
      i = end;
    }
    return spans;
  }

  function endsInsideCharacter(bytes) {
    for (let back = 1; back <= Math.min(4, bytes.length); back += 1) {
      const byte = bytes[bytes.length - back];
      if (!isContinuation(byte)) return sequenceLength(byte) > back;
    }
    return false;
  }

  function concat(chunks) {
    const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
    let at = 0;
    for (const chunk of chunks) {
      out.set(chunk, at);
      at += chunk.length;
    }
    return out;
  }

  // Each token's bytes as pieces: {text} for whole characters, {bytes, char, closes} for fragments
  // of a character shared with neighbours (char null: bytes that never form one; closes: its last
  // bytes, after which the views name the character). Tokens that share a character get the same
  // group (the index of the group's first token).
  function layOut(tokens) {
    const offsets = [0];
    for (const token of tokens) offsets.push(offsets[offsets.length - 1] + token.bytes.length);
    const data = concat(tokens.map((t) => t.bytes));
    const pieces = tokens.map(() => []);
    const links = tokens.map(() => false);
    const splits = [];
    let first = 0;
    for (const { begin, end, char } of characterSpans(data)) {
      while (offsets[first + 1] <= begin) first += 1;
      let last = first;
      while (offsets[last + 1] < end) last += 1;
      if (char !== null && first === last) {
        const previous = pieces[first][pieces[first].length - 1];
        if (previous && previous.text !== undefined) previous.text += char;
        else pieces[first].push({ text: char });
        continue;
      }
      for (let t = first; t <= last; t += 1) {
        const chunk = data.slice(Math.max(begin, offsets[t]), Math.min(end, offsets[t + 1]));
        if (chunk.length) pieces[t].push({ bytes: chunk, char, closes: t === last });
        if (t < last) links[t] = true;
      }
      splits.push({ char, bytes: data.slice(begin, end), tokens: tokens.slice(first, last + 1) });
    }
    let group = null;
    const layouts = tokens.map((token, t) => {
      if (!(t > 0 && links[t - 1])) group = links[t] ? t : null;
      return { token, pieces: pieces[t], group };
    });
    return { layouts, splits };
  }

  const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");

  function escapeChar(char) {
    const code = char.codePointAt(0);
    return code < 0x100 ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u${code.toString(16).padStart(4, "0")}`;
  }

  // Invisible or terminal-driving characters: escaped in quoted tokens. The flowing text escapes
  // only controls and bidi overrides, so that emoji sequences joined by U+200D still draw as one.
  const CONTROL = /[\u0000-\u001f\u007f-\u009f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/u;
  const FLOW_CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/u;

  // A token as a quoted literal: every byte visible, undecodable ones as \xNN.
  function quoted(bytes) {
    let out = "";
    for (const { begin, end, char } of characterSpans(bytes)) {
      if (char === null) {
        for (const b of bytes.subarray(begin, end)) out += `\\x${b.toString(16).padStart(2, "0")}`;
      } else if (char === "\\" || char === "'") out += `\\${char}`;
      else if (char === "\n") out += "\\n";
      else if (char === "\t") out += "\\t";
      else if (CONTROL.test(char)) out += escapeChar(char);
      else out += char;
    }
    return `'${out}'`;
  }

  // Bytes from a Responses logprob entry: `bytes` wins; else read the token's \xNN escapes back.
  function entryBytes(entry) {
    if (Array.isArray(entry.bytes)) return Uint8Array.from(entry.bytes);
    const token = String(entry.token ?? "");
    const chunks = [];
    let last = 0;
    for (const match of token.matchAll(/\\x([0-9a-fA-F]{2})/g)) {
      chunks.push(encoder.encode(token.slice(last, match.index)), Uint8Array.of(parseInt(match[1], 16)));
      last = match.index + match[0].length;
    }
    chunks.push(encoder.encode(token.slice(last)));
    return concat(chunks);
  }

  // ---- server-sent events --------------------------------------------------------------------

  // Yields {event, data} per SSE frame of a fetch body (multi-line data joined with "\n").
  async function* sseEvents(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    const frames = function* (final) {
      buffer = buffer.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0 || (final && buffer.trim())) {
        const block = cut >= 0 ? buffer.slice(0, cut) : buffer;
        buffer = cut >= 0 ? buffer.slice(cut + 2) : "";
        let event = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") event = value;
          else if (field === "data") data.push(value);
        }
        if (data.length) yield { event, data: data.join("\n") };
      }
    };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      if (buffer.endsWith("\r")) continue;  // wait: it may be the first half of "\r\n"
      yield* frames(false);
    }
    yield* frames(true);
  }

  // ---- drawing tokens ------------------------------------------------------------------------

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function appendText(parent, text) {
    let plain = "";
    const flush = () => {
      if (plain) parent.append(plain);
      plain = "";
    };
    for (const char of text) {
      if (char === "\n") {
        flush();
        parent.append(el("span", "mark", "↵"), "\n");
      } else if (FLOW_CONTROL.test(char)) {
        flush();
        parent.append(el("span", "mark", escapeChar(char)));
      } else plain += char;
    }
    flush();
  }

  function tokenElement(token, pieces) {
    const p = probability(token.logprob);
    const node = el("span", `tok p${bucket(p)}`);
    node.tabIndex = token.index === 0 ? 0 : -1;  // one tab stop; arrow keys move between tokens
    node.dataset.index = String(token.index);
    node.setAttribute("aria-describedby", "tooltip");
    for (const piece of pieces) {
      if (piece.text !== undefined) {
        appendText(node, piece.text);
        continue;
      }
      for (const b of piece.bytes) node.append(el("span", "byte", b.toString(16).padStart(2, "0")));
      if (piece.closes) {
        // The character these bytes (and the ones before, in earlier tokens) spell: not token text.
        const label = el("span", piece.char === null ? "joined incomplete" : "joined", piece.char ?? "incomplete");
        label.setAttribute("aria-hidden", "true");
        node.append(label);
        if (piece.char === null) node.classList.add("cut");
      }
    }
    if (!pieces.length) node.append(el("span", "mark", "∅"));
    return node;
  }

  function splitLabel(split) {
    return split.char === null ? "incomplete" : split.char;
  }

  function describeSplit(split) {
    return split.char === null
      ? `bytes ${hex(split.bytes)} that form no complete character, over ${split.tokens.length} tokens`
      : `“${split.char}” split across ${split.tokens.length} tokens`;
  }

  // Lays out a run of tokens that ends on a character boundary (or the stream's end) and draws it.
  // Tokens sharing split characters sit in one group, underlined, named for screen readers.
  function drawRun(run) {
    const { layouts, splits } = layOut(run);
    const groups = new Map();  // first token index -> {node, splits}
    for (const { token, pieces, group } of layouts) {
      token.el = tokenElement(token, pieces);
      if (group === null) {
        ui.tokens.append(token.el);
        continue;
      }
      if (!groups.has(group)) {
        const node = el("span", "split");
        node.setAttribute("role", "group");
        ui.tokens.append(node);
        groups.set(group, { node, splits: [] });
      }
      groups.get(group).node.append(token.el);
      token.group = groups.get(group);
    }
    for (const split of splits) {
      for (const token of split.tokens) token.split = split;
      state.splits.push(split);
      const group = split.tokens[0].group;
      if (group) group.splits.push(split);
    }
    for (const { node, splits: shared } of groups.values()) {
      node.setAttribute("aria-label", shared.map(describeSplit).join("; "));
      if (shared.some((s) => s.char === null)) node.classList.add("incomplete");
    }
  }

  function addTokens(entries) {
    for (const entry of entries) {
      const token = {
        index: state.tokens.length,
        bytes: entryBytes(entry),
        logprob: Number(entry.logprob),
        top: (entry.top_logprobs || []).map((c) => ({ bytes: entryBytes(c), logprob: Number(c.logprob) })),
        el: null,
        split: null,
        group: null,
      };
      state.tokens.push(token);
      state.pending.push(token);
    }
    if (state.pending.length && !endsInsideCharacter(concat(state.pending.map((t) => t.bytes)))) flushPending();
    queueSummary();
  }

  function flushPending() {
    if (!state.pending.length) return;
    $("tokens-empty")?.remove();
    ui.tokens.removeAttribute("aria-describedby");
    const run = state.pending;
    state.pending = [];
    drawRun(run);
  }

  // ---- tooltip -------------------------------------------------------------------------------

  const narrow = window.matchMedia("(max-width: 600px)");

  function tokenFrom(node) {
    const host = node instanceof Element ? node.closest(".tok") : null;
    return host ? state.tokens[Number(host.dataset.index)] : null;
  }

  function sameBytes(a, b) {
    return a.length === b.length && a.every((x, i) => x === b[i]);
  }

  function showTooltip(token) {
    const tip = ui.tooltip;
    tip.replaceChildren();
    const p = probability(token.logprob);
    const head = el("div", "tt-head");
    head.append(el("code", "tt-token", quoted(token.bytes)), el("span", `tt-p p${bucket(p)}`, formatProbability(p)));
    tip.append(head);
    if (token.split) {
      const split = token.split;
      const position = split.tokens.indexOf(token) + 1;
      const text = split.char === null
        ? `Part ${position} of ${split.tokens.length} of bytes ${hex(split.bytes)} that form no complete character`
        : `Part ${position} of ${split.tokens.length} of “${split.char}” (${hex(split.bytes)})`;
      tip.append(el("p", "tt-split", text));
    }
    const facts = el("dl", "tt-facts");
    const rank = token.top.findIndex((c) => sameBytes(c.bytes, token.bytes));
    for (const [term, value] of [
      ["bytes", `${hex(token.bytes) || "none"}  [${Array.from(token.bytes).join(", ")}]`],
      ["logprob", formatNumber(token.logprob, 4)],
      ["rank", token.top.length ? (rank >= 0 ? `${rank + 1} of ${token.top.length}` : `not in top ${token.top.length}`)
        : "no alternatives requested"],
    ]) facts.append(el("dt", "", term), el("dd", "", value));
    tip.append(facts);
    if (token.top.length) {
      tip.append(el("p", "tt-alts-title", "Alternatives"));
      const list = el("ol", "tt-alts");
      for (const [rank, candidate] of token.top.entries()) {
        const q = probability(candidate.logprob);
        const item = el("li", sameBytes(candidate.bytes, token.bytes) ? "chosen" : "");
        const bar = el("span", "bar");
        const fill = el("span", `fill p${bucket(q)}`);
        fill.style.width = `${Math.max(q * 100, 1)}%`;
        bar.append(fill);
        item.append(el("span", "alt-rank", `${rank + 1}.`), el("code", "alt-token", quoted(candidate.bytes)), bar,
          el("span", "alt-p", formatProbability(q)));
        if (sameBytes(candidate.bytes, token.bytes)) item.append(el("span", "visually-hidden", " (sampled)"));
        list.append(item);
      }
      tip.append(list);
    }
    tip.hidden = false;
    state.tooltipFor = token;
    for (const node of ui.tokens.querySelectorAll(".tok.active")) node.classList.remove("active");
    token.el?.classList.add("active");
    placeTooltip(token);
  }

  function placeTooltip(token) {
    const tip = ui.tooltip;
    if (narrow.matches || !token.el) {
      tip.style.left = "";
      tip.style.top = "";
      // A sheet at the bottom: keep the token itself in view above it.
      const rect = token.el?.getBoundingClientRect();
      const hidden = rect ? rect.bottom + 8 - (window.innerHeight - tip.offsetHeight) : 0;
      if (hidden > 0) window.scrollBy({ top: hidden });
      return;
    }
    const rect = token.el.getBoundingClientRect();
    const margin = 8;
    const width = tip.offsetWidth;
    const height = tip.offsetHeight;
    const left = Math.min(Math.max(margin, rect.left), window.innerWidth - width - margin);
    let top = rect.bottom + 6;
    if (top + height > window.innerHeight - margin && rect.top - height - 6 > margin) top = rect.top - height - 6;
    tip.style.left = `${Math.max(margin, left)}px`;
    tip.style.top = `${Math.max(margin, top)}px`;
  }

  function hideTooltip() {
    ui.tooltip.hidden = true;
    state.tooltipFor?.el?.classList.remove("active");
    state.tooltipFor = null;
  }

  function focusToken(token) {
    if (!token?.el) return;
    for (const node of ui.tokens.querySelectorAll('.tok[tabindex="0"]')) node.tabIndex = -1;
    token.el.tabIndex = 0;
    token.el.focus();
    token.el.scrollIntoView({ block: "nearest", inline: "nearest" });
  }

  ui.tokens.addEventListener("focusin", (event) => {
    const token = tokenFrom(event.target);
    if (!token) return;
    for (const node of ui.tokens.querySelectorAll('.tok[tabindex="0"]')) if (node !== token.el) node.tabIndex = -1;
    token.el.tabIndex = 0;
    state.dismissed = null;
    showTooltip(token);
  });
  ui.tokens.addEventListener("focusout", (event) => {
    if (!tokenFrom(event.relatedTarget)) hideTooltip();
  });
  ui.tokens.addEventListener("mouseover", (event) => {
    const token = tokenFrom(event.target);
    if (token && token !== state.tooltipFor && token !== state.dismissed) showTooltip(token);
  });
  ui.tokens.addEventListener("mouseleave", () => {
    state.dismissed = null;
    const focused = tokenFrom(document.activeElement);
    if (focused) showTooltip(focused);
    else hideTooltip();
  });
  ui.tokens.addEventListener("keydown", (event) => {
    const token = tokenFrom(event.target);
    if (!token) return;
    const moves = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
    let next = null;
    if (event.key in moves) next = state.tokens[token.index + moves[event.key]];
    else if (event.key === "Home") next = state.tokens[0];
    else if (event.key === "End") next = [...state.tokens].reverse().find((t) => t.el);
    if (next?.el) {
      event.preventDefault();
      focusToken(next);
    }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !ui.tooltip.hidden) {
      state.dismissed = state.tooltipFor;
      hideTooltip();
      event.preventDefault();
    }
  });
  window.addEventListener("resize", () => state.tooltipFor && placeTooltip(state.tooltipFor));
  window.addEventListener("scroll", () => state.tooltipFor && placeTooltip(state.tooltipFor), { passive: true });

  // ---- summary -------------------------------------------------------------------------------

  function queueSummary() {
    if (state.summaryQueued) return;
    state.summaryQueued = true;
    requestAnimationFrame(() => {
      state.summaryQueued = false;
      drawSummary();
    });
  }

  function drawSummary() {
    const tokens = state.tokens;
    const n = tokens.length;
    const logprobs = tokens.map((t) => (Number.isFinite(t.logprob) ? t.logprob : SENTINEL_LOGPROB));
    const total = logprobs.reduce((a, b) => a + b, 0);
    ui.count.textContent = String(n);
    ui.total.textContent = n ? formatNumber(total, 4) : "—";
    ui.perplexity.textContent = n ? formatNumber(Math.exp(-total / n), 3) : "—";
    ui.mean.textContent = n ? formatProbability(logprobs.reduce((a, lp) => a + probability(lp), 0) / n) : "—";
    const splits = state.splits.filter((s) => s.tokens.length > 1 || s.char === null);
    ui.splits.textContent = splits.length
      ? splits.map((s) => `${splitLabel(s)} (${s.tokens.length} tokens)`).join(", ") : (n ? "none" : "—");
    const finish = state.finish;
    ui.finish.textContent = finish
      ? [finish.status, finish.reason && `(${finish.reason})`,
        finish.usage && `· usage: ${finish.usage.input_tokens} in, ${finish.usage.output_tokens} out`]
        .filter(Boolean).join(" ")
      : (state.controller ? "streaming…" : "—");
    const order = tokens.map((t, i) => i).sort((a, b) => logprobs[a] - logprobs[b] || a - b).slice(0, LEAST_CONFIDENT);
    ui.least.replaceChildren(...order.map((i) => {
      const token = tokens[i];
      const p = probability(token.logprob);
      const button = el("button", "least-token");
      button.type = "button";
      button.dataset.index = String(i);
      button.append(el("code", "", quoted(token.bytes)), " ", el("span", `tt-p p${bucket(p)}`, formatProbability(p)),
        " ", el("span", "hint", `#${i}`));
      const item = el("li");
      item.append(button);
      return item;
    }));
  }

  ui.least.addEventListener("click", (event) => {
    const button = event.target instanceof Element ? event.target.closest("button") : null;
    if (button) focusToken(state.tokens[Number(button.dataset.index)]);
  });

  // ---- requests ------------------------------------------------------------------------------

  function setStatus(text, kind) {
    ui.status.textContent = text;
    ui.status.dataset.kind = kind || "";
  }

  function headers() {
    const result = { "Content-Type": "application/json" };
    const key = ui.apiKey.value.trim();
    if (key) result.Authorization = `Bearer ${key}`;
    return result;
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      return body?.error?.message || `HTTP ${response.status}`;
    } catch {
      return `HTTP ${response.status}`;
    }
  }

  async function loadModels() {
    try {
      const response = await fetch("v1/models", { headers: headers() });
      if (response.status === 401) ui.apiKey.closest("details").open = true;  // the gateway wants a key
      if (!response.ok) throw new Error(await errorMessage(response));
      const models = ((await response.json()).data || []).map((m) => m.id);
      ui.model.replaceChildren(...models.map((id) => {
        const option = el("option", "", id);
        option.value = id;
        return option;
      }));
      if (!models.length) ui.model.append(el("option", "", "no models configured"));
      ui.send.disabled = !models.length;
    } catch (error) {
      ui.model.replaceChildren(el("option", "", "models unavailable"));
      setStatus(`Could not list models: ${error.message}`, "error");
    }
  }

  function numberField(input, name, body, integer) {
    const raw = input.value.trim();
    if (raw === "") return;
    const value = Number(raw);
    if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
      throw new Error(`${name} must be ${integer ? "a whole number" : "a number"}`);
    }
    body[name] = value;
  }

  function buildBody() {
    const body = { model: ui.model.value, input: ui.input.value, stream: true, include: [LOGPROBS_INCLUDE] };
    if (ui.instructions.value.trim()) body.instructions = ui.instructions.value;
    numberField(ui.topLogprobs, "top_logprobs", body, true);
    numberField(ui.temperature, "temperature", body, false);
    numberField(ui.maxTokens, "max_output_tokens", body, true);
    const extra = ui.extra.value.trim();
    if (extra) {
      let parsed;
      try {
        parsed = JSON.parse(extra);
      } catch (error) {
        throw new Error(`Extra request fields are not valid JSON: ${error.message}`);
      }
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
        throw new Error("Extra request fields must be a JSON object");
      }
      Object.assign(body, parsed);
    }
    return body;
  }

  function reset() {
    hideTooltip();
    Object.assign(state, { tokens: [], pending: [], splits: [], finish: null, dismissed: null });
    ui.tokens.replaceChildren();
    drawSummary();
  }

  function handleEvent(name, data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    const type = event.type || name;
    if (type === "response.output_text.delta") {
      addTokens(event.logprobs || []);
    } else if (type === "response.completed" || type === "response.incomplete" || type === "response.failed") {
      const response = event.response || {};
      state.finish = {
        status: response.status || type.replace("response.", ""),
        reason: response.incomplete_details?.reason || null,
        error: response.error?.message || null,
        usage: response.usage || null,
      };
    } else if (type === "error") {
      state.finish = { status: "failed", reason: null, error: event.message || "error", usage: null };
    }
  }

  async function send(event) {
    event.preventDefault();
    if (state.controller) return;
    let body;
    try {
      body = buildBody();
    } catch (error) {
      setStatus(error.message, "error");
      return;
    }
    reset();
    document.body.dataset.state = "streaming";
    const controller = new AbortController();
    state.controller = controller;
    ui.send.disabled = true;
    ui.stop.disabled = false;
    ui.tokens.setAttribute("aria-busy", "true");
    setStatus("Streaming…", "busy");
    if (narrow.matches) ui.tokens.closest("section").scrollIntoView({ block: "start" });
    try {
      const response = await fetch("v1/responses", {
        method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      for await (const frame of sseEvents(response.body)) handleEvent(frame.event, frame.data);
      flushPending();
      const finish = state.finish;
      if (!finish) setStatus("The stream ended without a final event.", "error");
      else if (finish.error) setStatus(`Failed: ${finish.error}`, "error");
      else setStatus(`Done: ${finish.status}${finish.reason ? ` (${finish.reason})` : ""}, `
        + `${state.tokens.length} tokens.`, "done");
    } catch (error) {
      flushPending();
      if (error.name === "AbortError") setStatus(`Stopped after ${state.tokens.length} tokens.`, "done");
      else setStatus(`Error: ${error.message}`, "error");
    } finally {
      state.controller = null;
      ui.send.disabled = false;
      ui.stop.disabled = true;
      ui.tokens.removeAttribute("aria-busy");
      drawSummary();
      document.body.dataset.state = "idle";
    }
  }

  // The layout rules on plain arrays of bytes, for tests that hold them to gateway/inspect_view.py.
  window.logprobPlayground = Object.freeze({
    layOut: (tokenBytes) => layOut(tokenBytes.map((b) => ({ bytes: Uint8Array.from(b) }))).layouts.map(
      ({ pieces, group }) => ({
        group,
        pieces: pieces.map((p) => (p.text !== undefined ? p.text
          : { bytes: Array.from(p.bytes), char: p.char, closes: p.closes })),
      })),
    quoted: (bytes) => quoted(Uint8Array.from(bytes)),
  });

  ui.form.addEventListener("submit", send);
  ui.stop.addEventListener("click", () => state.controller?.abort());
  ui.apiKey.addEventListener("change", () => {
    setStatus("", "");
    loadModels();
  });
  loadModels().finally(() => {
    document.body.dataset.state = "idle";
  });
})();
