// kvchat's page: documents, conversations kept in this browser, streamed answers with their
// sources, and the document with what the model kept. Everything from the server or a document
// is put in the page as text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "kvchat.conversations";
const state = {
  model: null,
  key: sessionStorage.getItem("kvchat.key"),
  documents: [],          // the server's uploaded documents
  conversations: JSON.parse(localStorage.getItem(STORE) || "[]"),
  current: null,          // the conversation shown
  asking: null,           // the AbortController of the answer streaming in
  texts: new Map(),       // document ids joined by "," -> {text, pages}
  settings: [],           // the settings a request may set, as this server takes them (GET /v1/settings)
};

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function say(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "muted";
}

// ---- the API ------------------------------------------------------------------------------

async function askForKey() {
  $("key-input").value = "";
  $("key-dialog").showModal();
  await new Promise((resolve) => $("key-dialog").addEventListener("close", resolve, { once: true }));
  state.key = $("key-input").value.trim();
  sessionStorage.setItem("kvchat.key", state.key);
}

async function api(path, options = {}) {
  for (;;) {
    const headers = { ...(options.headers || {}) };
    if (state.key) headers.Authorization = `Bearer ${state.key}`;
    const response = await fetch(path, { ...options, headers });
    if (response.status !== 401) return response;
    await askForKey();
  }
}

