/* The book's search: Sphinx's html_search_scorer (set by _ext/course_html.py).
 * Sphinx pastes this file into language_data.js, which only the search page
 * loads, after searchtools.js. tests/test_book.py checks both parts in a browser.
 *
 * (1) Ranking: the page whose headings are about the query comes first.
 * Sphinx scores a page by its best-matching word alone: "KV cache" matched
 * "cache" in a heading of chapter 9 ("Generating with a KV cache") and of chapter
 * 10 ("Generating with the trained model, with and without a KV cache") alike,
 * 15 each, and the tie went to chapter 10 by title. Sphinx's own rule for a
 * heading that matches the whole query scores it Scorer.title x (length of the
 * query / length of the heading), but only for a heading at most twice the
 * query's length. Here every heading of a page that contains the query as a
 * phrase adds that much to the page's score: the more of its headings are about
 * the query, and the more of each heading the query is, the higher the page.
 * Chapter 9 (three such headings) gains 12, chapter 10 (one long one) 2.
 *
 * (2) Snippets of the page's text, without TeX.
 * The snippet under each result is cut from the page's HTML, where math is still
 * TeX source in span.math / div.math ("\(XX^\top\)"). The math is written as
 * plain text instead (XXᵀ), without its delimiters: \frac{a}{b} as a/b (with
 * brackets round a part of more than one term), \sqrt{x} as √x, environments
 * (\begin{aligned} ... \end{aligned}) and alignment marks (&) dropped, other
 * commands as Unicode or as their bare name.
 * Sphinx cuts the snippet from the page's [role=main], which in this theme holds
 * more than the article: the header bar's buttons (Colab, Repository, Suggest
 * edit, Open issue, .ipynb, .pdf), the print-only title and contents, the
 * "Contents" sidebar and the previous/next links. A query that matched the
 * page's title or a heading found its first match there, and the snippet was
 * "...Colab" or ".pdf Attention in today's language models Contents". These are
 * removed before the snippet is made (NOT_TEXT below), and so are the toggle
 * buttons' labels.
 */
var Scorer = {
  // Sphinx 7.4's defaults (searchtools.js), unchanged.
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,

  // Words of a heading or query, lower case, joined by single spaces.
  _words: (text) =>
    text
      .replace(/<[^>]*>/g, " ")
      .toLowerCase()
      .split(/[^\p{Letter}\p{Number}]+/u)
      .filter((w) => w)
      .join(" "),

  // {file index: [heading words, ...]}, from the search index, built once.
  _headings: null,

  headingBonus: (file, query) => {
    const index = Search._index;
    if (!Scorer._headings) {
      Scorer._headings = {};
      const add = (f, title) => (Scorer._headings[f] = Scorer._headings[f] || []).push(Scorer._words(title));
      for (const [title, places] of Object.entries(index.alltitles)) {
        for (const [f] of places) add(f, title);
      }
    }
    const phrase = Scorer._words(query);
    if (!phrase) return 0;
    let bonus = 0;
    for (const heading of Scorer._headings[file] || []) {
      if ((" " + heading + " ").includes(" " + phrase + " ")) {
        bonus += (Scorer.title * phrase.length) / heading.length;
      }
    }
    return Math.round(bonus * 10) / 10;
  },

  // result: [docname, title, anchor, descr, score, filename]. Objects (API
  // entries, which have a description) keep Sphinx's score.
  score: (result) => {
    const [docname, , , descr, score] = result;
    if (descr) return score;
    const query = new URLSearchParams(window.location.search).get("q") || "";
    const file = Search._index.docnames.indexOf(docname);
    return score + (file < 0 ? 0 : Scorer.headingBonus(file, query));
  },
};

