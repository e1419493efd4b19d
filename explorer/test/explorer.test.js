// Unit tests of explorer.js's pure helpers: `npm test` (node --test explorer/test/).
// tests/test_explorer.py runs them, and drives the whole explorer in Chromium.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const h = require("../site/explorer/explorer.js");

test("viridis runs from dark purple to yellow and clips", () => {
  assert.deepEqual(h.viridis(0), [68, 1, 84]);
  assert.deepEqual(h.viridis(1), [253, 231, 37]);
  assert.deepEqual(h.viridis(-3), h.viridis(0));
  assert.deepEqual(h.viridis(7), h.viridis(1));
  assert.deepEqual(h.viridis(NaN), h.viridis(0));
  assert.deepEqual(h.viridis(0.5), [33, 144, 141]);
});

test("text is white on dark cells and black on light ones", () => {
  assert.equal(h.textOn(h.viridis(0)), "#fff");
  assert.equal(h.textOn(h.viridis(1)), "#000");
});

test("parseIds reads ids separated by spaces or commas and names a bad one", () => {
  assert.deepEqual(h.parseIds(" 3, 4  31 ", 32, 24), { ids: [3, 4, 31] });
  assert.match(h.parseIds("3 32", 32, 24).error, /"32" is not a token id from 0 to 31/);
  assert.match(h.parseIds("3 -1", 32, 24).error, /"-1"/);
  assert.match(h.parseIds("3 x", 32, 24).error, /"x"/);
  assert.match(h.parseIds("   ", 32, 24).error, /at least one/);
  assert.match(h.parseIds("1 2 3", 32, 2).error, /At most 2 tokens, got 3/);
});

test("parseWords maps words of the vocabulary, in any case, to ids", () => {
  const vocab = ["Your", "journey", "starts", "with", "one", "step"];
  assert.deepEqual(h.parseWords("step JOURNEY your", vocab, 6), { ids: [5, 1, 0] });
  assert.match(h.parseWords("Your trip", vocab, 6).error, /"trip" is not in the vocabulary/);
  assert.match(h.parseWords("a b c d e f g", vocab, 6).error, /At most 6 words, got 7/);
});

test("inductionTargets gives the token after the latest earlier occurrence", () => {
  assert.deepEqual(h.inductionTargets([5, 6, 7, 5, 9, 5]), [null, null, null, 6, null, 9]);
  assert.deepEqual(h.inductionTargets([1, 1, 1]), [null, 1, 1]);
});

test("argmax, topK and weightRow read rows of flat tensors", () => {
  const data = [0.1, 0.7, 0.2, /* row 1 */ 0.5, 0.5, 0.0];
  assert.equal(h.argmax(data, 0, 3), 1);
  assert.equal(h.argmax(data, 3, 3), 0); // ties: the first
  assert.deepEqual(h.topK([0.2, 0.5, 0.3], 2), [{ index: 1, value: 0.5 }, { index: 2, value: 0.3 }]);
  // (1, 2 heads, 2, 2): head 1, query 1
  const weights = [1, 0, 0.4, 0.6, 1, 0, 0.9, 0.1];
  assert.deepEqual(h.weightRow(weights, 2, 1, 1), [0.9, 0.1]);
});
