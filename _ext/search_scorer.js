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
 * (2) Snippets without TeX.
 * The snippet under each result is cut from the page's HTML, where math is still
 * TeX source in span.math / div.math ("\(XX^\top\)"). The math is written as
 * plain text instead (XXᵀ), without its delimiters.
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
  };
  return tex
    .replace(/^\s*(\\\(|\\\[|\$\$?)/, "")
    .replace(/(\\\)|\\\]|\$\$?)\s*$/, "")
    .replace(/\^\{?\\top\}?/g, "ᵀ")
    .replace(/\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])/g, "")
    .replace(/\\(?:text|mathrm|mathbf|mathit|mathcal|operatorname|textbf|textit|boldsymbol)\s*/g, "")
    .replace(/\\([a-zA-Z]+)/g, (whole, name) => (name in symbols ? symbols[name] : name))
    .replace(/\\([,;:! ])/g, " ")
    .replace(/\\([{}_%&#$])/g, "$1")
    .replace(/&/g, "")
    .replace(/\\\\/g, " ")
    .replace(/[{}]/g, "")
    .replace(/\s+/g, " ")
    .trim();
};

if (typeof Search !== "undefined") {
  const sphinxHtmlToText = Search.htmlToText;
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(".math").forEach((math) => {
      const text = courseTexToText(math.textContent);
      math.replaceWith(doc.createTextNode(math.tagName === "DIV" ? ` ${text} ` : text));
    });
    return sphinxHtmlToText(doc.documentElement.outerHTML, anchor);
  };
}