async function failure(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// ---- documents ----------------------------------------------------------------------------

async function loadDocuments() {
  const response = await api("/v1/documents");
  if (!response.ok) return say(await failure(response), true);
  state.documents = (await response.json()).data;
  renderDocuments();
}

function renderDocuments() {
  const list = $("documents");
  list.replaceChildren();
  const chosen = new Set(state.current ? state.current.documentIds : []);
  for (const doc of state.documents) {
    const item = element("li");
    const box = element("input");
    box.type = "checkbox";
    box.id = `doc-${doc.id}`;
    box.checked = chosen.has(doc.id);
    box.addEventListener("change", () => chooseDocument(doc.id, box.checked));
    const label = element("label", `${doc.filename} · ${doc.pages} p. · ${doc.tokens.toLocaleString()} tok`);
    label.htmlFor = box.id;
    const remove = element("button", "Delete");
    remove.type = "button";
    remove.setAttribute("aria-label", `Delete ${doc.filename}`);
    remove.addEventListener("click", () => deleteDocument(doc));
    item.append(box, label, remove);
    list.append(item);
  }
  renderAskingAbout();
}

function chooseDocument(id, chosen) {
  const ids = state.current.documentIds.filter((each) => each !== id);
  state.current.documentIds = chosen ? [...ids, id] : ids;
  save();
  renderAskingAbout();
}

async function deleteDocument(doc) {
  const response = await api(`/v1/documents/${encodeURIComponent(doc.id)}`, { method: "DELETE" });
  if (!response.ok) return say(await failure(response), true);
  for (const conversation of state.conversations) {
    conversation.documentIds = conversation.documentIds.filter((id) => id !== doc.id);
  }
  save();
  await loadDocuments();
}

function upload(file) {
  const item = element("li", `${file.name}: uploading`);
  $("uploads").append(item);
  const form = new FormData();
  form.append("file", file);
  const request = new XMLHttpRequest();
  request.open("POST", "/v1/documents");
  if (state.key) request.setRequestHeader("Authorization", `Bearer ${state.key}`);
  const started = performance.now();
  request.upload.addEventListener("progress", (event) => {
    if (!event.lengthComputable) return;
    const share = event.loaded / event.total;
    const elapsed = (performance.now() - started) / 1000;
    const left = share > 0 ? elapsed * (1 - share) / share : 0;
    item.textContent = share < 1
      ? `${file.name}: uploading ${Math.round(share * 100)}% · about ${Math.ceil(left)} s left`
      : `${file.name}: reading its text`;
  });
  request.addEventListener("load", async () => {
    if (request.status === 401) {
      item.remove();
      await askForKey();
      return upload(file);
    }
    let body = {};
    try { body = JSON.parse(request.responseText); } catch { /* shown below */ }
    if (request.status !== 200) {
      item.textContent = `${file.name}: ${body.error ? body.error.message : request.statusText}`;
      item.className = "error";
      return;
    }
    item.remove();
    if (state.current && !state.current.messages.length) chooseDocument(body.id, true);
    await loadDocuments();
  });
  request.addEventListener("error", () => { item.textContent = `${file.name}: the upload failed`; item.className = "error"; });
  request.send(form);
}

// ---- conversations ------------------------------------------------------------------------

function save() {
  localStorage.setItem(STORE, JSON.stringify(state.conversations));
  if (state.current) localStorage.setItem("kvchat.current", state.current.id);
}

function newConversation() {
  const conversation = { id: crypto.randomUUID(), title: "New conversation", documentIds: [], messages: [], settings: {} };
  state.conversations.unshift(conversation);
  open(conversation);
}

function open(conversation) {
  state.current = conversation;
  save();
  for (const setting of state.settings) settingInput(setting).value = conversation.settings[setting.field] ?? "";
  renderConversations();
  renderDocuments();
  renderMessages();
}

function renderConversations() {
  const list = $("conversations");
  list.replaceChildren();
  for (const conversation of state.conversations) {
    const item = element("li", undefined, conversation === state.current ? "current" : "");
    const button = element("button", conversation.title, "open");
    button.type = "button";
    button.addEventListener("click", () => open(conversation));
    const remove = element("button", "Delete");
    remove.type = "button";
    remove.setAttribute("aria-label", `Delete the conversation ${conversation.title}`);
    remove.addEventListener("click", () => {
      state.conversations = state.conversations.filter((each) => each !== conversation);
      if (!state.conversations.length) return newConversation();
      open(conversation === state.current ? state.conversations[0] : state.current);
    });
    item.append(button, remove);
    list.append(item);
  }
}

function renderAskingAbout() {
  const names = state.current.documentIds.map((id) => state.documents.find((doc) => doc.id === id)).filter(Boolean).map((doc) => doc.filename);
  $("asking-about").textContent = names.length ? `Asking about: ${names.join(", ")}` : "Asking without a document (tick one to ask about it).";
}

function renderMessages() {
  const list = $("messages");
  list.replaceChildren();
  for (const message of state.current.messages) list.append(messageItem(message));
}

function messageItem(message) {
  const item = element("li", undefined, message.role);
  item.append(element("div", message.content, message.role === "assistant" ? "answer" : ""));
  if (message.error) item.append(element("div", message.error, "error"));
  if (message.kv) item.append(...answerDetails(message));
  return item;
}

function answerDetails(message) {
  const kv = message.kv;
  const parts = [];
  if (kv.sources && kv.sources.length) {
    const list = element("ol", undefined, "sources");
    for (const source of kv.sources) {
      const button = element("button", `${source.where} · “${source.text}”`);
      button.type = "button";
      button.addEventListener("click", () => showDocument(message, source));
      const item = element("li");
      item.append(button);
      list.append(item);
    }
    parts.push(list);
  }
  const mib = (bytes) => (bytes / 2 ** 20).toFixed(1);
  const stats = [`read ${kv.read}`, `prompt ${kv.prompt_tokens.toLocaleString()} tok`, `kept ${kv.kept_tokens.toLocaleString()}`,
    `KV ${mib(kv.kv_bytes_full)} → ${mib(kv.kv_bytes_kept)} MiB`, `TTFT ${kv.ttft_s.toFixed(2)} s`,
    `decode ${kv.decode_tokens_per_s ? `${kv.decode_tokens_per_s.toFixed(1)} tok/s` : "–"}`];  // none after a one-token answer
  if (kv.loaded_tokens) stats.push(`${kv.loaded_tokens.toLocaleString()} loaded from the saved reading`);
  parts.push(element("div", stats.join(" · "), "stats muted"));
  if (message.documentIds && message.documentIds.length) {
    const view = element("button", "What the model kept");
    view.type = "button";
    view.addEventListener("click", () => showDocument(message, null));
    parts.push(view);
  }
  for (const notice of kv.notices || []) parts.push(element("div", notice, "muted"));
  return parts;
}

// ---- asking -------------------------------------------------------------------------------

function requestBody(conversation) {
  const body = { model: state.model, stream: true, messages: conversation.messages.filter((m) => !m.error).map(({ role, content }) => ({ role, content })) };
  const ids = conversation.documentIds;
  if (ids.length === 1) body.document_id = ids[0];
  if (ids.length > 1) body.document_ids = ids;
  for (const setting of state.settings) {
    const value = conversation.settings[setting.field];
    if (value !== undefined && value !== "") body[setting.field] = requestValue(setting, value);
  }
  return body;
}

function showProgress(done, total, started) {
  $("progress").hidden = false;
  $("progress-bar").value = total ? done / total : 0;
  const elapsed = (performance.now() - started) / 1000;
  const left = done > 0 ? ` · about ${Math.ceil(elapsed * (total - done) / done)} s left` : "";
  $("progress-text").textContent = `reading ${done.toLocaleString()} of ${total.toLocaleString()} tokens${left}`;
}

async function ask(question) {
  const conversation = state.current;
  if (conversation.messages.length === 0) conversation.title = question.slice(0, 60);
  conversation.messages.push({ role: "user", content: question });
  const answer = { role: "assistant", content: "", documentIds: [...conversation.documentIds] };
  const body = requestBody(conversation);
  conversation.messages.push(answer);
  save();
  renderConversations();
  renderMessages();
  const shown = $("messages").lastElementChild;
  const text = shown.firstElementChild;
  state.asking = new AbortController();
  $("send").hidden = true;
  $("stop").hidden = false;
  const started = performance.now();
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal: state.asking.signal,
    });
    if (!response.ok) throw new Error(await failure(response));
    await readStream(response, (chunk) => {
      if (chunk.progress) return showProgress(chunk.progress.done, chunk.progress.total, started);
      if (chunk.error) throw new Error(chunk.error.message);
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) return;
      if (choice.delta && choice.delta.content) {
        $("progress").hidden = true;
        answer.content += choice.delta.content;
        text.textContent = answer.content;
      }
      if (chunk.kv) answer.kv = chunk.kv;
    });
  } catch (error) {
    answer.error = error.name === "AbortError" ? "stopped" : error.message;
  } finally {
    state.asking = null;
    $("progress").hidden = true;
    $("send").hidden = false;
    $("stop").hidden = true;
    save();
    shown.replaceWith(messageItem(answer));
  }
  if (answer.kv && answer.kv.read !== "full") followWholeReading();
}

