// The bothyd dashboard: a plain client of the API. Everything it shows from the API is
// rendered with textContent (never as HTML); the token stays in this browser's localStorage,
// where the token form or the one-time login URL that bothyd prints at start put it.
"use strict";

(() => {
  const TOKEN_KEY = "bothy.token";
  const EVENT_TYPES = [
    "sandbox.created", "sandbox.started", "sandbox.stopped", "sandbox.exited", "sandbox.deleted",
    "sandbox.paused", "sandbox.resumed", "sandbox.expired",
    "generation.captured", "generation.tombstoned", "generation.retired",
    "lease.acquired", "lease.released", "capture.progress",
    "checkpoint.created", "checkpoint.deleted", "sandbox.rolled-back", "sandbox.forked",
    "volume.created", "volume.deleted",
  ];
  const MAX_EVENTS = 50;

  const $ = (sel) => document.querySelector(sel);
  let token = localStorage.getItem(TOKEN_KEY) || "";

  // el builds an element; children are nodes or strings (as text, never HTML).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("data-")) e.setAttribute(k, v);
      else if (k === "title") e.title = v;
      else if (k === "type") e.type = v;
      else e[k] = v;
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  // Problem is a failed API call, with the problem+json body when there is one.
  class Problem extends Error {
    constructor(status, body) {
      const detail = body && body.detail ? body.detail : `The server answered HTTP ${status}.`;
      super(body && body.code ? `${detail} (${body.code})` : detail);
      this.status = status;
      this.code = body && body.code;
    }
  }

  async function api(method, path, body) {
    const headers = {};
    if (token) headers.Authorization = "Bearer " + token;
    const init = { method, headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (err) {
      throw new Error(`The server could not be reached: ${err.message}.`);
    }
    const ct = resp.headers.get("Content-Type") || "";
    if (!resp.ok) {
      let p = null;
      if (ct.includes("json")) {
        try { p = await resp.json(); } catch (_) { /* not JSON after all */ }
      }
      if (resp.status === 401) showTokenPanel(true);
      if (p && (p.code === "storage-full" || p.code === "storage-unavailable")) background(refreshStorage);
      throw new Problem(resp.status, p);
    }
    if (resp.status === 204 || resp.status === 202) return null;
    return ct.includes("json") ? resp.json() : resp.text();
  }

  // --- errors ---
  function showError(err) {
    $("#error-text").textContent = err && err.message ? err.message : String(err);
    $("#error").hidden = false;
  }
  function clearError() { $("#error").hidden = true; }
  $("#error-close").addEventListener("click", clearError);

  // act runs an action from a button, showing its failure as a readable message.
  async function act(button, fn) {
    if (button) button.disabled = true;
    try {
      clearError();
      await fn();
    } catch (err) {
      showError(err);
    } finally {
      if (button) button.disabled = false;
    }
  }

  // background runs a refresh; a failure is shown, but an earlier message is not cleared.
  function background(fn) {
    fn().catch(showError);
  }

  // actionButton makes a button that runs fn. A destructive one asks for a second click
  // within a few seconds; the pending confirmation is kept by key (action and target), so that
  // it survives the lists being re-rendered by a live update between the two clicks.
  const CONFIRM_MS = 4000;
  let pending = null; // { key, timer }

  function disarmAll() {
    for (const b of document.querySelectorAll("button.confirm")) {
      b.classList.remove("confirm");
      b.textContent = b.dataset.label;
    }
  }

  function actionButton(label, action, key, fn, destructive) {
    const b = el("button", { type: "button", "data-action": action, "data-label": label }, label);
    const arm = () => { b.classList.add("confirm"); b.textContent = "Sure?"; };
    if (destructive && pending && pending.key === key) arm();
    b.addEventListener("click", () => {
      if (destructive) {
        if (!pending || pending.key !== key) {
          if (pending) clearTimeout(pending.timer);
          pending = { key, timer: setTimeout(() => { pending = null; disarmAll(); }, CONFIRM_MS) };
          disarmAll();
          arm();
          return;
        }
        clearTimeout(pending.timer);
        pending = null;
      }
      act(b, fn);
    });
    return b;
  }

  // --- token ---
  function showTokenPanel(show) {
    $("#token-panel").hidden = !show;
    if (show) $("#token-input").focus();
  }
  $("#token-toggle").addEventListener("click", () => showTokenPanel($("#token-panel").hidden));
  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token = $("#token-input").value.trim();
    $("#token-input").value = "";
    if (token) localStorage.setItem(TOKEN_KEY, token); else localStorage.removeItem(TOKEN_KEY);
    showTokenPanel(false);
    clearError();
    connectEvents();
    refreshAll();
  });
  $("#token-forget").addEventListener("click", () => {
    token = "";
    localStorage.removeItem(TOKEN_KEY);
    connectEvents();
  });

  // --- sandboxes ---
  let sandboxes = [];

  function age(iso) {
    const s = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
    return `${Math.floor(s / 86400)}d`;
  }

  function size(bytes) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let n = bytes;
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
  }

  function sandboxRow(sb) {
    const id = sb.id;
    const enc = encodeURIComponent(id);
    const actions = el("td", { class: "actions" });
    const button = (label, action, fn, destructive) => {
      actions.append(actionButton(label, action, `${action} sandbox ${id}`, fn, destructive));
    };
    if (sb.state === "running") {
      button("Terminal", "terminal", async () => openTerminal(id));
      button("Stop", "stop", async () => {
        // An interactive shell ignores the stop's SIGTERM and would hold the stop for its
        // whole grace period; hanging up the terminal ends it at once.
        if (terminalFor === id) closeTerminal();
        await api("POST", `/v1/sandboxes/${enc}/stop`);
        await refreshSandboxes();
      });
      button("Pause", "pause", async () => { await api("POST", `/v1/sandboxes/${enc}/pause`); await refreshSandboxes(); });
    } else if (sb.state === "paused") {
      button("Resume", "resume", async () => { await api("POST", `/v1/sandboxes/${enc}/resume`); await refreshSandboxes(); });
      button("Stop", "stop", async () => { await api("POST", `/v1/sandboxes/${enc}/stop`); await refreshSandboxes(); });
    } else if (sb.state === "provisioned" || sb.state === "stopped") {
      button("Start", "start", async () => { await api("POST", `/v1/sandboxes/${enc}/start`); await refreshSandboxes(); });
    }
    button("Capture", "capture", async () => {
      $("#capture-sandbox").value = id;
      $("#capture-template").focus();
    });
    button("Delete", "delete", async () => {
      await api("DELETE", `/v1/sandboxes/${enc}`);
      if (terminalFor === id) closeTerminal();
      await refreshSandboxes();
    }, true);

    const origin = sb.template
      ? el("span", {}, `${sb.template.template} @ ${sb.template.generation}`)
      : el("span", {}, sb.image);
    const r = sb.resources || {};
    const exit = sb.last_exit
      ? el("div", { class: "muted" }, `last: ${sb.last_exit.reason}` +
          (sb.last_exit.code !== undefined ? ` ${sb.last_exit.code}` : "") +
          (sb.last_exit.signal ? ` ${sb.last_exit.signal}` : ""))
      : null;
    const labels = Object.entries(sb.labels || {}).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`));
    return el("tr", { "data-id": id, "data-state": sb.state },
      el("td", {}, el("code", {}, id)),
      el("td", {}, el("span", { class: "badge " + sb.state }, sb.state), exit),
      el("td", {}, origin),
      el("td", { title: sb.created_at }, age(sb.created_at)),
      el("td", {}, `${r.vcpus} vCPU, ${r.memory_mb} MiB, ${r.pids} pids` + (r.disk_mb ? `, ${r.disk_mb} MiB disk` : "")),
      el("td", {}, labels),
      actions);
  }

  function renderSandboxes() {
    const body = $("#sandboxes tbody");
    body.replaceChildren(...sandboxes.map(sandboxRow));
    $("#sandboxes-empty").hidden = sandboxes.length > 0;
  }

  // listAll follows a list's pages (next_cursor) to the end.
  async function listAll(path) {
    const items = [];
    let cursor = "";
    do {
      const page = await api("GET", `${path}?limit=500` + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
      items.push(...page.items);
      cursor = page.next_cursor || "";
    } while (cursor);
    return items;
  }

  async function refreshSandboxes() {
    sandboxes = (await listAll("/v1/sandboxes")).sort((a, b) => a.id.localeCompare(b.id));
    renderSandboxes();
  }

  function num(sel) {
    const v = $(sel).value.trim();
    return v === "" ? undefined : Number(v);
  }

  $("#create-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    act($("#create-submit"), async () => {
      const body = { start: $("#create-start").checked };
      for (const [field, sel] of [["id", "#create-id"], ["image", "#create-image"], ["template", "#create-template"], ["generation", "#create-generation"]]) {
        const v = $(sel).value.trim();
        if (v) body[field] = v;
      }
      const res = {};
      if (num("#create-vcpus") !== undefined) res.vcpus = num("#create-vcpus");
      if (num("#create-memory") !== undefined) res.memory_mb = num("#create-memory");
      if (num("#create-pids") !== undefined) res.pids = num("#create-pids");
      if (num("#create-disk") !== undefined) res.disk_mb = num("#create-disk");
      if (Object.keys(res).length) body.resources = res;
      const labels = {};
      for (const pair of $("#create-labels").value.split(",")) {
        const p = pair.trim();
        if (!p) continue;
        const i = p.indexOf("=");
        if (i < 1) throw new Error(`The label "${p}" is not of the form key=value.`);
        labels[p.slice(0, i).trim()] = p.slice(i + 1).trim();
      }
      if (Object.keys(labels).length) body.labels = labels;
      await api("POST", "/v1/sandboxes", body);
      $("#create-id").value = "";
      await refreshSandboxes();
    });
  });

  // --- templates ---
  async function refreshTemplates() {
    const msg = $("#templates-message");
    let templates;
    try {
      templates = await listAll("/v1/templates");
    } catch (err) {
      $("#templates").replaceChildren();
      msg.textContent = err.status === 501
        ? `Templates are not available on this server yet: ${err.message}`
        : err.message;
      msg.hidden = false;
      return;
    }
    msg.hidden = templates.length > 0;
    msg.textContent = "No templates yet.";
    const blocks = await Promise.all(templates.map(async (t) => {
      const name = encodeURIComponent(t.name);
      let gens = [];
      let problem = null;
      try {
        gens = await listAll(`/v1/templates/${name}/generations`);
      } catch (err) {
        problem = err.message;
      }
      const del = actionButton("Delete template", "delete-template", `delete template ${t.name}`, async () => {
        await api("DELETE", `/v1/templates/${name}`);
        await refreshTemplates();
      }, true);
      const rows = gens.map((g) => {
        const gen = encodeURIComponent(g.id);
        const actions = el("td", { class: "actions" });
        const add = (label, action, fn, destructive) => {
          actions.append(actionButton(label, action, `${action} ${t.name} ${g.id}`, fn, destructive));
        };
        if (g.state === "active") {
          add("Clone", "clone", async () => {
            await api("POST", "/v1/sandboxes", { template: t.name, generation: g.id, start: true });
            await refreshSandboxes();
            await refreshTemplates();
          });
          add("Tombstone", "tombstone", async () => {
            await api("POST", `/v1/templates/${name}/generations/${gen}/tombstone`);
            await refreshTemplates();
          }, true);
        }
        add("Retire", "retire", async () => {
          await api("DELETE", `/v1/templates/${name}/generations/${gen}?drain=true`);
          await refreshTemplates();
        }, true);
        return el("tr", { "data-generation": g.id },
          el("td", {}, el("code", {}, g.id)),
          el("td", {}, el("span", { class: "badge " + g.state }, g.state)),
          el("td", {}, el("span", { class: "badge " + g.eligibility }, g.eligibility)),
          el("td", { title: g.captured_at }, age(g.captured_at)),
          el("td", {}, size(g.size_bytes)),
          el("td", {}, String(g.leases)),
          actions);
      });
      return el("div", { class: "template", "data-template": t.name },
        el("h3", {}, el("code", {}, t.name),
          el("span", { class: "muted" }, `${t.generations} generation(s)` + (t.latest ? `, latest ${t.latest}` : "")),
          el("span", { class: "spacer" }), del),
        problem ? el("p", { class: "muted" }, problem) : null,
        rows.length
          ? el("table", {},
              el("thead", {}, el("tr", {}, ...["generation", "state", "eligibility", "captured", "size", "leases", ""].map((h) => el("th", {}, h)))),
              el("tbody", {}, rows))
          : el("p", { class: "muted" }, "No generations."));
    }));
    $("#templates").replaceChildren(...blocks);
  }

  $("#template-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    act(null, async () => {
      await api("POST", "/v1/templates", { name: $("#template-name").value.trim() });
      $("#template-name").value = "";
      await refreshTemplates();
    });
  });
  $("#capture-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    act(null, async () => {
      const tpl = encodeURIComponent($("#capture-template").value.trim());
      await api("POST", `/v1/templates/${tpl}/generations`, { sandbox: $("#capture-sandbox").value.trim() });
      await refreshTemplates();
    });
  });

  // --- terminal ---
  let terminalFor = null;
  let terminalClose = null;

  function closeTerminal() {
    if (terminalClose) terminalClose();
    terminalClose = null;
    terminalFor = null;
    $("#terminal-panel").hidden = true;
  }
  $("#terminal-close").addEventListener("click", closeTerminal);

  async function openTerminal(id) {
    closeTerminal();
    // Failures of the websocket handshake are hidden from scripts: check first, so that a
    // sandbox that is not running is explained rather than a bare "closed".
    const sb = await api("GET", `/v1/sandboxes/${encodeURIComponent(id)}`);
    if (sb.state !== "running") throw new Error(`The sandbox ${id} is ${sb.state}; start it to open a terminal.`);

    $("#terminal-panel").hidden = false;
    $("#terminal-title").textContent = id;
    const status = $("#terminal-status");
    status.textContent = "connecting…";
    const container = $("#terminal");
    container.replaceChildren();
    const term = new window.Terminal({ cursorBlink: true, fontSize: 14, scrollback: 2000 });
    const fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(container);
    fit.fit();

    const q = new URLSearchParams({ command: "/bin/sh", tty: "true", rows: String(term.rows), cols: String(term.cols) });
    if (token) q.set("access_token", token);
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${scheme}//${location.host}/v1/sandboxes/${encodeURIComponent(id)}/exec/stream?${q}`);
    ws.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    let opened = false;

    ws.addEventListener("open", () => {
      opened = true;
      status.textContent = "connected";
      term.focus();
    });
    ws.addEventListener("message", (m) => {
      if (typeof m.data === "string") {
        let c;
        try { c = JSON.parse(m.data); } catch (_) { return; }
        if (c.type === "exit") {
          const how = c.signal ? `killed by ${c.signal}` : `exit code ${c.exit_code}`;
          term.write(`\r\n[the shell ended: ${how}${c.timed_out ? ", timed out" : ""}]\r\n`);
        }
        return;
      }
      const b = new Uint8Array(m.data);
      if (b.length > 0 && (b[0] === 1 || b[0] === 2)) term.write(b.subarray(1));
    });
    ws.addEventListener("close", (e) => {
      if (!opened) {
        status.textContent = "";
        showError(new Error(`The terminal could not connect to ${id}: it may have stopped, or another exec holds it (sandbox-busy).`));
      } else {
        status.textContent = e.code === 1000 ? "closed" : `closed (${e.code}${e.reason ? " " + e.reason : ""})`;
      }
    });
    const onData = term.onData((d) => {
      if (ws.readyState !== WebSocket.OPEN) return;
      const data = encoder.encode(d);
      const frame = new Uint8Array(data.length + 1);
      frame[0] = 0;
      frame.set(data, 1);
      ws.send(frame);
    });
    // The size the shell was given, for people and tests to compare with `stty size`.
    container.dataset.size = `${term.rows} ${term.cols}`;
    const onResize = term.onResize(({ rows, cols }) => {
      container.dataset.size = `${rows} ${cols}`;
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", rows, cols }));
    });
    const refit = () => fit.fit();
    window.addEventListener("resize", refit);
    terminalFor = id;
    terminalClose = () => {
      window.removeEventListener("resize", refit);
      onData.dispose();
      onResize.dispose();
      ws.close(1000);
      term.dispose();
    };
  }

  // --- live events ---
  let source = null;
  let reconnectTimer = null;
  let refreshTimer = null;
  let refreshTemplatesToo = false;

  function scheduleRefresh(templates) {
    refreshTemplatesToo = refreshTemplatesToo || templates;
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      const both = refreshTemplatesToo;
      refreshTemplatesToo = false;
      background(async () => {
        await refreshSandboxes();
        if (both) await refreshTemplates();
      });
    }, 150);
  }

  function setLive(on, text) {
    const b = $("#live");
    b.textContent = text;
    b.className = "badge " + (on ? "on" : "off");
  }

  function logEvent(e) {
    const what = [e.sandbox, e.template, e.generation, e.checkpoint, e.volume,
      e.forks && "→ " + e.forks.join(", "), e.state, e.exit && e.exit.reason,
      e.progress && `${e.progress.phase} ${e.progress.bytes_done}${e.progress.bytes_total ? "/" + e.progress.bytes_total : ""}`]
      .filter(Boolean).join(" ");
    const list = $("#events");
    list.prepend(el("li", { "data-type": e.type }, `${new Date(e.at).toLocaleTimeString()}  #${e.seq}  ${e.type}  ${what}`));
    while (list.children.length > MAX_EVENTS) list.lastChild.remove();
  }

  // showCapture follows a capture's progress next to the capture form.
  function showCapture(e) {
    const status = $("#capture-status");
    if (e.type === "capture.progress" && e.progress) {
      const total = e.progress.bytes_total ? ` of ${size(e.progress.bytes_total)}` : "";
      status.textContent = `${e.sandbox} → ${e.template}: ${e.progress.phase} ${size(e.progress.bytes_done)}${total}`;
    } else if (e.type === "generation.captured") {
      status.textContent = `${e.sandbox} → ${e.template}: captured as ${e.generation}`;
    }
  }

  function connectEvents() {
    if (source) source.close();
    clearTimeout(reconnectTimer);
    const url = "/v1/events" + (token ? "?access_token=" + encodeURIComponent(token) : "");
    source = new EventSource(url);
    source.addEventListener("open", () => {
      setLive(true, "live");
      scheduleRefresh(true); // catch up on anything missed while disconnected
    });
    source.addEventListener("error", () => {
      if (source.readyState === EventSource.CLOSED) {
        // Refused (a wrong token, say): EventSource gives up; try again later.
        setLive(false, "offline");
        reconnectTimer = setTimeout(connectEvents, 5000);
      } else {
        setLive(false, "reconnecting");
      }
    });
    for (const type of EVENT_TYPES) {
      source.addEventListener(type, (m) => {
        let e;
        try { e = JSON.parse(m.data); } catch (_) { return; }
        logEvent(e);
        showCapture(e);
        // Any change may move lease counts (a clone created or deleted): refresh both lists.
        scheduleRefresh(true);
      });
    }
  }

  // --- the state root's health ---
  // refreshStorage shows a banner in the header while the state root is full or unavailable:
  // then creates, starts and uploads fail, while reads, stops and deletes still work.
  async function refreshStorage() {
    const info = await api("GET", "/v1/info");
    const st = info && info.storage;
    const banner = $("#storage");
    if (!st || st.state === "ok") {
      banner.hidden = true;
      return;
    }
    const since = new Date(st.since).toLocaleTimeString();
    banner.textContent = st.state === "full"
      ? `State root ${st.root} is full since ${since}: delete sandboxes or templates to free space.`
      : `State root ${st.root} is unavailable (read-only or failing) since ${since}: writes fail until the operator repairs it.`;
    banner.dataset.state = st.state;
    banner.hidden = false;
  }

  function refreshAll() {
    background(async () => {
      await refreshSandboxes();
      await refreshTemplates();
      await refreshStorage();
    });
  }

  // login exchanges the one-time code of the login URL that bothyd prints at start
  // (/#login=<code>) for the token, and keeps the token like one entered in the form. The code
  // is in the fragment, which the browser never sends, and is taken out of the address bar
  // and history before anything else: it is good once, and a bookmark of it would not be.
  async function login() {
    const m = /^#login=([0-9a-f]+)$/.exec(location.hash);
    if (!m) return;
    history.replaceState(null, "", location.pathname + location.search);
    try {
      const out = await api("POST", "/login", { code: m[1] });
      token = out.token;
      localStorage.setItem(TOKEN_KEY, token);
      showTokenPanel(false);
    } catch (err) {
      showError(err);
    }
  }

  // start logs in if the URL asks to, then connects.
  function start() {
    login().finally(() => {
      connectEvents();
      refreshAll();
    });
  }

  // Ages move on while nothing happens.
  setInterval(renderSandboxes, 15000);
  // The state root's health changes without an event: look again now and then.
  setInterval(() => { refreshStorage().catch(() => {}); }, 10000);
  // A login URL opened over the page itself changes only its fragment: no new page load.
  window.addEventListener("hashchange", () => { if (location.hash.startsWith("#login=")) start(); });
  start();
})();
