// Search: a question with k, a mode, a filter (built from the index's metadata fields or typed as JSON)
// and doc ids; each result with the question or sentence that matched highlighted, its score parts and
// metadata; /v1/answer's answer with its citations linked to the results; and the same request as curl
// and as a QragClient call.

import {call, describeIndex, keys, serverUrl} from "./api.js";
import {errorBox, h, locate, metadataList, num, replace, snippet} from "./dom.js";

const QUESTION_KINDS = new Set(["question", "quote", "atomquote"]);
const SENTENCE_KINDS = new Set(["sentence", "window"]);
const HYBRID_ALPHA = 0.67; // the presets' dense weight, for an index with a BM25 channel but no default
const ALPHAS = {dense: 1.0, bm25: 0.0, hybrid: HYBRID_ALPHA};

// what the view shows, kept while the person looks at a chunk or document and comes back
const state = {
  form: {query: "", k: 10, mode: "index", filterMode: "fields", combine: "and", rows: [], json: "", docIds: ""},
  outcome: null, // {kind: "search"|"answer", body, response} of the last request
  error: null,
};

export async function showSearch(main, view) {
  const status = h("p", {class: "status", role: "status", "aria-live": "polite"});
  const results = h("section", {class: "results", "aria-label": "Results"});
  const code = h("pre", {class: "code-block", id: "code-curl"});
  const python = h("pre", {class: "code-block", id: "code-python"});
  const formBox = h("section", {class: "panel"}, h("p", {class: "muted"}, "Reading the index…"));
  replace(main, formBox,
    h("details", {class: "panel code"},
      h("summary", {}, "The same request from code"),
      h("h3", {}, "curl"), code, copyButton(code),
      h("h3", {}, "Python (qrag-client)"), python, copyButton(python)),
    status, results);
  let info;
  try {
    info = await describeIndex();
  } catch (error) {
    if (view.closed) return;
    replace(formBox, errorBox(error));
    return;
  }
  if (view.closed) return;
  const form = buildForm(info, {results, status, code, python});
  replace(formBox, form);
  renderOutcome(results, info);
  showCode(info, code, python);
  form.querySelector("#query").focus();
}

function copyButton(pre) {
  return h("button", {type: "button", class: "secondary small", on: {click: async (event) => {
    try {
      await navigator.clipboard.writeText(pre.textContent);
      event.target.textContent = "Copied";
    } catch {
      event.target.textContent = "Select and copy";
    }
  }}}, "Copy");
}

// ------------------------------------------------------------------------------------ the form
function modes(info) {
  const out = [];
  if (info.bm25 && info.bm25_alpha !== null && info.bm25_alpha !== undefined) {
    out.push(["index", `hybrid (dense + BM25, α ${info.bm25_alpha})`], ["dense", "dense only"], ["bm25", "BM25 only"]);
  } else if (info.bm25) {
    out.push(["index", "dense"], ["hybrid", `hybrid (dense + BM25, α ${HYBRID_ALPHA})`], ["bm25", "BM25 only"]);
  } else {
    out.push(["index", "dense"]);
  }
  if (info.llm) out.push(["hyde", "HyDE (an LLM passage is embedded)"]);
  return out;
}

