// xinda serve: the web page. Plain JavaScript, no build step, no external resources.
// Talks to the JSON API with relative URLs (v1/models, v1/translate, v1/couplet, v1/poem), so the
// page also works when the server sits under a path prefix.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const REQUEST_TIMEOUT_MS = 180000;
  const TASK_TABS = { translate: "translate", couplet: "couplet", poetry: "poem" };
  const KEY_STORAGE = "xinda-serve-api-key";

  // ------------------------------------------------------------------ API key (servers with
  // --api-key want it on every API request; the page itself is public)

  function storedKey() {
    try {
      return sessionStorage.getItem(KEY_STORAGE) || "";
    } catch (err) {
      return "";
    }
  }

  function storeKey(key) {
    try {
      if (key) sessionStorage.setItem(KEY_STORAGE, key);
      else sessionStorage.removeItem(KEY_STORAGE);
    } catch (err) {
      // storage blocked: the key lives in the input box only
    }
  }

  function apiKey() {
    return $("api-key").value.trim();
  }

  function askForKey() {
    $("key-form").hidden = false;
    $("api-key").focus();
  }

  // ------------------------------------------------------------------ API and errors

  class ApiError extends Error {
    constructor(code, message, status) {
      super(message);
      this.code = code;
      this.status = status;
    }
  }

  async function api(path, body) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
    const init = { headers: { Accept: "application/json" }, signal: controller.signal };
    const key = apiKey();
    // a header carries bytes: send the key's UTF-8 bytes, as the server compares them
    if (key) init.headers["X-API-Key"] = String.fromCharCode(...new TextEncoder().encode(key));
    if (body !== undefined) {
      init.method = "POST";
      init.headers["Content-Type"] = "application/json; charset=utf-8";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      if (err && err.name === "AbortError") {
        throw new ApiError("timeout", `no answer from the server after ${REQUEST_TIMEOUT_MS / 1000} s`, 0);
      }
      throw new ApiError("network", "cannot reach the server (is `xinda serve` running?)", 0);
    } finally {
      clearTimeout(timer);
    }
    let data = null;
    try {
      data = await response.json();
    } catch (err) {
      data = null;
    }
    if (!response.ok) {
      const error = data && data.error ? data.error : null;
      const code = error && error.code ? error.code : `http_${response.status}`;
      let message = error && error.message ? error.message
        : `HTTP ${response.status} ${response.statusText || ""}`.trim();
      const retry = response.headers.get("Retry-After");
      if (response.status === 429 && retry) message += ` (retry after ${retry} s)`;
      if (response.status === 401) askForKey();
      throw new ApiError(code, message, response.status);
    }
    if (data === null) throw new ApiError("bad_response", "the server sent a response that is not JSON", response.status);
    return data;
  }

  function showError(err, prefix) {
    const box = $("error");
    box.textContent = "";
    const strong = document.createElement("strong");
    strong.textContent = prefix ? `${prefix}: ` : "Error: ";
    box.appendChild(strong);
    box.appendChild(document.createTextNode(err.message || String(err)));
    if (err.code) {
      const code = document.createElement("code");
      code.textContent = ` [${err.code}${err.status ? " " + err.status : ""}]`;
      box.appendChild(code);
    }
    box.hidden = false;
  }

  function showLineErrors(items) {
    // Per-line failures ("error" fields inside a 200 answer) also go to the error box.
    const lines = items.map((item, i) => (item.error ? `line ${i + 1}: ${item.error}` : null)).filter(Boolean);
    if (lines.length) showError({ message: lines.join("\n"), code: "line_error" }, "No output");
  }

  function clearError() {
    const box = $("error");
    box.hidden = true;
    box.textContent = "";
  }

  function setStatus(text) {
    $("status").textContent = text;
  }

  function requireText(id, what) {
    // A blank box would come back as an empty output: say what is missing instead.
    if ($(id).value.trim() !== "") return true;
    clearError();
    showError({ message: `type ${what} first`, code: "empty_source" }, "Nothing to do");
    $(id).focus();
    return false;
  }

  async function busy(button, label, work) {
    clearError();
    button.disabled = true;
    setStatus(label);
    const started = performance.now();
    try {
      await work();
      setStatus(`Done in ${((performance.now() - started) / 1000).toFixed(2)} s.`);
    } catch (err) {
      showError(err);
      setStatus("");
    } finally {
      button.disabled = false;
    }
  }

  // ------------------------------------------------------------------ small helpers

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function intValue(id) {
    const value = parseInt($(id).value, 10);
    return Number.isFinite(value) ? value : undefined;
  }

  function sourceLines(id) {
    // One line: a string (an empty box sends "" and the API says what is wrong); several: a list.
    const raw = $(id).value.replace(/\r\n?/g, "\n");
    const lines = raw.split("\n").filter((line) => line.trim() !== "");
    return lines.length > 1 ? lines : (lines[0] !== undefined ? lines[0] : raw.trim());
  }

  function langTag(code) {
    // Data-set language names ("zh", "en", "zh-classical", "words") -> a usable lang attribute.
    const match = /^[a-z]{2,3}(?=$|[-_])/i.exec(code || "");
    return match ? match[0].toLowerCase() : "";
  }

  function formatScore(score) {
    return typeof score === "number" && Number.isFinite(score) ? score.toFixed(3) : "–";
  }

  // ------------------------------------------------------------------ models and tabs

  const models = { translate: [], couplet: [], poetry: [] };

  function fillSelect(select, list) {
    select.textContent = "";
    for (const model of list) {
      const label = model.src_lang && model.tgt_lang
        ? `${model.name} (${model.src_lang} → ${model.tgt_lang})` : model.name;
      select.appendChild(el("option", { value: model.name, text: label }));
    }
    select.disabled = list.length === 0;
  }

  function selectedModel(task, selectId) {
    const name = $(selectId).value;
    return models[task].find((model) => model.name === name) || null;
  }

  function onModelChange() {
    const model = selectedModel("translate", "model");
    const info = $("model-info");
    if (!model) {
      info.textContent = "";
      return;
    }
    info.textContent = [model.arch, model.task, model.sampling && "samples (the beam is not used)"]
      .filter(Boolean).join(" · ");
    const src = langTag(model.src_lang);
    if (src) $("source").setAttribute("lang", src);
    else $("source").removeAttribute("lang");
  }

  function selectTab(name) {
    for (const tab of ["translate", "couplet", "poem"]) {
      const on = tab === name;
      $(`tab-${tab}`).setAttribute("aria-selected", on ? "true" : "false");
      $(`panel-${tab}`).hidden = !on;
    }
  }

  async function loadModels() {
    let data;
    try {
      data = await api("v1/models");
    } catch (err) {
      showError(err, "Cannot load the models");
      setStatus("");
      return;
    }
    const list = Array.isArray(data.models) ? data.models : [];
    for (const task of Object.keys(models)) models[task] = [];
    for (const model of list) {
      if (models[model.task]) models[model.task].push(model);
    }
    fillSelect($("model"), models.translate);
    fillSelect($("couplet-model"), models.couplet);
    fillSelect($("poem-model"), models.poetry);
    onModelChange();

    // Translation is always there (it says so when nothing is loaded); couplet and poem tabs
    // only when a model of that task is loaded.
    $("tab-couplet").hidden = models.couplet.length === 0;
    $("tab-poem").hidden = models.poetry.length === 0;
    const first = list.find((model) => TASK_TABS[model.task]);
    if (models.translate.length === 0 && first) selectTab(TASK_TABS[first.task]);
    if (list.length === 0) {
      showError({ message: "the server has no models loaded", code: "no_models" });
      setStatus("");
    } else {
      setStatus(`${list.length} model${list.length === 1 ? "" : "s"} loaded: ${list.map((m) => m.name).join(", ")}.`);
    }
    document.body.dataset.ready = "true";
  }

  // ------------------------------------------------------------------ translation

  let lastTranslations = [];

  async function translate(event) {
    event.preventDefault();
    if (!requireText("source", "a sentence to translate")) return;
    const button = $("translate");
    await busy(button, "Translating…", async () => {
      const body = { text: sourceLines("source"), attention: $("attention").checked };
      const model = $("model").value;
      if (model) body.model = model;
      const beam = intValue("beam");
      const nBest = intValue("n-best");
      const chosen = selectedModel("translate", "model");
      if (chosen && chosen.sampling) {  // its outputs are samples: no beam, n-best = samples
        if (nBest !== undefined) body.samples = nBest;
      } else {
        if (beam !== undefined) body.beam = beam;
        if (nBest !== undefined) body.n_best = nBest;
      }
      const data = await api("v1/translate", body);
      const model_ = models.translate.find((m) => m.name === data.model) || selectedModel("translate", "model");
      renderTranslations(data.translations || [], model_);
      showLineErrors(data.translations || []);
    });
  }

  function renderTranslations(translations, model) {
    lastTranslations = translations;
    const tgtLang = langTag(model && model.tgt_lang) || null;
    const srcLang = langTag(model && model.src_lang) || null;
    const several = translations.length > 1;
    const output = $("output");
    const nbest = $("nbest");
    output.textContent = "";
    nbest.textContent = "";

    translations.forEach((item, i) => {
      const line = el("div", { class: "line", "data-line": String(i) });
      if (several) line.appendChild(el("div", { class: "src", lang: srcLang, text: item.source }));
      const best = item.nbest && item.nbest[0];
      if (item.error || !best) {
        line.appendChild(el("div", { class: "line-error", text: `No output: ${item.error || "empty n-best list"}` }));
      } else {
        line.appendChild(el("div", { class: "tgt", lang: tgtLang, text: best.text }));
      }
      if (item.truncated_from) {
        line.appendChild(el("div", { class: "note", text: `The source was cut: it had ${item.truncated_from} tokens.` }));
      }
      output.appendChild(line);

      if (item.nbest && item.nbest.length) {
        if (several) nbest.appendChild(el("div", { class: "group-src", lang: srcLang, text: `${i + 1}. ${item.source}` }));
        const list = el("ol");
        item.nbest.forEach((hyp, k) => {
          const li = el("li", { "data-line": String(i), "data-rank": String(k), title: "Show this hypothesis's attention" },
            el("span", { class: "score", text: formatScore(hyp.score) }),
            el("span", { class: "text", lang: tgtLang, text: hyp.text }));
          li.addEventListener("click", () => showAttention(i, k));
          list.appendChild(li);
        });
        nbest.appendChild(list);
      }
    });

    $("results").hidden = false;
    const first = translations.findIndex((item) => item.nbest && item.nbest.length);
    if (first >= 0) showAttention(first, 0);
    else $("heatmap-box").hidden = true;
  }

  function showAttention(line, rank) {
    for (const li of $("nbest").querySelectorAll("li")) {
      li.classList.toggle("selected", li.dataset.line === String(line) && li.dataset.rank === String(rank));
    }
    const hyp = lastTranslations[line].nbest[rank];
    const box = $("heatmap-box");
    if (!Array.isArray(hyp.attention) || hyp.attention.length === 0) {
      box.hidden = true;
      clearHeatmap();
      return;
    }
    box.hidden = false;
    const several = lastTranslations.length > 1;
    $("heatmap-caption").textContent =
      `(${several ? `line ${line + 1}, ` : ""}hypothesis ${rank + 1}, score ${formatScore(hyp.score)})`;
    drawHeatmap($("heatmap"), hyp.attention, hyp.source_pieces || [], hyp.target_pieces || []);
  }

  // ------------------------------------------------------------------ attention heat-map

  const EOS_LABEL = "</s>";
  let heatmapGeometry = null;

  function clearHeatmap() {
    const canvas = $("heatmap");
    canvas.width = 0;
    canvas.height = 0;
    canvas.style.width = "0px";
    canvas.style.height = "0px";
    canvas.dataset.rows = "0";
    canvas.dataset.cols = "0";
    heatmapGeometry = null;
  }

  function shorten(label, max) {
    return label.length > max ? label.slice(0, max - 1) + "…" : label;
  }

  function axisLabels(pieces, count) {
    // rows = target pieces + EOS, cols = source pieces + EOS (the contract); tolerate a mismatch.
    const labels = [];
    for (let i = 0; i < count; i++) {
      if (i < pieces.length) labels.push(String(pieces[i]));
      else if (i === pieces.length) labels.push(EOS_LABEL);
      else labels.push(`#${i}`);
    }
    return labels;
  }

  function cellColor(v) {
    // White -> deep blue (a "Blues"-like ramp); v in [0, 1].
    const t = Math.max(0, Math.min(1, v));
    const from = [247, 251, 255];
    const to = [8, 48, 107];
    const mix = (a, b) => Math.round(a + (b - a) * Math.pow(t, 0.8));
    return `rgb(${mix(from[0], to[0])}, ${mix(from[1], to[1])}, ${mix(from[2], to[2])})`;
  }

  function drawHeatmap(canvas, weights, sourcePieces, targetPieces) {
    const nRows = weights.length;
    const nCols = Math.max(...weights.map((row) => (Array.isArray(row) ? row.length : 0)));
    if (!nRows || !nCols) {
      clearHeatmap();
      return;
    }
    const rowLabels = axisLabels(targetPieces, nRows).map((s) => shorten(s, 18));
    const colLabels = axisLabels(sourcePieces, nCols).map((s) => shorten(s, 18));
    let max = 0;
    for (const row of weights) for (const v of row) if (Number.isFinite(v) && v > max) max = v;
    if (max <= 0) max = 1;

    const fontFamily = getComputedStyle(document.body).fontFamily;
    const font = `13px ${fontFamily}`;
    const ctx = canvas.getContext("2d");
    ctx.font = font;
    const measure = (labels) => Math.max(...labels.map((s) => ctx.measureText(s).width));
    const cell = Math.max(16, Math.min(34, Math.floor(760 / nCols)));
    const pad = 8;
    const left = Math.ceil(measure(rowLabels)) + pad * 2;
    const top = Math.ceil(measure(colLabels)) + pad * 2;
    const legend = 60;
    const width = left + nCols * cell + pad + legend;
    const height = Math.max(top + nRows * cell + pad, top + 120);

    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.ceil(width * dpr);
    canvas.height = Math.ceil(height * dpr);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, width, height);
    ctx.font = font;
    ctx.fillStyle = "#1d2430";

    // Cells.
    for (let r = 0; r < nRows; r++) {
      for (let c = 0; c < nCols; c++) {
        const v = weights[r][c];
        ctx.fillStyle = cellColor(Number.isFinite(v) ? v / max : 0);
        ctx.fillRect(left + c * cell, top + r * cell, cell, cell);
      }
    }
    ctx.strokeStyle = "#d8dee6";
    ctx.lineWidth = 1;
    ctx.strokeRect(left + 0.5, top + 0.5, nCols * cell - 1, nRows * cell - 1);

    // Row labels (target pieces), right-aligned left of the grid.
    ctx.fillStyle = "#1d2430";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    rowLabels.forEach((label, r) => ctx.fillText(label, left - pad, top + r * cell + cell / 2));

    // Column labels (source pieces), rotated, reading upwards from the grid.
    ctx.textAlign = "left";
    colLabels.forEach((label, c) => {
      ctx.save();
      ctx.translate(left + c * cell + cell / 2, top - pad);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(label, 0, 0);
      ctx.restore();
    });

    // Legend: a vertical ramp from 0 to the largest weight.
    const lx = left + nCols * cell + pad + 10;
    const lh = Math.min(100, Math.max(40, nRows * cell));
    for (let y = 0; y < lh; y++) {
      ctx.fillStyle = cellColor(1 - y / lh);
      ctx.fillRect(lx, top + y, 12, 1);
    }
    ctx.strokeStyle = "#9aa6b5";
    ctx.strokeRect(lx + 0.5, top + 0.5, 11, lh - 1);
    ctx.fillStyle = "#5f6b7a";
    ctx.font = `11px ${fontFamily}`;
    ctx.textAlign = "left";
    ctx.fillText(max.toFixed(2), lx + 16, top + 5);
    ctx.fillText("0", lx + 16, top + lh - 5);

    canvas.dataset.rows = String(nRows);
    canvas.dataset.cols = String(nCols);
    heatmapGeometry = { left, top, cell, nRows, nCols, rowLabels, colLabels, weights };
  }

  function heatmapHover(event) {
    const tip = $("heatmap-tip");
    const g = heatmapGeometry;
    if (!g) return;
    const rect = event.target.getBoundingClientRect();
    const c = Math.floor((event.clientX - rect.left - g.left) / g.cell);
    const r = Math.floor((event.clientY - rect.top - g.top) / g.cell);
    if (r >= 0 && r < g.nRows && c >= 0 && c < g.nCols) {
      const v = g.weights[r][c];
      tip.textContent = `${g.rowLabels[r]} ← ${g.colLabels[c]}: ${Number.isFinite(v) ? v.toFixed(3) : "–"}`;
    } else {
      tip.textContent = "Point at a cell to see its weight.";
    }
  }

  // ------------------------------------------------------------------ couplet (对联)

  async function couplet(event) {
    event.preventDefault();
    if (!requireText("couplet-source", "a first line (上联)")) return;
    await busy($("couplet-go"), "Writing second lines…", async () => {
      const body = {
        text: sourceLines("couplet-source"),
        tone: $("couplet-tone").checked,
        no_copy: $("couplet-no-copy").checked,
      };
      const model = $("couplet-model").value;
      if (model) body.model = model;
      const nBest = intValue("couplet-n-best");
      if (nBest !== undefined) body.n_best = nBest;
      const data = await api("v1/couplet", body);
      const items = data.couplets || [];
      const out = $("couplet-output");
      out.textContent = "";
      out.appendChild(el("h2", { text: "Couplets" }, " ", el("span", { lang: "zh", text: "对联" })));
      for (const item of items) {
        const box = el("div", { class: "couplet" });
        const best = item.nbest && item.nbest[0];
        box.appendChild(el("div", { class: "pair", lang: "zh" },
          el("span", { class: "muted small", text: "上联 " }), item.source || ""));
        if (item.error || !best) {
          box.appendChild(el("div", { class: "line-error", text: `No output: ${item.error || "empty n-best list"}` }));
        } else {
          box.appendChild(el("div", { class: "pair", lang: "zh" },
            el("span", { class: "muted small", text: "下联 " }), best.text));
          const list = el("ol", { class: "nbest" });
          for (const hyp of item.nbest) {
            list.appendChild(el("li", {}, el("span", { class: "score", text: formatScore(hyp.score) }),
              el("span", { lang: "zh", text: hyp.text })));
          }
          box.appendChild(list);
        }
        out.appendChild(box);
      }
      out.hidden = false;
      showLineErrors(items);
    });
  }

  // ------------------------------------------------------------------ acrostic poem (藏头诗)

  async function poem(event) {
    event.preventDefault();
    await busy($("poem-go"), "Writing the poem…", async () => {
      const body = {
        keywords: $("poem-keywords").value.trim(),
        form: parseInt($("poem-form-select").value, 10) || 7,
        rhyme: $("poem-rhyme").checked,
      };
      const acrostic = $("poem-acrostic").value.trim();
      if (acrostic) body.acrostic = acrostic;
      const model = $("poem-model").value;
      if (model) body.model = model;
      const nBest = intValue("poem-n-best");
      if (nBest !== undefined) body.n_best = nBest;
      const data = await api("v1/poem", body);
      const out = $("poem-output");
      out.textContent = "";
      out.appendChild(el("h2", { text: "Poems" }, " ", el("span", { lang: "zh", text: "诗" })));
      for (const item of data.poems || []) {
        const box = el("div", { class: "poem", lang: "zh" });
        const lines = Array.isArray(item.lines) && item.lines.length ? item.lines : [item.text || ""];
        for (const line of lines) box.appendChild(el("div", { class: "poem-line", text: line }));
        box.appendChild(el("div", { class: "muted small", lang: "en", text: `score ${formatScore(item.score)}` }));
        out.appendChild(box);
      }
      if (data.error) out.appendChild(el("div", { class: "line-error", text: `No output: ${data.error}` }));
      out.hidden = false;
      if (data.error) showError({ message: data.error, code: "no_output" }, "No poem");
    });
  }

  // ------------------------------------------------------------------ wiring

  function submitOnCtrlEnter(textarea, form) {
    textarea.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const tab of ["translate", "couplet", "poem"]) {
      $(`tab-${tab}`).addEventListener("click", () => selectTab(tab));
    }
    $("model").addEventListener("change", onModelChange);
    $("translate-form").addEventListener("submit", translate);
    $("couplet-form").addEventListener("submit", couplet);
    $("poem-form").addEventListener("submit", poem);
    $("heatmap").addEventListener("mousemove", heatmapHover);
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      storeKey(apiKey());
      clearError();
      setStatus("Loading models…");
      loadModels();
    });
    const key = storedKey();
    if (key) {
      $("api-key").value = key;
      $("key-form").hidden = false;
    }
    submitOnCtrlEnter($("source"), $("translate-form"));
    submitOnCtrlEnter($("couplet-source"), $("couplet-form"));
    loadModels();
  });
})();
