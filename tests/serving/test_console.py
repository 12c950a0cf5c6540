"""The browser console (serving/console.py, serving/console_assets/): its files and headers (unit), then
its pages in a real headless Chromium (Debian's `chromium` and `chromium-driver`, driven by Selenium)
against a real Serve app with the console on (slow tier): a filtered search shows only matching chunks
with the question that matched, a bad filter the API's message, a wrong key the 401's message, a
`<script>` document stays text, the operate view counts new traffic, the keyboard alone reaches every
step; every page loads with no request leaving the machine and no console error, each view paints within
a second against the warm server. Each view's screenshot is taken on the way.

Cost in the slow tier: one 2-shard index of 15 small documents (one build, ~30 s on 2 cores), one Serve
app (Router, two ShardSearchers, the Synthesizer on the suite's fake LLM: ~30 s) and one browser for
the module (~40 s of pages). Chromium comes from Debian's packages, installed by the `chromium_binaries`
fixture when missing (as root: `apt-get install -y chromium chromium-driver`); never a browser download.

The screenshots of docs/img/console-*.png are these tests' own:
    QRAG_CONSOLE_SCREENSHOTS=docs/img python -m pytest -m slow tests/serving/test_console.py"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from qrag_ray.serving.api_errors import ApiError
from qrag_ray.serving.console import ASSET_HEADERS, CONTENT_SECURITY_POLICY, Console, asset_names

ROOT = Path(__file__).resolve().parents[2]
# The screenshots every run takes go to runs/ (ignored); QRAG_CONSOLE_SCREENSHOTS=docs/img refreshes the docs'
# own copies, so that a plain `make test` leaves the tree as it found it.
SCREENSHOTS = ROOT / os.environ.get("QRAG_CONSOLE_SCREENSHOTS", "runs/console-screenshots")
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
LOOPS = {"for", "while", "break", "continue"}  # the documents whose metadata group is "loops"
PAINT_BUDGET_MS = 1000


# ------------------------------------------------------------------------------------ unit: files, headers
def test_the_console_serves_only_its_own_files_with_the_security_headers():
    console = Console(True)
    names = set(asset_names())
    assert {"index.html", "main.js", "console.css"} <= names
    page = console.page()
    assert page.media_type.startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert console.asset("main.js").media_type.startswith("text/javascript")
    for name in ("../config.py", "console.py", "index.htm", ".hidden"):
        with pytest.raises(ApiError) as found:
            console.asset(name)
        assert found.value.status == 404
    assert set(ASSET_HEADERS) >= {"Content-Security-Policy", "Referrer-Policy", "X-Content-Type-Options"}


def test_a_console_that_is_off_answers_every_route_404():
    console = Console(False)
    for call in (console.page, console.entry, lambda: console.asset("main.js"), console.require):
        with pytest.raises(ApiError) as found:
            call()
        assert found.value.status == 404 and "console is off" in found.value.message


def test_the_pages_have_no_inline_script_style_or_html_parsing():
    """What the CSP forbids is absent from the files too (a browser would refuse it, silently for the user),
    and no script parses data as HTML."""
    html = (asset_names()["index.html"]).read_text()
    assert "<style" not in html and " style=" not in html and not re.search(r"\son\w+=", html)
    assert html.count("<script") == 1 and 'type="module" src="main.js"' in html
    for name, path in asset_names().items():
        if name.endswith(".js"):
            text = path.read_text()
            for unsafe in (r"\.innerHTML\b", r"\.outerHTML\b", r"insertAdjacentHTML\(", r"document\.write",
                           r"\beval\(", r"new Function\b", r"\blocalStorage\.", r"document\.cookie"):
                assert not re.search(unsafe, text), (name, unsafe)


def test_serve_command_turns_the_console_on_unless_told_not_to(monkeypatch, tmp_path):
    """`qrag serve` serves the console by default, --no-console turns it off; AppArgs (a deployed config)
    leaves it off unless it says `console: true`."""
    import qrag_ray.serving.application as application  # imported before the patches below, never under them
    from qrag_ray.serving.config import AppArgs

    assert AppArgs(index="/x").console is False
    assert AppArgs(index="/x", console=True).console is True
    from typer.testing import CliRunner

    from qrag_ray.cli.app import app, register_commands

    register_commands()
    index = tmp_path / "idx"  # just enough of an index for the command's checks before Ray
    index.mkdir()
    (index / "manifest.json").write_text(json.dumps({
        "format_version": 1, "index_version": "v", "num_shards": 1, "embedder": {"model": "m", "dim": 3},
        "shards": [{"id": 0, "faiss": "shards/00000.faiss", "meta": "shards/00000.parquet", "vectors": 0,
                    "vectors_before_filters": 0, "chunks": 0, "kinds": {}, "seconds": 0.0}],
        "files": {}, "representation": "chunk"}))
    seen = {}

    def stop(args, deployment_options=None):
        seen["args"] = args
        raise SystemExit(0)

    monkeypatch.setattr(os, "environ", dict(os.environ))  # what the command sets for the Ray it would start
    monkeypatch.setattr("qrag_ray.runtime.ray_start.ensure_ray", lambda address=None: None)
    monkeypatch.setattr(application, "compose_app", stop)
    runner = CliRunner()
    for flags, want in (([], True), (["--no-console"], False), (["--console"], True)):
        seen.clear()
        result = runner.invoke(app, ["serve", "--index", str(index), *flags])
        assert seen.get("args", {}).get("console") is want, (flags, result.output)


# ------------------------------------------------------------------------------------ the browser
def _install_chromium() -> None:
    """Debian's chromium and chromium-driver, as the test set-up installs them where missing (as root)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]
    if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600, check=True)
        subprocess.run(install, env=env, capture_output=True, timeout=900, check=True)