function buildForm(info, parts) {
  const f = state.form;
  if (!modes(info).some(([value]) => value === f.mode)) f.mode = "index";
  const fields = info.fields || [];
  const rows = h("div", {class: "rows"});
  const query = h("input", {id: "query", type: "search", name: "query", required: true, maxlength: 2000,
    placeholder: "Ask a question…", value: f.query, autocomplete: "off", "aria-label": "Question"});
  const k = h("input", {id: "k", type: "number", min: 1, max: 1000, value: f.k, inputmode: "numeric"});
  const mode = h("select", {id: "mode"}, modes(info).map(([value, label]) =>
    h("option", {value, selected: value === f.mode}, label)));
  const docIds = h("input", {id: "doc-ids", value: f.docIds, placeholder: "comma-separated document ids",
    autocomplete: "off"});
  const combine = h("select", {id: "combine", "aria-label": "Combine conditions"},
    h("option", {value: "and", selected: f.combine === "and"}, "all"),
    h("option", {value: "or", selected: f.combine === "or"}, "any"));
  const json = h("textarea", {id: "filter-json", rows: 4, spellcheck: "false", "aria-label": "Filter as JSON",
    placeholder: '{"type": "eq", "key": "group", "value": "loops"}'}, f.json);
  const byFields = h("div", {id: "filter-fields", hidden: f.filterMode !== "fields"},
    fields.length
      ? [h("p", {class: "inline"}, "Chunks whose document matches ", combine, " of:"), rows,
        h("button", {type: "button", class: "secondary small", id: "add-condition",
          on: {click: () => {
            f.rows.push({field: fields[0].name, op: fields[0].operators[0], value: ""});
            renderRows(rows, fields, changed);
            rows.querySelector(".condition:last-child select").focus();
          }}}, "+ condition")]
      : h("p", {class: "muted"}, "This index has no metadata fields (doc ids still select documents)."));
  const byJson = h("div", {id: "filter-json-box", hidden: f.filterMode !== "json"}, json,
    h("p", {class: "muted small"}, "OpenAI's vector-store grammar: eq ne gt gte lt lte in nin, and/or."));
  const radio = (value, label) => h("label", {class: "choice"},
    h("input", {type: "radio", name: "filter-mode", value, checked: f.filterMode === value,
      on: {change: () => {
        f.filterMode = value;
        byFields.hidden = value !== "fields";
        byJson.hidden = value !== "json";
        changed();
      }}}), label);
  const search = h("button", {type: "submit", class: "primary", id: "search"}, "Search");
  const answer = info.llm ? h("button", {type: "button", class: "secondary", id: "answer",
    on: {click: () => submit("answer")}}, "Answer") : null;

  function changed() {
    f.query = query.value;
    f.k = k.value;
    f.mode = mode.value;
    f.docIds = docIds.value;
    f.combine = combine.value;
    f.json = json.value;
    showCode(info, parts.code, parts.python);
  }

  async function submit(kind) {
    changed();
    const built = requestBody(info);
    if (built.problem) {
      state.outcome = null;
      state.error = {status: 0, kind: "invalid_filter", message: built.problem};
      renderOutcome(parts.results, info);
      return;
    }
    search.disabled = true;
    if (answer) answer.disabled = true;
    parts.status.textContent = kind === "answer" ? "Answering…" : "Searching…";
    try {
      const response = await call(kind === "answer" ? "v1/answer" : "v1/search", {method: "POST", body: built.body});
      state.outcome = {kind, body: built.body, response};
      state.error = null;
      parts.status.textContent = `${response.results.length} results from '${response.index}' ` +
        `(version ${response.index_version}) in ${Math.round(response.took_ms)} ms`;
    } catch (error) {
      state.outcome = null;
      state.error = error;
      parts.status.textContent = "";
    } finally {
      search.disabled = false;
      if (answer) answer.disabled = false;
    }
    renderOutcome(parts.results, info);
    showCode(info, parts.code, parts.python);
  }

  const form = h("form", {id: "search-form", class: "search-form", on: {
    submit: (event) => {
      event.preventDefault();
      submit("search");
    },
    input: changed,
    change: changed,
  }},
  h("div", {class: "query-row"}, query, search, answer),
  h("div", {class: "options"},
    h("label", {}, "k ", k),
    h("label", {}, "mode ", mode),
    h("label", {class: "grow"}, "doc ids ", docIds)),
  h("fieldset", {class: "filter"},
    h("legend", {}, "Filter"),
    h("div", {class: "filter-mode"}, radio("fields", "by field"), radio("json", "as JSON")),
    byFields, byJson));
  renderRows(rows, fields, changed);
  return form;
}

function valueInput(field, op, value) {
  const attrs = {class: "value", value, "aria-label": "Value", autocomplete: "off"};
  if (op === "in" || op === "nin") return h("input", {...attrs, placeholder: "values, comma-separated"});
  if (field.type === "bool") {
    return h("select", {class: "value", "aria-label": "Value"},
      ["true", "false"].map((x) => h("option", {value: x, selected: value === x}, x)));
  }
  if (field.type === "number") return h("input", {...attrs, type: "number", step: "any"});
  if (field.type === "date") return h("input", {...attrs, type: "date"});
  if (field.type === "datetime") return h("input", {...attrs, placeholder: "2024-04-01T12:00:00Z"});
  return h("input", attrs);
}

function renderRows(rowsBox, fields, changed) {
  const rows = state.form.rows;
  replace(rowsBox, rows.map((row, i) => {
    const field = fields.find((x) => x.name === row.field) || fields[0];
    if (!field.operators.includes(row.op)) row.op = field.operators[0];
    const fieldSelect = h("select", {"aria-label": "Field", on: {change: (event) => {
      row.field = event.target.value;
      row.value = "";
      renderRows(rowsBox, fields, changed);
      rowsBox.children[i].querySelector("select").focus();
    }}}, fields.map((x) => h("option", {value: x.name, selected: x.name === field.name}, `${x.name} (${x.type})`)));
    const opSelect = h("select", {"aria-label": "Operator", on: {change: (event) => {
      row.op = event.target.value;
      renderRows(rowsBox, fields, changed);
      rowsBox.children[i].querySelectorAll("select")[1].focus();
    }}}, field.operators.map((op) => h("option", {value: op, selected: op === row.op}, op)));
    const value = valueInput(field, row.op, row.value);
    if (field.type === "bool" && !row.value) row.value = "true";
    value.addEventListener("input", () => {
      row.value = value.value;
    });
    value.addEventListener("change", () => {
      row.value = value.value;
    });
    const remove = h("button", {type: "button", class: "secondary small", "aria-label": `Remove condition ${i + 1}`,
      on: {click: () => {
        rows.splice(i, 1);
        renderRows(rowsBox, fields, changed);
        changed();
      }}}, "×");
    return h("div", {class: "condition"}, fieldSelect, opSelect, value, remove);
  }));
}

