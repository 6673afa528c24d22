// The bothyd dashboard: a plain client of the API. Everything it shows from the API is
// rendered with textContent (never as HTML): a sandbox's files, log, names and labels are
// written by whoever runs in it. The token stays in this browser's localStorage, where the
// token form or the one-time login URL that bothyd prints at start put it.
//
// Pages are views of one document, chosen by the URL's fragment (#/, #/sandboxes/{id},
// #/templates, #/images, #/volumes, #/secrets, #/webhooks, and #/nodes on a cluster router),
// so the page needs no route of its
// own on the server and a reload or a bookmark opens the same view.
"use strict";

(() => {
  const TOKEN_KEY = "bothy.token";
  const EVENT_TYPES = [
    "sandbox.created", "sandbox.started", "sandbox.stopped", "sandbox.exited", "sandbox.deleted",
    "sandbox.paused", "sandbox.resumed", "sandbox.asleep", "sandbox.awake", "sandbox.expired",
    "generation.captured", "generation.tombstoned", "generation.retired",
    "lease.acquired", "lease.released", "capture.progress",
    "image.pull.progress", "image.pulled", "image.imported", "image.failed", "image.deleted",
    "checkpoint.created", "checkpoint.deleted", "sandbox.rolled-back", "sandbox.forked",
    "volume.created", "volume.deleted",
  ];
  // The event types a webhook may ask for (WebhookEventType in the spec).
  const WEBHOOK_EVENTS = EVENT_TYPES;
  const MAX_EVENTS = 50;
  const LOG_LINES = 500;
  const LOG_POLL_MS = 2000;

  const $ = (sel) => document.querySelector(sel);
  let token = localStorage.getItem(TOKEN_KEY) || "";
  let info = null; // /v1/info, for the forms' defaults and limits

  // newest hands out a ticket to each call of one list's refresh; the ticket lets its call
  // draw unless a call that began later has drawn already. Refreshes overlap (a live event's
  // and a button's own), and one whose reads were answered before a change that a later one
  // saw (a template deleted between them) must not draw last and bring the gone back; yet
  // under a steady flow of events every call still draws unless a newer one did, so the list
  // never goes undrawn.
  const refreshTickets = {};
  function newest(list) {
    const t = (refreshTickets[list] ||= { issued: 0, drawn: 0 });
    const mine = ++t.issued;
    return () => {
      if (mine < t.drawn) return false;
      t.drawn = mine;
      return true;
    };
  }

  // el builds an element; children are nodes or strings (as text, never HTML).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("data-") || k.startsWith("aria-")) e.setAttribute(k, v);
      else if (k === "title") e.title = v;
      else if (k === "type") e.type = v;
      else e[k] = v;
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  // sandboxLink links to a sandbox's page. Ids are checked by the server's pattern, and are
  // encoded besides: the href is always a fragment of this page.
  function sandboxLink(id) {
    return el("a", { href: "#/sandboxes/" + encodeURIComponent(id), "data-sandbox-link": id }, el("code", {}, id));
  }

  // Problem is a failed API call, with the problem+json body when there is one.
  class Problem extends Error {
    constructor(status, body) {
      const detail = body && body.detail ? body.detail : `The server answered HTTP ${status}.`;
      super(body && body.code ? `${detail} (${body.code})` : detail);
      this.status = status;
      this.code = body && body.code;
      this.field = body && body.field;
    }
  }

  // request sends one API call and answers the response, or throws a Problem. A body that is
  // a Blob (a file to upload) is sent as it is; anything else as JSON.
  async function request(method, path, body) {
    const headers = {};
    if (token) headers.Authorization = "Bearer " + token;
    const init = { method, headers };
    if (body instanceof Blob) {
      headers["Content-Type"] = "application/octet-stream";
      init.body = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    for (let attempt = 1; ; attempt++) {
      try {
        resp = await fetch(path, init);
        break;
      } catch (err) {
        // A read that failed on its way (a connection the browser kept was dropped under
        // it) is sent once more before the page says so; a write is not repeated, as the
        // server may have carried it out.
        if (method === "GET" && attempt === 1) {
          await new Promise((resolve) => setTimeout(resolve, 250));
          continue;
        }
        throw new Error(`The server could not be reached: ${err.message}.`);
      }
    }
    if (!resp.ok) {
      const ct = resp.headers.get("Content-Type") || "";
      let p = null;
      if (ct.includes("json")) {
        try { p = await resp.json(); } catch (_) { /* not JSON after all */ }
      }
      if (resp.status === 401) showTokenPanel(true);
      if (p && (p.code === "storage-full" || p.code === "storage-unavailable")) background(refreshStorage);
      throw new Problem(resp.status, p);
    }
    return resp;
  }

  async function api(method, path, body) {
    const resp = await request(method, path, body);
    if (resp.status === 204) return null;
    const ct = resp.headers.get("Content-Type") || "";
    const text = await resp.text();
    if (!ct.includes("json")) return text;
    return text ? JSON.parse(text) : null;
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

  // fieldFor finds the input a problem's `field` names (`resources.vcpus`, `network.allow[2]`,
  // `path`): the field itself, then without its index, then its parents.
  function fieldFor(form, field) {
    const names = [];
    let f = field;
    while (f) {
      names.push(f);
      const unindexed = f.replace(/\[\d+\]$/, "");
      if (unindexed !== f) { f = unindexed; continue; }
      const dot = f.lastIndexOf(".");
      names.push(f.slice(dot + 1));
      f = dot < 0 ? "" : f.slice(0, dot);
    }
    for (const n of names) {
      const input = form.querySelector(`[data-field="${CSS.escape(n)}"]`);
      if (input) return input;
    }
    return null;
  }

  function clearFieldErrors(form) {
    for (const e of form.querySelectorAll(".field-error")) e.remove();
    for (const e of form.querySelectorAll("[aria-invalid]")) e.removeAttribute("aria-invalid");
  }

  // formAct runs a form's submission: a refusal that names a field is shown beside that
  // field, any other failure in the page's banner.
  function formAct(form, fn) {
    const button = form.querySelector('button[type="submit"]');
    clearFieldErrors(form);
    act(button, async () => {
      try {
        await fn();
      } catch (err) {
        const input = err.field ? fieldFor(form, err.field) : null;
        if (!input) throw err;
        input.setAttribute("aria-invalid", "true");
        const holder = input.closest(".field") || input;
        holder.append(el("small", { class: "field-error", role: "alert", "data-for": err.field }, err.message));
      }
    });
  }

  function onSubmit(sel, fn) {
    const form = $(sel);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      formAct(form, () => fn(form));
    });
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
    if (destructive) b.title = "Destroys something: click again to confirm.";
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

  // --- formatting ---
  function age(iso) {
    const s = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
    return `${Math.floor(s / 86400)}d`;
  }

  function until(iso) {
    const s = Math.floor((Date.parse(iso) - Date.now()) / 1000);
    if (s <= 0) return "now";
    if (s < 60) return `in ${s}s`;
    if (s < 3600) return `in ${Math.floor(s / 60)}m`;
    if (s < 86400) return `in ${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
    return `in ${Math.floor(s / 86400)}d`;
  }

  function size(bytes) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let n = bytes;
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
  }

  function when(iso) { return iso ? new Date(iso).toLocaleString() : ""; }

  // listAll follows a list's pages (next_cursor) to the end.
  async function listAll(path) {
    const items = [];
    let cursor = "";
    do {
      const sep = path.includes("?") ? "&" : "?";
      const page = await api("GET", `${path}${sep}limit=500` + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
      items.push(...page.items);
      cursor = page.next_cursor || "";
    } while (cursor);
    return items;
  }

  function table(sel, rows, empty) {
    const body = $(sel + " tbody");
    body.replaceChildren(...rows);
    if (!rows.length && empty) body.append(el("tr", { class: "empty" }, el("td", { colSpan: 9, class: "muted" }, empty)));
  }

  // --- routing ---
  const views = ["sandboxes", "sandbox", "templates", "images", "volumes", "secrets", "webhooks", "nodes", "missing"];
  let view = "";

  function route() {
    const h = location.hash;
    if (h === "" || h === "#" || h === "#/") return { view: "sandboxes" };
    const m = /^#\/sandboxes\/([^/]+)$/.exec(h);
    if (m) {
      let id;
      try { id = decodeURIComponent(m[1]); } catch (_) { return { view: "missing" }; }
      return { view: "sandbox", id };
    }
    const page = /^#\/([a-z]+)$/.exec(h);
    if (page && views.includes(page[1]) && page[1] !== "sandbox" && page[1] !== "missing") return { view: page[1] };
    return { view: "missing" };
  }

  function navigate() {
    if (location.hash.startsWith("#login=")) return;
    const r = route();
    if (view === "sandbox" && (r.view !== "sandbox" || r.id !== page.id)) leaveSandbox();
    view = r.view;
    for (const v of document.querySelectorAll(".view")) v.hidden = v.dataset.view !== view;
    for (const a of document.querySelectorAll("#nav a")) {
      a.classList.toggle("current", a.dataset.nav === view || (view === "sandbox" && a.dataset.nav === "sandboxes"));
    }
    document.title = view === "sandbox" ? `${r.id} · bothyd` : `bothyd · ${view}`;
    if (view === "sandbox") enterSandbox(r.id);
    else refreshView();
  }

  // refreshView loads what the current page shows.
  function refreshView() {
    background(async () => {
      switch (view) {
        case "sandboxes": await refreshSandboxes(); break;
        case "sandbox": await refreshSandboxPage(); break;
        case "templates": await refreshTemplates(); break;
        case "images": await refreshImages(); break;
        case "volumes": await refreshVolumes(); break;
        case "secrets": await refreshSecrets(); break;
        case "webhooks": await refreshWebhooks(); break;
        case "nodes": await refreshNodes(); break;
        default: break;
      }
    });
  }

  // --- sandboxes ---
  let sandboxes = [];

  async function post(path, body) { return api("POST", path, body); }

  function sandboxRow(sb) {
    const id = sb.id;
    const enc = encodeURIComponent(id);
    const actions = el("td", { class: "actions" });
    const button = (label, action, fn, destructive) => {
      actions.append(actionButton(label, action, `${action} sandbox ${id}`, fn, destructive));
    };
    if (sb.state === "running") {
      button("Terminal", "terminal", async () => {
        location.hash = "#/sandboxes/" + enc;
        await openTerminal(id);
      });
      button("Stop", "stop", async () => {
        // An interactive shell ignores the stop's SIGTERM and would hold the stop for its
        // whole grace period; hanging up the terminal ends it at once.
        if (terminalFor === id) closeTerminal();
        await post(`/v1/sandboxes/${enc}/stop`);
        await refreshSandboxes();
      });
      button("Pause", "pause", async () => { await post(`/v1/sandboxes/${enc}/pause`); await refreshSandboxes(); });
    } else if (sb.state === "paused") {
      button("Resume", "resume", async () => { await post(`/v1/sandboxes/${enc}/resume`); await refreshSandboxes(); });
      button("Stop", "stop", async () => { await post(`/v1/sandboxes/${enc}/stop`); await refreshSandboxes(); });
    } else if (sb.state === "provisioned" || sb.state === "stopped") {
      button("Start", "start", async () => { await post(`/v1/sandboxes/${enc}/start`); await refreshSandboxes(); });
    }
    button("Capture", "capture", async () => {
      $("#capture-sandbox").value = id;
      location.hash = "#/templates";
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
      el("td", {}, sandboxLink(id)),
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

  async function refreshSandboxes() {
    const current = newest("sandboxes");
    const list = await listAll("/v1/sandboxes");
    if (!current()) return;
    sandboxes = list.sort((a, b) => a.id.localeCompare(b.id));
    renderSandboxes();
  }

  function num(sel) {
    const v = $(sel).value.trim();
    return v === "" ? undefined : Number(v);
  }

  function parseLabels(text) {
    const labels = {};
    for (const pair of text.split(",")) {
      const p = pair.trim();
      if (!p) continue;
      const i = p.indexOf("=");
      if (i < 1) {
        const err = new Error(`The label "${p}" is not of the form key=value.`);
        err.field = "labels";
        throw err;
      }
      labels[p.slice(0, i).trim()] = p.slice(i + 1).trim();
    }
    return labels;
  }

  onSubmit("#create-form", async () => {
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
    if (num("#create-timeout") !== undefined) body.timeout_s = num("#create-timeout");
    const labels = parseLabels($("#create-labels").value);
    if (Object.keys(labels).length) body.labels = labels;
    await post("/v1/sandboxes", body);
    $("#create-id").value = "";
    await refreshSandboxes();
  });

  // --- one sandbox's page ---
  const page = { id: null, sb: null, timers: [], filesPath: "/", netFilled: false, logBusy: false, links: null, linksSeq: 0 };
  // The paths of the links made from this page, by link id. The API lists a sandbox's live
  // links without their tokens (a token is shown once, to its maker), so only a link made
  // here can be shown as a URL and copied; the others are listed to be seen and revoked.
  const madeHere = new Map();

  function enterSandbox(id) {
    if (page.id !== id) {
      page.id = id;
      page.sb = null;
      page.filesPath = "/";
      page.netFilled = false;
      page.links = null;
      $("#files-path").value = "/";
      $("#sb-log").textContent = "";
      $("#sb-charts").replaceChildren();
      $("#sb-fork-result").textContent = "";
      $("#sb-capture-status").textContent = "";
      $("#files tbody").replaceChildren();
      for (const f of document.querySelectorAll("#view-sandbox form")) clearFieldErrors(f);
    }
    $("#sb-id").textContent = id;
    renderLinks();
    background(async () => {
      await refreshSandboxPage();
      const sb = page.sb;
      if (sb) await listFiles().catch((err) => movedOn(sb, err));
    });
    stopPolling();
    page.timers.push(setInterval(() => { pollLog().catch(() => {}); }, LOG_POLL_MS));
    page.timers.push(setInterval(() => { refreshMetrics().catch(() => {}); }, 5000));
  }

  function stopPolling() {
    for (const t of page.timers) clearInterval(t);
    page.timers = [];
  }

  function leaveSandbox() {
    stopPolling();
    closeTerminal();
  }

  const pageEnc = () => encodeURIComponent(page.id);

  async function refreshSandboxPage() {
    let sb;
    try {
      sb = await api("GET", `/v1/sandboxes/${pageEnc()}`);
    } catch (err) {
      if (err.status !== 404) throw err;
      page.sb = null;
      $("#sb-state").textContent = "gone";
      $("#sb-state").className = "badge stopped";
      $("#sb-gone").textContent = `There is no sandbox ${page.id} (any more).`;
      $("#sb-gone").hidden = false;
      $("#sb-body").hidden = true;
      return;
    }
    const was = page.sb && page.sb.state;
    page.sb = sb;
    $("#sb-gone").hidden = true;
    $("#sb-body").hidden = false;
    renderSandboxPage(sb);
    const more = [refreshCheckpoints(), refreshLinks(), refreshMetrics(), pollLog()];
    // The files can be read while it runs only: list them again when that changes.
    if (was && was !== sb.state && (was === "running" || sb.state === "running")) more.push(listFiles());
    await Promise.all(more).catch((err) => movedOn(sb, err));
  }

  // movedOn answers a failure of a call about the page's sandbox made after the page read it
  // as `sb`. A sandbox deleted, stopped or paused in between (by another client, or by this
  // page's own list) refuses such calls: that is not a failure but news, so the page is read
  // again and shows what the sandbox is now. Any other failure is reported as it came.
  async function movedOn(sb, err) {
    if (err.status !== 404 && err.status !== 409) throw err;
    if (page.id !== sb.id) return; // the page shows another sandbox now
    let now;
    try {
      now = await api("GET", `/v1/sandboxes/${pageEnc()}`);
    } catch (again) {
      if (again.status !== 404) throw err;
      return refreshSandboxPage(); // gone: shown as gone
    }
    if (now.state === sb.state) throw err;
    return refreshSandboxPage();
  }

  function fact(name, value) {
    if (value === undefined || value === null || value === "") return [];
    return [el("dt", {}, name), el("dd", { "data-fact": name }, value)];
  }

  function renderSandboxPage(sb) {
    const enc = pageEnc();
    const st = $("#sb-state");
    st.textContent = sb.state + (sb.asleep ? " (asleep)" : "");
    st.className = "badge " + sb.state;
    st.dataset.state = sb.state;
    const r = sb.resources || {};
    const exit = sb.last_exit
      ? `${sb.last_exit.reason}` + (sb.last_exit.code !== undefined ? ` ${sb.last_exit.code}` : "") +
        (sb.last_exit.signal ? ` ${sb.last_exit.signal}` : "") + (sb.last_exit.at ? `, ${when(sb.last_exit.at)}` : "")
      : "";
    $("#sb-facts").replaceChildren(
      ...fact("origin", sb.template ? `template ${sb.template.template} @ ${sb.template.generation}` : `image ${sb.image}`),
      ...fact("runtime", sb.runtime),
      ...fact("created", `${when(sb.created_at)} (${age(sb.created_at)} ago)`),
      ...fact("started", sb.started_at ? `${when(sb.started_at)} (${age(sb.started_at)} ago)` : ""),
      ...fact("lifetime", sb.expires_at ? `ends ${until(sb.expires_at)} (${when(sb.expires_at)}), then ${sb.on_timeout || "stop"}` : "none"),
      ...fact("resources", `${r.vcpus} vCPU, ${r.memory_mb} MiB, ${r.pids} pids` + (r.disk_mb ? `, ${r.disk_mb} MiB disk` : ", no disk of its own")),
      ...fact("address", sb.address),
      ...fact("environment", (sb.env_keys || []).join(", ")),
      ...fact("last exit", exit));
    $("#sb-labels").replaceChildren(...Object.entries(sb.labels || {}).map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`)));

    const actions = [];
    const button = (label, action, fn, destructive) => {
      actions.push(actionButton(label, action, `${action} page ${sb.id}`, async () => {
        await fn();
        await refreshSandboxPage();
      }, destructive));
    };
    if (sb.state === "provisioned" || sb.state === "stopped") {
      button("Start", "start", () => post(`/v1/sandboxes/${enc}/start`));
    }
    if (sb.state === "running") {
      button("Stop", "stop", async () => { closeTerminal(); await post(`/v1/sandboxes/${enc}/stop`); });
      button("Pause", "pause", () => post(`/v1/sandboxes/${enc}/pause`));
    }
    if (sb.state === "paused") {
      button("Resume", "resume", () => post(`/v1/sandboxes/${enc}/resume`));
      button("Stop", "stop", () => post(`/v1/sandboxes/${enc}/stop`));
    }
    const live = sb.state === "running" || sb.state === "paused";
    actions.push(actionButton(live ? "Delete (kills it)" : "Delete", "delete", `delete page ${sb.id}`, async () => {
      closeTerminal();
      await api("DELETE", `/v1/sandboxes/${enc}` + (live ? "?force=true" : ""));
      location.hash = "#/";
    }, true));
    $("#sb-actions").replaceChildren(...actions);
    $("#terminal-open").disabled = sb.state !== "running";

    if (!page.netFilled) fillNetwork(sb.network || {});
    const vols = sb.volumes || [];
    $("#sb-volumes").replaceChildren(...(vols.length
      ? vols.map((v) => el("li", { "data-volume": v.name },
          el("a", { href: "#/volumes" }, el("code", {}, v.name)), ` at ${v.path}`, v.read_only ? " (read-only)" : ""))
      : [el("li", { class: "muted" }, "No volumes.")]));
  }

  // The lifetime, forks, checkpoints and captures of the page's sandbox.
  onSubmit("#sb-extend-form", async () => {
    await post(`/v1/sandboxes/${pageEnc()}/timeout`, { timeout_s: Number($("#sb-extend-seconds").value), on_timeout: $("#sb-extend-on").value });
    await refreshSandboxPage();
  });
  onSubmit("#sb-fork-form", async () => {
    const out = await post(`/v1/sandboxes/${pageEnc()}/fork`, { count: Number($("#sb-fork-count").value) });
    const made = out.items.filter((i) => i.sandbox);
    const refused = out.items.filter((i) => i.error);
    const status = $("#sb-fork-result");
    status.replaceChildren(made.length ? "Forked: " : "", ...made.flatMap((i) => [sandboxLink(i.id), " "]),
      refused.length ? `refused: ${refused.map((i) => `${i.id}: ${i.error.detail}`).join("; ")}` : "");
  });
  onSubmit("#sb-checkpoint-form", async () => {
    await post(`/v1/sandboxes/${pageEnc()}/checkpoints`, { name: $("#sb-checkpoint-name").value.trim() });
    $("#sb-checkpoint-name").value = "";
    await refreshCheckpoints();
  });
  onSubmit("#sb-capture-form", async () => {
    const tpl = $("#sb-capture-template").value.trim();
    const gen = await post(`/v1/templates/${encodeURIComponent(tpl)}/generations`, { sandbox: page.id });
    $("#sb-capture-status").replaceChildren(`captured as `, el("a", { href: "#/templates" }, `${tpl} @ ${gen.id}`));
  });

  async function refreshCheckpoints() {
    const msg = $("#checkpoints-message");
    let list;
    try {
      list = await api("GET", `/v1/sandboxes/${pageEnc()}/checkpoints`);
    } catch (err) {
      table("#checkpoints", []);
      msg.textContent = err.message;
      msg.hidden = false;
      return;
    }
    msg.hidden = true;
    const enc = pageEnc();
    table("#checkpoints", (list.items || []).map((c) => {
      const name = encodeURIComponent(c.name);
      return el("tr", { "data-checkpoint": c.name },
        el("td", {}, el("code", {}, c.name)),
        el("td", { title: c.created_at }, `${age(c.created_at)} ago`),
        el("td", {}, size(c.size_bytes)),
        el("td", {}, c.mode + (c.freeze_ms ? `, frozen ${c.freeze_ms} ms` : "")),
        el("td", {}, String(c.layers)),
        el("td", { class: "actions" },
          actionButton("Roll back", "rollback", `rollback ${page.id} ${c.name}`, async () => {
            closeTerminal();
            await post(`/v1/sandboxes/${enc}/checkpoints/${name}/rollback`);
            await refreshSandboxPage();
          }, true),
          actionButton("Delete", "delete-checkpoint", `delete checkpoint ${page.id} ${c.name}`, async () => {
            await api("DELETE", `/v1/sandboxes/${enc}/checkpoints/${name}`);
            await refreshCheckpoints();
          }, true)));
    }), "No checkpoints.");
  }

  // --- metrics: cpu, memory and tasks drawn over time ---
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  // chart draws one series as a line over its samples' times; a limit, when known, is the
  // top of the scale and drawn dashed.
  function chart(name, title, points, limit, fmt) {
    const W = 320;
    const H = 110;
    const PAD = 4;
    const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": title });
    box.append(svg("rect", { x: 0, y: 0, width: W, height: H, class: "chart-bg" }));
    const last = points.length ? points[points.length - 1].v : undefined;
    // The scale follows the readings (a sandbox far below its limit would be a flat line at
    // the bottom); the limit is drawn when the readings come near it.
    const high = Math.max(...points.map((p) => p.v), 0);
    const top = limit && high > limit * 0.6 ? limit : Math.max(high * 1.25, limit ? limit / 100 : 1e-6);
    if (points.length) {
      const t0 = points[0].t;
      const span = Math.max(points[points.length - 1].t - t0, 1);
      const xy = (p) => [PAD + (W - 2 * PAD) * (points.length === 1 ? 1 : (p.t - t0) / span), H - PAD - (H - 2 * PAD) * Math.min(p.v / top, 1)];
      const line = points.map((p) => xy(p).map((n) => n.toFixed(1)).join(",")).join(" ");
      box.append(svg("polyline", { points: line, class: "chart-line" }));
      if (limit && top === limit) box.append(svg("line", { x1: PAD, x2: W - PAD, y1: PAD, y2: PAD, class: "chart-limit" }));
      box.append(svg("text", { x: W - PAD, y: 12, class: "chart-scale", "text-anchor": "end" }));
      box.lastChild.textContent = fmt(top);
    }
    const caption = el("figcaption", {}, el("strong", {}, title), " ",
      last === undefined ? "no reading yet" : fmt(last), limit ? el("span", { class: "muted" }, ` of ${fmt(limit)}`) : "");
    const fig = el("figure", { class: "chart", "data-metric": name, "data-points": String(points.length) }, caption);
    fig.append(box);
    return fig;
  }

  async function refreshMetrics() {
    const status = $("#sb-metrics-status");
    if (!page.sb || (page.sb.state !== "running" && page.sb.state !== "paused")) {
      status.textContent = page.sb ? `not measured while ${page.sb.state}` : "";
      return;
    }
    let m;
    try {
      m = await api("GET", `/v1/sandboxes/${pageEnc()}/metrics`);
    } catch (err) {
      status.textContent = err.message;
      return;
    }
    const samples = [...(m.history || [])];
    if (!samples.length || Date.parse(m.current.at) > Date.parse(samples[samples.length - 1].at)) samples.push(m.current);
    const series = (f) => samples.filter((s) => f(s) !== undefined && f(s) !== null).map((s) => ({ t: Date.parse(s.at), v: f(s) }));
    const cur = m.current;
    status.textContent = `every ${Math.round(m.interval_ms / 1000)} s, ${samples.length} sample(s)` + (cur.cpu_approximate ? "; CPU approximate" : "");
    const cpus = cur.vcpus || (page.sb.resources && page.sb.resources.vcpus) || 0;
    $("#sb-charts").replaceChildren(
      chart("cpu", "CPU", series((s) => s.cpu_rate), cpus, (v) => `${v.toFixed(2)} CPUs`),
      chart("memory", "Memory", series((s) => s.memory_bytes), cur.memory_limit_bytes || 0, size),
      chart("pids", "Tasks", series((s) => s.pids), cur.pids_limit || 0, (v) => String(Math.round(v))));
  }

  // --- the log, live ---
  async function pollLog() {
    if (!page.id || page.logBusy || view !== "sandbox") return;
    page.logBusy = true;
    try {
      const text = await api("GET", `/v1/sandboxes/${pageEnc()}/logs?tail=${LOG_LINES}`);
      const pre = $("#sb-log");
      if (pre.textContent !== text) {
        const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.textContent = text; // the sandbox wrote it: text, never markup
        if (atEnd) pre.scrollTop = pre.scrollHeight;
      }
    } catch (err) {
      if (err.status === 404) $("#sb-log").textContent = "";
      else throw err;
    } finally {
      page.logBusy = false;
    }
  }

  // --- files ---
  function joinPath(dir, name) { return dir === "/" ? "/" + name : dir + "/" + name; }
  function parentPath(p) {
    const i = p.replace(/\/+$/, "").lastIndexOf("/");
    return i <= 0 ? "/" : p.slice(0, i);
  }

  async function listFiles() {
    if (!page.sb || page.sb.state !== "running") {
      table("#files", [], page.sb ? `The files can be read while the sandbox runs; it is ${page.sb.state}.` : "");
      return;
    }
    const dir = page.filesPath;
    const out = await api("GET", `/v1/sandboxes/${pageEnc()}/files/list?path=${encodeURIComponent(dir)}`);
    const items = (out.items || []).sort((a, b) => (a.type === "directory" ? 0 : 1) - (b.type === "directory" ? 0 : 1) || a.name.localeCompare(b.name));
    table("#files", items.map((f) => {
      const path = joinPath(dir, f.name);
      const nameCell = f.type === "directory"
        ? el("button", { type: "button", class: "link", "data-open": f.name }, f.name + "/")
        : el("span", {}, f.name);
      if (f.type === "directory") nameCell.addEventListener("click", () => { page.filesPath = path; $("#files-path").value = path; background(listFiles); });
      const actions = el("td", { class: "actions" });
      if (f.type === "file") actions.append(actionButton("Download", "download", `download ${path}`, () => download(path, f.name)));
      actions.append(actionButton("Delete", "delete-file", `delete file ${page.id} ${path}`, async () => {
        await api("DELETE", `/v1/sandboxes/${pageEnc()}/files?path=${encodeURIComponent(path)}` + (f.type === "directory" ? "&recursive=true" : ""));
        await listFiles();
      }, true));
      return el("tr", { "data-file": f.name, "data-type": f.type },
        el("td", {}, nameCell), el("td", {}, f.type), el("td", {}, f.type === "file" ? size(f.size) : ""),
        el("td", {}, el("code", {}, f.mode)), el("td", { title: f.modified_at }, `${age(f.modified_at)} ago`), actions);
    }), "The directory is empty.");
  }

  // download saves a file of the sandbox through a blob: the request needs the token, which
  // a plain link cannot carry. The blob's type is forced to octet-stream, so that the browser
  // saves the sandbox's bytes and never renders them.
  async function download(path, name) {
    const resp = await request("GET", `/v1/sandboxes/${pageEnc()}/files?path=${encodeURIComponent(path)}`);
    const blob = new Blob([await resp.blob()], { type: "application/octet-stream" });
    const url = URL.createObjectURL(blob);
    const a = el("a", { href: url, download: name, hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  }

  onSubmit("#files-form", async () => {
    const p = $("#files-path").value.trim() || "/";
    page.filesPath = p;
    await listFiles();
  });
  $("#files-up").addEventListener("click", () => {
    page.filesPath = parentPath(page.filesPath);
    $("#files-path").value = page.filesPath;
    background(listFiles);
  });
  onSubmit("#upload-form", async () => {
    const file = $("#upload-file").files[0];
    if (!file) {
      const err = new Error("Choose a file to upload.");
      err.field = "path";
      throw err;
    }
    await request("PUT", `/v1/sandboxes/${pageEnc()}/files?path=${encodeURIComponent(joinPath(page.filesPath, file.name))}`, file);
    $("#upload-file").value = "";
    await listFiles();
  });

  // --- ports and links ---
  // safeLinkURL makes a link's URL from the server's answer, and only a same-origin
  // http(s) URL under /p/: whatever the answer held, the href never becomes javascript:.
  function safeLinkURL(path) {
    let u;
    try { u = new URL(path, location.origin); } catch (_) { return null; }
    if (u.origin !== location.origin || !u.pathname.startsWith("/p/")) return null;
    return u.href;
  }

  // refreshLinks lists the sandbox's live links, every port's, from the API.
  async function refreshLinks() {
    const id = page.id;
    const seq = ++page.linksSeq;
    const list = await api("GET", `/v1/sandboxes/${pageEnc()}/links`);
    // The page moved on meanwhile, or a link was made here after this list was asked for:
    // the answer is older than what the page shows.
    if (page.id !== id || seq !== page.linksSeq) return;
    page.links = list.items || [];
    renderLinks();
  }

  // renderLinks shows each port's live links, by port, oldest first: a link made here as its
  // URL (with copy), any other as its id; each one with a revoke, confirmed.
  function renderLinks() {
    if (!page.links) {
      table("#links", [], "Listing the links…");
      return;
    }
    const rows = [...page.links].sort((a, b) => a.port - b.port);
    table("#links", rows.map((l) => {
      const path = madeHere.get(l.id);
      const url = path === undefined ? null : safeLinkURL(path);
      const status = el("span", { class: "muted" });
      const copy = url ? actionButton("Copy", "copy-link", `copy ${l.id}`, async () => {
        try {
          await navigator.clipboard.writeText(url);
          status.textContent = " copied";
        } catch (_) {
          status.textContent = " select the link and copy it";
        }
      }) : null;
      const revoke = actionButton("Revoke", "revoke-link", `revoke ${l.id}`, async () => {
        await api("DELETE", `/v1/sandboxes/${pageEnc()}/ports/${l.port}/links/${encodeURIComponent(l.id)}`);
        madeHere.delete(l.id);
        await refreshLinks();
      }, true);
      let shown;
      if (url) shown = el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, url);
      else if (path !== undefined) shown = "(not a link of this server)";
      else shown = el("span", { class: "muted", title: "Its URL was shown once, to whoever made it; make a new link to share one." }, el("code", {}, l.id), " (made elsewhere)");
      return el("tr", { "data-link": l.id, "data-port": String(l.port), "data-made-here": path !== undefined ? "true" : "false" },
        el("td", {}, String(l.port)),
        el("td", {}, shown),
        el("td", { title: l.expires_at }, until(l.expires_at)),
        el("td", { class: "actions" }, copy, revoke, status));
    }), "No live links.");
  }

  onSubmit("#link-form", async () => {
    const port = Number($("#link-port").value);
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      const err = new Error("The port is a number from 1 to 65535.");
      err.field = "port";
      throw err;
    }
    const body = {};
    if ($("#link-ttl").value.trim()) body.ttl_s = Number($("#link-ttl").value);
    const l = await post(`/v1/sandboxes/${pageEnc()}/ports/${port}/links`, body);
    madeHere.set(l.id, l.path);
    page.linksSeq++;
    // Shown at once from the answer; the next listing (any refresh of the page) confirms it.
    page.links = [...(page.links || []).filter((o) => o.id !== l.id),
      { id: l.id, sandbox: l.sandbox, port: l.port, created_at: l.created_at, expires_at: l.expires_at }];
    renderLinks();
  });

  // --- network policy ---
  function lines(text) { return text.split("\n").map((s) => s.trim()).filter(Boolean); }

  function fillNetwork(n) {
    page.netFilled = true;
    $("#net-internet").checked = !!n.internet;
    $("#net-allow").value = (n.allow || []).join("\n");
    $("#net-deny").value = (n.deny || []).join("\n");
    const secrets = Object.entries(n.secrets || {});
    $("#net-secrets").textContent = secrets.length
      ? "Secrets bound (kept as they are): " + secrets.map(([k, b]) => `${k} → ${b.hosts.join(", ")}`).join("; ")
      : "";
  }

  onSubmit("#network-form", async () => {
    const body = { internet: $("#net-internet").checked, allow: lines($("#net-allow").value), deny: lines($("#net-deny").value) };
    const secrets = page.sb && page.sb.network && page.sb.network.secrets;
    if (secrets) body.secrets = secrets;
    const sb = await api("PUT", `/v1/sandboxes/${pageEnc()}/network`, body);
    page.sb = sb;
    fillNetwork(sb.network || {});
    renderSandboxPage(sb);
  });

  // --- terminal ---
  let terminalFor = null;
  let terminalClose = null;

  function closeTerminal() {
    if (terminalClose) terminalClose();
    terminalClose = null;
    terminalFor = null;
    $("#terminal").hidden = true;
    $("#terminal-close").hidden = true;
    $("#terminal-open").hidden = false;
    $("#terminal-title").textContent = "";
  }
  $("#terminal-close").addEventListener("click", closeTerminal);
  $("#terminal-open").addEventListener("click", () => act($("#terminal-open"), () => openTerminal(page.id)));

  async function openTerminal(id) {
    closeTerminal();
    // Failures of the websocket handshake are hidden from scripts: check first, so that a
    // sandbox that is not running is explained rather than a bare "closed".
    const sb = await api("GET", `/v1/sandboxes/${encodeURIComponent(id)}`);
    if (sb.state !== "running") throw new Error(`The sandbox ${id} is ${sb.state}; start it to open a terminal.`);

    $("#terminal").hidden = false;
    $("#terminal-close").hidden = false;
    $("#terminal-open").hidden = true;
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

  // --- templates ---
  async function refreshTemplates() {
    const current = newest("templates");
    const msg = $("#templates-message");
    let templates;
    try {
      templates = await listAll("/v1/templates");
    } catch (err) {
      if (!current()) return;
      $("#templates").replaceChildren();
      msg.textContent = err.status === 501
        ? `Templates are not available on this server yet: ${err.message}`
        : err.message;
      msg.hidden = false;
      return;
    }
    if (!current()) return;
    $("#template-names").replaceChildren(...templates.map((t) => el("option", { value: t.name })));
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
      const rows = await Promise.all(gens.map(async (g) => {
        const gen = encodeURIComponent(g.id);
        const actions = el("td", { class: "actions" });
        const add = (label, action, fn, destructive) => {
          actions.append(actionButton(label, action, `${action} ${t.name} ${g.id}`, fn, destructive));
        };
        if (g.state === "active") {
          add("Clone", "clone", async () => {
            await post("/v1/sandboxes", { template: t.name, generation: g.id, start: true });
            await refreshSandboxes();
            await refreshTemplates();
          });
          add("Tombstone", "tombstone", async () => {
            await post(`/v1/templates/${name}/generations/${gen}/tombstone`);
            await refreshTemplates();
          }, true);
        }
        add("Retire", "retire", async () => {
          await api("DELETE", `/v1/templates/${name}/generations/${gen}?drain=true`);
          await refreshTemplates();
        }, true);
        // Who holds the generation: its leases, each a clone.
        let holders = [];
        if (g.leases > 0) {
          try {
            const leases = await api("GET", `/v1/templates/${name}/generations/${gen}/leases`);
            holders = (leases.items || []).map((l) => [sandboxLink(l.sandbox), " "]);
          } catch (err) {
            holders = [err.message];
          }
        }
        const row = el("tr", { "data-generation": g.id },
          el("td", {}, el("code", {}, g.id)),
          el("td", {}, el("span", { class: "badge " + g.state }, g.state)),
          el("td", {}, el("span", { class: "badge " + g.eligibility }, g.eligibility)),
          el("td", { title: g.captured_at }, age(g.captured_at)),
          el("td", {}, size(g.size_bytes)),
          el("td", {}, String(g.leases)),
          el("td", { class: "holders" }, holders),
          el("td", { class: "lineage" }, lineage(g.source)),
          actions);
        if (highlighted && highlighted.key === `${t.name}@${g.id}` && Date.now() < highlighted.until) lightUp(row);
        return row;
      }));
      return el("div", { class: "template", "data-template": t.name },
        el("h3", {}, el("code", {}, t.name),
          el("span", { class: "muted" }, `${t.generations} generation(s), oldest first` + (t.latest ? `, latest ${t.latest}` : "")),
          el("span", { class: "spacer" }), del),
        problem ? el("p", { class: "muted" }, problem) : null,
        rows.length
          ? el("table", {},
              el("thead", {}, el("tr", {}, ...["generation", "state", "eligibility", "captured", "size", "leases", "leased by", "captured from", ""].map((h) => el("th", {}, h)))),
              el("tbody", {}, rows))
          : el("p", { class: "muted" }, "No generations."));
    }));
    if (!current()) return; // a later refresh began while the generations were read
    $("#templates").replaceChildren(...blocks);
  }

  // highlighted is the generation row a lineage link brought into view, until when: a refresh
  // of the list that redraws the row in that time draws it highlighted too.
  let highlighted = null;

  // lightUp highlights row until highlighted.until.
  function lightUp(row) {
    row.classList.add("highlight");
    setTimeout(() => row.classList.remove("highlight"), Math.max(0, highlighted.until - Date.now()));
  }

  // lineage shows what a generation was captured from: its sandbox (which may be gone since)
  // and, for a clone's capture, the parent generation, which a click brings into view when
  // this page lists it (a parent may be retired before its children).
  function lineage(src) {
    if (!src) return el("span", { class: "muted" }, "not recorded");
    const parts = [sandboxLink(src.sandbox)];
    if (src.template && src.generation) {
      const parent = el("a", { href: "#/templates", "data-parent": `${src.template}@${src.generation}` },
        el("code", {}, `${src.template} @ ${src.generation}`));
      parent.addEventListener("click", (ev) => {
        ev.preventDefault();
        const row = document.querySelector(`div[data-template="${CSS.escape(src.template)}"] tr[data-generation="${CSS.escape(src.generation)}"]`);
        if (!row) {
          showError(new Error(`Generation ${src.generation} of template ${src.template} is not listed here: it was retired, or its template deleted.`));
          return;
        }
        row.scrollIntoView({ block: "center" });
        highlighted = { key: `${src.template}@${src.generation}`, until: Date.now() + 2000 };
        lightUp(row);
      });
      parts.push(" clone of ", parent);
    }
    return el("span", {}, ...parts);
  }

  onSubmit("#template-form", async () => {
    await post("/v1/templates", { name: $("#template-name").value.trim() });
    $("#template-name").value = "";
    await refreshTemplates();
  });
  onSubmit("#capture-form", async () => {
    const tpl = encodeURIComponent($("#capture-template").value.trim());
    await post(`/v1/templates/${tpl}/generations`, { sandbox: $("#capture-sandbox").value.trim() });
    await refreshTemplates();
  });

  // --- images ---
  let images = [];
  const pulls = new Map(); // image name -> Map(layer -> {done, total}), from image.pull.progress

  // pullProgress sums a pull's layers: from the image's own answer, which has every layer's
  // bytes so far, or else from the progress events (sent a few times a second at most).
  function pullProgress(img) {
    let layers = null;
    if ((img.layers || []).some((l) => l.bytes_done !== undefined)) {
      layers = img.layers.map((l) => ({ done: l.bytes_done || 0, total: l.bytes_total === undefined ? -1 : l.bytes_total }));
    } else if (pulls.has(img.name)) {
      layers = [...pulls.get(img.name).values()];
    }
    if (!layers) return null;
    let done = 0;
    let total = 0;
    let known = true;
    for (const l of layers) {
      done += l.done;
      if (l.total < 0) known = false; else total += l.total;
    }
    return { done, total: known ? total : 0, layers: layers.length };
  }

  function renderImages() {
    $("#image-names").replaceChildren(...images.map((i) => el("option", { value: i.name })));
    table("#images", images.map((img) => {
      const name = encodeURIComponent(img.name);
      let state = el("span", { class: "badge " + img.state }, img.state);
      if (img.state === "pulling") {
        const p = pullProgress(img);
        const bar = el("progress", { max: p && p.total ? p.total : 1, value: p && p.total ? p.done : 0 });
        state = el("span", {}, state, " ", bar, p ? ` ${size(p.done)}${p.total ? " of " + size(p.total) : ""} (${p.layers} layer(s))` : "");
      } else if (img.state === "failed") {
        state = el("span", {}, state, el("div", { class: "muted" }, img.error || ""));
      }
      const users = (img.used_by || []).map((u) => {
        const m = /^sandbox (.+)$/.exec(u);
        return [m ? ["sandbox ", sandboxLink(m[1])] : u, el("br")];
      });
      const actions = el("td", { class: "actions" });
      if (img.kind === "oci") {
        actions.append(actionButton("Delete", "delete-image", `delete image ${img.name}`, async () => {
          await api("DELETE", `/v1/images/${name}`);
          await refreshImages();
        }, true));
      }
      return el("tr", { "data-image": img.name, "data-state": img.state },
        el("td", {}, el("code", {}, img.name)),
        el("td", {}, img.kind),
        el("td", {}, state),
        el("td", {}, img.ref || ""),
        el("td", {}, img.size_bytes ? size(img.size_bytes) : ""),
        el("td", { class: "holders" }, users),
        actions);
    }), "No images.");
  }

  async function refreshImages() {
    const current = newest("images");
    const list = await listAll("/v1/images");
    // The list may leave out who uses an image; each image's own answer names them.
    const fresh = await Promise.all(list.map(async (i) => {
      if (i.kind !== "oci" || i.used_by) return i;
      try { return await api("GET", `/v1/images/${encodeURIComponent(i.name)}`); } catch (_) { return i; }
    }));
    if (!current()) return;
    images = fresh;
    renderImages();
  }

  onSubmit("#pull-form", async () => {
    const body = { ref: $("#pull-ref").value.trim() };
    if ($("#pull-name").value.trim()) body.name = $("#pull-name").value.trim();
    if ($("#pull-platform").value.trim()) body.platform = $("#pull-platform").value.trim();
    await post("/v1/images", body);
    $("#pull-ref").value = "";
    $("#pull-name").value = "";
    await refreshImages();
  });
  onSubmit("#import-form", async () => {
    const name = $("#import-name").value.trim();
    const file = $("#import-file").files[0];
    if (!file) {
      const err = new Error("Choose an archive to import.");
      err.field = "name";
      throw err;
    }
    $("#import-status").textContent = `importing ${size(file.size)}…`;
    try {
      await request("PUT", `/v1/images/${encodeURIComponent(name)}`, file);
    } finally {
      $("#import-status").textContent = "";
    }
    $("#import-name").value = "";
    $("#import-file").value = "";
    await refreshImages();
  });

  // --- volumes ---
  async function refreshVolumes() {
    const current = newest("volumes");
    const vols = await listAll("/v1/volumes");
    if (!current()) return;
    table("#volumes", vols.map((v) => el("tr", { "data-volume": v.name },
      el("td", {}, el("code", {}, v.name)),
      el("td", {}, `${v.size_mb} MiB`),
      el("td", {}, size(v.used_bytes)),
      el("td", { title: v.created_at }, `${age(v.created_at)} ago`),
      el("td", { class: "holders" }, (v.sandboxes || []).map((s) => [sandboxLink(s), " "])),
      el("td", { class: "actions" }, actionButton("Delete", "delete-volume", `delete volume ${v.name}`, async () => {
        await api("DELETE", `/v1/volumes/${encodeURIComponent(v.name)}`);
        await refreshVolumes();
      }, true)))), "No volumes.");
  }

  onSubmit("#volume-form", async () => {
    const body = { name: $("#volume-name").value.trim() };
    if ($("#volume-size").value.trim()) body.size_mb = Number($("#volume-size").value);
    await post("/v1/volumes", body);
    $("#volume-name").value = "";
    await refreshVolumes();
  });

  // --- secrets: names only ---
  async function refreshSecrets() {
    const current = newest("secrets");
    const secrets = await listAll("/v1/secrets");
    if (!current()) return;
    table("#secrets", secrets.map((s) => {
      const name = encodeURIComponent(s.name);
      const rotate = el("form", { class: "inline", autocomplete: "off", noValidate: true, "data-rotate": s.name },
        el("label", { class: "field" }, el("span", { class: "sr" }, `New value of ${s.name}`),
          el("input", { type: "password", size: 16, maxLength: 8192, placeholder: "new value", "data-field": "value", autocomplete: "off", required: true })),
        el("button", { type: "submit", "data-action": "rotate" }, "Rotate"));
      rotate.addEventListener("submit", (ev) => {
        ev.preventDefault();
        formAct(rotate, async () => {
          const input = rotate.querySelector("input");
          const value = input.value;
          input.value = ""; // never kept in the page once sent
          await post(`/v1/secrets/${name}/rotate`, { value });
          await refreshSecrets();
        });
      });
      return el("tr", { "data-secret": s.name },
        el("td", {}, el("code", {}, s.name)),
        el("td", { title: s.created_at }, `${age(s.created_at)} ago`),
        el("td", { title: s.rotated_at || "" }, s.rotated_at ? `${age(s.rotated_at)} ago` : "never"),
        el("td", { class: "holders" }, (s.bindings || []).map((b) => [sandboxLink(b.sandbox), ` → ${b.hosts.join(", ")}`, el("br")])),
        el("td", { class: "actions" }, rotate, actionButton("Delete", "delete-secret", `delete secret ${s.name}`, async () => {
          await api("DELETE", `/v1/secrets/${name}`);
          await refreshSecrets();
        }, true)));
    }), "No secrets.");
  }

  onSubmit("#secret-form", async () => {
    const value = $("#secret-value").value;
    $("#secret-value").value = ""; // never kept in the page once sent
    await post("/v1/secrets", { name: $("#secret-name").value.trim(), value });
    $("#secret-name").value = "";
    await refreshSecrets();
  });

  // --- nodes: a cluster router's ---
  // The page is offered when /v1/info carries cluster, which only a router sends; a single
  // bothyd answers the nodes API 501 not-a-cluster.
  function isCluster() { return Boolean(info && info.cluster); }

  function mib(n) { return n >= 1024 ? `${(n / 1024).toFixed(1)} GiB` : `${n} MiB`; }
  function cpus(milli) { return `${(milli / 1000).toFixed(milli % 1000 ? 1 : 0)}`; }

  async function refreshNodes() {
    if (info && !info.cluster) {
      table("#nodes", [], "This server is a single bothyd, not a cluster router: it has no nodes to show.");
      return;
    }
    const current = newest("nodes");
    const nodes = (await api("GET", "/v1/nodes")).items || [];
    if (!current()) return;
    table("#nodes", nodes.map((n) => {
      const name = encodeURIComponent(n.name);
      const health = n.live ? (n.health || "unpublished") : "lost";
      const placement = [n.cordoned ? "cordoned" : "", n.draining ? "draining" : ""].filter(Boolean).join(", ") || "schedulable";
      const drain = n.drain ? ` (${n.drain.remaining} left${n.drain.drained ? ", drained" : ""})` : "";
      const patch = (cordoned) => async () => {
        await api("PATCH", `/v1/nodes/${name}`, { cordoned });
        await refreshNodes();
      };
      const button = n.cordoned
        ? actionButton("Uncordon", "uncordon-node", `uncordon node ${n.name}`, patch(false), true)
        : actionButton("Cordon", "cordon-node", `cordon node ${n.name}`, patch(true), true);
      button.title = n.cordoned ? "Let placement put new sandboxes here again: click again to confirm."
        : "Put no new sandbox here (its own keep running): click again to confirm.";
      return el("tr", { "data-node": n.name, "data-live": String(n.live), "data-cordoned": String(n.cordoned) },
        el("td", {}, el("code", {}, n.name), n.address ? el("div", { class: "muted" }, n.address) : null),
        el("td", { class: "health", "data-health": health, title: n.health_message || "" }, health, n.health_message ? el("div", { class: "muted" }, n.health_message) : null),
        el("td", { class: "placement" }, placement + drain),
        el("td", {}, String(n.sandboxes)),
        el("td", {}, `${mib(n.free.memory_mb)} of ${mib(n.capacity.memory_mb)}`),
        el("td", {}, `${cpus(n.free.milli_cpu)} of ${cpus(n.capacity.milli_cpu)}`),
        el("td", { class: "slots" }, `${n.free.sandboxes} of ${n.capacity.sandboxes}`),
        el("td", { title: n.lease_renewed_at || "" }, n.lease_renewed_at ? `renewed ${age(n.lease_renewed_at)} ago` : "none"),
        el("td", {}, n.version || ""),
        el("td", { class: "actions" }, button));
    }), "No nodes have registered.");
  }

  // --- webhooks ---
  $("#webhook-events").append(...WEBHOOK_EVENTS.map((t) =>
    el("label", { class: "check" }, el("input", { type: "checkbox", value: t, checked: t.startsWith("sandbox.") }), " " + t)));

  function delivery(d) {
    const parts = [`${d.pending} pending, ${d.delivered} delivered, ${d.failed} failed, ${d.dropped} dropped`];
    if (d.last_attempt_at) parts.push(`last attempt ${age(d.last_attempt_at)} ago` + (d.last_status ? ` (HTTP ${d.last_status})` : ""));
    if (d.last_error) parts.push(`error: ${d.last_error}`);
    if (d.next_attempt_at) parts.push(`next ${until(d.next_attempt_at)}`);
    return parts.map((p) => el("div", {}, p));
  }

  async function refreshWebhooks() {
    const current = newest("webhooks");
    const hooks = await listAll("/v1/webhooks");
    if (!current()) return;
    table("#webhooks", hooks.map((h) => el("tr", { "data-webhook": h.id },
      el("td", {}, el("code", {}, h.id)),
      el("td", {}, h.url), // text, not a link
      el("td", {}, h.events.join(", ")),
      el("td", { class: "delivery" }, delivery(h.delivery || {})),
      el("td", { class: "actions" }, actionButton("Delete", "delete-webhook", `delete webhook ${h.id}`, async () => {
        await api("DELETE", `/v1/webhooks/${encodeURIComponent(h.id)}`);
        await refreshWebhooks();
      }, true)))), "No webhooks.");
  }

  onSubmit("#webhook-form", async () => {
    const events = [...document.querySelectorAll("#webhook-events input:checked")].map((i) => i.value);
    const secret = $("#webhook-secret").value;
    $("#webhook-secret").value = "";
    await post("/v1/webhooks", { url: $("#webhook-url").value.trim(), events, secret });
    $("#webhook-url").value = "";
    await refreshWebhooks();
  });

  // --- live events ---
  let source = null;
  let reconnectTimer = null;
  let refreshTimer = null;
  let listTimer = null;

  // scheduleRefresh reloads the current page a little after an event (events come in bursts).
  // A sandbox's page reloads for its own events only, or for one that names no sandbox.
  function scheduleRefresh(e) {
    if (view === "sandbox" && e && e.sandbox && e.sandbox !== page.id && !(e.forks || []).includes(page.id)) {
      if (!listTimer) listTimer = setTimeout(() => { listTimer = null; background(refreshSandboxes); }, 150);
      return;
    }
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      refreshView();
      // The list feeds the home page and the terminal's bookkeeping: keep it current.
      if (view !== "sandboxes") background(refreshSandboxes);
    }, 150);
  }

  function setLive(on, text) {
    const b = $("#live");
    b.textContent = text;
    b.className = "badge " + (on ? "on" : "off");
  }

  function logEvent(e) {
    const what = [e.sandbox, e.template, e.generation, e.checkpoint, e.volume, e.image,
      e.forks && "→ " + e.forks.join(", "), e.state, e.exit && e.exit.reason,
      e.progress && `${e.progress.phase} ${e.progress.bytes_done}${e.progress.bytes_total ? "/" + e.progress.bytes_total : ""}`]
      .filter(Boolean).join(" ");
    const list = $("#events");
    list.prepend(el("li", { "data-type": e.type }, `${new Date(e.at).toLocaleTimeString()}  #${e.seq}  ${e.type}  ${what}`));
    while (list.children.length > MAX_EVENTS) list.lastChild.remove();
  }

  // showCapture follows a capture's progress next to the capture forms.
  function showCapture(e) {
    let text = "";
    if (e.type === "capture.progress" && e.progress) {
      const total = e.progress.bytes_total ? ` of ${size(e.progress.bytes_total)}` : "";
      text = `${e.sandbox} → ${e.template}: ${e.progress.phase} ${size(e.progress.bytes_done)}${total}`;
    } else if (e.type === "generation.captured") {
      text = `${e.sandbox} → ${e.template}: captured as ${e.generation}`;
    } else {
      return;
    }
    $("#capture-status").textContent = text;
  }

  function onEvent(e) {
    if (e.type === "image.pull.progress" && e.image_progress) {
      // Progress comes often: it redraws the list it has, without asking the server again.
      if (!pulls.has(e.image)) pulls.set(e.image, new Map());
      const p = e.image_progress;
      pulls.get(e.image).set(p.diff_id || p.layer || "?", { done: p.bytes_done, total: p.bytes_total });
      if (view === "images") renderImages();
      return;
    }
    if (e.type === "image.pulled" || e.type === "image.failed" || e.type === "image.deleted") pulls.delete(e.image);
    logEvent(e);
    showCapture(e);
    scheduleRefresh(e);
  }

  function connectEvents() {
    if (source) source.close();
    clearTimeout(reconnectTimer);
    const url = "/v1/events" + (token ? "?access_token=" + encodeURIComponent(token) : "");
    source = new EventSource(url);
    source.addEventListener("open", () => {
      setLive(true, "live");
      scheduleRefresh(); // catch up on anything missed while disconnected
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
        onEvent(e);
      });
    }
  }

  // --- the server's limits and the state root's health ---
  // showLimits writes the server's defaults and limits beside the fields they bound.
  function showLimits() {
    const l = info && info.limits;
    if (!l) return;
    const def = l.default_resources || {};
    const max = l.max_resources || {};
    for (const key of ["vcpus", "memory_mb", "pids", "disk_mb"]) {
      for (const h of document.querySelectorAll(`[data-hint="${key}"]`)) {
        h.textContent = `default ${def[key]}` + (max[key] !== undefined ? `, up to ${max[key]}` : "");
      }
      for (const i of document.querySelectorAll(`input[data-limit="${key}"]`)) {
        i.placeholder = String(def[key]);
        if (max[key]) i.max = String(max[key]);
      }
    }
    for (const h of document.querySelectorAll('[data-hint="max_file_bytes"]')) h.textContent = `up to ${size(l.max_file_bytes)}`;
    if (l.max_port_link_ttl_seconds) {
      for (const h of document.querySelectorAll('[data-hint="max_port_link_ttl_seconds"]')) h.textContent = `default 3600, up to ${l.max_port_link_ttl_seconds}`;
      $("#link-ttl").max = String(l.max_port_link_ttl_seconds);
    }
  }

  // refreshStorage shows a banner in the header while the state root is full or unavailable:
  // then creates, starts and uploads fail, while reads, stops and deletes still work.
  async function refreshStorage() {
    info = await api("GET", "/v1/info");
    showLimits();
    $("#nav-nodes").hidden = !isCluster();
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

  // fillNames offers the images' and templates' names to the fields that take one.
  async function fillNames() {
    const [imgs, tpls] = await Promise.all([listAll("/v1/images"), listAll("/v1/templates").catch(() => [])]);
    $("#image-names").replaceChildren(...imgs.map((i) => el("option", { value: i.name })));
    $("#template-names").replaceChildren(...tpls.map((t) => el("option", { value: t.name })));
  }

  function refreshAll() {
    background(async () => {
      await refreshStorage();
      await refreshSandboxes();
      await fillNames();
    });
    navigate();
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

  // A pull's bytes come faster than its events: follow them while one runs.
  setInterval(() => {
    if (view === "images" && images.some((i) => i.state === "pulling")) refreshImages().catch(() => {});
  }, 1000);
  // A webhook's deliveries change without an event: look again while its page is open.
  setInterval(() => { if (view === "webhooks") refreshWebhooks().catch(() => {}); }, 3000);
  // Leases, health and capacity change without an event: look again while the nodes are shown.
  setInterval(() => { if (view === "nodes") refreshNodes().catch(() => {}); }, 3000);
  // Ages move on while nothing happens.
  setInterval(() => { if (view === "sandboxes") renderSandboxes(); }, 15000);
  // The state root's health changes without an event: look again now and then.
  setInterval(() => { refreshStorage().catch(() => {}); }, 10000);
  // A login URL opened over the page itself changes only its fragment: no new page load.
  window.addEventListener("hashchange", () => {
    if (location.hash.startsWith("#login=")) start();
    else navigate();
  });
  start();
})();
