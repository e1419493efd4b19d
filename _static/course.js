/* The course's additions to the book's pages (Jupyter Book adds every .js file
 * in _static/ to every page). tests/test_book.py checks each in a browser.
 *
 * (1) A solution opens from its whole title.
 * sphinx-exercise titles a solution "Solution to <a>Exercise 1.2 (...)</a>", and
 * sphinx-togglebutton makes the title a dropdown's handle. A click on the link,
 * which is most of the title, followed the link back to the exercise (just
 * above) and did not open the solution; only the chevron and the words
 * "Solution to" did. A click anywhere on a dropdown's title now opens or closes
 * it; with Ctrl, Cmd or Shift held (or the middle button) the link still opens
 * the exercise.
 *
 * (2) Long names in the contents wrap at their joints.
 * The contents beside the API page list names such as check_prefix_matching_score();
 * course.css lets them wrap, and a <wbr> after each dot (or, in a name without
 * one, each underscore) lets them wrap there rather than mid-word.
 *
 * (3) Printed sentences wrap; printed columns do not.
 * course.css lets a cell's printed output scroll sideways, so that a tensor or a
 * table keeps its columns on a phone. An output whose lines are all sentences (a
 * printed CheckFailed message, a result stated in words: no line indented, no
 * run of two spaces aligning a column, no tensor) is marked course-prose-output,
 * which wraps it at the box's edge instead, like the page's text. So does an
 * output with a line of over LONG_LINE characters (pytest's report of a failed
 * check on the instructors' page, one line of 350): no column layout is read
 * across 2,500 px, and its end is what the reader is sent to read.
 *
 * (4) A box that scrolls sideways says so.
 * A code box, a printed output, a table or a display equation wider than its box
 * scrolls inside it; on a phone nothing showed that there was more (555 of 734
 * boxes). Each such box gets course-scroll-right while more of it lies to the
 * right, course-scroll-left while some lies to the left, kept up to date as it
 * scrolls and as the window changes; course.css fades the box's edge on that side.
 */
"use strict";

(() => {
  const TITLE = ".admonition.dropdown > .admonition-title";

  document.addEventListener(
    "click",
    (event) => {
      const title = event.target.closest && event.target.closest(TITLE);
      if (!title || event.target.closest(".toggle-button")) return;
      const link = event.target.closest("a");
      if (link && (event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0)) return;
      const button = title.querySelector(".toggle-button");
      if (!button) return;
      // Not the link's jump, and not togglebutton's own handler on the title (which
      // finds no button for a click on the link): the button's click toggles.
      event.preventDefault();
      event.stopPropagation();
      button.click();
    },
    true,
  );

  const breakNames = () => {
    const spans = document.querySelectorAll(".bd-sidebar-secondary nav.page-toc code span.pre");
    for (const span of spans) {
      if (span.children.length || !/[._]/.test(span.textContent)) continue;
      // After each dot where there is one (DotProductVariance.|num_samples), else
      // after each underscore (check_weight_|transfer()).
      const joint = span.textContent.includes(".") ? /(?<=\.)/ : /(?<=_)/;
      const pieces = span.textContent.split(joint);
      span.textContent = "";
      pieces.forEach((piece, i) => {
        if (i) span.appendChild(document.createElement("wbr"));
        span.appendChild(document.createTextNode(piece));
      });
    }
  };
  const isProse = (text) => {
    const lines = text.split("\n").filter((line) => line.trim());
    return lines.length > 0 && lines.every((line) => !/^\s|\S {2,}\S|^(tensor|array)\(/.test(line));
  };
  const markProse = () => {
    const outputs = document.querySelectorAll(
      ".bd-content div.cell_output .output.stream, .bd-content div.cell_output .output.text_plain");
    for (const output of outputs) {
      const pre = output.querySelector("pre");
      if (pre && isProse(pre.textContent)) output.classList.add("course-prose-output");
    }
  };

  const LONG_LINE = 160;
  const markLongLines = () => {
    for (const pre of document.querySelectorAll(".bd-content div.cell_output .output pre")) {
      if (pre.textContent.split("\n").some((line) => line.length > LONG_LINE)) {
        pre.closest(".output").classList.add("course-prose-output");
      }
    }
  };

  const SCROLLERS = [
    ".bd-article div.highlight pre",
    ".bd-article table",
    '.bd-article mjx-container[display="true"]',
  ].join(", ");
  const cue = (box) => {
    const more = box.scrollWidth - box.clientWidth;
    box.classList.toggle("course-scroll-right", more > 1 && box.scrollLeft < more - 1);
    box.classList.toggle("course-scroll-left", more > 1 && box.scrollLeft > 1);
  };
  const markScrolling = () => document.querySelectorAll(SCROLLERS).forEach(cue);
  document.addEventListener(
    "scroll",
    (event) => {
      const box = event.target;
      if (box instanceof Element && box.matches(SCROLLERS)) cue(box);
    },
    { capture: true, passive: true },
  );
  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(markScrolling, 100);
  });
  // Display equations are typeset after the page loads; hidden cells and solutions
  // open later: look again then.
  window.addEventListener("load", () => {
    markScrolling();
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(markScrolling);
    }
  });
  document.addEventListener("toggle", markScrolling, true);
  document.addEventListener("click", () => setTimeout(markScrolling, 0));

  const ready = () => {
    breakNames();
    markProse();
    markLongLines();
    markScrolling();
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready);
  else ready();
})();