function typedValue(field, op, text) {
  const one = (x) => {
    if (field.type === "number" && x.trim() !== "" && !Number.isNaN(Number(x))) return Number(x);
    if (field.type === "bool") return x === "true";
    return x;
  };
  if (op === "in" || op === "nin") return text.split(",").map((x) => x.trim()).filter(Boolean).map(one);
  return one(text.trim());
}

/** The request body the form says, or the reason it cannot be sent ({body} or {problem}). */
function requestBody(info) {
  const f = state.form;
  const body = {query: f.query, k: Number(f.k) || 10};
  if (f.mode in ALPHAS && info.bm25) body.bm25_alpha = ALPHAS[f.mode];
  if (f.mode === "hyde") body.mode = "hyde";
  if (f.filterMode === "json" && f.json.trim()) {
    try {
      body.filter = JSON.parse(f.json);
    } catch (error) {
      return {problem: `the filter is not JSON: ${error.message}`};
    }
  } else if (f.filterMode === "fields") {
    const fields = info.fields || [];
    const clauses = f.rows.filter((row) => String(row.value).trim() !== "").map((row) => {
      const field = fields.find((x) => x.name === row.field);
      return {type: row.op, key: row.field, value: typedValue(field, row.op, String(row.value))};
    });
    if (clauses.length === 1) body.filter = clauses[0];
    if (clauses.length > 1) body.filter = {type: f.combine, filters: clauses};
  }
  const ids = f.docIds.split(",").map((x) => x.trim()).filter(Boolean);
  if (ids.length) body.doc_ids = ids;
  return {body};
}

// ------------------------------------------------------------------------------------ results
function renderOutcome(box, info) {
  if (state.error) {
    replace(box, errorBox(state.error));
    return;
  }
  const outcome = state.outcome;
  if (!outcome) {
    replace(box);
    return;
  }
  const results = outcome.response.results;
  const answer = outcome.kind === "answer" ? answerPanel(outcome.response) : null;
  if (!results.length) {
    replace(box, answer, h("p", {class: "panel muted"}, "No chunk matched (with a filter: none passes it)."));
    return;
  }
  replace(box, answer, h("ol", {class: "result-list"}, results.map((r, i) => resultCard(r, i + 1, info))));
}

function answerPanel(response) {
  const parts = [];
  const pattern = /\[(\d{1,3}(?:\s*[,;]\s*\d{1,3})*)\]/g;
  let last = 0;
  for (const found of response.answer.matchAll(pattern)) {
    parts.push(response.answer.slice(last, found.index));
    const numbers = found[1].split(/\s*[,;]\s*/);
    parts.push("[", numbers.map((n, i) => [i ? ", " : "", citationLink(Number(n), response)]), "]");
    last = found.index + found[0].length;
  }
  parts.push(response.answer.slice(last));
  return h("section", {class: "panel answer", "aria-label": "Answer"},
    h("h2", {}, "Answer"), h("p", {class: "answer-text"}, parts),
    response.citations.length
      ? h("p", {class: "muted small"}, "Cited: ", response.citations.map((c, i) =>
        [i ? " · " : "", `[${c.n}] `, h("a", {href: `#/chunk/${encodeURIComponent(c.chunk_id)}`}, c.chunk_id)]))
      : null);
}

function citationLink(n, response) {
  const cited = response.citations.find((c) => c.n === n);
  if (!cited) return String(n);
  return h("button", {type: "button", class: "cite", "aria-label": `Result ${n}: ${cited.chunk_id}`,
    on: {click: () => {
      const card = document.getElementById(`result-${n}`);
      card.scrollIntoView({block: "center"});
      card.focus();
    }}}, String(n));
}

/** How the score is made of its parts, when the search was hybrid. */
function fusion(info, body) {
  const alpha = body.bm25_alpha ?? info.bm25_alpha;
  if (!info.bm25 || alpha === null || alpha === undefined || alpha === 1) return null;
  return h("span", {class: "muted small"}, `fused: ${num(alpha, 2)} × dense + ${num(1 - alpha, 2)} × BM25`);
}