// After a fast first answer the server reads the document for the follow-ups (its passages, or
// whole): its progress (GET /health) is shown until it is done.
async function followWholeReading() {
  for (;;) {
    const response = await api("/health");
    const readings = response.ok ? (await response.json()).reading_on_progress || [] : [];
    if (!readings.length) return say("");
    const what = (r) => (r.reads === "passages" ? `the passages of ${r.document}` : `${r.document} whole`);
    say(readings.map((r) => `reading ${what(r)} for follow-ups: ${r.total ? Math.round(100 * r.done / r.total) : 0}%`).join(" · "));
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

// Server-sent events: `data:` lines hold chunks, comment lines kvchat's reading progress.
async function readStream(response, onChunk) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split("\n")) {
        if (line.startsWith(": progress ")) onChunk({ progress: JSON.parse(line.slice(11)) });
        else if (line.startsWith("data: ") && line !== "data: [DONE]") onChunk(JSON.parse(line.slice(6)));
      }
    }
  }
}

// ---- the document view --------------------------------------------------------------------

async function documentText(ids) {
  const key = ids.join(",");
  if (!state.texts.has(key)) {
    const response = await api(`/v1/documents/${ids.map(encodeURIComponent).join(",")}/text`);
    if (!response.ok) throw new Error(await failure(response));
    state.texts.set(key, await response.json());
  }
  return state.texts.get(key);
}

