// Index: what `qrag info` shows (representation, model, counts, fields with their types, sample chunks
// with their generated questions), a chunk's page with every vector's text, and a document's page.

import {call, describeIndex, segment} from "./api.js";
import {bytes, errorBox, externalLink, facts, h, metadataList, replace, table} from "./dom.js";

function chunkLink(id, label) {
  return h("a", {href: `#/chunk/${encodeURIComponent(id)}`}, label || id);
}

function docLink(id, label) {
  return h("a", {href: `#/doc/${encodeURIComponent(id)}`}, label || id);
}

function loading(main, what) {
  replace(main, h("p", {class: "status", role: "status"}, `Reading ${what}…`));
}

export async function showIndex(main, view) {
  loading(main, "the index");
  let info;
  try {
    info = await describeIndex();
  } catch (error) {
    if (!view.closed) replace(main, errorBox(error));
    return;
  }
  if (view.closed) return;
  const counts = info.counts || {};
  const overview = facts([
    ["index", info.name],
    ["version", h("code", {}, info.index_version)],
    ["representation", `${info.representation || "–"}${info.preset ? ` (preset ${info.preset})` : ""}`],
    ["vector kinds", (info.kinds || []).join(", ") || "–"],
    ["embedder", `${info.embedder.model || "–"} (${info.embedder.dim || "?"} dimensions)`],
    ["shards", String(info.num_shards)],
    ["documents", counts.documents ?? "–"],
    ["chunks", counts.chunks ?? "–"],
    ["vectors", counts.vectors ?? "–"],
    ["BM25", info.bm25 ? `${info.bm25.docs} chunks, ${info.bm25.vocabulary} terms` +
      (info.bm25.alpha === null ? " (searches dense unless asked)" : `, hybrid at α ${info.bm25.alpha}`) : "none"],
    ["LLM on this server", info.llm ? "yes (HyDE and answers)" : "no"],
    ["on disk", `${bytes(info.bytes.total)} (FAISS ${bytes(info.bytes.faiss)}, rows ${bytes(info.bytes.rows)}, ` +
      `chunks ${bytes(info.bytes.chunks)}, BM25 ${bytes(info.bytes.bm25)})`],
    ["built", info.created_at ? `${info.created_at}${info.build_seconds ? ` in ${info.build_seconds.toFixed(1)} s` : ""}` : "–"],
  ]);
  const kinds = table(["kind", "vectors"], Object.entries(info.vectors_per_kind || {}).map(([k, n]) => [k, String(n)]));
  const fields = (info.fields || []).length
    ? table(["field", "type", "filter operators"], info.fields.map((f) => [h("code", {}, f.name), f.type,
      f.operators.join(" ")]))
    : h("p", {class: "muted"}, "No metadata fields: records were indexed without a metadata object.");
  const samples = (info.samples || []).map((s) => h("article", {class: "sample"},
    h("h3", {}, chunkLink(s.chunk_id, s.title || s.chunk_id)),
    h("p", {class: "ids"}, "document ", docLink(s.doc_id), " · chunk ", h("code", {}, s.chunk_id)),
    h("p", {class: "chunk-text clamp"}, s.text),
    s.questions.length
      ? h("div", {class: "questions"}, h("span", {class: "label"}, "generated questions"),
        h("ul", {}, s.questions.map((q) => h("li", {}, q))))
      : h("p", {class: "muted small"}, "no generated questions")));
  replace(main,
    h("section", {class: "panel"}, h("h2", {}, "Index"), overview),
    h("div", {class: "columns"},
      h("section", {class: "panel"}, h("h2", {}, "Vectors per kind"), kinds),
      h("section", {class: "panel"}, h("h2", {}, "Metadata fields"), fields)),
    h("section", {class: "panel"}, h("h2", {}, "Sample chunks"), samples.length ? samples
      : h("p", {class: "muted"}, "The index has no chunks.")));
}

export async function showChunk(main, view, chunkId) {
  loading(main, `chunk ${chunkId}`);
  let chunk;
  let vectors;
  try {
    [chunk, vectors] = await Promise.all([call(`v1/chunks/${segment(chunkId)}`),
      call(`v1/console/vectors/${segment(chunkId)}`)]);
  } catch (error) {
    if (!view.closed) replace(main, h("section", {class: "panel"}, h("h2", {}, "Chunk"), errorBox(error)));
    return;
  }
  if (view.closed) return;
  const byKind = new Map();
  for (const v of vectors.vectors) {
    if (!byKind.has(v.kind)) byKind.set(v.kind, []);
    byKind.get(v.kind).push(v.text);
  }
  replace(main,
    h("section", {class: "panel"},
      h("p", {class: "crumbs"}, h("a", {href: "#/search"}, "Search"), " › document ", docLink(chunk.doc_id),
        " › chunk"),
      h("h2", {}, chunk.title || chunk.chunk_id),
      facts([["chunk", h("code", {}, chunk.chunk_id)], ["document", docLink(chunk.doc_id)],
        ["url", chunk.url ? externalLink(chunk.url) : "–"], ["index version", h("code", {}, chunk.index_version)]]),
      h("p", {class: "chunk-text full"}, chunk.text),
      metadataList(chunk.metadata)),
    h("section", {class: "panel"},
      h("h2", {}, `Its ${vectors.vectors.length} vectors`),
      h("p", {class: "muted small"}, "Every text the index embedded for this chunk: a query is compared with each."),
      [...byKind.entries()].map(([kind, texts]) => h("div", {class: "vector-kind"},
        h("h3", {}, `${kind} (${texts.length})`),
        h("ol", {class: `vectors ${kind}`}, texts.map((t) => h("li", {}, t)))))));
  main.querySelector("h2").setAttribute("tabindex", "-1");
  main.querySelector("h2").focus();
}

export async function showDocument(main, view, docId) {
  loading(main, `document ${docId}`);
  let doc;
  try {
    doc = await call(`v1/documents/${segment(docId)}`);
  } catch (error) {
    if (!view.closed) replace(main, h("section", {class: "panel"}, h("h2", {}, "Document"), errorBox(error)));
    return;
  }
  if (view.closed) return;
  replace(main,
    h("section", {class: "panel"},
      h("p", {class: "crumbs"}, h("a", {href: "#/search"}, "Search"), " › document"),
      h("h2", {}, doc.title || doc.doc_id),
      facts([["document", h("code", {}, doc.doc_id)], ["url", doc.url ? externalLink(doc.url) : "–"],
        ["chunks", String(doc.chunks.length)], ["index version", h("code", {}, doc.index_version)]]),
      metadataList(doc.metadata)),
    doc.chunks.map((c) => h("section", {class: "panel"},
      h("h3", {}, chunkLink(c.chunk_id, c.chunk_id)),
      h("p", {class: "chunk-text full"}, c.text),
      c.questions.length ? h("div", {class: "questions"}, h("span", {class: "label"}, "generated questions"),
        h("ul", {}, c.questions.map((q) => h("li", {}, q)))) : null)));
  main.querySelector("h2").setAttribute("tabindex", "-1");
  main.querySelector("h2").focus();
}
