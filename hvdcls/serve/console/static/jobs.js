// The job list: every POLL_MS ask for this page's rows, sending the fingerprints of those shown,
// and replace only the rows that changed (the server renders them, escaped, as it renders the page).
"use strict";
(function () {
  const POLL_MS = 2000;
  const table = document.getElementById("jobs");
  const body = table.tBodies[0];
  const fingerprints = new Map();  // job id -> fingerprint of the row shown
  for (const pair of (table.dataset.have || "").split(",").filter(Boolean)) {
    const [id, h] = pair.split(".");
    fingerprints.set(id, h);
  }

  function elapsed(seconds) {
    if (!(seconds >= 0)) return "";
    const h = Math.floor(seconds / 3600), m = Math.floor(seconds % 3600 / 60), s = Math.floor(seconds % 60);
    return (h ? h + "h " : "") + (h || m ? m + "m " : "") + s + "s";
  }
  function tick() {
    const now = Date.now() / 1000;
    for (const cell of document.querySelectorAll(".elapsed")) {
      const since = parseFloat(cell.dataset.since), until = parseFloat(cell.dataset.until);
      cell.textContent = elapsed((isNaN(until) ? now : until) - since);
    }
  }
  function rowFrom(html) {
    const holder = document.createElement("tbody");
    holder.innerHTML = html;  // server-rendered, autoescaped
    return holder.firstElementChild;
  }
  async function poll() {
    if (document.hidden) return;
    const have = [...fingerprints].map(([id, h]) => id + "." + h).join(",");
    const query = new URLSearchParams({page: table.dataset.page, have: have});
    if (table.dataset.state) query.set("state", table.dataset.state);
    const reply = await fetch("/console/jobs.json?" + query, {credentials: "same-origin"});
    if (reply.status === 401) { location.href = "/console/signin"; return; }
    if (!reply.ok) return;
    const update = await reply.json();
    const rows = new Map([...body.rows].map(row => [row.dataset.id, row]));
    let previous = null;
    for (const {id, h} of update.order) {
      const key = String(id);
      let row = rows.get(key);
      if (key in update.rows) {
        const fresh = rowFrom(update.rows[key]);
        if (row) row.replaceWith(fresh);
        row = fresh;
      }
      if (!row) continue;
      const wanted = previous ? previous.nextSibling : body.firstChild;
      if (row !== wanted) body.insertBefore(row, wanted);
      fingerprints.set(key, h);
      rows.delete(key);
      previous = row;
    }
    for (const [key, row] of rows) { row.remove(); fingerprints.delete(key); }
    document.getElementById("total").textContent = update.total;
    document.getElementById("pages").textContent = update.pages;
    for (const [state, n] of Object.entries(update.counts)) {
      const cell = document.querySelector('[data-count="' + state + '"]');
      if (cell) cell.textContent = n;
    }
    document.getElementById("hosts").innerHTML = update.hosts;  // server-rendered, autoescaped
    const empty = document.getElementById("empty");
    if (empty && update.order.length) empty.remove();
    table.dataset.polled = String(Number(table.dataset.polled || 0) + 1);
    tick();
  }
  tick();
  setInterval(tick, 1000);
  setInterval(poll, POLL_MS);
})();