// TeX as plain text: the common commands as Unicode, the rest without backslashes.
const courseTexToText = (tex) => {
  const symbols = {
    top: "ᵀ", times: "×", cdot: "·", sqrt: "√", sum: "∑", prod: "∏", in: "∈",
    infty: "∞", approx: "≈", le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠",
    to: "→", rightarrow: "→", leftarrow: "←", ldots: "…", dots: "…", cdots: "⋯",
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", theta: "θ",
    lambda: "λ", mu: "μ", pi: "π", sigma: "σ", tau: "τ", phi: "φ", omega: "ω",
    Delta: "Δ", Sigma: "Σ", Omega: "Ω", odot: "⊙", otimes: "⊗", pm: "±", mid: "|",
    partial: "∂", ell: "ℓ", circ: "∘", lVert: "‖", rVert: "‖", Vert: "‖", lceil: "⌈",
    rceil: "⌉", lnot: "¬", land: "∧", bmod: "mod", quad: " ", qquad: " ",
  };
  // A group {...} with up to two levels of nested braces inside.
  const group = String.raw`\{((?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)\}`;
  const frac = new RegExp(String.raw`\\[dt]?frac\s*` + group + String.raw`\s*` + group, "g");
  const sqrt = new RegExp(String.raw`\\sqrt\s*` + group, "g");
  // A part of a fraction or a root, in brackets where it is more than one term.
  const part = (text) => {
    const t = fracs(text).trim();
    return /[\s+\-−=,/]/.test(t) && !/^√?\([^()]*\)$/.test(t) ? `(${t})` : t;
  };
  // Fractions and roots, their parts first (a fraction in a fraction: (a/b)/c).
  const fracs = (text) => text
    .replace(frac, (whole, a, b) => `${part(a)}/${part(b)}`)
    .replace(sqrt, (whole, a) => `√${part(a)}`);
  const text = tex
    .replace(/^\s*(\\\(|\\\[|\$\$?)/, "")
    .replace(/(\\\)|\\\]|\$\$?)\s*$/, "")
    .replace(/\\(?:begin|end)\s*\{[^{}]*\}(?:\s*\{[lcr|]*\})?/g, " ")
    .replace(/\^(?:\{\\top\}|\\top)/g, "ᵀ")
    .replace(/\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])/g, "")
    .replace(/\\\\/g, " ")
    .replace(/\\(?:text|mathrm|mathbf|mathbb|mathit|mathcal|mathsf|mathtt|operatorname|textbf|textit|boldsymbol)\s*/g, "")
    .replace(/\\(?:hat|tilde|bar|vec|overline|underline|widehat|widetilde|underbrace|overbrace)(?![a-zA-Z])\s*/g, "");
  return fracs(text)
    .replace(/\\[dt]?frac\s*([^\s{\\])\s*([^\s{\\])/g, "$1/$2")
    .replace(/\\([a-zA-Z]+)/g, (whole, name) => (name in symbols ? symbols[name] : name))
    .replace(/\\([,;:! ])/g, " ")
    .replace(/\\([{}_%&#$])/g, "$1")
    .replace(/&/g, "")
    .replace(/[{}]/g, "")
    .replace(/\s+/g, " ")
    .trim();
};

// Parts of a page's [role=main] that are not its text: the header bar, the
// print-only title and contents, the contents sidebar and its dialog, navigation,
// the previous/next links and the toggle buttons.
const NOT_TEXT = [
  ".bd-header-article", ".header-article-items", "#jb-print-docs-body", ".onlyprint",
  ".bd-sidebar-secondary", "dialog", "nav", ".prev-next-footer", ".prev-next-area",
  ".bd-footer-content", ".searchbox", ".toggle-button", "button",
].join(", ");

if (typeof Search !== "undefined") {
  const sphinxHtmlToText = Search.htmlToText;
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(NOT_TEXT).forEach((element) => element.remove());
    doc.querySelectorAll(".math").forEach((math) => {
      const text = courseTexToText(math.textContent);
      math.replaceWith(doc.createTextNode(math.tagName === "DIV" ? ` ${text} ` : text));
    });
    return sphinxHtmlToText(doc.documentElement.outerHTML, anchor);
  };
}