async function showDocument(message, source) {
  let content;
  try {
    content = await documentText(message.documentIds);
  } catch (error) {
    return say(error.message, true);
  }
  $("viewer").hidden = false;
  $("viewer-title").textContent = content.filename;
  renderStrip(message.kv.attention || []);
  const mark = renderText(content.text, message.kv.kept_spans || [], source);
  if (mark) mark.scrollIntoView({ block: "center" });
  else $("document-text").scrollTop = 0;
}

function renderStrip(shares) {
  const strip = $("strip");
  strip.replaceChildren();
  const most = Math.max(...shares, 0);
  for (const share of shares) {
    const cell = element("span");
    cell.style.background = `rgba(var(--heat), ${most > 0 ? share / most : 0})`;
    strip.append(cell);
  }
}

// The text with the kept ranges shaded and the source marked: cut at every edge, each piece a
// span (shaded when kept) in the view or, inside the source, in its one mark. Returns the mark.
function renderText(text, kept, source) {
  const edges = new Set([0, text.length]);
  for (const [start, end] of kept) { edges.add(start); edges.add(end); }
  if (source) { edges.add(source.start); edges.add(source.end); }
  const cuts = [...edges].filter((at) => at >= 0 && at <= text.length).sort((a, b) => a - b);
  const view = $("document-text");
  view.replaceChildren();
  let mark = null;
  let k = 0;
  for (let i = 0; i + 1 < cuts.length; i++) {
    const [start, end] = [cuts[i], cuts[i + 1]];
    while (k < kept.length && kept[k][1] <= start) k++;
    const isKept = k < kept.length && kept[k][0] <= start && end <= kept[k][1];
    const piece = element("span", text.slice(start, end), isKept ? "kept" : "");
    if (source && source.start <= start && end <= source.end) {
      if (!mark) view.append(mark = element("mark"));
      mark.append(piece);
    } else {
      view.append(piece);
    }
  }
  return mark;
}

// ---- start --------------------------------------------------------------------------------

function wire() {
  $("drop").addEventListener("click", () => $("file").click());
  $("drop").addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") { event.preventDefault(); $("file").click(); }
  });
  $("file").addEventListener("change", () => { [...$("file").files].forEach(upload); $("file").value = ""; });
  for (const name of ["dragenter", "dragover"]) {
    $("drop").addEventListener(name, (event) => { event.preventDefault(); $("drop").classList.add("over"); });
  }
  $("drop").addEventListener("dragleave", () => $("drop").classList.remove("over"));
  $("drop").addEventListener("drop", (event) => {
    event.preventDefault();
    $("drop").classList.remove("over");
    [...event.dataTransfer.files].forEach(upload);
  });
  $("new-conversation").addEventListener("click", newConversation);
  $("ask").addEventListener("submit", (event) => {
    event.preventDefault();
    const question = $("question").value.trim();
    if (!question || state.asking) return;
    $("question").value = "";
    ask(question);
  });
  $("question").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("ask").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => state.asking && state.asking.abort());
  $("close-viewer").addEventListener("click", () => { $("viewer").hidden = true; });
}

async function start() {
  wire();
  const response = await api("/v1/models");
  if (!response.ok) return say(await failure(response), true);
  state.model = (await response.json()).data[0].id;
  $("model").textContent = `model ${state.model}`;
  await loadSettings();
  const current = state.conversations.find((each) => each.id === localStorage.getItem("kvchat.current"));
  if (current) open(current);
  else if (state.conversations.length) open(state.conversations[0]);
  else newConversation();
  await loadDocuments();
  document.body.dataset.ready = "yes";
}

start();