@pytest.fixture(scope="session")
def chromium_binaries() -> tuple[Path, Path]:
    """/usr/bin/chromium and /usr/bin/chromedriver, installed with apt-get when missing and running as root."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.fail(f"the console's browser tests need {CHROMIUM} and {CHROMEDRIVER}: run "
                        "`apt-get install -y chromium chromium-driver` as root", pytrace=False)
        try:
            _install_chromium()
        except (subprocess.SubprocessError, OSError) as e:
            pytest.fail(f"could not install chromium and chromium-driver with apt-get: {e}", pytrace=False)
    return CHROMIUM, CHROMEDRIVER


def console_records() -> list[dict]:
    """The pydoc corpus with its questions, each record with metadata and a url, and one document whose
    title, text, url and metadata are markup and script (it must show as text)."""
    from support.corpus import pydoc_docs

    groups = {"for": "loops", "while": "loops", "break": "loops", "continue": "loops", "if": "branches",
              "lambda": "expressions", "binary": "expressions", "augassign": "expressions"}
    out = [r | {"url": f"https://docs.python.org/3/reference/#{r['id']}",
                "metadata": {"group": groups.get(r["id"], "statements"), "order": i, "added": f"2024-03-{1 + i:02d}",
                             "tags": [groups.get(r["id"], "statements"), r["id"]]}}
           for i, r in enumerate(pydoc_docs())]
    out.append({"id": "markup", "title": '<img src=x onerror="window.__pwned=1">Markup',
                "text": "A console shows markup as text. <script>window.__pwned = 2</script> The script tag above "
                        "is part of this document and must never run.",
                "questions": ["How does the console show a script tag in a document?"],
                "url": "javascript:window.__pwned=3", "metadata": {"group": "<b>markup</b>", "order": 99,
                                                                  "added": "2024-05-01", "tags": ["<i>x</i>"]}})
    return out


@pytest.fixture(scope="module")
def console_app(local_ray, fake_llm, tmp_path_factory):
    """One Serve app with the console on: tenants `docs` (the console index: chunks, sentences and given
    questions, BM25 hybrid at 0.67, metadata) and `other` (a copy), an admin key, the fake LLM."""
    import httpx
    from ray import serve

    from qrag_ray.runtime.ports import free_port
    from qrag_ray.serving.application import compose_app
    from qrag_ray.serving.tenants import add_tenant, set_admin_key
    from support.corpus import write_jsonl
    from support.indexes import shared_build

    wd = tmp_path_factory.mktemp("console")
    index = wd / "docs-index"
    shared_build({"input": str(write_jsonl(wd / "docs.jsonl", console_records())), "build.output": str(index),
                  "representation": "chunk+sentence+question", "generator": {"backend": "precomputed"}, "shards": 2,
                  "bm25": {"enabled": True}, "search": {"bm25_alpha": 0.67}, "faiss.factory": "Flat",
                  "chunker": {"method": "token", "size": 120, "overlap": 20}, "build.overwrite": True})
    shutil.copytree(index, wd / "other-index")
    tenants = wd / "tenants.yaml"
    keys = {"docs": add_tenant(tenants, "docs", index), "other": add_tenant(tenants, "other", wd / "other-index"),
            "admin": set_admin_key(tenants)}
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    small = {"ray_actor_options": {"num_cpus": 0.5}}
    opts = {n: small for n in ("Router", "ShardSearcher0", "ShardSearcher1", "Synthesizer")}
    gen = {"backend": "openai", "base_url": fake_llm.url, "model": "fake-llm", "api_key_env": ""}
    serve.run(compose_app({"tenants": str(tenants), "generator": gen, "console": True}, opts), name="console",
              route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=120)
    deadline = time.time() + 180
    while client.get("/readyz").status_code != 200 and time.time() < deadline:
        time.sleep(1)
    yield {"url": url, "client": client, "keys": keys}
    client.close()
    serve.shutdown()


@pytest.fixture(scope="module")
def browser(chromium_binaries):
    """One headless Chromium for the module (Debian's, through its own chromedriver), a fresh profile,
    every request and console message recorded."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = chromium_binaries
    profile = tempfile.mkdtemp(prefix="qrag-console-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,960",
                 "--force-device-scale-factor=1", "--lang=en-US"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(str(chromedriver)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Page:
    """The console in the browser: navigation, waits, and what the browser recorded."""

    def __init__(self, driver, app):
        self.driver, self.app = driver, app

    def open(self, view: str = "#/search", fresh: bool = True) -> None:
        """The console at `view`; `fresh`: a new tab state (no key) first."""
        if fresh:
            self.driver.get("about:blank")
            self.records()  # what came before belongs to another test
            self.driver.get(f"{self.app['url']}/console/")
            self.driver.execute_script("sessionStorage.clear()")
            self.driver.get("about:blank")  # so the next address loads the page anew, not only its #fragment
        self.driver.get(f"{self.app['url']}/console/{view}")
        self.wait_for("#main")

    def wait_for(self, css: str, timeout: float = 30, text: str | None = None):
        """The first element matching `css` (holding `text`, when given) once it shows."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        def found(driver):
            for el in driver.find_elements(By.CSS_SELECTOR, css):
                if el.is_displayed() and (text is None or text in el.text):
                    return el
            return False

        return WebDriverWait(self.driver, timeout).until(found, f"no {css!r} {text or ''} on {self.driver.current_url}")

    def all(self, css: str) -> list:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def use_key(self, who: str = "docs") -> None:
        key = self.wait_for("#key-input")
        key.send_keys(self.app["keys"].get(who, who))
        key.submit()

    def search(self, query: str) -> None:
        box = self.wait_for("#query")
        box.clear()
        box.send_keys(query)
        self.wait_for("#search").click()

    def records(self) -> tuple[list[str], list[dict]]:
        """(every URL the page requested, every console message) since the last call."""
        urls = []
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] in ("Network.requestWillBeSent", "Network.webSocketCreated"):
                urls.append(message["params"].get("request", {}).get("url") or message["params"].get("url"))
        return urls, self.driver.get_log("browser")

    def assert_clean(self, expected_statuses: tuple[int, ...] = ()) -> list[str]:
        """No request left this server (the console's own files and API only) and no console error but the
        network lines of responses the test asked for (an API error's status); the URLs requested."""
        urls, logs = self.records()
        # a data: URL (the date input's own calendar icon, Chromium's) is no request at all
        foreign = [u for u in urls if not (u.startswith(self.app["url"] + "/") or u.startswith("data:"))]
        assert not foreign, foreign
        errors = [e["message"] for e in logs if e["level"] == "SEVERE" and not (
            e.get("source") == "network" and any(f"status of {s} " in e["message"] for s in expected_statuses))]
        assert not errors, errors
        return urls

    def shoot(self, name: str) -> None:
        """console-<name>.png in SCREENSHOTS: the page as shown, down to the end of its content (at most 1600 px)."""
        height = min(1600, self.driver.execute_script("return document.documentElement.scrollHeight"))
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1}})
        import base64

        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        (SCREENSHOTS / f"console-{name}.png").write_bytes(base64.b64decode(shot["data"]))


@pytest.fixture
def page(browser, console_app):
    return Page(browser, console_app)


def api_search(app, body, who="docs"):
    return app["client"].post("/v1/search", json=body, headers={"Authorization": f"Bearer {app['keys'][who]}"})


@pytest.mark.slow
def test_a_filtered_search_shows_only_matching_chunks_with_the_matched_question(page):
    from selenium.webdriver.support.ui import Select

    page.open()
    page.use_key()
    page.wait_for("#query")
    page.wait_for("#add-condition").click()
    condition = page.wait_for(".condition")
    Select(condition.find_elements("css selector", "select")[0]).select_by_value("group")
    Select(page.wait_for(".condition").find_elements("css selector", "select")[1]).select_by_value("eq")
    page.wait_for(".condition .value").send_keys("loops")
    query = "what happens to the else branch when a for loop finishes normally?"
    page.search(query)
    page.wait_for(".result")
    shown = [el.get_attribute("textContent") for el in page.all(".result .ids code")]
    want = api_search(page.app, {"query": query, "k": 10, "filter": {"type": "eq", "key": "group", "value": "loops"}})
    assert want.status_code == 200, want.text
    results = want.json()["results"]
    assert shown == [r["chunk_id"] for r in results] and shown
    assert {r["doc_id"] for r in results} <= LOOPS and len(results) >= 4
    assert all(r["metadata"]["group"] == "loops" for r in results)
    first = page.wait_for("#result-1")
    matched = first.find_element("css selector", ".match.question mark").text
    assert "When does the else clause of a for loop run?" in matched
    assert "matched question" in first.find_element("css selector", ".match .label").text.lower()
    assert "cosine" in first.find_element("css selector", ".scores").text
    assert "BM25" in first.find_element("css selector", ".scores").text
    curl = page.driver.execute_script("return document.getElementById('code-curl').textContent")
    python = page.driver.execute_script("return document.getElementById('code-python').textContent")
    assert '"filter":{"type":"eq","key":"group","value":"loops"}' in curl and "$QRAG_API_KEY" in curl
    assert 'filter={"type": "eq", "key": "group", "value": "loops"}' in python and "QragClient(" in python
    assert page.app["keys"]["docs"] not in curl + python
    # what a developer copies runs as it is, and finds what the page shows
    env = {**os.environ, "QRAG_API_KEY": page.app["keys"]["docs"]}
    ran = subprocess.run([sys.executable, "-c", python], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert [line.split()[1] for line in ran.stdout.splitlines()] == shown
    assert "When does the else clause of a for loop run?" in ran.stdout.splitlines()[0]
    if shutil.which("bash") and shutil.which("curl"):
        ran = subprocess.run(["bash", "-c", curl], env=env, capture_output=True, text=True, timeout=60)
        assert [r["chunk_id"] for r in json.loads(ran.stdout)["results"]] == shown, ran.stdout[:300]
    page.shoot("search")
    page.assert_clean()


@pytest.mark.slow
def test_a_bad_filter_shows_the_apis_message(page):
    page.open()
    page.use_key()
    page.wait_for("input[name='filter-mode'][value='json']").click()
    bad = {"type": "eq", "key": "colour", "value": "red"}
    page.wait_for("#filter-json").send_keys(json.dumps(bad))
    page.search("for loop")
    shown = page.wait_for(".error").text
    api = api_search(page.app, {"query": "for loop", "k": 10, "filter": bad})
    assert api.status_code == 422 and api.json()["error"] == "invalid_filter"
    assert api.json()["message"] in shown and "422 invalid_filter" in shown
    assert not page.all(".result")
    box = page.wait_for("#filter-json")
    box.clear()
    box.send_keys("{not json")
    page.search("for loop")
    assert "the filter is not JSON" in page.wait_for(".error", text="not JSON").text
    page.assert_clean(expected_statuses=(422,))


@pytest.mark.slow
def test_a_wrong_key_shows_the_401_message_and_no_key_leaves_the_tab(page):
    page.open()
    page.driver.get(f"{page.app['url']}/console")  # the address without its slash leads to the console
    page.wait_for("#key-input")
    assert page.driver.current_url == f"{page.app['url']}/console/"
    wrong = "qrag_wrong-key-typed-into-the-page"
    page.use_key(wrong)
    shown = page.wait_for(".error").text  # the search view's first call (the index's fields) is refused
    assert "401 unauthorized" in shown and "unknown API key" in shown
    page.wait_for("#key-forget").click()
    page.use_key("docs")
    page.search("for loop")
    page.wait_for(".result")
    urls = page.assert_clean(expected_statuses=(401,))
    keys = [wrong, page.app["keys"]["docs"]]
    assert not [u for u in urls + [page.driver.current_url] if any(k in u for k in keys)]
    assert page.driver.get_cookies() == []
    assert page.driver.execute_script("return window.localStorage.length") == 0


@pytest.mark.slow
def test_a_script_document_shows_as_text_and_never_runs(page):
    page.open()
    page.use_key()
    page.search("How does the console show a script tag in a document?")
    first = page.wait_for("#result-1")
    assert first.find_element("css selector", ".title").text == '<img src=x onerror="window.__pwned=1">Markup'
    assert "<script>window.__pwned = 2</script>" in first.find_element("css selector", ".chunk-text").text
    assert "<b>markup</b>" in first.find_element("css selector", "dl.meta").text
    first.find_element("css selector", ".title").click()
    page.wait_for(".vector-kind")
    assert page.wait_for("dl.facts", text="javascript:").find_elements("css selector", "a[href^='javascript']") == []
    page.driver.get(f"{page.app['url']}/console/#/doc/markup")
    page.wait_for(".chunk-text", text="<script>")
    assert page.driver.execute_script("return window.__pwned === undefined && !document.querySelector('main script, "
                                      "main img')")
    page.assert_clean()


@pytest.mark.slow
def test_the_index_view_and_a_chunks_page_show_what_the_index_holds(page):
    page.open("#/index", fresh=True)
    page.use_key()
    info = page.app["client"].get("/v1/console/index", headers={"Authorization": f"Bearer {page.app['keys']['docs']}"})
    assert info.status_code == 200, info.text
    info = info.json()
    assert "path" not in info and info["representation"] == "chunk+sentence+question"
    assert {f["name"]: f["type"] for f in info["fields"]} == {"added": "date", "group": "string", "order": "number",
                                                              "tags": "string_list"}
    overview = page.wait_for("dl.facts", text="chunk+sentence+question").text
    assert "all-MiniLM-L6-v2" in overview and "docs" in overview
    fields = page.wait_for("table", text="string_list").text
    assert "added date" in fields and "order number" in fields
    page.wait_for(".sample")
    with_questions = [x for x in info["samples"] if x["questions"]]
    assert with_questions, info["samples"]
    shown = [el.get_attribute("textContent") for el in page.all(".sample .questions li")]
    assert shown == [q for x in info["samples"] for q in x["questions"]]
    page.shoot("index")
    page.driver.get(f"{page.app['url']}/console/#/chunk/for%230")
    page.wait_for(".vector-kind")
    vectors = page.app["client"].get("/v1/console/vectors/for%230",
                                     headers={"Authorization": f"Bearer {page.app['keys']['docs']}"}).json()["vectors"]
    shown = [el.get_attribute("textContent") for el in page.all(".vector-kind li")]
    assert sorted(shown) == sorted(v["text"] for v in vectors)
    assert {v["kind"] for v in vectors} == {"chunk", "sentence", "question"}
    assert "When does the else clause of a for loop run?" in shown
    page.shoot("chunk")
    page.assert_clean()


@pytest.mark.slow
def test_an_answer_links_its_citations_to_the_results(page):
    page.open()
    page.use_key()
    page.wait_for("#query").send_keys("What does the else clause of a for loop do?")
    page.wait_for("#answer").click()
    answer = page.wait_for(".answer")
    assert "[1]" in answer.text and "[2]" in answer.text
    page.wait_for("button.cite").click()
    assert page.driver.execute_script("return document.activeElement.id") == "result-1"
    code = page.driver.execute_script("return document.getElementById('code-curl').textContent + "
                                      "document.getElementById('code-python').textContent")
    assert "/v1/answer" in code and "qrag.answer(" in code  # the code shown is the answer's call
    page.assert_clean()


@pytest.mark.slow
def test_the_operate_view_needs_the_admin_key_and_counts_new_traffic(page):
    # The view counts a sliding minute of requests: the tenant counted here is `other`, which no other test
    # searches, so nothing leaves its window while the new requests arrive.
    page.open("#/operate", fresh=True)
    page.wait_for("#admin-key").send_keys(page.app["keys"]["docs"] + "\n")  # a tenant's key is not the admin's
    assert "401 unauthorized" in page.wait_for(".error").text
    page.wait_for("#admin-key").send_keys(page.app["keys"]["admin"] + "\n")
    page.wait_for("#tenants-table tbody tr", text="other")

    def count() -> int:  # read in the page: the table is rebuilt every refresh
        return int(page.driver.execute_script(
            "const row = [...document.querySelectorAll('#tenants-table tbody tr')]"
            ".find((r) => r.cells[0].textContent === 'other'); return row.cells[6].textContent"))

    before = count()
    for number in range(5):
        assert api_search(page.app, {"query": f"for loop {number}", "k": 3}, who="other").status_code == 200
    deadline = time.time() + 20
    while count() < before + 5 and time.time() < deadline:
        time.sleep(0.5)
    assert count() >= before + 5
    row = page.wait_for("#tenants-table tbody tr", text="other")
    assert "ok" in row.text and " ms" in row.text
    assert "ShardSearcher0" in page.wait_for("#deployments-table").text
    page.shoot("operate")
    page.assert_clean(expected_statuses=(401,))


@pytest.mark.slow
def test_the_keyboard_alone_reaches_every_step(page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    def focused() -> str:
        return page.driver.execute_script("const e = document.activeElement; return (e.id || '') + '|' + "
                                          "(e.className || '') + '|' + e.tagName")

    def tab_to(marker: str, limit: int = 40) -> None:
        for _ in range(limit):
            if marker in focused():
                return
            ActionChains(page.driver).send_keys(Keys.TAB).perform()
        raise AssertionError(f"Tab never reached {marker!r} (at {focused()})")

    def type_keys(*keys) -> None:
        ActionChains(page.driver).send_keys(*keys).perform()

    page.open()
    tab_to("key-input")
    type_keys(page.app["keys"]["docs"], Keys.ENTER)
    page.wait_for("#query")
    assert focused().startswith("query|")  # the search view puts the cursor in the question
    type_keys("when does a while loop stop?", Keys.ENTER)
    page.wait_for(".result")
    tab_to("title|A")  # the first result's link to its chunk
    type_keys(Keys.ENTER)
    page.wait_for(".vector-kind")
    assert "#/chunk/" in page.driver.current_url
    page.assert_clean()


@pytest.mark.slow
def test_each_view_paints_within_a_second_on_the_warm_server(page):
    """First paint within a second, timed by the page itself from the start of its navigation, after a
    first visit has warmed the server's reads of the view (the browser's cache as a person has it on a
    second visit); the view's content (its data read through the API) within two, a guard against a view
    that waits on something slow. The median of three visits: one visit on a busy shared box can lose a
    time slice that is no property of the page."""
    import statistics

    page.open()
    page.use_key()
    page.wait_for("#query")
    ready_at = ("const [selector, done] = arguments; const check = () => document.querySelector(selector) ? "
                "done(performance.now()) : requestAnimationFrame(check); check();")
    first_paint = "const p = performance.getEntriesByName('first-contentful-paint')[0]; return p ? p.startTime : null"
    timings = {}
    for view, ready in (("#/search", "#query"), ("#/index", ".sample"), ("#/chunk/for%230", ".vector-kind"),
                        ("#/operate", "#admin-key")):
        visits = []
        for visit in range(4):  # the first warms the server's reads of this view
            page.driver.get("about:blank")
            page.open(view, fresh=False)
            content = page.driver.execute_async_script(ready_at, ready)
            if visit:
                visits.append((page.driver.execute_script(first_paint), content))
        assert all(paint is not None for paint, _ in visits), (view, visits)
        timings[view] = (statistics.median(p for p, _ in visits), statistics.median(c for _, c in visits))
    print("first paint, content, median ms:", {v: (round(p), round(c)) for v, (p, c) in timings.items()})
    assert all(paint < PAINT_BUDGET_MS for paint, _ in timings.values()), timings
    assert all(content < 2 * PAINT_BUDGET_MS for _, content in timings.values()), timings
    page.assert_clean()
