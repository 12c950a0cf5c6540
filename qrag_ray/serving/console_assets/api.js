// The public API, called with the key typed into the page. The key lives in this tab's sessionStorage
// only: never in a URL, a cookie or localStorage, and it is sent only as an Authorization header to this
// server (the page's Content-Security-Policy allows no other origin).

const TENANT_KEY = "qrag-console.key";
const ADMIN_KEY = "qrag-console.admin";
const OPEN = "qrag-console.open"; // "1": the server has no tenants file, so no key is sent

/** The app's root: the console lives at <root>console/, whatever prefix the app is served under. */
export const root = new URL("../", document.baseURI);

/** The address of an API path, e.g. apiUrl("v1/search"). */
export function apiUrl(path, params) {
  const url = new URL(path.replace(/^\//, ""), root);
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  return url;
}

/** The root written for code a developer copies (no trailing slash). */
export function serverUrl() {
  return root.href.replace(/\/$/, "");
}

export const keys = {
  tenant: () => sessionStorage.getItem(TENANT_KEY) || "",
  admin: () => sessionStorage.getItem(ADMIN_KEY) || "",
  open: () => sessionStorage.getItem(OPEN) === "1",
  /** Whether the page may call the tenant API: a key, or a server without keys. */
  ready: () => Boolean(sessionStorage.getItem(TENANT_KEY)) || sessionStorage.getItem(OPEN) === "1",
  setTenant(key) {
    sessionStorage.setItem(TENANT_KEY, key);
    sessionStorage.removeItem(OPEN);
  },
  setOpen() {
    sessionStorage.removeItem(TENANT_KEY);
    sessionStorage.setItem(OPEN, "1");
  },
  setAdmin(key) {
    sessionStorage.setItem(ADMIN_KEY, key);
  },
  forget() {
    for (const name of [TENANT_KEY, ADMIN_KEY, OPEN]) sessionStorage.removeItem(name);
  },
};

/** An error answer of the API: its status, its stable kind, its one-line message and the invalid fields. */
export class ApiError extends Error {
  constructor(status, kind, message, detail) {
    super(message);
    this.status = status;
    this.kind = kind;
    this.detail = detail || [];
  }
}

/** Call the API; the JSON body, or an ApiError carrying the server's own message. `admin`: send the
 *  admin key instead of the tenant's. */
export async function call(path, {method = "GET", body, params, admin = false, signal} = {}) {
  const headers = {Accept: "application/json"};
  const key = admin ? keys.admin() : keys.tenant();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(apiUrl(path, params), {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal,
      cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer",
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "unreachable", `the server did not answer (${error.message})`);
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.error) || "http_error",
      (data && data.message) || `HTTP ${response.status}`, data && data.detail);
  }
  return data;
}

/** A chunk or document id as one path segment ("#" and "/" percent-encoded, as the API wants). */
export function segment(id) {
  return encodeURIComponent(id);
}

let described = null; // the key's index description (GET v1/console/index), fetched once per key

/** The key's index as `qrag info` describes it, with its fields' filter operators and whether the
 *  server has an LLM; cached until the key changes. */
export function describeIndex() {
  const key = keys.tenant();
  if (!described || described.key !== key) {
    const promise = call("v1/console/index", {params: {sample: 5}});
    described = {key, promise};
    promise.catch(() => {
      if (described && described.promise === promise) described = null;
    });
  }
  return described.promise;
}
