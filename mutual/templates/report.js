"use strict";
for (const table of document.querySelectorAll("table.sortable")) {
  const heads = [...table.tHead.rows[0].cells];
  heads.forEach((th, col) => {
    const button = th.querySelector("button");
    if (!button) return;
    button.addEventListener("click", () => {
      const ascending = th.getAttribute("aria-sort") !== "ascending";
      heads.forEach(h => h.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      const numeric = th.dataset.type === "number";
      const key = row => {
        const v = row.cells[col].dataset.value;
        return numeric ? parseFloat(v) : v;
      };
      const body = table.tBodies[0];
      const rows = [...body.rows];
      rows.sort((a, b) => {
        const x = key(a), y = key(b);
        const c = numeric ? x - y : x.localeCompare(y);
        return ascending ? c : -c;
      });
      body.append(...rows);
    });
  });
}
const images = document.getElementById("images").tBodies[0];
const filter = document.getElementById("filter");
const wrongOnly = document.getElementById("wrong-only");
const shown = document.getElementById("shown");
function applyFilter() {
  const query = filter.value.trim().toLowerCase();
  let n = 0;
  for (const row of images.rows) {
    const keep = (!query || row.dataset.search.includes(query))
      && (!wrongOnly.checked || row.dataset.correct === "0");
    row.hidden = !keep;
    n += keep;
  }
  shown.textContent = `${n} of ${images.rows.length} images`;
}
filter.addEventListener("input", applyFilter);
wrongOnly.addEventListener("change", applyFilter);
images.addEventListener("click", event => {
  const row = event.target.closest("tr");
  const link = row && row.querySelector("a");
  if (link && !event.target.closest("a")) link.click();
});
function markSelected() {
  for (const row of images.querySelectorAll("tr.selected")) row.classList.remove("selected");
  const match = /^#img-(\d+)$/.exec(location.hash);
  const row = match && images.querySelector(`tr[data-index="${match[1]}"]`);
  if (row) row.classList.add("selected");
}
window.addEventListener("hashchange", markSelected);
markSelected();
applyFilter();
