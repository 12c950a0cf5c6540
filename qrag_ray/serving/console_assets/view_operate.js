// Operate (the admin key only): every tenant with its served version, shards, bytes and its requests in
// the answering Router replica's last minute (rate, p50, p99, errors), each store's cache counts, and the
// app's deployments with their replicas; read again every two seconds while the view is open.

import {call, keys} from "./api.js";
import {bytes, errorBox, h, num, replace, table} from "./dom.js";

const REFRESH_MS = 2000;

function adminForm(main, view, message) {
  const input = h("input", {id: "admin-key", type: "password", autocomplete: "off", spellcheck: "false",
    placeholder: "qrag_…", "aria-label": "Admin key"});
  const form = h("form", {class: "inline-form", on: {submit: (event) => {
    event.preventDefault();
    const key = input.value.trim();
    input.value = "";
    if (!key) return;
    keys.setAdmin(key);
    showOperate(main, view);
  }}}, input, h("button", {type: "submit", class: "primary"}, "Use admin key"));
  replace(main, h("section", {class: "panel notice"},
    h("h2", {}, "Operate"),
    h("p", {}, "The operate view needs the admin key (", h("code", {}, "qrag tenants admin-key"),
      " printed it); like the tenant key it stays in this tab only."),
    message ? errorBox(message) : null, form));
  input.focus();
}

export async function showOperate(main, view) {
  if (!keys.admin() && !keys.open()) {
    adminForm(main, view, null);
    return;
  }
  const stamp = h("span", {class: "muted small", role: "status"}, "reading…");
  const head = h("div", {class: "panel-head"}, h("h2", {}, "Operate"), stamp);
  const body = h("div", {}, h("section", {class: "panel"}, head));
  replace(main, body);
  while (!view.closed) {
    let data;
    try {
      data = await call("v1/console/operate", {admin: true});
    } catch (error) {
      if (view.closed) return;
      if (error.status === 401 || error.status === 403) {
        keys.setAdmin("");
        adminForm(main, view, error);
        return;
      }
      replace(body, errorBox(error));
      await sleep(REFRESH_MS);
      continue;
    }
    if (view.closed) return;
    render(body, head, data);
    stamp.textContent = `updated ${new Date(data.at * 1000).toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
    await sleep(REFRESH_MS);
  }
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function chip(status) {
  return h("span", {class: `chip ${status}`}, status);
}

function requestCells(r) {
  if (!r) return ["0", "–", "–", "–", "0"];
  return [String(r.requests), num(r.per_s, 2), `${num(r.p50_ms, 1)} ms`, `${num(r.p99_ms, 1)} ms`,
    r.server_errors ? `${r.errors} (${r.server_errors} 5xx)` : String(r.errors)];
}

function render(body, head, data) {
  const window = `last ${Math.round(data.window_s)} s`;
  const tenants = table(
    ["tenant", "status", "serving version", "shards", "searched in", "on disk", `requests (${window})`, "per s",
      "p50", "p99", "errors"],
    data.tenants.map((t) => [
      h("strong", {}, t.name), [chip(t.status), t.problems.length ? h("div", {class: "small"}, t.problems.join("; ")) : null],
      t.serving_version ? h("code", {}, t.serving_version) : "not loaded", t.num_shards ?? "–", t.searched_in || "–",
      bytes(t.index_bytes), ...requestCells(t.requests)]),
    {class: "wide", id: "tenants-table"});
  const anonymous = data.unauthenticated
    ? h("p", {class: "muted small"}, `Without a known key: ${data.unauthenticated.requests} requests, ` +
      `${data.unauthenticated.errors} errors (${window}).`) : null;
  const caches = table(["store", "shards", "bytes", "budget", "hits", "loads", "evictions"],
    data.caches.map((c) => [c.where, c.reachable ? String(c.loaded ?? "–") : h("span", {class: "chip error"},
      c.error || "unreachable"), bytes(c.bytes), bytes(c.max_bytes), String(c.hits), String(c.cold_loads),
    String(c.evictions)]), {class: "numbers"});
  const deployments = data.deployments.length
    ? table(["deployment", "status", "replicas"], data.deployments.map((d) => [d.name, chip(d.status.toLowerCase()),
      Object.entries(d.replicas).map(([state, n]) => `${n} ${state.toLowerCase()}`).join(", ") || "0"]),
    {id: "deployments-table"})
    : h("p", {class: "muted"}, data.deployments_error || "no deployments reported");
  replace(body,
    h("section", {class: "panel"}, head,
      h("p", {}, "Server ", chip(data.status), data.ready ? " ready" : " warming up", ` · ${data.inflight} in flight · `,
        `${data.registry.tenants} tenants`, data.registry.error ? h("span", {class: "chip error"}, data.registry.error) : null),
      h("h3", {}, "Tenants"), tenants, anonymous,
      h("p", {class: "muted small"}, `Requests are those of the Router replica that answered (${data.replica || "?"});`,
        " Prometheus (qrag_request_latency_ms) has every replica's.")),
    h("div", {class: "columns wide-left"},
      h("section", {class: "panel"}, h("h3", {}, "Shard caches"), caches),
      h("section", {class: "panel"}, h("h3", {}, "Deployments"), deployments)));
}
