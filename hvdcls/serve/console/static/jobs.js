// The job list: every 2 s this page's rows that changed, the counts by state and the hosts
// (hvdcls.follow, rows.js).
"use strict";
(function () {
  const table = document.getElementById("jobs");
  const query = () => table.dataset.state ? {page: table.dataset.page, state: table.dataset.state}
                                          : {page: table.dataset.page};
  hvdcls.follow(table, "/console/jobs.json", 2000, query, update => {
    document.getElementById("total").textContent = update.total;
    document.getElementById("pages").textContent = update.pages;
    for (const [state, n] of Object.entries(update.counts)) {
      const cell = document.querySelector('[data-count="' + state + '"]');
      if (cell) cell.textContent = n;
    }
    document.getElementById("hosts").innerHTML = update.hosts;  // server-rendered, autoescaped
  });
})();
