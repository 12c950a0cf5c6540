// Building the page from data without ever parsing data as HTML: every value from an index, a query or
// the server becomes a text node (a document whose text is "<script>" shows as that text), and links
// are made only to this console's own views or to http(s) addresses.

/** An element: h("a", {class: "x", href: "#/search", on: {click: fn}}, "text", child, [more]). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "on") {
      for (const [event, handler] of Object.entries(value)) el.addEventListener(event, handler);
    } else if (name === "class") {
      el.className = value;
    } else if (name === "href") {
      el.setAttribute("href", safeHref(value));
    } else if (value === true) {
      el.setAttribute(name, "");
    } else {
      el.setAttribute(name, String(value));
    }
  }
  append(el, children);
  return el;
}

/** Append children (strings as text, nodes, nested arrays; null and false skipped). */
export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** A link target that cannot run code: this console's #/views, or an absolute http(s) address. */
export function safeHref(value) {
  const text = String(value);
  if (text.startsWith("#")) return text;
  try {
    const url = new URL(text);
    if (url.protocol === "http:" || url.protocol === "https:") return url.href;
  } catch {
    // not an absolute URL: no link
  }
  return "#";
}

/** An external address as a link (opened without a referrer), or as plain text when it is not http(s). */
export function externalLink(url) {
  const href = safeHref(url);
  if (href === "#") return h("span", {class: "mono"}, url);
  return h("a", {href, rel: "noopener noreferrer", target: "_blank"}, url);
}

/** Replace an element's children. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** Where `needle` first occurs in `text` (whitespace-insensitive): {start, end}, or null. */
export function locate(text, needle) {
  const words = String(needle || "").trim().split(/\s+/).filter(Boolean);
  if (!words.length) return null;
  const escaped = words.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const found = new RegExp(escaped.join("\\s+")).exec(text);
  return found ? {start: found.index, end: found.index + found[0].length} : null;
}

/** Up to about `size` characters of `text` as nodes: around the span `at` (in a <mark>) when given,
 *  else its beginning; an ellipsis where text was cut. */
export function snippet(text, at, size = 600) {
  if (!at) return text.length > size ? [text.slice(0, size).trimEnd(), " …"] : [text];
  const room = Math.max(size - (at.end - at.start), 0);
  let from = Math.max(0, at.start - Math.floor(room * 0.4));
  let to = Math.min(text.length, at.end + Math.ceil(room * 0.6));
  if (from > 0) from = Math.min(at.start, from + Math.max(0, text.slice(from).search(/\s/)) + 1); // whole words
  if (to < text.length) to = Math.max(at.end, text.lastIndexOf(" ", to));
  return [from > 0 ? "… " : "", text.slice(from, at.start), h("mark", {}, text.slice(at.start, at.end)),
    text.slice(at.end, to), to < text.length ? " …" : ""];
}

/** A number with `digits` decimals, or "–" for none. */
export function num(value, digits = 3) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

/** Bytes as B, KiB, MiB, GiB. */
export function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = Number(value);
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) {
    size /= 1024;
    unit += 1;
  }
  return `${size.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

/** A definition list from [term, value] pairs (values: text or nodes). */
export function facts(pairs) {
  return h("dl", {class: "facts"}, pairs.map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

/** A table from column headings and rows of cells (text or nodes). */
export function table(headings, rows, attrs = {}) {
  return h("table", attrs,
    h("thead", {}, h("tr", {}, headings.map((x) => h("th", {scope: "col"}, x)))),
    h("tbody", {}, rows.map((row) => h("tr", {}, row.map((cell) => h("td", {}, cell))))));
}

/** The box that shows an API error: its kind, the server's message and each invalid field. */
export function errorBox(error) {
  const detail = (error.detail || []).map((d) => h("li", {}, `${(d.loc || []).join(".")}: ${d.msg}`));
  return h("div", {class: "error", role: "alert"},
    h("strong", {}, error.status ? `${error.status} ${error.kind}` : error.kind), " ",
    h("span", {class: "message"}, error.message),
    detail.length ? h("ul", {}, detail) : null);
}

/** A metadata value as text (lists joined, booleans and numbers as JSON writes them). */
export function metaText(value) {
  return Array.isArray(value) ? value.join(", ") : String(value);
}

/** A document's metadata as a definition list, or nothing when it has none. */
export function metadataList(metadata) {
  const entries = Object.entries(metadata || {});
  if (!entries.length) return null;
  return h("dl", {class: "meta"}, entries.map(([key, value]) => [h("dt", {}, key), h("dd", {}, metaText(value))]));
}
