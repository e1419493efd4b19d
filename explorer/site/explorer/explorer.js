/* The live attention explorer of chapters 6 and 10 (issue 32).
 *
 * Runs the course's tiny trained models in the page with onnxruntime-web: no
 * server, no kernel. A page opts in with an element
 *
 *   <div class="attn-explorer" data-explorer="induction"></div>   (chapter 10)
 *   <div class="attn-explorer" data-explorer="journey"></div>     (chapter 6)
 *
 * and _static/explorer-loader.js, on such pages only, loads this file and
 * explorer.css from the book's explorer/ folder (explorer/site/explorer in the
 * repository). This file loads ort/ort.wasm.min.js (onnxruntime-web's
 * WebAssembly build, copied there by explorer/build.py from node_modules) and
 * models/models.json with the ONNX files that attnlib.export wrote.
 *
 * The reader types a sequence (token ids 0-31 for chapter 10, words of the
 * journey sentence for chapter 6); every edit runs the model and redraws each
 * layer's and head's attention map. Hovering or focusing a query token (the
 * buttons above the maps; arrow keys move between them) shows where each head
 * looks from it: the other rows of every map dim, and a text line per head
 * names the keys with the most weight. Chapter 10 also shows the model's
 * prediction at every position and whether it is right (where the current
 * token occurred before, so that an induction head can know the answer);
 * chapter 6 shows the heads' concatenated context vectors and the output
 * projection.
 *
 * Each explorer keeps its last run in `element.attnExplorer.last`
 * ({ids, outputs: {name: {dims, data}}}) and counts runs in the element's
 * data-runs attribute: tests/test_explorer.py compares them with PyTorch.
 * The pure helpers at the end are exported to Node for explorer/test/.
 */
