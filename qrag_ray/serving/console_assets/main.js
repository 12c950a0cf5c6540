// The console's entry: the key form in the header, and the view the URL's #fragment names
// (#/search, #/index, #/chunk/<id>, #/doc/<id>, #/operate). The fragment never holds a key.

import {keys} from "./api.js";
import {h, replace} from "./dom.js";
import {showIndex, showChunk, showDocument} from "./view_index.js";
import {showOperate} from "./view_operate.js";
import {showSearch} from "./view_search.js";

const main = document.getElementById("main");
let current = {closed: false}; // the view on screen; a view stops its work (polling) once closed

function route() {
  const hash = location.hash || "#/search";
  const [, view = "search", ...rest] = hash.split("/");
  return {view, arg: rest.length ? decodeURIComponent(rest.join("/")) : ""};
}

function markNav(view) {
  const section = {chunk: "index", doc: "index"}[view] || view;
  for (const link of document.querySelectorAll("nav a[data-view]")) {
    if (link.dataset.view === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function keyNeeded() {
  return h("section", {class: "panel notice"},
    h("h2", {}, "An API key is needed"),
    h("p", {}, "Type your tenant's API key in the box above (",
      h("code", {}, "qrag tenants add"), " printed it). It stays in this browser tab only: never in the address, ",
      "a cookie or the server's logs; closing the tab forgets it."),
    h("p", {}, "A server started with ", h("code", {}, "--index"), " (no tenants file) takes no key:"),
    h("button", {type: "button", class: "secondary", on: {click: () => {
      keys.setOpen();
      refreshKeyState();
      show();
    }}}, "Continue without a key"));
}

function show() {
  current.closed = true;
  current = {closed: false};
  const {view, arg} = route();
  markNav(view);
  refreshKeyState();
  const needsKey = view !== "operate";
  if (needsKey && !keys.ready()) {
    replace(main, keyNeeded());
    return;
  }
  const views = {
    search: () => showSearch(main, current),
    index: () => showIndex(main, current),
    chunk: () => showChunk(main, current, arg),
    doc: () => showDocument(main, current, arg),
    operate: () => showOperate(main, current),
  };
  (views[view] || views.search)();
}

function refreshKeyState() {
  const form = document.getElementById("key-form");
  const state = document.getElementById("key-state");
  const label = document.getElementById("key-label");
  const ready = keys.ready();
  form.hidden = ready;
  state.hidden = !ready;
  label.textContent = keys.open() ? "no key (open server)" : "key set · this tab only";
}

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("key-input");
  const key = input.value.trim();
  input.value = "";
  if (!key) return;
  keys.setTenant(key);
  refreshKeyState();
  show();
});

document.getElementById("key-forget").addEventListener("click", () => {
  keys.forget();
  refreshKeyState();
  show();
  document.getElementById("key-input").focus();
});

window.addEventListener("hashchange", show);
refreshKeyState();
show();
