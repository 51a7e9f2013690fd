// What the console's live tables share: a poll that sends the fingerprints of the rows shown and
// patches in place the rows that changed (the server renders each row, escaped, as it renders the
// page, and resends only those), and elapsed times that tick.
"use strict";
window.hvdcls = (function () {
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
  // row key -> fingerprint of the row shown, from the table's data-have ("key.h,key.h,...")
  function fingerprintsOf(table) {
    const shown = new Map();
    for (const pair of (table.dataset.have || "").split(",").filter(Boolean)) {
      const at = pair.lastIndexOf(".");
      shown.set(pair.slice(0, at), pair.slice(at + 1));
    }
    return shown;
  }
  function have(fingerprints) {
    return [...fingerprints].map(([key, h]) => key + "." + h).join(",");
  }
  function rowFrom(html) {
    const holder = document.createElement("tbody");
    holder.innerHTML = html;  // server-rendered, autoescaped
    return holder.firstElementChild;
  }
  // The body's rows become update.order's: those in update.rows anew, the others kept, the rest gone.
  function patch(body, fingerprints, update) {
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
    const empty = document.getElementById("empty");
    if (empty && update.order.length) empty.remove();
  }
  // Every `ms`, while the page is seen, ask `url` (with query()'s parameters and the fingerprints of
  // the rows shown) for what changed, patch the table's rows and hand the answer to after().
  function follow(table, url, ms, query, after) {
    const fingerprints = fingerprintsOf(table);
    async function poll() {
      if (document.hidden) return;
      const params = new URLSearchParams(Object.assign(query(), {have: have(fingerprints)}));
      const reply = await fetch(url + "?" + params, {credentials: "same-origin"});
      if (reply.status === 401) { location.href = "/console/signin"; return; }
      if (!reply.ok) return;
      const update = await reply.json();
      patch(table.tBodies[0], fingerprints, update);
      after(update);
      table.dataset.polled = String(Number(table.dataset.polled || 0) + 1);
      tick();
    }
    tick();
    setInterval(tick, 1000);
    setInterval(poll, ms);
  }
  return {elapsed: elapsed, tick: tick, follow: follow};
})();