function matchLabel(kind) {
  if (QUESTION_KINDS.has(kind)) return "matched question";
  if (SENTENCE_KINDS.has(kind)) return `matched ${kind}`;
  if (kind === "chunk" || kind === "onedoc") return "matched the chunk itself";
  return `matched ${kind}`;
}

function resultCard(r, rank, info) {
  const best = r.matched[0];
  // a matched sentence or window is shown in place, marked; a matched question (not part of the text) above it
  const at = best && SENTENCE_KINDS.has(best.kind) ? locate(r.text, best.text) : null;
  let matchBox = null;
  if (best && !at && best.kind !== "chunk" && best.kind !== "onedoc") {
    matchBox = h("p", {class: `match ${QUESTION_KINDS.has(best.kind) ? "question" : ""}`},
      h("span", {class: "label"}, matchLabel(best.kind)), " ", h("mark", {}, best.text),
      h("span", {class: "score-chip"}, num(best.score)));
  } else if (best) {
    matchBox = h("p", {class: "match"}, h("span", {class: "label"}, matchLabel(best.kind)),
      at ? " (marked in the text)" : "", h("span", {class: "score-chip"}, num(best.score)));
  }
  const parts = [h("span", {class: "score"}, num(r.score)), h("span", {class: "part"}, `cosine ${num(r.cosine)}`)];
  if (r.bm25 !== null && r.bm25 !== undefined) parts.push(h("span", {class: "part"}, `BM25 ${num(r.bm25)}`));
  const others = r.matched.slice(1);
  return h("li", {class: "result", id: `result-${rank}`, tabindex: "-1"},
    h("div", {class: "rank", "aria-hidden": "true"}, String(rank)),
    h("div", {class: "result-body"},
      h("div", {class: "result-head"},
        h("a", {class: "title", href: `#/chunk/${encodeURIComponent(r.chunk_id)}`}, r.title || r.chunk_id),
        h("span", {class: "ids"}, "document ",
          h("a", {href: `#/doc/${encodeURIComponent(r.doc_id)}`}, r.doc_id), " · chunk ", h("code", {}, r.chunk_id))),
      h("div", {class: "scores", "aria-label": "Score parts"}, parts,
        fusion(info, state.outcome.body)),
      matchBox,
      h("p", {class: "chunk-text"}, snippet(r.text, at)),
      metadataList(r.metadata),
      others.length ? h("details", {class: "more"}, h("summary", {}, `${others.length} more matching vectors`),
        h("ul", {}, others.map((x) => h("li", {}, h("span", {class: "label"}, x.kind), " ", x.text, " ",
          h("span", {class: "score-chip"}, num(x.score)))))) : null));
}

// ------------------------------------------------------------------------------------ code
function shellQuote(text) {
  return `'${text.replace(/'/g, "'\\''")}'`;
}

function py(value) {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") return String(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(py).join(", ")}]`;
  return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${py(v)}`).join(", ")}}`;
}

function showCode(info, curlBox, pythonBox) {
  const built = requestBody(info);
  const body = built.body || {query: state.form.query || "…"};
  if (!body.query) body.query = "…";
  const answer = Boolean(state.outcome && state.outcome.kind === "answer"); // an answer on screen: its call
  const url = serverUrl();
  const keyed = !keys.open();
  const curl = [`curl -s ${url}/v1/${answer ? "answer" : "search"}`];
  if (keyed) curl.push(`  -H "Authorization: Bearer $QRAG_API_KEY"`);
  curl.push(`  -H "Content-Type: application/json"`, `  -d ${shellQuote(JSON.stringify(body))}`);
  replace(curlBox, curl.join(" \\\n"));
  const args = [py(body.query), `k=${body.k}`];
  for (const name of ["filter", "doc_ids", "mode", "bm25_alpha"]) {
    if (body[name] !== undefined) args.push(`${name}=${py(body[name])}`);
  }
  const lines = [];
  if (keyed) lines.push("import os", "");
  lines.push("from qrag_client import QragClient", "",
    `with QragClient(${py(url)}${keyed ? ', api_key=os.environ["QRAG_API_KEY"]' : ""}) as qrag:`,
    ...(answer
      ? [`    reply = qrag.answer(${args.join(", ")})`, "    print(reply.answer)",
        "    for c in reply.citations:", '        print(f"[{c.n}] {c.chunk_id}")']
      : [`    page = qrag.search(${args.join(", ")})`, "    for r in page.results:",
        '        print(f"{r.score:.3f} {r.chunk_id} {r.matched_question}")']));
  replace(pythonBox, lines.join("\n"));
}