(function () {
  "use strict";

  // ------------------------------------------------------------- helpers

  /** Viridis, 9 stops (matplotlib's), as [r, g, b] in 0..255. */
  const VIRIDIS = [
    [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
  ];

  /** The viridis colour of t in [0, 1] (clipped), as [r, g, b]. */
  function viridis(t) {
    const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (VIRIDIS.length - 1);
    const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
    const f = x - i;
    return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
  }

  /** Black or white text, whichever reads better on the colour rgb. */
  function textOn(rgb) {
    const lum = (0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]) / 255;
    return lum > 0.45 ? "#000" : "#fff";
  }

  /**
   * Token ids from the reader's text: integers separated by spaces or commas.
   * Returns {ids} or {error} (a sentence saying what is wrong).
   */
  function parseIds(text, vocabSize, maxTokens) {
    const parts = String(text).trim().split(/[\s,]+/).filter((p) => p.length);
    if (!parts.length) return { error: "Type at least one token id." };
    if (parts.length > maxTokens) {
      return { error: `At most ${maxTokens} tokens, got ${parts.length}.` };
    }
    const ids = [];
    for (const part of parts) {
      if (!/^\d+$/.test(part) || Number(part) >= vocabSize) {
        return { error: `"${part}" is not a token id from 0 to ${vocabSize - 1}.` };
      }
      ids.push(Number(part));
    }
    return { ids };
  }

  /** Words of the vocabulary (case-insensitive) to their ids; {ids} or {error}. */
  function parseWords(text, vocab, maxTokens) {
    const parts = String(text).trim().split(/\s+/).filter((p) => p.length);
    if (!parts.length) return { error: "Type at least one word." };
    if (parts.length > maxTokens) {
      return { error: `At most ${maxTokens} words, got ${parts.length}.` };
    }
    const lower = vocab.map((w) => w.toLowerCase());
    const ids = [];
    for (const part of parts) {
      const id = lower.indexOf(part.toLowerCase());
      if (id < 0) {
        return { error: `"${part}" is not in the vocabulary (${vocab.join(", ")}).` };
      }
      ids.push(id);
    }
    return { ids };
  }

  /**
   * The induction rule's answer at each position: the token that followed the
   * latest earlier occurrence of the current token, or null where it has none.
   */
  function inductionTargets(ids) {
    return ids.map((token, t) => {
      for (let s = t - 1; s >= 0; s--) if (ids[s] === token) return ids[s + 1];
      return null;
    });
  }

  /** Index of the largest of values[start .. start + length - 1], from start. */
  function argmax(values, start, length) {
    let best = 0;
    for (let i = 1; i < length; i++) if (values[start + i] > values[start + best]) best = i;
    return best;
  }

  /** The k largest entries of a row: [{index, value}], largest first. */
  function topK(row, k) {
    return Array.from(row, (value, index) => ({ index, value }))
      .sort((a, b) => b.value - a.value || a.index - b.index)
      .slice(0, k);
  }

  /** Row q of head h of a (1, heads, n, n) weight tensor's flat data. */
  function weightRow(data, n, h, q) {
    const start = (h * n + q) * n;
    return Array.from(data.slice(start, start + n));
  }

  // ------------------------------------------------------------- drawing

  /**
   * Draw an (rows x cols) matrix on a canvas in viridis between lo and hi;
   * rows other than `focus` (if not null) are dimmed; cells get numbers when
   * `numbers` is set.
   */
  function drawMatrix(canvas, values, rows, cols, opts) {
    const cell = opts.cell;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(cols * cell * dpr);
    canvas.height = Math.round(rows * cell * dpr);
    canvas.style.aspectRatio = `${cols} / ${rows}`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const span = opts.hi - opts.lo || 1;
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) {
        const v = values[r * cols + c];
        const masked = opts.causal && c > r;
        const rgb = masked ? [128, 128, 128] : viridis((v - opts.lo) / span);
        ctx.globalAlpha = masked ? 0.15 : opts.focus !== null && r !== opts.focus ? 0.3 : 1;
        ctx.fillStyle = `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
        ctx.fillRect(c * cell, r * cell, cell, cell);
        if (opts.numbers && !masked) {
          ctx.globalAlpha = 1;
          ctx.fillStyle = textOn(rgb);
          ctx.font = `${Math.max(11, Math.floor(cell / 3.2))}px sans-serif`;
          ctx.textAlign = "center";
          ctx.textBaseline = "middle";
          ctx.fillText(v.toFixed(2), (c + 0.5) * cell, (r + 0.5) * cell);
        }
      }
    }
    ctx.globalAlpha = 1;
    if (opts.focus !== null) {
      ctx.strokeStyle = opts.highlight;
      ctx.lineWidth = Math.max(2, cell / 8);
      ctx.strokeRect(1, opts.focus * cell + 1, cols * cell - 2, cell - 2);
    }
  }

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children || []) node.append(child);
    return node;
  }

  // --------------------------------------------------------- the explorer

  class Explorer {
    constructor(root, ort, meta, baseUrl) {
      this.root = root;
      this.ort = ort;
      this.meta = meta;
      this.baseUrl = baseUrl;
      this.kind = root.dataset.explorer;
      this.sessions = {};
      this.focus = null;
      this.runs = 0;
      this.last = null;
      this.pending = Promise.resolve();
      root.attnExplorer = this;
    }

    async session(key) {
      if (!this.sessions[key]) {
        const url = this.baseUrl + "models/" + this.meta[key].file;
        // "basic": constant folding and the like, in ONNX's own operators. The
        // extended level fuses a MatMul with a Transpose into com.microsoft's
        // FusedMatMul, which the wasm build has for float32 only: the float64
        // graphs (attnlib.export) then fail to load.
        this.sessions[key] = this.ort.InferenceSession.create(url, {
          executionProviders: ["wasm"],
          graphOptimizationLevel: "basic",
        });
      }
      return this.sessions[key];
    }

    build() {
      const root = this.root;
      root.replaceChildren();
      root.classList.add("attn-explorer-ready");
      const journey = this.kind === "journey";
      const inputId = `${root.id || "attn-explorer"}-input`;
      this.input = el("input", {
        id: inputId,
        type: "text",
        class: "attn-explorer-input",
        autocomplete: "off",
        spellcheck: "false",
        "aria-describedby": `${inputId}-help`,
      });
      const help = el("p", { id: `${inputId}-help`, class: "attn-explorer-help" });
      this.error = el("p", { class: "attn-explorer-error", role: "alert" });
      const controls = el("div", { class: "attn-explorer-controls" });
      if (journey) {
        const m = this.meta.ch06;
        this.modelKey = "ch06";
        this.input.value = m.tokens.join(" ");
        help.textContent = `Up to ${m.context_length} words from the chapter's vocabulary: ` +
          `${m.tokens.join(", ")}. Every edit reruns the layer.`;
        controls.append(this.button("Reset the sentence", () => {
          this.input.value = m.tokens.join(" ");
          this.update();
        }));
      } else {
        const keys = ["ch10_two_layer", "ch10_one_layer"].filter((k) => this.meta[k]);
        this.modelKey = keys[0];
        const m = this.meta[this.modelKey];
        this.input.value = m.examples[0].tokens.join(" ");
        help.textContent = `Up to ${m.context_length} token ids from 0 to ${m.vocab_size - 1}, ` +
          "separated by spaces. The test sequences are 16 random tokens, then 8 of them " +
          "again from an offset.";
        const group = el("div", { class: "attn-explorer-group", role: "group",
          "aria-label": "Model" });
        this.modelButtons = keys.map((key) => {
          const label = key === "ch10_two_layer" ? "Two layers" : "One layer (control)";
          const b = this.button(label, () => this.setModel(key));
          b.setAttribute("aria-pressed", String(key === this.modelKey));
          b.dataset.model = key;
          group.append(b);
          return b;
        });
        const examples = el("div", { class: "attn-explorer-group", role: "group",
          "aria-label": "Test sequences" });
        m.examples.forEach((example, i) => {
          examples.append(this.button(`Test ${i + 1} (offset ${example.offset})`, () => {
            this.input.value = example.tokens.join(" ");
            this.update();
          }));
        });
        controls.append(group, examples);
      }
      const label = el("label", { for: inputId, class: "attn-explorer-label",
        text: journey ? "Sentence" : "Token ids" });
      this.tokens = el("div", { class: "attn-explorer-tokens", role: "toolbar",
        "aria-label": "Query tokens: hover, focus or use the arrow keys" });
      this.tokens.addEventListener("keydown", (event) => this.onKey(event));
      this.tokens.addEventListener("mouseleave", () => this.setFocus(null));
      this.summary = el("p", { class: "attn-explorer-summary", "aria-live": "polite" });
      this.looks = el("ul", { class: "attn-explorer-looks" });
      this.maps = el("div", { class: "attn-explorer-maps" });
      this.extra = el("div", { class: "attn-explorer-extra" });
      root.append(controls, label, this.input, help, this.error, this.tokens, this.summary,
        this.looks, this.maps, this.extra);
      let timer = null;
      this.input.addEventListener("input", () => {
        clearTimeout(timer);
        timer = setTimeout(() => this.update(), 150);
      });
      return this.update();
    }

    button(text, onClick) {
      const b = el("button", { type: "button", class: "attn-explorer-button", text });
      b.addEventListener("click", onClick);
      return b;
    }

    setModel(key) {
      this.modelKey = key;
      for (const b of this.modelButtons) b.setAttribute("aria-pressed", String(b.dataset.model === key));
      return this.update();
    }

    /** Parse the input, run the model, redraw. Runs one at a time, in order. */
    update() {
      this.pending = this.pending.then(() => this.run()).catch((err) => {
        this.error.textContent = `The model could not run: ${err && err.message ? err.message : err}`;
        this.root.dataset.state = "error";
      });
      return this.pending;
    }

    async run() {
      const journey = this.kind === "journey";
      const m = this.meta[this.modelKey];
      const parsed = journey
        ? parseWords(this.input.value, m.tokens, m.context_length)
        : parseIds(this.input.value, m.vocab_size, m.context_length);
      this.input.setAttribute("aria-invalid", String(Boolean(parsed.error)));
      if (parsed.error) {
        this.error.textContent = parsed.error;
        this.root.dataset.state = "invalid";
        return;
      }
      this.error.textContent = "";
      this.root.dataset.state = "running";
      const session = await this.session(this.modelKey);
      const ids = parsed.ids;
      const feed = { idx: new this.ort.Tensor("int64", BigInt64Array.from(ids.map(BigInt)),
        [1, ids.length]) };
      const result = await session.run(feed);
      const outputs = {};
      for (const name of m.outputs) {
        outputs[name] = { dims: Array.from(result[name].dims), data: Array.from(result[name].data) };
      }
      this.last = { model: this.modelKey, ids, outputs };
      if (this.focus !== null && this.focus >= ids.length) this.focus = null;
      this.render();
      this.runs += 1;
      this.root.dataset.runs = String(this.runs);
      this.root.dataset.state = "ready";
    }

    labels() {
      const m = this.meta[this.modelKey];
      return this.last.ids.map((id) => (this.kind === "journey" ? m.tokens[id] : String(id)));
    }

    render() {
      const { ids, outputs } = this.last;
      const n = ids.length;
      const labels = this.labels();
      const m = this.meta[this.modelKey];
      const journey = this.kind === "journey";
      // Query buttons, with chapter 10's prediction under each.
      let predictions = null;
      if (!journey) {
        const logits = outputs.logits.data;
        const targets = inductionTargets(ids);
        predictions = ids.map((_, t) => {
          const predicted = argmax(logits, t * m.vocab_size, m.vocab_size);
          return { predicted, target: targets[t] };
        });
      }
      this.tokens.replaceChildren();
      this.chips = ids.map((_, t) => {
        const chip = el("button", { type: "button", class: "attn-explorer-chip",
          tabindex: t === (this.focus ?? 0) ? "0" : "-1" });
        chip.append(el("span", { class: "attn-explorer-chip-token", text: labels[t] }));
        let description = `query ${t}: ${labels[t]}`;
        if (predictions) {
          const p = predictions[t];
          const mark = p.target === null ? "" : p.predicted === p.target ? " ✓" : " ✗";
          chip.append(el("span", { class: "attn-explorer-chip-pred", text: `→${p.predicted}${mark}` }));
          if (p.target !== null) chip.classList.add(p.predicted === p.target ? "right" : "wrong");
          description += `, predicts ${p.predicted}` + (p.target === null ? ""
            : p.predicted === p.target ? ", right" : `, wrong (the rule says ${p.target})`);
        }
        chip.setAttribute("aria-label", description);
        chip.setAttribute("aria-pressed", String(this.focus === t));
        chip.addEventListener("mouseenter", () => this.setFocus(t));
        chip.addEventListener("focus", () => this.setFocus(t));
        chip.addEventListener("click", () => this.setFocus(t));
        this.tokens.append(chip);
        return chip;
      });
      if (predictions) {
        const scored = predictions.filter((p) => p.target !== null);
        const right = scored.filter((p) => p.predicted === p.target).length;
        this.summary.textContent = `${m.num_layers === 2 ? "Two-layer model" : "One-layer control"}: ` +
          `${right} of ${scored.length} predictions right where the current token occurred ` +
          "before (✓ right, ✗ wrong; the arrow shows the predicted next token).";
      } else {
        this.summary.textContent = `${n} tokens, ${m.num_heads} heads of ${m.head_dim} ` +
          `features; d_out = ${m.d_out}.`;
      }
      // One map per layer and head.
      this.maps.replaceChildren();
      this.canvases = [];
      const layers = journey ? ["attn_weights"] : m.outputs.slice(1);
      layers.forEach((name, layer) => {
        const heads = outputs[name].dims[1];
        for (let h = 0; h < heads; h++) {
          const title = journey ? `Head ${h}` : `Layer ${layer}, head ${h}`;
          const canvas = el("canvas", { class: "attn-explorer-map", role: "img" });
          const figure = el("figure", { class: "attn-explorer-figure" }, [
            el("figcaption", { text: title }), canvas,
            el("p", { class: "attn-explorer-axes", text: journey
              ? `rows (queries, top to bottom) and columns (keys, left to right): ${labels.join(", ")}`
              : `rows: queries 0 to ${n - 1} (top to bottom); columns: keys 0 to ${n - 1} ` +
                "(left to right); the line marks the query in focus" }),
          ]);
          this.maps.append(figure);
          this.canvases.push({ canvas, name, h, title });
        }
      });
      if (journey) this.renderJourneyExtra();
      this.draw();
    }

    renderJourneyExtra() {
      const { outputs } = this.last;
      const n = this.last.ids.length;
      this.extra.replaceChildren();
      this.extraCanvases = [];
      for (const [name, title] of [["concatenated", "Heads' context vectors side by side " +
        "(columns 0-3: head 0, 4-7: head 1, 8-11: head 2)"],
        ["context_vec", "After the output projection (context_vec, d_out = 12)"]]) {
        const canvas = el("canvas", { class: "attn-explorer-map attn-explorer-wide", role: "img" });
        const data = outputs[name].data;
        const lo = Math.min(...data), hi = Math.max(...data);
        this.extra.append(el("figure", { class: "attn-explorer-figure" }, [
          el("figcaption", { text: title }), canvas,
          el("p", { class: "attn-explorer-axes",
            text: `rows: the ${n} tokens; colour from ${lo.toFixed(2)} (dark) to ${hi.toFixed(2)} (yellow)` }),
        ]));
        this.extraCanvases.push({ canvas, name, lo, hi });
      }
    }

    setFocus(t) {
      if (this.focus === t || !this.last) return;
      this.focus = t;
      if (this.chips) {
        this.chips.forEach((chip, i) => {
          chip.setAttribute("aria-pressed", String(i === t));
          chip.tabIndex = i === (t ?? 0) ? 0 : -1;
        });
      }
      this.draw();
    }

    onKey(event) {
      if (!this.chips || !this.chips.length) return;
      const moves = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
      let t = this.focus ?? 0;
      if (event.key in moves) t = Math.min(this.chips.length - 1, Math.max(0, t + moves[event.key]));
      else if (event.key === "Home") t = 0;
      else if (event.key === "End") t = this.chips.length - 1;
      else if (event.key === "Escape") { this.setFocus(null); return; }
      else return;
      event.preventDefault();
      this.chips[t].focus();
    }

    draw() {
      const { ids, outputs } = this.last;
      const n = ids.length;
      const labels = this.labels();
      const highlight = getComputedStyle(this.root).getPropertyValue("--attn-highlight").trim() || "#d55e00";
      const journey = this.kind === "journey";
      const cell = journey ? 48 : Math.max(12, Math.floor(336 / n));
      this.looks.replaceChildren();
      for (const { canvas, name, h, title } of this.canvases) {
        const data = outputs[name].data;
        const values = data.slice(h * n * n, (h + 1) * n * n);
        drawMatrix(canvas, values, n, n, { cell, lo: 0, hi: 1, focus: this.focus, causal: true,
          numbers: journey, highlight });
        const strongest = [];
        for (let q = 0; q < n; q++) strongest.push(argmax(values, q * n, n));
        canvas.setAttribute("aria-label", `${title}: attention weights, ${n} queries by ${n} keys ` +
          `(0 to 1, yellow is 1). Each query's strongest key: ` +
          strongest.map((k, q) => `${q}→${k}`).join(", ") + ".");
        if (this.focus !== null) {
          const best = topK(weightRow(data, n, h, this.focus), Math.min(3, this.focus + 1));
          const text = best.map((b) => `${labels[b.index]} (position ${b.index}) ` +
            b.value.toFixed(3)).join(", ");
          this.looks.append(el("li", { text: `${title} looks from ${labels[this.focus]} ` +
            `(position ${this.focus}) at ${text}` }));
        }
      }
      if (this.focus === null) {
        this.looks.append(el("li", { text: "Hover over or focus a query token above to see " +
          "where each head looks from it." }));
      }
      if (journey && this.extraCanvases) {
        for (const { canvas, name, lo, hi } of this.extraCanvases) {
          const dims = outputs[name].dims;
          drawMatrix(canvas, outputs[name].data, n, dims[2], { cell: 28, lo, hi,
            focus: this.focus, causal: false, numbers: false, highlight });
          canvas.setAttribute("aria-label", `${name}: ${n} rows of ${dims[2]} numbers`);
        }
        if (this.focus !== null) {
          const row = (name) => outputs[name].data
            .slice(this.focus * 12, this.focus * 12 + 12).map((v) => v.toFixed(3));
          const c = row("concatenated");
          this.looks.append(el("li", { text: `Concatenated for ${labels[this.focus]}: ` +
            `head 0 [${c.slice(0, 4).join(", ")}] | head 1 [${c.slice(4, 8).join(", ")}] | ` +
            `head 2 [${c.slice(8).join(", ")}]; after the output projection: ` +
            `[${row("context_vec").join(", ")}]` }));
        }
      }
    }
  }

  // ------------------------------------------------------------- start-up

  function message(root, text) {
    root.classList.add("attn-explorer-unavailable");
    root.replaceChildren(el("p", { class: "attn-explorer-message", role: "status", text }));
    root.dataset.state = "unavailable";
  }

  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = src;
      script.onload = resolve;
      script.onerror = () => reject(new Error(`could not load ${src}`));
      document.head.append(script);
    });
  }

  async function start(baseUrl) {
    const roots = Array.from(document.querySelectorAll(".attn-explorer[data-explorer]"));
    if (!roots.length) return;
    // Either the build had no npm or network (models.json says so), or the page was
    // opened without a web server (from a file), where fetch fails.
    const unavailable = "The live explorer could not start here: this build of the book " +
      "may lack onnxruntime-web (make book needs npm and a network connection once), or " +
      "the page was opened from a file rather than a web server. The still figure below " +
      "shows the models instead.";
    let meta;
    try {
      // Written by explorer/build.py (make book); "onnxruntime_web" is null
      // when npm could not install it.
      meta = await (await fetch(baseUrl + "models/models.json")).json();
      if (!meta.onnxruntime_web) throw new Error("no onnxruntime-web in this build");
      await loadScript(baseUrl + "ort/ort.wasm.min.js");
    } catch (err) {
      roots.forEach((root) => message(root, unavailable));
      return;
    }
    const ort = window.ort;
    ort.env.wasm.wasmPaths = baseUrl + "ort/";
    ort.env.wasm.numThreads = 1; // no cross-origin isolation on a static site
    ort.env.wasm.proxy = false;
    ort.env.logLevel = "error";
    const ran = await Promise.all(roots.map(async (root, i) => {
      if (!root.id) root.id = `attn-explorer-${i}`;
      const explorer = new Explorer(root, ort, meta, baseUrl);
      await explorer.build(); // runs the model once; a failure sets data-state="error"
      return root.dataset.state !== "error";
    }));
    // The still figure is hidden on screen only once a model has run, so that a page
    // whose explorer fails (WebAssembly blocked, say) still shows it.
    if (ran.some(Boolean)) document.documentElement.classList.add("attn-explorer-live");
  }

  const helpers = { viridis, textOn, parseIds, parseWords, inductionTargets, argmax, topK,
    weightRow };
  if (typeof module !== "undefined" && module.exports) {
    module.exports = helpers;
  } else {
    const script = document.currentScript;
    const baseUrl = script ? script.src.replace(/[^/]*$/, "") : "explorer/";
    window.attnExplorerHelpers = helpers;
    const go = () => start(baseUrl);
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", go);
    else go();
  }
})();
